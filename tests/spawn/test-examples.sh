#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The spawn examples, every start method: they exit 0 when their results
# check out (hogwild converges, pipeline sees every frame intact).
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/common/ktap.sh"
B=${B:-build}
case $B in /*) ;; *) B=$top/$B ;; esac

ktap_plan 6
for m in fork spawn forkserver; do
	out=$(timeout 120 "$B/examples/hogwild" -m "$m" -n 3 -s 5000 2>&1)
	ktap_check "hogwild -m $m" test $? = 0 || true
	sed 's/^/# /' <<<"$out"
	out=$(timeout 120 "$B/examples/pipeline" -m "$m" -n 2 -f 200 -s 65536 2>&1)
	ktap_check "pipeline -m $m" test $? = 0 || true
	sed 's/^/# /' <<<"$out"
done
ktap_done
