# SPDX-License-Identifier: GPL-2.0
# The Python package: the _tshm extension (python/src, libtshm.a linked in
# statically) and the package's Python files, laid out in $(B)/python so
# that PYTHONPATH=$(B)/python works; a second copy built with ASan+UBSan in
# $(B)/asan/python for the sanitizer run.  PYTHON picks the interpreter
# (Debian's by default: it has numpy, pytest and torch).

PYTHON       ?= /usr/bin/python3
PY_B         := $(B)/python
PY_ASAN_B    := $(B)/asan/python
py_cfg        = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("$(1)") or "")' 2>/dev/null)
PY_INCLUDE   := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_EXT_SUFFIX := $(call py_cfg,EXT_SUFFIX)
PY_VERSION   := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
include cuda/cuda-vars.mk

# python/src/cuda.c (libtshm-cuda's objects) is built in when the CUDA
# toolkit's headers are there (cuda/cuda-vars.mk); the driver is loaded at
# run time, so the extension still imports on a machine without one.
PY_SRCS      := $(filter-out python/src/cuda.c,$(sort $(wildcard python/src/*.c)))
PY_HDRS      := $(wildcard python/src/*.h) lib/include/tshm.h \
		lib/include/tshm-spawn.h
PY_CUDA_CFLAGS :=
PY_CUDA_A    :=
PY_CUDA_ASAN_SRCS :=
ifneq ($(CUDA_ENABLED),)
PY_SRCS      += python/src/cuda.c
PY_HDRS      += $(CUDA_HDRS)
PY_CUDA_CFLAGS := -DPYTSHM_CUDA $(CUDA_INC)
PY_CUDA_A    := $(CUDA_A)
PY_CUDA_ASAN_SRCS := $(CUDA_SRCS)
endif
PY_FILES     := $(wildcard python/tshm/*.py python/tshm/*.pyi python/tshm/torch/*.py) \
		python/tshm/py.typed
PY_EXT       := $(PY_B)/tshm/_tshm$(PY_EXT_SUFFIX)
PY_ASAN_EXT  := $(PY_ASAN_B)/tshm/_tshm$(PY_EXT_SUFFIX)
PY_COPIES    := $(patsubst python/%,$(PY_B)/%,$(PY_FILES))
PY_ASAN_COPIES := $(patsubst python/%,$(PY_ASAN_B)/%,$(PY_FILES))
# -isystem: Python's own headers are not held to our warnings.  Only
# PyInit__tshm is exported; libtshm's symbols stay inside the extension.
PY_CFLAGS    := $(BASE_CFLAGS) $(CFLAGS) -fPIC -fvisibility=hidden \
		-isystem $(PY_INCLUDE)
PY_LDFLAGS   := -shared -Wl,--exclude-libs,ALL -Wl,-z,relro -Wl,-z,now

# Debian's python3 looks in /usr/local/lib/python3.X/dist-packages (for
# PREFIX=/usr/local) and /usr/lib/python3/dist-packages (PREFIX=/usr).
ifeq ($(PREFIX),/usr)
PY_SITE      ?= $(PREFIX)/lib/python3/dist-packages
else
PY_SITE      ?= $(PREFIX)/lib/python$(PY_VERSION)/dist-packages
endif

ifneq ($(PY_EXT_SUFFIX),)
ALL += $(PY_EXT) $(PY_COPIES) $(PY_ASAN_EXT) $(PY_ASAN_COPIES)
endif

.PHONY: python install-python
python: $(PY_EXT) $(PY_COPIES)
install: install-python

$(PY_EXT): $(PY_SRCS) $(PY_HDRS) $(PY_CUDA_A) $(LIB_A)
	@mkdir -p $(@D)
	$(Q)$(CC) $(PY_CFLAGS) $(PY_CUDA_CFLAGS) $(PY_LDFLAGS) -o $@ \
		$(PY_SRCS) $(PY_CUDA_A) $(LIB_A) $(LIB_LDLIBS) -ldl

$(PY_ASAN_EXT): $(PY_SRCS) $(PY_HDRS) $(PY_CUDA_ASAN_SRCS) $(LIB_ASAN_A)
	@mkdir -p $(@D)
	$(Q)$(CC) $(PY_CFLAGS) $(PY_CUDA_CFLAGS) $(SAN_FLAGS) $(PY_LDFLAGS) \
		-o $@ $(PY_SRCS) $(PY_CUDA_ASAN_SRCS) $(LIB_ASAN_A) \
		$(LIB_LDLIBS) -ldl

# (Two rules: a pattern rule with two targets would make both at once.)
$(PY_B)/tshm/%: python/tshm/%
	@mkdir -p $(@D)
	$(Q)cp $< $@

$(PY_ASAN_B)/tshm/%: python/tshm/%
	@mkdir -p $(@D)
	$(Q)cp $< $@

install-python: $(PY_EXT) $(PY_COPIES)
	install -d $(DESTDIR)$(PY_SITE)/tshm
	install -d $(DESTDIR)$(PY_SITE)/tshm/torch
	install -m 0644 $(filter-out $(PY_B)/tshm/torch/%,$(PY_COPIES)) \
		$(DESTDIR)$(PY_SITE)/tshm/
	install -m 0644 $(filter $(PY_B)/tshm/torch/%,$(PY_COPIES)) \
		$(DESTDIR)$(PY_SITE)/tshm/torch/
	install -m 0755 $(PY_EXT) $(DESTDIR)$(PY_SITE)/tshm/
