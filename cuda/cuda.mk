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

$(CUDA_SO): $(CUDA_OBJS) $(LIB_SO) cuda/libtshm-cuda.map
	$(Q)$(CC) -shared -Wl,-soname,$(CUDA_SONAME) -Wl,-z,defs \
		-Wl,--version-script=cuda/libtshm-cuda.map \
		-Wl,-z,relro -Wl,-z,now $(LDFLAGS) -o $@ $(CUDA_OBJS) \
		-L$(LIB_B) -l:$(notdir $(LIB_SO)) $(CUDA_LDLIBS)

$(CUDA_B)/$(CUDA_SONAME): $(CUDA_SO)
	$(Q)ln -sf $(notdir $<) $@

$(CUDA_B)/libtshm-cuda.so: $(CUDA_B)/$(CUDA_SONAME)
	$(Q)ln -sf $(notdir $<) $@

# Like libtshm.a (lib/lib.mk): one object, only libtshm-cuda.map's
# symbols global, so the helpers it shares with libtshm never clash.
$(CUDA_A): $(CUDA_OBJS) cuda/libtshm-cuda.map
	$(call lib_archive,$(CUDA_OBJS),cuda/libtshm-cuda.map)

# Beside libtshm (install-lib), when the toolkit was found at build time.
# tshm-cuda.h needs no CUDA header and the library loads the driver itself:
# a program using it builds and links without the toolkit.
install: install-cuda
.PHONY: install-cuda
install-cuda: $(CUDA_SO) $(CUDA_A)
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 0755 $(CUDA_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(CUDA_SO)) $(DESTDIR)$(LIBDIR)/$(CUDA_SONAME)
	ln -sf $(CUDA_SONAME) $(DESTDIR)$(LIBDIR)/libtshm-cuda.so
	install -m 0644 $(CUDA_A) $(DESTDIR)$(LIBDIR)/
	$(call lib_pc,cuda/tshm-cuda.pc.in) > \
		$(DESTDIR)$(LIBDIR)/pkgconfig/tshm-cuda.pc
	install -m 0644 cuda/include/tshm-cuda.h $(DESTDIR)$(INCLUDEDIR)/

endif
