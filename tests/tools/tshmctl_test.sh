#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# tshmctl against the real module, in the VM as root with tshm.ko loaded;
# some checks run again as nobody (setpriv).  The module is unloaded and
# loaded again on the way; it is left loaded, with default parameters, and
# with no segment, as found.
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/tests/common/ktap.sh"
B=${B:-build}
case $B in /*) ;; *) B=$top/$B ;; esac
T=$B/tools/tshmctl
H=$B/tests/tools/seghold
# The module to load again: the one vm-run loaded (TSHM_MODULE: the build
# for this kernel, 6.1's, 6.12's or the debug one), named with --module
# where it is not the file next to tshmctl (build/kmod/tshm.ko, 6.1's).
KO=${TSHM_MODULE:-$B/kmod/tshm.ko} KO_ARGS=()
KO_FROM="the file next to tshmctl"
[ "$KO" -ef "$B/kmod/tshm.ko" ] || KO_ARGS=(--module "$KO") KO_FROM="--module $KO"

ktap_plan 47
if [ "$(id -u)" != 0 ] || [ ! -e /proc/tshm ] || [ ! -x "$T" ] || [ ! -x "$H" ]; then
	for _ in $(seq 47); do ktap_skip "tshmctl" "needs root, tshm.ko loaded, $T and $H built"; done
	ktap_done
	exit 4
fi

tmp=$(mktemp -d)
chmod 0755 "$tmp"
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	wait 2>/dev/null
	# Leave the module as the next suite expects it.
	[ -e /proc/tshm ] || "$T" load --module "$KO" >/dev/null 2>&1 || insmod "$KO"
	rm -rf "$tmp"
}
trap cleanup EXIT

# An array, not a function: a backgrounded function would be a subshell
# whose death leaves the holder running.
NOBODY=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
# Debian's python3 directly: a pyenv shim on PATH takes ~30 s in the VM.
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

# hold OUT [setpriv...] seghold-args: start a holder, wait for "ready".
hold() {
	local out=$tmp/$1 i; shift
	"$@" >"$out" 2>&1 &
	pids+=($!)
	for i in $(seq 100); do
		grep -q '^ready' "$out" && return 0
		sleep 0.1
	done
	echo "# holder did not get ready: $(cat "$out")"
	return 1
}
field() { sed -n "s/.* $2=\([0-9]*\).*/\1/p" "$tmp/$1" | head -n1; }
# ids OUT: every id= of a holder, space-separated
ids() { grep -o ' id=[0-9]*' "$tmp/$1" | cut -d= -f2 | xargs; }

# jcheck FILE PYTHON-EXPRESSION: true if the expression over d (the JSON) is.
jcheck() {
	"$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
seg = {s["id"]: s for s in d.get("segments", [])}
r = eval(sys.argv[2])
sys.exit(0 if r else 1)' "$1" "$2" || { sed 's/^/# /' "$1"; return 1; }
}

# run NAME CMD...: output in $tmp/NAME.out (stdout) and .err, status in $rc
run() {
	local n=$1; shift
	"$@" >"$tmp/$n.out" 2>"$tmp/$n.err"
	rc=$?
}
has() { grep -q -- "$2" "$tmp/$1" || { echo "# no '$2' in $1:"; sed 's/^/#   /' "$tmp/$1"; return 1; }; }

wait_empty() {
	local i
	for i in $(seq 100); do
		grep -q '^total 0 ' /proc/tshm && return 0
		sleep 0.1
	done
	return 1
}
killall_holders() {
	local p
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	wait 2>/dev/null
	pids=()
	wait_empty
}

# --- bad input --------------------------------------------------------
run nocmd "$T" frobnicate
ktap_check "unknown command: exit 2, says so" eval '[ $rc = 2 ] && has nocmd.err "unknown command .frobnicate."'
run noopt "$T" list --frob
ktap_check "unknown option: exit 2, says so" eval '[ $rc = 2 ] && has noopt.err "list: unknown option .--frob."'
run nosort "$T" list --sort colour
ktap_check "bad --sort value: exit 2" eval '[ $rc = 2 ] && has nosort.err "not id, size, resident or age"'
run noparm "$T" load nosuch_param=1
ktap_check "load with an unknown parameter: exit 2, lists the real ones" \
	eval '[ $rc = 2 ] && has noparm.err "no parameter .nosuch_param." && has noparm.err max_user_segments'
