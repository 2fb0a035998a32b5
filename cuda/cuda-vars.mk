# SPDX-License-Identifier: GPL-2.0
# Variables shared by cuda/cuda.mk, tests/cuda/cuda-tests.mk and
# bench/cuda.mk (the top Makefile includes the test fragments before
# cuda/cuda.mk, so each includes this first).  CUDA_A stays empty when
# $(CUDA_HOME) has no nvcc: then nothing CUDA is built.

ifndef CUDA_VARS_INCLUDED
CUDA_VARS_INCLUDED := 1

CUDA_HOME ?= /usr/local/cuda

ifneq ($(wildcard $(CUDA_HOME)/bin/nvcc),)
CUDA_ENABLED  := 1

NVCC          ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCHS    ?= -gencode arch=compute_80,code=sm_80 \
		 -gencode arch=compute_90,code=sm_90 \
		 -gencode arch=compute_90,code=compute_90
NVCC_FLAGS    ?= -O2 -std=c++17 $(CUDA_ARCHS) -Xcompiler -Wall,-Werror
CUDA_INC      := -I$(CUDA_HOME)/include -Icuda/include
CUDA_B        := $(B)/cuda
CUDA_SRCS     := $(sort $(wildcard cuda/*.c))
CUDA_HDRS     := cuda/include/tshm-cuda.h cuda/cuda-private.h \
		 lib/include/tshm.h
CUDA_OBJS     := $(patsubst cuda/%.c,$(CUDA_B)/obj/%.o,$(CUDA_SRCS))
CUDA_CFLAGS   := $(BASE_CFLAGS) $(CFLAGS) $(CUDA_INC) -fPIC
CUDA_SONAME   := libtshm-cuda.so.0
CUDA_SO       := $(CUDA_B)/libtshm-cuda.so.0.3
CUDA_A        := $(CUDA_B)/libtshm-cuda.a
CUDA_LDLIBS   := -ldl -lpthread
# Test/bench kernels (tests/cuda/tk-kernels.cu; the rule is in
# tests/cuda/cuda-tests.mk), shared by the suite and bench/cuda-bench.
CUDA_TK_OBJ   := $(B)/tests/cuda/tk-kernels.o
# What a program using libtshm-cuda.a + the static cudart links with.
CUDART_LIBS   := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread \
		 -lstdc++

endif
endif
