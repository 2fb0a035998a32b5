#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# planted-bugs.sh: the debug kernel must catch bugs planted in the module.
#
# For each patch here (plant-*.patch, a tiny diff against kmod/), copy
# kmod/ into $B/planted/NAME, apply it, build against the debug kernel's
# tree and boot `scripts/vm-run --debug --module that.ko -- TRIGGER`: the
# run must FAIL and its report must name the checker that caught the bug
# (KASAN for the use-after-free, lockdep for the lock inversion).  Then the
# unpatched module must pass the same trigger.  Prints kselftest TAP.
#
#   tests/hardening/planted-bugs.sh [-- TRIGGER...]
#
# TRIGGER defaults to $B/tests/hardening/plant-trigger (built here if
# needed); the fuzzer with a fixed seed works too, e.g.
#   tests/hardening/planted-bugs.sh -- build/tests/fuzz/tshm-fuzz --seed 1 --seconds 20
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
. "$top/tests/common/ktap.sh"
cd "$top" || exit 1

B=${B:-build}
case $B in /*) ;; *) B=$top/$B ;; esac
out=$B/planted
timeout=${PLANT_TIMEOUT:-300}

if [ "${1:-}" = -- ]; then
	shift
	trigger=("$@")
else
	trigger=("$B/tests/hardening/plant-trigger")
	src=$here/plant-trigger.c
	if [ ! -x "${trigger[0]}" ] || [ "$src" -nt "${trigger[0]}" ]; then
		mkdir -p "$(dirname "${trigger[0]}")"
		${CC:-cc} -O2 -g -Wall -Werror -Ikmod/include/uapi \
			-o "${trigger[0]}" "$src" || exit 1
	fi
fi

# name  patch  what the report must contain (grep -E)
cases=(
	"uaf plant-uaf.patch KASAN: (slab-)?use-after-free"
	"lock-inversion plant-lock-inversion.patch possible circular locking dependency"
	"clean - -"
)

env_out=$(scripts/build-debug-kernel --print-env) || {
	ktap_plan 3
	for c in "${cases[@]}"; do ktap_skip "planted ${c%% *}" "no debug kernel"; done
	ktap_done
	exit 4
}
eval "$env_out"

ktap_plan ${#cases[@]}
echo "# debug kernel: $KDEBUG_IMAGE"
echo "# trigger: ${trigger[*]}"
for c in "${cases[@]}"; do
	read -r name patch pattern <<< "$c"
	dir=$out/$name
	rm -rf "$dir"
	mkdir -p "$dir"
	cp kmod/*.c kmod/*.h kmod/Kbuild "$dir/"
	cp -r kmod/include "$dir/"
	if [ "$patch" != - ] &&
	   ! patch -s -p1 -d "$dir" < "$here/$patch" > "$dir/patch.log" 2>&1; then
		ktap_fail "planted $name" "$patch does not apply: $(head -3 "$dir/patch.log")"
		continue
	fi
	if ! make -C "$KDEBUG_TREE" M="$dir" -j"$(nproc)" modules \
		> "$dir/build.log" 2>&1; then
		tail -n 20 "$dir/build.log" | sed 's/^/# /'
		ktap_fail "planted $name" "module build failed"
		continue
	fi
	start=$(date +%s.%N)
	scripts/vm-run --debug --timeout "$timeout" --module "$dir/tshm.ko" \
		--keep-log "$dir/guest.log" -- "${trigger[@]}" > "$dir/vm-run.log" 2>&1
	rc=$?
	secs=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $start}")
	echo "# $name: vm-run exit $rc after ${secs}s (debug boot + trigger + kmemleak scan)"
	if [ "$patch" = - ]; then
		if [ "$rc" = 0 ]; then
			ktap_ok "clean module passes the trigger on the debug kernel"
		else
			tail -n 30 "$dir/vm-run.log" | sed 's/^/# /'
			ktap_fail "clean module passes the trigger on the debug kernel" \
				"vm-run exit $rc; log in $dir/vm-run.log"
		fi
		continue
	fi
	hit=$(grep -E -m 1 "$pattern" "$dir/vm-run.log")
	if [ "$rc" != 0 ] && [ -n "$hit" ]; then
		hit=$(grep -E "$pattern|(Read|Write) of size|-> #[0-9]" "$dir/vm-run.log")
		# The report's first line and the module's frames in it.
		{ echo "$hit"; grep -E '\[tshm\]' "$dir/vm-run.log"; } |
			sed 's/^vm-run: | *//' | awk '!seen[$0]++' | head -n 8 |
			sed 's/^/# caught: /'
		ktap_ok "planted $name: debug kernel run fails naming '$pattern'"
	elif [ "$rc" = 124 ]; then
		ktap_fail "planted $name: debug kernel run fails naming '$pattern'" \
			"vm-run timed out; log in $dir/vm-run.log"
	else
		tail -n 30 "$dir/vm-run.log" | sed 's/^/# /'
		ktap_fail "planted $name: debug kernel run fails naming '$pattern'" \
			"vm-run exit $rc without '$pattern'; log in $dir/vm-run.log"
	fi
done
ktap_done
