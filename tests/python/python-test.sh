#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The Python package's pytest suites, against $B/python (make python), with
# Debian's python3 (numpy, pytest).  With --asan: against the ASan+UBSan
# build in $B/asan/python, the sanitizer runtime preloaded into python3.
# With --torch / --no-torch: only the test_torch* files / all but them
# (make check runs the two halves as two suites, python-torch-test.sh and
# python-core-test.sh, so that each has its own time limit in the VM).
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
B=${B:-build}
case $B in /*) ;; *) B=$top/$B ;; esac
py=${TSHM_TEST_PYTHON:-/usr/bin/python3}
pkg=$B/python
part=all
case ${1:-} in
--torch|--no-torch) part=${1#--}; shift ;;
esac
if [ "${1:-}" = --asan ]; then
	shift
	pkg=$B/asan/python
	export LD_PRELOAD=$(gcc -print-file-name=libasan.so)
	# CPython's own allocations are never freed at exit: no leak report.
	export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
	export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
fi
if ! "$py" -c 'import numpy, pytest' 2>/dev/null; then
	echo "1..0 # SKIP $py lacks numpy or pytest (scripts/setup-deps installs them)"
	echo "# Totals: pass:0 fail:0 xfail:0 xpass:0 skip:1 error:0"
	exit 4
fi
export PYTHONPATH=$pkg PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
cd "$top/tests/python" || exit 1
case $part in
all) sel=(.) ;;
torch) sel=(test_torch*.py) ;;
no-torch) sel=(--ignore-glob='test_torch*' .) ;;
esac
exec "$py" -m pytest -q -p no:cacheprovider -rs "$@" "${sel[@]}"
