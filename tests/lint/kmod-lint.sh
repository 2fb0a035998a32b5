#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The module against the kernel's own rules: checkpatch --strict, sparse
# (C=2: every file, not only rebuilt ones) and a W=1 build without warnings,
# against every kernel's headers (scripts/setup-deps: 6.1 and 6.12).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
B=${B:-build}
. tests/common/ktap.sh
eval "$(scripts/setup-deps --print-env)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ktap_plan $((1 + $(wc -w <<<"$TSHM_KERNELS")))
cp() {
	perl "$KTREE/scripts/checkpatch.pl" --strict --no-tree --terse \
		--ignore FILE_PATH_CHANGES --show-types "$@"
}
# BIT() does not exist for userspace: the UAPI header cannot use it.  The
# compat header is where kernel versions are tested, by design.
if cp -f kmod/*.c $(ls kmod/*.h | grep -v /compat.h) > "$tmp/cp" 2>&1 &&
   cp --ignore LINUX_VERSION_CODE,CONSTANT_COMPARISON \
	-f kmod/compat.h >> "$tmp/cp" 2>&1 &&
   cp --ignore BIT_MACRO -f kmod/include/uapi/linux/*.h >> "$tmp/cp" 2>&1; then
	ktap_ok "checkpatch --strict: kmod/ clean"
else
	ktap_fail "checkpatch --strict" "$(head -n 40 "$tmp/cp")"
fi

# A private build folder per kernel, so the normal build's objects are not
# disturbed.
for k in $TSHM_KERNELS; do
	var=$(tr .- __ <<<"$k")
	eval "kheaders=\$KHEADERS_$var"
	kb=$B/lint/kmod-$k
	rm -rf "$kb"
	mkdir -p "$kb"
	for f in kmod/*.c kmod/*.h kmod/Kbuild kmod/include; do
		[ -e "$f" ] && ln -sfn "$top/$f" "$kb/$(basename "$f")"
	done
	MAKEFLAGS= make -C "$kheaders" M="$top/$kb" W=1 C=2 modules > "$tmp/build" 2>&1
	rc=$?
	# Compiler and sparse diagnostics look like "file.c:12:3: warning: ...".
	diag=': (warning|error):'
	if [ $rc = 0 ] && ! grep -qE "$diag" "$tmp/build"; then
		ktap_ok "$k: W=1 build with sparse (C=2): no warnings"
	else
		ktap_fail "$k: W=1 build with sparse (C=2)" \
			"$(grep -E -A3 "$diag|Error" "$tmp/build" | head -n 40)"
	fi
done
ktap_done
