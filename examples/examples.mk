# SPDX-License-Identifier: GPL-2.0
# Small programs a newcomer runs first.

EXAMPLES := $(B)/examples/kmod-demo
ALL += $(EXAMPLES)

$(B)/examples/kmod-demo: examples/kmod-demo.c kmod/include/uapi/linux/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(LDLIBS)

# spawn examples (issue 6): workers started with tshm_spawn().
SPAWN_EXAMPLES := $(B)/examples/hogwild $(B)/examples/pipeline
EXAMPLES += $(SPAWN_EXAMPLES)
ALL += $(SPAWN_EXAMPLES)

$(SPAWN_EXAMPLES): $(B)/examples/%: examples/%.c $(LIB_A) lib/include/tshm.h \
		lib/include/tshm-spawn.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

# libtshm examples (issue 5): producer and consumer through a queue and a
# buffer pool, across fork or exec.
LIB_EXAMPLES := $(B)/examples/producer-consumer
EXAMPLES += $(LIB_EXAMPLES)
ALL += $(LIB_EXAMPLES)

$(LIB_EXAMPLES): $(B)/examples/%: examples/%.c $(LIB_A) lib/include/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)
