# SPDX-License-Identifier: GPL-2.0
# libtshm suites.  Each runs on the host (memfd fallback), again with
# ASan+UBSan, and in the VM on the module.

LIB_TESTS      := $(patsubst tests/lib/%.c,%,$(wildcard tests/lib/test-*.c))
LIB_TEST_B     := $(B)/tests/lib
LIB_TEST_ASAN_B := $(B)/asan/tests/lib
LIB_TEST_BINS  := $(addprefix $(LIB_TEST_B)/,$(LIB_TESTS))
LIB_TEST_ASAN_BINS := $(addprefix $(LIB_TEST_ASAN_B)/,$(LIB_TESTS))
LIB_TEST_CFLAGS := $(TEST_CFLAGS) -Wno-sign-compare
LIB_TEST_DEPS  := tests/lib/tshm-test.h tests/lib/stop-in-copy.h lib/include/tshm.h

TESTS_BOTH      += $(LIB_TEST_BINS)
TESTS_HOST_ASAN += $(LIB_TEST_ASAN_BINS)
ALL             += $(LIB_TEST_ASAN_BINS)

$(LIB_TEST_B)/%: tests/lib/%.c $(LIB_TEST_DEPS) $(LIB_A)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LIB_TEST_CFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

$(LIB_TEST_ASAN_B)/%: tests/lib/%.c $(LIB_TEST_DEPS) $(LIB_ASAN_A)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LIB_TEST_CFLAGS) $(SAN_FLAGS) -o $@ $< $(LIB_ASAN_A) $(LDLIBS)

# The libtshm examples, run by a shell suite (needs $(B)/examples built).
TESTS_BOTH += tests/lib/test-lib-examples.sh
