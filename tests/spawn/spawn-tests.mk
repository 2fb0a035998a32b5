# SPDX-License-Identifier: GPL-2.0
# spawn suites: run on the host (memfd fallback), again with ASan+UBSan, and
# in the VM on the module.

SPAWN_TESTS        := $(patsubst tests/spawn/%.c,%,$(wildcard tests/spawn/test-*.c))
SPAWN_TEST_B       := $(B)/tests/spawn
SPAWN_TEST_ASAN_B  := $(B)/asan/tests/spawn
SPAWN_TEST_BINS    := $(addprefix $(SPAWN_TEST_B)/,$(SPAWN_TESTS))
SPAWN_TEST_ASAN_BINS := $(addprefix $(SPAWN_TEST_ASAN_B)/,$(SPAWN_TESTS))
SPAWN_TEST_CFLAGS  := $(TEST_CFLAGS) -Wno-sign-compare
SPAWN_TEST_DEPS    := lib/include/tshm.h lib/include/tshm-spawn.h \
		      tests/spawn/spawn-tests.mk

TESTS_BOTH      += $(SPAWN_TEST_BINS) tests/spawn/test-examples.sh
TESTS_HOST_ASAN += $(SPAWN_TEST_ASAN_BINS)
ALL             += $(SPAWN_TEST_ASAN_BINS)

# -z now: a program linking libtshm.a lets the supervisor unmap what it
# inherited only when nothing is bound lazily (lib/spawn-sup-mem.c).
$(SPAWN_TEST_B)/%: tests/spawn/%.c $(SPAWN_TEST_DEPS) $(LIB_A)
	@mkdir -p $(@D)
	$(Q)$(CC) $(SPAWN_TEST_CFLAGS) -Wl,-z,now -o $@ $< $(LIB_A) $(LDLIBS)

$(SPAWN_TEST_ASAN_B)/%: tests/spawn/%.c $(SPAWN_TEST_DEPS) $(LIB_ASAN_A)
	@mkdir -p $(@D)
	$(Q)$(CC) $(SPAWN_TEST_CFLAGS) $(SAN_FLAGS) -o $@ $< $(LIB_ASAN_A) $(LDLIBS)
