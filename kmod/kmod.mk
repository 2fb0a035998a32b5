# SPDX-License-Identifier: GPL-2.0
# The module, built out of tree against Debian's headers of every kernel in
# $(TSHM_KERNELS) (6.1 into $(B)/kmod, the others into $(B)/kmod-<k>), and
# (make kmod-debug) against the debug kernel of scripts/build-debug-kernel.
# make kmod builds the one for $(KVER).
# Kbuild writes its objects next to the sources it is given, so the sources
# are mirrored into the build folder as symlinks and built there.

KMOD_SRCS    := $(wildcard kmod/*.c kmod/*.h) kmod/Kbuild
# kmod_dir K: where the module for kernel K is built.
kmod_dir      = $(if $(filter 6.1,$(1)),$(B)/kmod,$(B)/kmod-$(1))
KO           := $(call kmod_dir,$(KVER))/tshm.ko
KOS          := $(foreach k,$(TSHM_KERNELS),$(call kmod_dir,$(k))/tshm.ko)
KO_DEBUG     := $(B)/kmod-debug/tshm.ko
KMOD_DEPS    := $(KMOD_SRCS) $(wildcard kmod/include/uapi/linux/*.h) $(DEPS_MK)

# $(call kmod_build,KERNEL_TREE,OUT_DIR): W=1, warnings are errors, the
# log kept in OUT_DIR/build.log; C=1 or C=2 runs sparse too.
define kmod_build
	@mkdir -p $(2)
	$(Q)for f in $(KMOD_SRCS) kmod/include; do \
		ln -sfn $(CURDIR)/$$f $(2)/$$(basename $$f); done
	$(Q)+$(MAKE) -C $(1) M=$(abspath $(2)) W=1 KCFLAGS=-Werror \
		$(if $(C),C=$(C)) modules > $(2)/build.log 2>&1 || \
		{ cat $(2)/build.log; exit 1; }
	$(Q)if grep -E ': (warning|error):' $(2)/build.log; then exit 1; fi
endef

ALL += $(KOS)

.PHONY: kmod kmod-debug kmod-lint
kmod: kmod-kver $(KO)

# Checked when the rules run: an older $(DEPS_MK) is remade first.
.PHONY: kmod-kver
kmod-kver:
	$(if $(filter $(KVER),$(TSHM_KERNELS) $(TSHM_KERNELS_EXTRA)),,\
		$(error KVER=$(KVER) is not one of: $(TSHM_KERNELS) $(TSHM_KERNELS_EXTRA)))
kmod-debug: $(KO_DEBUG)

# One rule per kernel; $(KVER)'s takes $(KHEADERS), which may be overridden.
define kmod_rule
$(call kmod_dir,$(1))/tshm.ko: $$(KMOD_DEPS)
	$$(call kmod_build,$(if $(filter $(1),$(KVER)),$$(KHEADERS),$$(KHEADERS_$(call kvar,$(1)))),$(call kmod_dir,$(1)))
endef
$(foreach k,$(sort $(TSHM_KERNELS) $(KVER)),$(eval $(call kmod_rule,$(k))))

# Not part of 'all': the first build of the debug kernel takes minutes.
$(KO_DEBUG): $(KMOD_DEPS) scripts/build-debug-kernel scripts/debug-kernel.config
	$(Q)scripts/build-debug-kernel --print-env > $(B)/kdebug.env
	$(call kmod_build,$$(sed -n 's/^KDEBUG_TREE=//p' $(B)/kdebug.env),$(B)/kmod-debug)

# checkpatch --strict, sparse and W=1 (also without THP): the lint suite
# of make check.
kmod-lint: $(DEPS_MK)
	$(Q)B=$(B) tests/lint/kmod-lint.sh
	$(Q)B=$(B) tests/lint/kmod-nothp.sh
