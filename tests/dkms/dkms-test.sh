#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The module through Debian's dkms, the way an admin installs it: make
# install (into a DESTDIR) stages /usr/src/tshm-<version>; dkms adds it,
# builds and installs it for every kernel's headers (6.1, 6.12), in a private
# dkms tree under $B/dkms so the host's /var/lib/dkms and /lib/modules are
# untouched (and depmod, which would index the host's /lib/modules, is not
# run); dkms status must list it installed for each kernel; then each
# kernel boots in the VM with the module dkms built and runs seg_test.
#   tests/dkms/dkms-test.sh [BUILD_DIR]
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
B=${1:-${B:-build}}
case $B in /*) ;; *) B=$top/$B ;; esac
export B
. tests/common/ktap.sh
eval "$(scripts/setup-deps --print-env)"
ver=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' kmod/dkms.conf)
dkdir=$B/dkms
rm -rf "$dkdir"
mkdir -p "$dkdir/stage" "$dkdir/tree" "$dkdir/install"
# dkms runs its own make: not a sub-make of `make -j check` (whose
# jobserver it would inherit, and warn about in the log checked below).
dk() {
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
		dkms --dkmstree "$dkdir/tree" --sourcetree "$dkdir/stage/usr/src" \
		--installtree "$dkdir/install" "$@"
}
nk=$(wc -w <<<"$TSHM_KERNELS")
ktap_plan $((2 + 3 * nk))

# 1. make install stages the DKMS source tree (and everything else).
if MAKEFLAGS= make -s --no-print-directory B="$B" install DESTDIR="$dkdir/stage" \
	PREFIX=/usr > "$dkdir/install.log" 2>&1 &&
   [ -r "$dkdir/stage/usr/src/tshm-$ver/dkms.conf" ]; then
	ktap_ok "make install DESTDIR stages /usr/src/tshm-$ver"
else
	ktap_fail "make install DESTDIR" "$(tail -n 20 "$dkdir/install.log")"
fi

# 2. dkms add.
if dk add -m tshm -v "$ver" > "$dkdir/add.log" 2>&1; then
	ktap_ok "dkms add tshm/$ver"
else
	ktap_fail "dkms add tshm/$ver" "$(tail -n 20 "$dkdir/add.log")"
fi

for k in $TSHM_KERNELS; do
	var=$(tr .- __ <<<"$k")
	eval "krel=\$KREL_$var kheaders=\$KHEADERS_$var"
	log=$dkdir/build-$k.log
	# dkms installs only "onto an existing kernel": its modules folder.
	mkdir -p "$dkdir/install/$krel"
	# 3. dkms build and install against this kernel's headers, no warning.
	if dk build -m tshm -v "$ver" -k "$krel" --kernelsourcedir "$kheaders" \
		> "$log" 2>&1 &&
	   dk install --no-depmod -m tshm -v "$ver" -k "$krel" \
		--kernelsourcedir "$kheaders" \
		>> "$log" 2>&1 &&
	   ! grep -E ': (warning|error):' "$dkdir/tree/tshm/$ver/$krel"/*/log/make.log \
		>> "$log"; then
		ktap_ok "$k: dkms build and install for $krel"
	else
		ktap_fail "$k: dkms build and install for $krel" "$(tail -n 20 "$log")"
	fi

	# 4. dkms status says so.
	dk status > "$dkdir/status" 2>&1
	# (grep -F: the release has a '+'.)
	ktap_check "$k: dkms status: tshm/$ver, $krel, installed" eval \
		'grep -F "tshm/$ver, $krel, " "$dkdir/status" | grep -q ": installed$"'

	# 5. The module dkms built loads in that kernel and passes seg_test.
	ko=$(ls "$dkdir/install/$krel/updates/dkms/"tshm.ko* 2>/dev/null | head -n1)
	if [ -z "$ko" ]; then
		ktap_fail "$k: seg_test with the dkms module" "no module installed"
		continue
	fi
	scripts/vm-run --kernel "$k" --module "$ko" -- \
		sh -c 'grep "^tshm " /proc/modules && "$0"' \
		"$B/tests/kmod/seg_test" > "$dkdir/vm-$k.log" 2>&1
	rc=$?
	if [ "$rc" = 0 ] && grep -q '^# Totals: pass:[1-9][0-9]* fail:0' "$dkdir/vm-$k.log"; then
		ktap_ok "$k: $(basename "$ko") from dkms loads, seg_test passes"
	else
		ktap_fail "$k: seg_test with the dkms module" "rc=$rc: $(tail -n 20 "$dkdir/vm-$k.log")"
	fi
done
echo "# dkms status:"
sed 's/^/# /' "$dkdir/status"
ktap_done
