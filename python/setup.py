# SPDX-License-Identifier: LGPL-2.1-or-later
"""Builds the _tshm extension with libtshm compiled in (statically: no
libtshm.so is needed at run time).  The sources are those of the checkout
this directory sits in (../lib), so build from a checkout:

    python3 -m pip install --no-build-isolation ./python
"""

import glob
import os

from setuptools import Extension, setup

here = os.path.dirname(os.path.abspath(__file__))
top = os.path.dirname(here)


def rel(*parts):
    return os.path.relpath(os.path.join(top, *parts), here)


lib_sources = sorted(glob.glob(os.path.join(top, "lib", "*.c")))
if not lib_sources:
    raise SystemExit("setup.py: libtshm's sources (../lib) not found; "
                     "build from a tshm checkout")

# libtshm-cuda (tshm.cuda) is built in when the CUDA toolkit's headers are
# there; its driver is loaded at run time, as in the Makefile's build.
cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
with_cuda = os.path.exists(os.path.join(cuda_home, "include", "cuda.h")) \
    and os.path.exists(os.path.join(top, "cuda", "include", "tshm-cuda.h"))
sources = [p for p in sorted(glob.glob(os.path.join("src", "*.c")))
           if with_cuda or os.path.basename(p) != "cuda.c"]
sources += [os.path.relpath(p, here) for p in lib_sources]
include_dirs = [rel("lib", "include"), rel("lib"),
                rel("kmod", "include", "uapi")]
macros = [("_GNU_SOURCE", None)]
if with_cuda:
    sources += [os.path.relpath(p, here) for p in
                sorted(glob.glob(os.path.join(top, "cuda", "*.c")))]
    include_dirs += [os.path.join(cuda_home, "include"), rel("cuda", "include")]
    macros.append(("PYTSHM_CUDA", None))

setup(ext_modules=[Extension(
    "tshm._tshm",
    sources=sources,
    include_dirs=include_dirs,
    define_macros=macros,
    extra_compile_args=["-std=gnu11", "-fvisibility=hidden",
                        "-fno-strict-aliasing"],
    # -z now: a spawn supervisor then unmaps the caller's memory it
    # inherited (lib/spawn-sup-mem.c: not where a call binds lazily).
    extra_link_args=["-Wl,--exclude-libs,ALL", "-Wl,-z,now"],
    libraries=["pthread", "dl"],
)])
