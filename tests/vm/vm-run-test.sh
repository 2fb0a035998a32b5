#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# vm-run's own tests, run on the host: each case boots the guest.
#   tests/vm/vm-run-test.sh [BUILD_DIR]
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-${B:-$top/build}}
export B
. "$top/tests/common/ktap.sh"
vm=$top/scripts/vm-run
eval "$("$top/scripts/setup-deps" --print-env)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ktap_plan 11

# 1. COMMAND's exit status is vm-run's, with no terminal and no stdin.
setsid "$vm" --no-module -- sh -c 'exit 7' < /dev/null > "$tmp/out" 2>&1
rc=$?
ktap_check "exit status of the command (7) comes back" [ "$rc" = 7 ]

# 2. The guest runs the kernel the module is built for; cwd and env follow.
( cd "$top/tests" && VMRUN_PROBE=hello "$vm" --no-module -- \
	sh -c 'uname -r; pwd; echo "$VMRUN_PROBE"' ) > "$tmp/out" 2>&1
if [ "$(sed -n 1p "$tmp/out")" = "$KVER" ] &&
   [ "$(sed -n 2p "$tmp/out")" = "$top/tests" ] &&
   [ "$(sed -n 3p "$tmp/out")" = hello ]; then
	ktap_ok "uname -r is $KVER, cwd and environment carried"
else
	ktap_fail "uname -r, cwd and environment" "$(cat "$tmp/out")"
fi

# 3. The module is loaded.
if [ -r "$B/kmod/tshm.ko" ]; then
	"$vm" -- cat /proc/modules > "$tmp/out" 2>&1
	ktap_check "/proc/modules shows tshm" grep -q '^tshm ' "$tmp/out"
else
	ktap_skip "/proc/modules shows tshm" "module not built"
fi

# 4. A kernel WARNING fails the run and its excerpt is printed.
warn_ko=$B/tests/vm/warn-module/vmrun_warn.ko
if [ -r "$warn_ko" ]; then
	"$vm" --module "$warn_ko" -- true > "$tmp/out" 2>&1
	rc=$?
	if [ "$rc" != 0 ] && grep -q 'vm-run: | .*WARNING:' "$tmp/out" &&
	   grep -q 'deliberate warning' "$tmp/out"; then
		ktap_ok "a guest WARNING fails the run with the excerpt"
	else
		ktap_fail "a guest WARNING fails the run" "rc=$rc: $(tail -n 20 "$tmp/out")"
	fi
else
	ktap_skip "a guest WARNING fails the run" "warn module not built"
fi

# 5. --timeout kills the guest and says so, in about the time asked.
start=$(date +%s)
"$vm" --no-module --timeout 5 -- sleep 60 > "$tmp/out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" = 124 ] && [ "$took" -lt 20 ] && grep -q 'timed out after 5s' "$tmp/out"; then
	ktap_ok "--timeout 5 fails after ${took}s naming the timeout"
else
	ktap_fail "--timeout 5" "rc=$rc took=${took}s: $(tail -n 5 "$tmp/out")"
fi

# 6. The project folder is writable from the guest; the host sees the file.
probe=$B/vm/write-probe.$$
"$vm" --no-module -- sh -c "echo guest > $probe" > "$tmp/out" 2>&1
ktap_check "project folder writable from the guest" grep -qx guest "$probe"
rm -f "$probe"

# 7. A failing test inside the guest fails the run (status passed through).
"$vm" --no-module -- sh -c 'test -e /nonexistent' > "$tmp/out" 2>&1
ktap_check "a failing command fails vm-run" [ $? = 1 ]

# 8. --keep-log keeps the guest kernel log.
"$vm" --no-module --keep-log "$tmp/klog" -- true > "$tmp/out" 2>&1
ktap_check "--keep-log keeps the guest dmesg" grep -q 'Linux version' "$tmp/klog"


# 9. --kernel 6.12 boots Debian's 6.12 with the module built for it loaded.
if [ -r "$B/kmod-6.12/tshm.ko" ]; then
	"$vm" --kernel 6.12 -- sh -c 'uname -r; grep "^tshm " /proc/modules' \
		> "$tmp/out" 2>&1
	rc=$?
	if [ "$rc" = 0 ] && [ "$(sed -n 1p "$tmp/out")" = "$KREL_6_12" ] &&
	   grep -q '^tshm ' "$tmp/out"; then
		ktap_ok "--kernel 6.12: uname -r is $KREL_6_12, tshm loaded"
	else
		ktap_fail "--kernel 6.12" "rc=$rc: $(tail -n 20 "$tmp/out")"
	fi
else
	ktap_skip "--kernel 6.12" "module for 6.12 not built"
fi
# 10. A kernel that panics as it boots, before our /init, is booted again
# once, and says so; the second boot's result is the run's.
TSHM_VM_TEST_BOOT_PANICS=1 "$vm" --no-module -- sh -c 'exit 5' \
	> "$tmp/out" 2>&1
rc=$?
if [ "$rc" = 5 ] && grep -q 'panicked while booting' "$tmp/out" &&
   grep -q 'booting again, once' "$tmp/out"; then
	ktap_ok "a boot that panics before /init is tried again once"
else
	ktap_fail "a boot that panics before /init is tried again" \
		"rc=$rc: $(tail -n 20 "$tmp/out")"
fi

# 11. Twice is a failure with the excerpt; and a panic after /init (what
# COMMAND makes, here through sysrq) is never tried again.
TSHM_VM_TEST_BOOT_PANICS=2 "$vm" --no-module -- true > "$tmp/out" 2>&1
rc1=$?
"$vm" --no-module -- sh -c 'echo c > /proc/sysrq-trigger' \
	> "$tmp/out2" 2>&1
rc2=$?
if [ "$rc1" = 1 ] && [ "$(grep -c 'booting again' "$tmp/out")" = 1 ] &&
   grep -q 'vm-run: | .*Kernel panic' "$tmp/out" &&
   [ "$rc2" = 1 ] && ! grep -q 'booting again' "$tmp/out2" &&
   grep -q 'vm-run: | .*Kernel panic' "$tmp/out2"; then
	ktap_ok "a second boot panic, or one after /init, fails the run"
else
	ktap_fail "a second boot panic, or one after /init, fails the run" \
		"rc1=$rc1 rc2=$rc2: $(tail -n 8 "$tmp/out"; tail -n 8 "$tmp/out2")"
fi
ktap_done
