#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Makes the terminal screenshots-as-text of Documentation/admin-guide/
# tshmctl.rst: a few segments held in known ways, then `tshmctl list
# --holders` and `tshmctl top` in a 120x30 tmux pane, captured as text.
# Not a test.  Run in the VM, as root, with tmux installed on the host:
#
#   scripts/vm-run -- tests/tools/capture-screens.sh OUTDIR
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
B=${B:-build}
case $B in /*) ;; *) B=$top/$B ;; esac
out=${1:?usage: capture-screens.sh OUTDIR}
mkdir -p "$out"
H=$B/tests/tools/seghold
export SEGHOLD_FILL=1 PATH=$B/tools:$PATH
cd /tmp

bg() { "$@" >/dev/null & sleep 1; }
bg "$H" fd batch-0041 $((64 << 20)) batch-0042 $((64 << 20))
bg "$H" pair weights $((256 << 20))
bg "$H" map frame-ring $((16 << 20))
SEGHOLD_FILL= bg setpriv --reuid=nobody --regid=nogroup --clear-groups \
	"$H" fd scratch $((512 << 20))
sleep 2

tmux -L cap new-session -d -x 120 -y 30 -s cap "env PS1='# ' TERM=xterm bash --norc --noprofile"
sleep 1
tmux -L cap send-keys -t cap 'tshmctl list --holders' Enter
sleep 3
tmux -L cap capture-pane -p -t cap | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' >"$out/list.txt"
tmux -L cap send-keys -t cap 'clear; tshmctl top' Enter
sleep 4
tmux -L cap capture-pane -p -t cap | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' >"$out/top.txt"
tmux -L cap send-keys -t cap q
sleep 1
tmux -L cap kill-server
# Plain output, for the same page.
{ echo '# tshmctl status'; tshmctl status; } >"$out/status.txt" 2>&1
{ echo '# tshmctl unload; echo $?'; rc=0; tshmctl unload || rc=$?; echo $rc; } \
	>"$out/unload.txt" 2>&1
kill $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true
