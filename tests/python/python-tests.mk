# SPDX-License-Identifier: GPL-2.0
# The Python package's pytest suites: on the host (memfd) and in the VM
# (module) against $(B)/python, and on the host once more against the
# ASan+UBSan build of the extension.

ifneq ($(PY_EXT_SUFFIX),)
TESTS_BOTH += tests/python/python-core-test.sh tests/python/python-torch-test.sh
TESTS_HOST_ASAN += tests/python/python-asan-test.sh
# README's install paths (pip, another interpreter): builds, host only.
TESTS_HOST += tests/python/pip-install-test.sh
# Every suite again under torch 2.x and Python 3.13 (Debian trixie's, in a
# chroot: scripts/torch2-root), on the host.
TESTS_HOST += tests/python/torch2-test.sh
# The extension runs no kernel code the C suites do not: under KASAN and
# emulation its minutes of Python would buy nothing.
TESTS_NOT_DEBUG += tests/python/python-core-test.sh \
		   tests/python/python-torch-test.sh
# For the same reason, in the VM on the first of Debian's kernels only
# (6.1): on 6.12 they took 16 of make check's 87 minutes, and the
# libtshm suites run there, which are what the extension calls.
TESTS_FIRST_KERNEL += tests/python/python-core-test.sh \
		      tests/python/python-torch-test.sh
endif
