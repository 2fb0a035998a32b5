# SPDX-License-Identifier: GPL-2.0
# The fault-injection run: only on the debug kernel (scripts/check's
# "faultinject" suite, vm-run --debug); see Documentation/dev-tools/
# fault-injection.rst.

FI_TEST := $(B)/tests/faultinject/fi_test
TESTS_FI := tests/faultinject/fi-run.sh
ALL += $(FI_TEST)

$(FI_TEST): tests/faultinject/fi_test.c tests/kmod/tshm_test.h \
	    kmod/include/uapi/linux/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(TEST_CFLAGS) -Itests/kmod -Wno-clobbered -Wno-sign-compare \
		-o $@ $< $(LDLIBS)
