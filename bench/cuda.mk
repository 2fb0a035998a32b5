# SPDX-License-Identifier: GPL-2.0
# cuda-bench: GPU buffer handoff latency through tshm queues against raw
# cudaIpc*MemHandle.  Built only when cuda/cuda-vars.mk found nvcc; SKIPs
# (exit 4) on a machine without a GPU.  bench/cuda-torch.py is the
# torch.multiprocessing baseline, run by hand where PyTorch exists.

include cuda/cuda-vars.mk

ifneq ($(CUDA_ENABLED),)

CUDA_BENCH    := $(B)/bench/cuda-bench
CUDA_BENCH_TK := $(CUDA_TK_OBJ)

BENCH += $(CUDA_BENCH)
ALL   += $(CUDA_BENCH)

$(CUDA_BENCH): bench/cuda-bench.c $(CUDA_BENCH_TK) $(CUDA_A) $(LIB_A) \
	       $(CUDA_HDRS) tests/cuda/tk-kernels.h bench/bench-util.h
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) $(CUDA_INC) -Itests/cuda -Ibench -o $@ $< \
		$(CUDA_BENCH_TK) $(CUDA_A) $(LIB_A) $(CUDART_LIBS) $(LDLIBS)

endif
