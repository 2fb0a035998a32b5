# SPDX-License-Identifier: GPL-2.0
# kmod-bench: tshm.ko segments against memfd (run it in the VM).

KMOD_BENCH := $(B)/bench/kmod-bench
BENCH += $(KMOD_BENCH)
ALL += $(KMOD_BENCH)

$(KMOD_BENCH): bench/kmod-bench.c kmod/include/uapi/linux/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(LDLIBS)
