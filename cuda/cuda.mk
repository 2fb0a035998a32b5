# SPDX-License-Identifier: GPL-2.0
# libtshm-cuda: built only when $(CUDA_HOME) has nvcc; otherwise this
# fragment defines nothing and the rest of the project builds without it.
#
# The library is plain C compiled by $(CC) against cuda.h.  It does not link
# libcuda: the driver is dlopen()ed ("libcuda.so.1") at tshm_cuda_open() time,
# so programs start (and SKIP) on machines without the driver, and the stub
# in $(CUDA_HOME)/lib64/stubs is never loaded.  Test kernels (.cu) are
# compiled by nvcc and linked with the static cudart (no libcudart.so needed
# at run time, so the binaries also start in the VM).

include cuda/cuda-vars.mk

ifneq ($(CUDA_ENABLED),)

ALL += $(CUDA_SO) $(CUDA_B)/$(CUDA_SONAME) $(CUDA_B)/libtshm-cuda.so $(CUDA_A)

.PHONY: cuda
cuda: $(CUDA_SO) $(CUDA_B)/libtshm-cuda.so $(CUDA_A)

$(CUDA_B)/obj/%.o: cuda/%.c $(CUDA_HDRS)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CUDA_CFLAGS) -c -o $@ $<

$(CUDA_SO): $(CUDA_OBJS) $(LIB_SO)
	$(Q)$(CC) -shared -Wl,-soname,$(CUDA_SONAME) -Wl,-z,defs \
		-Wl,-z,relro -Wl,-z,now $(LDFLAGS) -o $@ $(CUDA_OBJS) \
		-L$(LIB_B) -l:$(notdir $(LIB_SO)) $(CUDA_LDLIBS)

$(CUDA_B)/$(CUDA_SONAME): $(CUDA_SO)
	$(Q)ln -sf $(notdir $<) $@

$(CUDA_B)/libtshm-cuda.so: $(CUDA_B)/$(CUDA_SONAME)
	$(Q)ln -sf $(notdir $<) $@

$(CUDA_A): $(CUDA_OBJS)
	$(Q)rm -f $@ && $(AR) rcs $@ $^

endif
