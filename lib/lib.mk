# SPDX-License-Identifier: GPL-2.0
# libtshm: shared (libtshm.so.0, versioned symbols) and static, plus the
# pkg-config file.  Every lib/*.c is part of the library.

LIB_VERSION  := 0.5
LIB_B        := $(B)/lib
LIB_SRCS     := $(sort $(wildcard lib/*.c))
LIB_HDRS     := lib/include/tshm.h lib/include/tshm-spawn.h $(wildcard lib/*.h) \
		kmod/include/uapi/linux/tshm.h
LIB_OBJS     := $(patsubst lib/%.c,$(LIB_B)/obj/%.o,$(LIB_SRCS))
LIB_SONAME   := libtshm.so.0
LIB_SO       := $(LIB_B)/libtshm.so.$(LIB_VERSION)
LIB_A        := $(LIB_B)/libtshm.a
LIB_PC       := $(LIB_B)/tshm.pc
LIB_LDLIBS   := -lpthread
LIB_CFLAGS   := $(BASE_CFLAGS) $(CFLAGS) -fPIC

# The same sources with ASan+UBSan, static, for the sanitizer test builds.
LIB_ASAN_B   := $(B)/asan/lib
LIB_ASAN_OBJS := $(patsubst lib/%.c,$(LIB_ASAN_B)/obj/%.o,$(LIB_SRCS))
LIB_ASAN_A   := $(LIB_ASAN_B)/libtshm.a

LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include

ALL += $(LIB_SO) $(LIB_B)/libtshm.so $(LIB_A) $(LIB_PC) $(LIB_ASAN_A)

.PHONY: lib install-lib
lib: $(LIB_SO) $(LIB_B)/libtshm.so $(LIB_A) $(LIB_PC)
install: install-lib

$(LIB_B)/obj/%.o: lib/%.c $(LIB_HDRS)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LIB_CFLAGS) -c -o $@ $<

$(LIB_ASAN_B)/obj/%.o: lib/%.c $(LIB_HDRS)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LIB_CFLAGS) $(SAN_FLAGS) -c -o $@ $<

$(LIB_SO): $(LIB_OBJS) lib/libtshm.map
	$(Q)$(CC) -shared -Wl,-soname,$(LIB_SONAME) \
		-Wl,--version-script=lib/libtshm.map -Wl,-z,defs -Wl,-z,relro \
		-Wl,-z,now $(LDFLAGS) -o $@ $(LIB_OBJS) $(LIB_LDLIBS)

$(LIB_B)/$(LIB_SONAME): $(LIB_SO)
	$(Q)ln -sf $(notdir $<) $@

$(LIB_B)/libtshm.so: $(LIB_B)/$(LIB_SONAME)
	$(Q)ln -sf $(notdir $<) $@

# The static library is one relocatable object in which only the symbols of
# libtshm.map stay global: a program (or a Python extension) that links
# libtshm.a never meets the library's internal names (now_ns, fd_send, ...).
# The build fails if any other symbol would be global.
# $(2): the map file, lib/libtshm.map by default (cuda/cuda.mk names its own).
lib_exports = sed -n 's/^[[:space:]]*\(tshm_[a-z0-9_]*\);.*/\1/p' \
	$(or $(1),lib/libtshm.map)
define lib_archive
	$(Q)rm -f $@ $@.o $@.syms
	$(Q)$(call lib_exports,$(2)) > $@.syms
	$(Q)$(LD) -r -o $@.o $(1)
	$(Q)$(OBJCOPY) --keep-global-symbols=$@.syms $@.o
	$(Q)if $(NM) -g --defined-only $@.o | awk 'NF == 3 { print $$3 }' | \
		grep -vxF -f $@.syms; then \
		echo "$@: global symbols outside $(or $(2),lib/libtshm.map) (above)" >&2; \
		rm -f $@.o; exit 1; fi
	$(Q)$(AR) rcs $@ $@.o && rm -f $@.o $@.syms
endef

OBJCOPY ?= objcopy
NM      ?= nm

$(LIB_A): $(LIB_OBJS) lib/libtshm.map
	$(call lib_archive,$(LIB_OBJS))

$(LIB_ASAN_A): $(LIB_ASAN_OBJS) lib/libtshm.map
	$(call lib_archive,$(LIB_ASAN_OBJS))

# The .pc names PREFIX: install writes it afresh for the PREFIX it is given.
lib_pc = sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	-e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@VERSION@|$(LIB_VERSION)|' $(1)

$(LIB_PC): lib/tshm.pc.in lib/lib.mk
	@mkdir -p $(@D)
	$(Q)$(call lib_pc,$<) > $@

install-lib: $(LIB_SO) $(LIB_B)/libtshm.so $(LIB_A) $(LIB_PC)
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 0755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(LIB_SO)) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/libtshm.so
	install -m 0644 $(LIB_A) $(DESTDIR)$(LIBDIR)/
	$(call lib_pc,lib/tshm.pc.in) > $(DESTDIR)$(LIBDIR)/pkgconfig/tshm.pc
	install -m 0644 lib/include/tshm.h lib/include/tshm-spawn.h \
		$(DESTDIR)$(INCLUDEDIR)/
