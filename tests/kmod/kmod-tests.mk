# SPDX-License-Identifier: GPL-2.0
# kselftests of tshm.ko: run in the VM, as root, with the module loaded.

KMOD_TESTS := seg_test life_test proc_test mm_test vma_test scale_test \
	      churn_test \
	      rmmod_test
KMOD_TEST_BINS := $(addprefix $(B)/tests/kmod/,$(KMOD_TESTS))
TESTS_VM += $(KMOD_TEST_BINS)

$(KMOD_TEST_BINS): $(B)/tests/kmod/%: tests/kmod/%.c tests/kmod/tshm_test.h \
		   kmod/include/uapi/linux/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(TEST_CFLAGS) -Itests/kmod -Wno-clobbered -Wno-sign-compare \
		-o $@ $< $(LDLIBS)
