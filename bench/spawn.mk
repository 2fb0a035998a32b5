# SPDX-License-Identifier: GPL-2.0
# spawn-bench: tshm_spawn() to ready and to joined, per start method.

SPAWN_BENCH := $(B)/bench/spawn-bench

BENCH += $(SPAWN_BENCH)
ALL   += $(SPAWN_BENCH)

$(SPAWN_BENCH): bench/spawn-bench.c $(LIB_A) lib/include/tshm.h \
		lib/include/tshm-spawn.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)
