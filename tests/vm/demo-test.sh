#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Runs inside the VM (TESTS_VM): what `make demo` shows must stay true.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/common/ktap.sh"
ktap_plan 1
if [ ! -e /dev/tshm ]; then
	ktap_skip "make demo, in the guest" "no /dev/tshm"
	ktap_done
	exit
fi
out=$(cd "$top" && TSHM_DEMO_GUEST=1 scripts/demo --build "${B:-build}" 2>&1)
rc=$?
echo "$out" | sed 's/^/# /'
if [ $rc = 0 ] && grep -q '^### OK: no segment left, Shmem back to baseline' <<<"$out" &&
   grep -q 'poll woke after' <<<"$out"; then
	ktap_ok "make demo: shared, listed, consumer killed, poll woke, all freed"
else
	ktap_fail "make demo (exit $rc)"
fi
ktap_done
