# SPDX-License-Identifier: GPL-2.0
# libtshm benchmarks (bench/lib-*.c), linked statically against libtshm.a.
# lib-iceoryx-bench is built only where iceoryx's C binding is installed
# (Debian: libiceoryx-binding-c-dev, RouDi from iceoryx); bench/run-iceoryx
# runs it.

LIB_BENCH_B    := $(B)/bench
LIB_BENCH_SRCS := $(filter-out bench/lib-iceoryx-bench.c,$(wildcard bench/lib-*.c))
LIB_BENCH_BINS := $(patsubst bench/%.c,$(LIB_BENCH_B)/%,$(LIB_BENCH_SRCS))

# The binding installs its headers under a versioned folder.
IOX_INC := $(firstword $(patsubst %/iceoryx_binding_c/publisher.h,%,\
	     $(wildcard /usr/include/iceoryx/v*/iceoryx_binding_c/publisher.h \
			/usr/local/include/iceoryx/v*/iceoryx_binding_c/publisher.h)))
ifneq ($(IOX_INC),)
LIB_BENCH_BINS += $(LIB_BENCH_B)/lib-iceoryx-bench
endif

BENCH += $(LIB_BENCH_BINS)
ALL   += $(LIB_BENCH_BINS)

$(LIB_BENCH_B)/lib-iceoryx-bench: bench/lib-iceoryx-bench.c $(LIB_A) lib/include/tshm.h bench/bench-util.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -isystem $(IOX_INC) -o $@ $< \
		$(LIB_A) -liceoryx_binding_c $(LDLIBS)

$(LIB_BENCH_B)/lib-%: bench/lib-%.c $(LIB_A) lib/include/tshm.h bench/bench-util.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)
