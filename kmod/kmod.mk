# SPDX-License-Identifier: GPL-2.0
# The module, built out of tree against Debian's linux-headers-$(KVER).
# Kbuild writes its objects next to the sources it is given, so the sources
# are mirrored into $(B)/kmod as symlinks and built there.

KMOD_B    := $(B)/kmod
KMOD_SRCS := $(wildcard kmod/*.c kmod/*.h) kmod/Kbuild
KO        := $(KMOD_B)/tshm.ko
# W=1, warnings as errors; C=1 runs sparse (make kmod C=1).
KMOD_MAKE = $(MAKE) -C $(KHEADERS) M=$(CURDIR)/$(KMOD_B) W=1 \
	    KCFLAGS=-Werror $(if $(C),C=$(C))

ALL += $(KO)

kmod: $(KO)

$(KO): $(KMOD_SRCS) $(wildcard kmod/include/uapi/linux/*.h) $(DEPS_MK)
	@mkdir -p $(KMOD_B)
	$(Q)for f in $(KMOD_SRCS) kmod/include; do \
		ln -sfn $(CURDIR)/$$f $(KMOD_B)/$$(basename $$f); done
	$(Q)+$(KMOD_MAKE) modules $(if $(filter 0,$(V)),>$(KMOD_B)/build.log 2>&1 || \
		{ cat $(KMOD_B)/build.log; exit 1; })
	@grep -i 'warning:' $(KMOD_B)/build.log 2>/dev/null && exit 1 || true

# checkpatch --strict and sparse over the module's sources.  The UAPI
# header cannot use BIT() (not exported), and _BITUL() would change the
# flags' type from unsigned int to unsigned long.
CHECKPATCH = perl $(KTREE)/scripts/checkpatch.pl --strict --no-tree --terse \
	     --show-types --ignore FILE_PATH_CHANGES,SPDX_LICENSE_TAG
.PHONY: kmod-lint
kmod-lint: $(DEPS_MK)
	$(Q)$(CHECKPATCH) -f kmod/*.c kmod/*.h
	$(Q)$(CHECKPATCH) --ignore BIT_MACRO -f kmod/include/uapi/linux/*.h
	$(Q)rm -f $(KO) && $(MAKE) --no-print-directory kmod C=2 V=1 2>&1 | \
		tee $(KMOD_B)/sparse.log | grep -E ': (warning|error):' && exit 1 || true
