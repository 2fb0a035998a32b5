# SPDX-License-Identifier: GPL-2.0
# libtshm benchmarks (bench/lib-*.c), linked statically against libtshm.a.

LIB_BENCH_B    := $(B)/bench
LIB_BENCH_BINS := $(patsubst bench/%.c,$(LIB_BENCH_B)/%,$(wildcard bench/lib-*.c))

BENCH += $(LIB_BENCH_BINS)
ALL   += $(LIB_BENCH_BINS)

$(LIB_BENCH_B)/lib-%: bench/lib-%.c $(LIB_A) lib/include/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)
