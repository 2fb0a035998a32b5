# SPDX-License-Identifier: GPL-2.0
# vm-run's own tests: run on the host, each boots the guest.

WARN_KO := $(B)/tests/vm/warn-module/vmrun_warn.ko
ALL += $(WARN_KO)

$(WARN_KO): tests/vm/warn-module/vmrun_warn.c tests/vm/warn-module/Kbuild $(DEPS_MK)
	@mkdir -p $(@D)
	$(Q)ln -sfn $(CURDIR)/tests/vm/warn-module/vmrun_warn.c $(@D)/vmrun_warn.c
	$(Q)ln -sfn $(CURDIR)/tests/vm/warn-module/Kbuild $(@D)/Kbuild
	$(Q)$(MAKE) -C $(KHEADERS) M=$(CURDIR)/$(@D) W=1 KCFLAGS=-Werror modules \
		>$(@D)/build.log 2>&1 || { cat $(@D)/build.log; exit 1; }

# make demo's guest half, checked in the VM suite.
TESTS_VM += tests/vm/demo-test.sh
