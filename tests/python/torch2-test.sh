#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# run-tests: timeout=1800
#
# The Python package's pytest suites once more, under the other generation
# of torch and Python: Debian trixie's python3-torch (2.x) on Python 3.13
# with numpy 2, in a chroot (scripts/torch2-root), on the host (memfd).
# The extension is built there from a copy of the sources with
# python/setup.py, as pip would; nothing of the checkout is written.
#
# In a mount namespace of its own, so that its mounts (proc, sys, dev, a
# tmpfs on the root's /tmp) go with it, however it ends.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)

skip() {
	echo "1..0 # SKIP $*"
	echo "# Totals: pass:0 fail:0 xfail:0 xpass:0 skip:1 error:0"
	exit 4
}

[ "$(id -u)" = 0 ] || skip "chroot needs root"
no_root() {
	echo "not ok 1 a trixie root with torch 2.x (scripts/torch2-root): $*"
	echo "# Totals: pass:0 fail:1 xfail:0 xpass:0 skip:0 error:0"
	exit 1
}
root=$("$top/scripts/torch2-root") || no_root "could not be made"
# Held shared for the run (inherited by what runs): no remaking or
# removing of the root under it.
exec 9>"$root.lock"
flock -s 9
[ -e "$root/.tshm-ready" ] || no_root "removed meanwhile"

# In the root: build the extension, then run every suite (expanded there).
# shellcheck disable=SC2016
inner='
set -e
cd /tmp/src/python
python3 setup.py -q build_ext --build-lib /tmp/pkg > /tmp/build.log 2>&1 ||
	{ cat /tmp/build.log; exit 1; }
cp -r tshm/. /tmp/pkg/tshm/
echo "# $(python3 -c "import torch, numpy, sys; print(\"torch\", torch.__version__, \"numpy\", numpy.__version__, \"Python\", sys.version.split()[0])")"
cd /tmp/src/tests/python
export PYTHONPATH=/tmp/pkg PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
exec python3 -m pytest -q -p no:cacheprovider -rs .
'

# shellcheck disable=SC2016
exec unshare -m --propagation private bash -c '
set -e
root=$1 top=$2 inner=$3
# The root a mount point: the tests that mount a small /dev/shm in a
# namespace of their own (unshare --propagation private) need one.
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o size=4g tshm-torch2 "$root/tmp"
mkdir -p "$root/tmp/src/kmod" "$root/tmp/src/tests"
cp -r "$top/lib" "$top/python" "$top/cuda" "$root/tmp/src/"
cp -r "$top/kmod/include" "$root/tmp/src/kmod/"
cp -r "$top/tests/python" "$root/tmp/src/tests/"
rm -rf "$root/tmp/src/python/build"
exec chroot "$root" /bin/bash -c "$inner"
' torch2 "$root" "$top" "$inner"
