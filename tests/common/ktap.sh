# SPDX-License-Identifier: GPL-2.0
# Shell helpers that print TAP the way kselftest_harness.h does, so shell
# suites are counted by scripts/run-tests like the C ones.
#   ktap_plan N; ktap_ok|ktap_fail|ktap_skip "description" [reason]; ktap_done
ktap_n=0 ktap_pass=0 ktap_failn=0 ktap_skipn=0

ktap_plan() { echo "TAP version 13"; echo "1..$1"; }
ktap_ok() { ktap_n=$((ktap_n + 1)); ktap_pass=$((ktap_pass + 1)); echo "ok $ktap_n $1"; }
ktap_fail() {
	ktap_n=$((ktap_n + 1)); ktap_failn=$((ktap_failn + 1))
	echo "not ok $ktap_n $1"
	[ -n "${2:-}" ] && echo "# $2"
	return 0
}
ktap_skip() {
	ktap_n=$((ktap_n + 1)); ktap_skipn=$((ktap_skipn + 1))
	echo "ok $ktap_n $1 # SKIP ${2:-}"
}
# ktap_check "description" CONDITION-COMMAND...
ktap_check() {
	local d=$1; shift
	if "$@"; then ktap_ok "$d"; else ktap_fail "$d"; fi
}
ktap_done() {
	echo "# Totals: pass:$ktap_pass fail:$ktap_failn xfail:0 xpass:0 skip:$ktap_skipn error:0"
	[ "$ktap_failn" = 0 ]
}