run nonum "$T" load max_user_bytes=lots
ktap_check "load with a non-number: exit 2" eval '[ $rc = 2 ] && has nonum.err "wants a number"'
run noargs "$T"
ktap_check "no command: exit 2 with usage" eval '[ $rc = 2 ] && has noargs.err "usage:"'

hdr="id size resident holders grants flags uid pid comm age name"
printf '%s\n1 4096 0 1 0 - 0 1 init 5\ntotal 1 4096 0\n' "$hdr" >"$tmp/short"
TSHMCTL_PROC=$tmp/short run short "$T" list
ktap_check "short /proc/tshm line: exit 5, names file and line" \
	eval '[ $rc = 5 ] && has short.err "$tmp/short:2: 10 fields where the header has 11"'
printf '%s\n1 4096 x 1 0 - 0 1 init 5 a\ntotal 1 4096 0\n' "$hdr" >"$tmp/nan"
TSHMCTL_PROC=$tmp/nan run nan "$T" list --json
ktap_check "non-number field: exit 5" eval '[ $rc = 5 ] && has nan.err "resident .x. is not a number"'
printf 'id size holders grants flags uid pid comm age name\ntotal 0 0 0\n' >"$tmp/old"
TSHMCTL_PROC=$tmp/old run old "$T" list
ktap_check "header without a known column: exit 5" eval '[ $rc = 5 ] && has old.err "no .resident. column"'
printf '%s\n1 4096 0 1 0 - 0 1 init 5 a\ntotal 2 4096 0\n' "$hdr" >"$tmp/tot"
TSHMCTL_PROC=$tmp/tot run tot "$T" list
ktap_check "totals disagreeing with the lines: exit 5" eval '[ $rc = 5 ] && has tot.err "counts 2 segments"'
printf '%s numa\n7 8192 4096 1 0 hp 0 1 my\\040init 5 a\\134b\\040c 0\ntotal 1 8192 4096\n' "$hdr" >"$tmp/newer"
TSHMCTL_PROC=$tmp/newer run newer "$T" list --json
ktap_check "a newer module's extra column is ignored, escapes undone" \
	eval '[ $rc = 0 ] && jcheck $tmp/newer.out "seg[7][\"name\"] == \"a\\\\b c\" and seg[7][\"comm\"] == \"my init\" and seg[7][\"huge\"]"'

# --- list, --json, --holders, as root ----------------------------------
hold one "$H" fd alpha 1048576 beta 3000
P=$(field one pid); read -r A1 A2 <<<"$(ids one)"
run l1 "$T" list --json --pid "$P"
ktap_check "list --json: sizes, names, creator pid, holders" \
	jcheck "$tmp/l1.out" "len(d['segments']) == 2 and seg[$A1]['size'] == 1048576 and seg[$A2]['size'] == 4096 and seg[$A1]['name'] == 'alpha' and seg[$A2]['name'] == 'beta' and all(s['pid'] == $P and s['comm'] == 'seghold' and s['holders'] == 1 and s['grants'] == 0 and s['uid'] == 0 and s['user'] == 'root' and s['resident'] >= 4096 for s in d['segments']) and d['total']['segments'] == 2 and d['total']['size'] == 1048576 + 4096"
run l2 "$T" list --json --holders --pid "$P"
ktap_check "list --json --holders: the fds of the one holder" \
	jcheck "$tmp/l2.out" "all(len(s['held_by']) == 1 and s['held_by'][0]['pid'] == $P and len(s['held_by'][0]['fds']) == 1 and s['held_by'][0]['mappings'] == 0 for s in d['segments'])"
