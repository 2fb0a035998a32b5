# SPDX-License-Identifier: GPL-2.0
# Test suites: kselftest_harness.h programs that print TAP.  Each suite's own
# fragment appends to TESTS_VM or TESTS_BOTH (see the top-level Makefile).

TEST_CFLAGS := $(BASE_CFLAGS) $(CFLAGS) -I$(KSELFTEST) -Itests/common \
	       -Wno-missing-prototypes

include tests/vm/vm-tests.mk
-include tests/kmod/kmod-tests.mk
-include tests/lib/lib-tests.mk
-include tests/spawn/spawn-tests.mk
-include tests/tools/tools-tests.mk
-include tests/cuda/cuda-tests.mk
-include tests/fuzz/fuzz.mk
-include tests/python/python-tests.mk
-include tests/faultinject/fi-tests.mk

ALL += $(TESTS_VM) $(TESTS_BOTH)
