#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The libtshm examples: producer-consumer, its consumer started by fork and
# by fork+exec, on the backend the library picks (the module in the VM, the
# memfd fallback on the host) and on the forced fallback.  The example exits
# 0 when every buffer arrived intact and came back to its pool; afterwards
# none of its segments may be left (/proc/tshm, open memfds).
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/common/ktap.sh"
B=${B:-build}
case $B in /*) ;; *) B=$top/$B ;; esac
prog=$B/examples/producer-consumer

# Segments named example-* still alive anywhere (module or memfd).
leftovers() {
	local n=0
	if [ -r /proc/tshm ]; then
		n=$(grep -c ' example-' /proc/tshm)
	fi
	n=$((n + $(ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c 'memfd:tshm:example-')))
	echo "$n"
}

ktap_plan 5
if [ ! -x "$prog" ]; then
	for i in 1 2 3 4 5; do ktap_fail "producer-consumer" "not built: $prog"; done
	ktap_done
	exit
fi
for backend in "" memfd; do
	for mode in "" --exec; do
		out=$(TSHM_BACKEND=$backend timeout 60 "$prog" $mode 2>&1)
		rc=$?
		ktap_check "producer-consumer ${mode:-(fork)} backend ${backend:-default}" \
			test $rc = 0 -a "$(tail -n1 <<<"$out")" = OK
		sed 's/^/# /' <<<"$out"
	done
done
ktap_check "no example segment left behind" test "$(leftovers)" = 0
ktap_done
