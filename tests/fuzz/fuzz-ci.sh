#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The bounded fuzz make check runs inside the VM: TSHM_FUZZ_SECONDS
# (default 60) of tshm-fuzz with 4 workers and a fresh seed, which it
# prints first so a failure replays with --seed.
top=$(cd "$(dirname "$0")/../.." && pwd)
B=${B:-build}
case $B in /*) ;; *) B=$top/$B ;; esac
exec "$B/tests/fuzz/tshm-fuzz" --seconds "${TSHM_FUZZ_SECONDS:-60}" --procs 4
