# SPDX-License-Identifier: GPL-2.0
# tshmctl: load, unload and audit tshm.ko (tools/tshmctl, tshmctl(8)).

TSHMCTL      := $(B)/tools/tshmctl
TSHMCTL_SRCS := $(wildcard tools/tshmctl/*.c)
TSHMCTL_HDRS := $(wildcard tools/tshmctl/*.h)
KMOD_CFLAGS  := $(shell pkg-config --cflags libkmod 2>/dev/null)
# The project's version: the one DKMS knows the module by.
TSHM_VERSION := $(shell sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' kmod/dkms.conf)
KMOD_LIBS    := $(or $(shell pkg-config --libs libkmod 2>/dev/null),-lkmod)

ALL += $(TSHMCTL)

.PHONY: tools install-tools
tools: $(TSHMCTL)

$(TSHMCTL): $(TSHMCTL_SRCS) $(TSHMCTL_HDRS) kmod/include/uapi/linux/tshm.h \
	    kmod/dkms.conf
	@mkdir -p $(@D)
	$(Q)$(CC) $(BASE_CFLAGS) $(CFLAGS) $(KMOD_CFLAGS) \
		-DTSHMCTL_VERSION='"$(TSHM_VERSION)"' -o $@ \
		$(TSHMCTL_SRCS) $(KMOD_LIBS)

# make install: the tool, its man pages, the module for $(KREL) (with
# depmod unless DESTDIR is set: a staged tree is indexed where it lands),
# the DKMS source tree and the udev rule for /dev/tshm.
SBINDIR  ?= $(PREFIX)/sbin
MANDIR   ?= $(PREFIX)/share/man
UDEVDIR  ?= /lib/udev/rules.d
MODDIR   := /lib/modules/$(KREL)/extra
DKMSDIR  := /usr/src/tshm-$(TSHM_VERSION)

install: install-tools

install-tools: $(TSHMCTL) $(KO)
	install -D -m 0755 $(TSHMCTL) $(DESTDIR)$(SBINDIR)/tshmctl
	install -D -m 0644 Documentation/man/tshmctl.8 $(DESTDIR)$(MANDIR)/man8/tshmctl.8
	install -D -m 0644 Documentation/man/tshm.4 $(DESTDIR)$(MANDIR)/man4/tshm.4
	install -D -m 0644 Documentation/man/tshm.7 $(DESTDIR)$(MANDIR)/man7/tshm.7
	install -D -m 0644 $(KO) $(DESTDIR)$(MODDIR)/tshm.ko
	$(if $(DESTDIR),,depmod -a $(KREL))
	install -d $(DESTDIR)$(DKMSDIR)/include/uapi/linux
	install -m 0644 kmod/Kbuild kmod/dkms.conf $(wildcard kmod/*.c kmod/*.h) \
		$(DESTDIR)$(DKMSDIR)/
	install -m 0644 kmod/include/uapi/linux/tshm.h \
		$(DESTDIR)$(DKMSDIR)/include/uapi/linux/
	install -D -m 0644 tools/udev/60-tshm.rules $(DESTDIR)$(UDEVDIR)/60-tshm.rules
