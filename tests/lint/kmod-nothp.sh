#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The module builds, W=1 and without warnings, against a kernel configured
# without transparent huge pages (scripts/build-nothp-tree: Debian's 6.1
# config with CONFIG_TRANSPARENT_HUGEPAGE=n), so no THP-only symbol or
# constant (HPAGE_PMD_SIZE is a BUILD_BUG there) creeps back in.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 2
B=${B:-build}
. tests/common/ktap.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ktap_plan 1
if ! env=$(scripts/build-nothp-tree --print-env 2> "$tmp/prep"); then
	ktap_fail "no THP: kernel tree prepared" "$(tail -n 20 "$tmp/prep")"
	ktap_done
	exit
fi
eval "$env"
kb=$B/lint/kmod-nothp
rm -rf "$kb"
mkdir -p "$kb"
for f in kmod/*.c kmod/*.h kmod/Kbuild kmod/include; do
	[ -e "$f" ] && ln -sfn "$top/$f" "$kb/$(basename "$f")"
done
MAKEFLAGS="" make -C "$KNOTHP_TREE" M="$top/$kb" W=1 KCFLAGS=-Werror \
	modules > "$tmp/build" 2>&1
rc=$?
# Compiler diagnostics ("file.c:12:3: warning: ...") and modpost's
# ("WARNING: modpost: ...": an undefined symbol).
diag=': (warning|error):|^WARNING: modpost:|^ERROR: modpost:'
if [ $rc = 0 ] && [ -e "$kb/tshm.ko" ] && ! grep -qE "$diag" "$tmp/build"; then
	ktap_ok "no THP: W=1 build against $(cat "$KNOTHP_TREE/include/config/kernel.release")"
else
	ktap_fail "no THP: W=1 build (CONFIG_TRANSPARENT_HUGEPAGE=n)" \
		"$(grep -E -A3 "$diag|Error" "$tmp/build" | head -n 40)"
fi
ktap_done
