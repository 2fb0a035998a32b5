# SPDX-License-Identifier: GPL-2.0
#
# tshm: one entry point.  Everything built goes under $(B)/ (default build/).
#
#   make            module, library, tools, tests, benchmarks
#   make kmod       only the module, for KVER=6.1 (default) or KVER=6.12
#                   (against Debian's headers for that kernel)
#   make python     the Python package into $(B)/python (PYTHONPATH=$(B)/python)
#   make check      every test: host suites (memfd fallback, plain and
#                   ASan+UBSan) and VM suites (module loaded), one summary line
#   make demo       the main job end to end in the VM
#   make deps       install what the build and the VM need (scripts/setup-deps)
#   make install    PREFIX=/usr/local DESTDIR=
#   make clean

.DEFAULT_GOAL := all

B        ?= build
PREFIX   ?= /usr/local
DESTDIR  ?=
CC       ?= cc
V        ?= 0

ifeq ($(V),0)
Q := @
else
Q :=
endif

# Facts about the kernels and the cache, resolved once by scripts/setup-deps
# (which installs what is missing) and kept in $(B)/deps.mk: TSHM_KERNELS
# (6.1 6.12), and for each KREL_<k> (the release, 6.12.X+deb12-amd64) and
# KHEADERS_<k>, k written with _ for . and -.
DEPS_MK := $(B)/deps.mk
ifeq ($(filter clean deps,$(MAKECMDGOALS)),)
-include $(DEPS_MK)
endif
$(DEPS_MK): scripts/setup-deps
	@mkdir -p $(@D)
	$(Q)scripts/setup-deps --print-make > $@.tmp && mv $@.tmp $@

# The kernel `make kmod` and `make install` build the module for: one of
# $(TSHM_KERNELS), or of $(TSHM_KERNELS_EXTRA) (built only when named).  KREL is its release, KHEADERS its headers (which may be
# given instead: KHEADERS=/lib/modules/$(uname -r)/build).
KVER     ?= 6.1
kvar      = $(subst -,_,$(subst .,_,$(1)))
ifneq ($(TSHM_KERNELS),)
# A kernel built only when asked for (6.12-rt) is fetched now.
ifneq ($(filter $(KVER),$(TSHM_KERNELS_EXTRA)),)
$(foreach v,$(shell scripts/setup-deps --kernel $(KVER) --print-env | \
	grep -E '^K(REL|HEADERS)_$(call kvar,$(KVER))='),$(eval $(v)))
endif
endif
KREL     := $(KREL_$(call kvar,$(KVER)))
KHEADERS ?= $(KHEADERS_$(call kvar,$(KVER)))

KSELFTEST := $(KTREE)/tools/testing/selftests

WARN     := -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wmissing-prototypes \
	    -Wstrict-prototypes -Wno-unused-parameter
CFLAGS   ?= -O2 -g
BASE_CFLAGS := -std=gnu11 -D_GNU_SOURCE $(WARN) -fno-strict-aliasing \
	    -Ilib/include -Ikmod/include/uapi
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer \
	    -fno-sanitize-recover=all
LDLIBS   := -lpthread

# Test binaries, filled in by the fragments:
#   TESTS_VM     run only in the VM, module loaded
#   TESTS_HOST   run only on the host (what needs no kernel of ours: builds)
#   TESTS_BOTH   run on the host (memfd fallback, also under ASan) and in the
#                VM (module); each must pick its backend through the library
TESTS_VM   :=
TESTS_HOST :=
TESTS_BOTH :=
BENCH      :=
ALL        :=

.PHONY: all kmod check check-host check-vm demo deps clean install
all: build-all

include kmod/kmod.mk
include lib/lib.mk
-include python/python.mk
include tests/tests.mk
-include tools/tools.mk
-include $(wildcard bench/*.mk)
-include examples/examples.mk
-include cuda/cuda.mk

.PHONY: build-all
build-all: $(ALL)

deps:
	$(Q)scripts/setup-deps
	$(Q)rm -f $(DEPS_MK)

check: build-all
	$(Q)scripts/check --build $(B)

check-host: build-all
	$(Q)scripts/check --build $(B) --host-only

check-vm: build-all
	$(Q)scripts/check --build $(B) --vm-only

demo: build-all
	$(Q)scripts/demo --build $(B)

clean:
	rm -rf $(B)

# Echo a variable: make print-TESTS_VM
print-%:
	@echo $($*)
