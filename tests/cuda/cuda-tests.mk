# SPDX-License-Identifier: GPL-2.0
# libtshm-cuda suite: built only when cuda/cuda.mk found nvcc.  The binary
# runs on the host and in the VM (neither has a GPU there: every GPU test
# SKIPs with the reason; the rest runs).  Test kernels are compiled by nvcc
# and linked with the static cudart, the driver is dlopen()ed.

include cuda/cuda-vars.mk

ifneq ($(CUDA_ENABLED),)

CUDA_TEST_B     := $(B)/tests/cuda
CUDA_TEST_BIN   := $(CUDA_TEST_B)/test-cuda
CUDA_TEST_CFLAGS := $(TEST_CFLAGS) $(CUDA_INC) -Itests/cuda -Wno-sign-compare

# The same suite against a fake driver (tests/cuda/fake-cuda.c): runs the
# channel, lease, cache, pool and SIGKILL logic on machines without a GPU.
CUDA_FAKE_BIN   := $(CUDA_TEST_B)/test-cuda-fake
CUDA_FAKE_LIB   := $(CUDA_TEST_B)/libfake-cuda.so

# And that one with ASan+UBSan over the library's sources too (host only).
CUDA_FAKE_ASAN_B   := $(B)/asan/tests/cuda
CUDA_FAKE_ASAN_BIN := $(CUDA_FAKE_ASAN_B)/test-cuda-fake

TESTS_BOTH      += $(CUDA_TEST_BIN) $(CUDA_FAKE_BIN)
TESTS_HOST_ASAN += $(CUDA_FAKE_ASAN_BIN)
ALL             += $(CUDA_FAKE_LIB) $(CUDA_FAKE_ASAN_BIN)

$(CUDA_TK_OBJ): tests/cuda/tk-kernels.cu tests/cuda/tk-kernels.h
	@mkdir -p $(@D)
	$(Q)$(NVCC) $(NVCC_FLAGS) -Itests/cuda -c -o $@ $<

$(CUDA_TEST_BIN): tests/cuda/test-cuda.c tests/cuda/tk-kernels.h \
		  $(CUDA_HDRS) $(CUDA_TK_OBJ) $(CUDA_A) $(LIB_A)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CUDA_TEST_CFLAGS) -o $@ $< $(CUDA_TK_OBJ) $(CUDA_A) \
		$(LIB_A) $(CUDART_LIBS) $(LDLIBS)

$(CUDA_FAKE_LIB): tests/cuda/fake-cuda.c
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) $(CUDA_INC) -fPIC -shared \
		-Wl,-z,defs -o $@ $<

$(CUDA_FAKE_BIN): tests/cuda/test-cuda.c $(CUDA_HDRS) $(CUDA_A) $(LIB_A) \
		  | $(CUDA_FAKE_LIB)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CUDA_TEST_CFLAGS) -DTSHM_CUDA_FAKE -o $@ $< $(CUDA_A) \
		$(LIB_A) -ldl $(LDLIBS)

# The binary loads libfake-cuda.so from its own folder.
$(CUDA_FAKE_ASAN_B)/libfake-cuda.so: $(CUDA_FAKE_LIB)
	@mkdir -p $(@D)
	$(Q)cp $< $@

$(CUDA_FAKE_ASAN_BIN): tests/cuda/test-cuda.c $(CUDA_SRCS) \
		       $(CUDA_HDRS) $(LIB_ASAN_A) \
		       | $(CUDA_FAKE_ASAN_B)/libfake-cuda.so
	@mkdir -p $(@D)
	$(Q)$(CC) $(CUDA_TEST_CFLAGS) $(SAN_FLAGS) -DTSHM_CUDA_FAKE -o $@ $< \
		$(CUDA_SRCS) $(LIB_ASAN_A) -ldl $(LDLIBS)

endif
