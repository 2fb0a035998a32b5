#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# README's pip install path, for real: `python3 -m pip install
# --no-build-isolation ./python` (no network) for Debian's python3 and for
# the first python3 on PATH when that is another interpreter (here a pyenv
# build), each into a folder of its own from a copy of the checkout's
# sources (pip builds in the source tree).  Each installed copy is then
# imported from outside the checkout: it must be the installed one, link
# no libtshm.so, carry its stubs, and move an object with an out-of-band
# buffer and a segment through a Queue across fork.
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/common/ktap.sh"

pythons=(/usr/bin/python3)
other=$(command -v python3)
if [ -n "$other" ] && [ -x /usr/bin/python3 ]; then
	a=$(/usr/bin/python3 -c 'import sys; print(sys.executable, sys.version)')
	b=$("$other" -c 'import sys; print(sys.executable, sys.version)' 2>/dev/null)
	[ -n "$b" ] && [ "$a" != "$b" ] && pythons+=("$other")
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/kmod"
cp -r "$top/python" "$top/lib" "$top/cuda" "$tmp/src/"
cp -r "$top/kmod/include" "$tmp/src/kmod/"
rm -rf "$tmp/src/python/build" "$tmp/src/python/"*.egg-info

smoke='
import os, sys, tshm
assert tshm.__file__.startswith(sys.argv[1]), tshm.__file__
here = os.path.dirname(tshm.__file__)
for f in ("py.typed", "_tshm.pyi"):
    assert os.path.exists(os.path.join(here, f)), f
q = tshm.Queue()
seg = tshm.Segment(1 << 16, "pip-smoke")
memoryview(seg)[:4] = b"pip!"
blob = bytearray(os.urandom(1 << 20))
pid = os.fork()
if pid == 0:
    o = q.get(timeout=30)
    ok = bytes(memoryview(o["seg"])[:4]) == b"pip!" and o["blob"] == blob
    memoryview(o["seg"])[4:6] = b"ok"
    os._exit(0 if ok else 1)
q.put({"seg": seg, "blob": blob})
_, st = os.waitpid(pid, 0)
assert st == 0, st
assert bytes(memoryview(seg)[4:6]) == b"ok"
print("python", sys.version.split()[0], "backend", tshm.default_context().backend)
'

# check_copy PY DIR LABEL: the copy of tshm in DIR, imported by PY.
check_copy() {
	local py=$1 dir=$2 label=$3 ext out rc
	ext=$(ls "$dir"/tshm/_tshm*.so 2>/dev/null | head -n1)
	ktap_check "$py: $label: the extension links no libtshm.so" \
		test -n "$ext" -a -z "$(ldd "$ext" 2>/dev/null | grep libtshm)"
	out=$(cd / && PYTHONPATH=$dir timeout 120 "$py" -c "$smoke" "$dir" 2>&1)
	rc=$?
	ktap_check "$py: $label: a segment and 1 MiB through a Queue across fork" \
		test $rc = 0
	sed 's/^/# /' <<<"$out"
}

ktap_plan $((3 * ${#pythons[@]} + 3 * (${#pythons[@]} - 1)))
for py in "${pythons[@]}"; do
	target=$tmp/site-$RANDOM
	if ! "$py" -c 'import wheel' 2>/dev/null; then
		# pip builds a wheel even with --no-build-isolation.
		ktap_skip "$py: pip install --no-build-isolation ./python" \
			"no 'wheel' module in this interpreter, and no network to get one"
		ktap_skip "$py: pip: the extension links no libtshm.so" "no pip build"
		ktap_skip "$py: pip: the installed copy works" "no pip build"
	else
		out=$(cd "$tmp/src" && timeout 600 "$py" -m pip install \
			--no-input --no-build-isolation --no-deps --no-index \
			--target "$target" ./python 2>&1)
		rc=$?
		ktap_check "$py: pip install --no-build-isolation ./python" \
			test $rc = 0
		[ $rc = 0 ] || tail -n 20 <<<"$out" | sed 's/^/# /'
		check_copy "$py" "$target" pip
	fi
	[ "$py" = /usr/bin/python3 ] && continue
	# Another interpreter: make python builds for it too.
	out=$(timeout 600 make -C "$top" --no-print-directory -s \
		B="$tmp/b-other" PYTHON="$py" python 2>&1)
	rc=$?
	ktap_check "$py: make python PYTHON=$py" test $rc = 0
	[ $rc = 0 ] || tail -n 20 <<<"$out" | sed 's/^/# /'
	check_copy "$py" "$tmp/b-other/python" "make python"
done
ktap_done