run l3 "$T" list --sort size --json
ktap_check "list --sort size: largest first" jcheck "$tmp/l3.out" "[s['size'] for s in d['segments']] == sorted([s['size'] for s in d['segments']], reverse=True)"
run l4 "$T" list
ktap_check "list table: human sizes and names" eval '[ $rc = 0 ] && has l4.out "1.0 MiB .* alpha$" && has l4.out "4.0 KiB .* beta$" && has l4.out "^ *ID  *SIZE  *RESIDENT"'
run l5 "$T" list --user nobody --json
ktap_check "list --user nobody: not root's segments" jcheck "$tmp/l5.out" "$A1 not in seg and $A2 not in seg"
run l6 "$T" list --user root --json
ktap_check "list --user root: root's segments" jcheck "$tmp/l6.out" "$A1 in seg and $A2 in seg"

hold two "$H" pair duo 2097152
P2=$(field two pid); M2=$(field two mappid); D=$(ids two)
run h1 "$T" list --json --holders
ktap_check "--holders names both pids" \
	jcheck "$tmp/h1.out" "seg[$D]['holders'] == 2 and sorted(h['pid'] for h in seg[$D]['held_by']) == sorted([$P2, $M2])"
ktap_check "--holders: the creator by its fd, not mapped" \
	jcheck "$tmp/h1.out" "[(len(h['fds']), h['mappings']) for h in seg[$D]['held_by'] if h['pid'] == $P2] == [(1, 0)]"
ktap_check "--holders: the other by one 2 MiB mapping, no fd" \
	jcheck "$tmp/h1.out" "[(h['fds'], h['mappings'], h['mapped']) for h in seg[$D]['held_by'] if h['pid'] == $M2] == [([], 1, 2097152)]"
run h2 "$T" list --holders
ktap_check "--holders table: a line per holding pid" \
	eval 'has h2.out "held by pid $P2 (seghold, root): fd [0-9]*$" && has h2.out "held by pid $M2 (seghold, root): 2.0 MiB mapped (1 mapping)"'
run h3 "$T" list --json --pid "$M2"
ktap_check "--pid of a process that only maps it finds the segment" jcheck "$tmp/h3.out" "list(seg) == [$D]"
run t1 timeout 20 "$T" top -n 2 -d 0.2
ktap_check "top -n 2: two screens with the segments" \
	eval '[ $rc = 0 ] && [ "$(grep -c "^tshmctl top" $tmp/t1.out)" = 2 ] && has t1.out "duo$"'
(sleep 0.5; echo q) | timeout 10 "$T" top >"$tmp/t2.out" 2>&1
rc=$?
ktap_check "top exits on q" eval '[ $rc = 0 ] && has t2.out alpha'

# --- as nobody ---------------------------------------------------------
hold nob "${NOBODY[@]}" "$H" fd nobseg 8192
PN=$(field nob pid); N1=$(ids nob)
run n1 "${NOBODY[@]}" "$T" list --json
ktap_check "nobody: list shows only nobody's segments" \
	jcheck "$tmp/n1.out" "list(seg) == [$N1] and seg[$N1]['user'] == 'nobody' and seg[$N1]['pid'] == $PN"
run n2 "${NOBODY[@]}" "$T" list --json --holders
ktap_check "nobody: --holders finds its own process, notes the others" \
	eval 'jcheck $tmp/n2.out "[h[\"pid\"] for h in seg[$N1][\"held_by\"]] == [$PN]" && has n2.err "could not be inspected"'
run n3 "$T" list --json
ktap_check "root sees nobody's segment too" jcheck "$tmp/n3.out" "$N1 in seg and $D in seg and seg[$N1]['uid'] == 65534"
run n4 "${NOBODY[@]}" "$T" status
ktap_check "nobody: status works, says it sees its own" eval '[ $rc = 0 ] && has n4.out "segments: 1, 8.0 KiB" && has n4.out "yours only"'
run n5 "${NOBODY[@]}" "$T" unload
ktap_check "nobody: unload refused for lack of privilege, exit 1" eval '[ $rc = 1 ] && has n5.err "needs root"'
ktap_check "module still loaded after nobody's unload" test -e /proc/tshm

