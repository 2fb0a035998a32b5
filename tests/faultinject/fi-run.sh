#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The fault-injection run (tests/faultinject/fi_test.c) with Shmem's
# baseline taken before it: run in the debug kernel's VM, module loaded.
#   scripts/vm-run --debug -- tests/faultinject/fi-run.sh
top=$(cd "$(dirname "$0")/../.." && pwd)
B=${B:-build}
case $B in /*) ;; *) B=$top/$B ;; esac
echo 1 > /proc/sys/vm/stat_refresh 2>/dev/null
TSHM_FI_SHMEM_KB=$(awk '/^Shmem:/ { print $2 }' /proc/meminfo)
export TSHM_FI_SHMEM_KB
exec "$B/tests/faultinject/fi_test" "$@"
