# SPDX-License-Identifier: GPL-2.0
# tshm-fuzz: the module's ioctl/mm/process fuzzer, run inside the VM, and
# the planted-bug check (Documentation/dev-tools/hardening.rst).
#
#   make fuzz [FUZZ_SECONDS=300] [FUZZ_PROCS=4] [FUZZ_SEED=N] [FUZZ_DEBUG=1]
#                       a fuzz run in the VM (stock kernel; FUZZ_DEBUG=1:
#                       the debug kernel, module from $(B)/kmod-debug)
#   make planted-bugs   the planted use-after-free and lock inversion must
#                       fail the debug-kernel run; the clean module must pass

FUZZ_BIN     := $(B)/tests/fuzz/tshm-fuzz
PLANT_TRIGGER := $(B)/tests/hardening/plant-trigger
FUZZ_SECONDS ?= 300
FUZZ_PROCS   ?= 4
FUZZ_SEED    ?=
FUZZ_DEBUG   ?=
ALL += $(FUZZ_BIN) $(PLANT_TRIGGER)

$(FUZZ_BIN): tests/fuzz/tshm-fuzz.c kmod/include/uapi/linux/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -Wno-missing-prototypes -o $@ $< $(LDLIBS)

$(PLANT_TRIGGER): tests/hardening/plant-trigger.c kmod/include/uapi/linux/tshm.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(LDLIBS)

# The VM gets FUZZ_SECONDS plus boot, teardown and a margin.
.PHONY: fuzz planted-bugs
fuzz: $(FUZZ_BIN) $(if $(FUZZ_DEBUG),$(KO_DEBUG),$(KO))
	$(Q)scripts/vm-run $(if $(FUZZ_DEBUG),--debug) \
		--timeout $$(( $(FUZZ_SECONDS) * 3 / 2 + 240 )) -- \
		$(FUZZ_BIN) --seconds $(FUZZ_SECONDS) --procs $(FUZZ_PROCS) \
		$(if $(FUZZ_SEED),--seed $(FUZZ_SEED))

planted-bugs: $(PLANT_TRIGGER)
	$(Q)B=$(B) tests/hardening/planted-bugs.sh