# --- unload while a mapping lives ---------------------------------------
killall_holders
ktap_check "every holder gone: /proc/tshm empty" grep -q '^total 0 0 0' /proc/tshm
hold solo "$H" map solo 65536
PS=$(field solo pid); S=$(ids solo)
run u1 "$T" unload
ktap_check "unload while a mapping lives: refused, exit 4" eval '[ $rc = 4 ] && has u1.err "refused, tshm is in use"'
ktap_check "the refusal names the segment" has u1.err "segment $S \"solo\" (64 KiB, 1 holder"
ktap_check "the refusal names the pid and the mapping" has u1.err "pid $PS (seghold): maps 64 KiB of it"
ktap_check "module still loaded after the refusal" test -e /proc/tshm
killall_holders
run u2 "$T" unload
ktap_check "unload once the mapping is gone" eval '[ $rc = 0 ] && [ ! -e /proc/tshm ]'

# --- module missing ----------------------------------------------------
run m1 "$T" status
ktap_check "status when not loaded: exit 3, says so" eval '[ $rc = 3 ] && has m1.out "not loaded"'
run m2 "$T" list
ktap_check "list when not loaded: exit 3, says so" eval '[ $rc = 3 ] && has m2.err "not loaded"'
run m3 "$T" unload
ktap_check "unload when not loaded: exit 3" eval '[ $rc = 3 ] && has m3.err "not loaded"'
run m4 "${NOBODY[@]}" "$T" load
ktap_check "nobody: load refused, exit 1, says root is needed" eval '[ $rc = 1 ] && has m4.err "needs root" && [ ! -e /proc/tshm ]'
run m5 "$T" load --module "$tmp/none.ko"
ktap_check "load of a missing file: exit 1" eval '[ $rc = 1 ] && has m5.err "none.ko: No such file"'

# --- load with no --module: the build for the running kernel ------------
# (build/kmod is 6.1's; on 6.12 it must take build/kmod-6.12, on the debug
# kernel build/kmod-debug: the one whose vermagic names uname -r.)
run d1 "$T" load
dko=$(sed -n 's/^tshm: loaded \([^ ]*\).*/\1/p' "$tmp/d1.out")
dvm=$([ -n "$dko" ] && modinfo -F vermagic "$dko")
echo "# load with no --module took $dko ($dvm)"
ktap_check "load with no --module: the build for $(uname -r)" \
	eval '[ $rc = 0 ] && [ -e /proc/tshm ] && [ "${dvm%% *}" = "$(uname -r)" ]'
run d2 "$T" unload

# --- load with parameters ----------------------------------------------
run p1 "$T" load --module "$KO" max_user_segments=77 max_user_bytes=1G
ktap_check "load max_user_segments=77 max_user_bytes=1G" eval '[ $rc = 0 ] && [ -e /proc/tshm ] && has p1.out "loaded .*tshm.ko"'
run p2 "$T" status
ktap_check "status shows the parameters given" \
	eval '[ $rc = 0 ] && has p2.out "max_user_segments  *77" && has p2.out "max_user_bytes  *1073741824  *1.0 GiB" && has p2.out "loaded (live)"'
run p3 "$T" status --json
ktap_check "status --json shows them too" jcheck "$tmp/p3.out" "d['loaded'] and d['parameters']['max_user_segments'] == 77 and d['parameters']['max_user_bytes'] == 1 << 30 and d['total']['segments'] == 0"
run p4 "$T" load
ktap_check "load when loaded: exit 4, already loaded" eval '[ $rc = 4 ] && has p4.err "already loaded"'
run p5 "$T" unload
run p6 "$T" load "${KO_ARGS[@]}"
ktap_check "unload, load again with defaults ($KO_FROM)" eval '[ $rc = 0 ] && [ "$(cat /sys/module/tshm/parameters/max_user_segments)" = 16384 ]'
ktap_done
