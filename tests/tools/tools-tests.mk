# SPDX-License-Identifier: GPL-2.0
# tshmctl's tests: run in the VM, as root (and as nobody inside), with the
# module loaded; tshmctl_test.sh unloads and reloads it, leaving it loaded
# with default parameters.

SEGHOLD := $(B)/tests/tools/seghold
ALL += $(SEGHOLD)
TESTS_VM += tests/tools/tshmctl_test.sh

$(SEGHOLD): tests/tools/seghold.c kmod/include/uapi/linux/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(TEST_CFLAGS) -o $@ $<
