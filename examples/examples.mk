# SPDX-License-Identifier: GPL-2.0
# Small programs a newcomer runs first.

EXAMPLES := $(B)/examples/kmod-demo
ALL += $(EXAMPLES)

$(B)/examples/kmod-demo: examples/kmod-demo.c kmod/include/uapi/linux/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(LDLIBS)
