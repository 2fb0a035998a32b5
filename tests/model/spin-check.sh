#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# Model-check the queue's slot protocol (tests/model/queue.pml, a Promela
# model of lib/queue.c) with Debian's spin: for each configuration, spin
# writes the verifier, gcc compiles it, and it searches every interleaving
# (assertions: no torn message, no message taken twice, every published
# message taken when a receiver survives; no invalid end state).  One TAP
# line per configuration; skipped (exit 4) without spin.
#
# Documentation/lib/queue.rst, "The model check", lists the configurations
# and their state counts.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 2
. tests/common/ktap.sh
model=$top/tests/model/queue.pml

# name|spin -D options|expect (pass, or the violation a known bug gives)
configs=(
	"cap 1, 2 senders, 1 receiver, no event|-DCAP=1 -DMAXPOS=3|pass"
	"cap 1, a sender SIGKILLed at any step|-DCAP=1 -DMAXPOS=3 -DCHAOS=1|pass"
	"cap 1, a receiver SIGKILLed at any step|-DCAP=1 -DMAXPOS=3 -DCHAOS=2|pass"
	"cap 1, a sender stopped for good at any step|-DCAP=1 -DMAXPOS=3 -DCHAOS=4|pass"
	"cap 1, a receiver stopped for good at any step|-DCAP=1 -DMAXPOS=3 -DCHAOS=8|pass"
	"cap 2, 2 senders, 1 receiver, no event|-DCAP=2 -DMAXPOS=3|pass"
	"cap 2, a sender SIGKILLed at any step|-DCAP=2 -DMAXPOS=3 -DCHAOS=1|pass"
	"cap 2, a sender stopped for good at any step|-DCAP=2 -DMAXPOS=3 -DCHAOS=4|pass"
	"cap 1, 1 sender of 2 messages, 2 receivers, no event|-DCAP=1 -DMAXPOS=3 -DNSEND=1 -DNMSG=2 -DNRECV=2|pass"
	# The check can fail: a planted bug (a sender reuses a revoked
	# claimer's slot while that claimer may still write) tears a message.
	"planted bug: revoked slot reused at once|-DCAP=1 -DMAXPOS=3 -DPLANT_REUSE|assertion violated ((ra==rb)&&(ra==pubmsg[h]))"
	# Receivers drain what is queued before -EPIPE.  This found a bug in
	# q_find(): the slot read EMPTY, then a send and tshm_queue_close()
	# completed before the load of closed, and the receiver got -EPIPE
	# with a message queued; q_find() now looks again after closed.
	"drain before -EPIPE|-DCAP=1 -DMAXPOS=3 -DCHECK_DRAIN|pass"
)

if ! command -v spin > /dev/null; then
	ktap_plan ${#configs[@]}
	for c in "${configs[@]}"; do
		ktap_skip "model: ${c%%|*}" "spin is not installed (scripts/setup-deps)"
	done
	ktap_done
	exit 4
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Memory for the stored states (MiB): the larger configurations need ~1 GiB.
memlim=${TSHM_SPIN_MEMLIM:-2048}

ktap_plan ${#configs[@]}
i=0
for c in "${configs[@]}"; do
	IFS='|' read -r name opts expect <<<"$c"
	i=$((i + 1))
	d=$tmp/$i
	mkdir -p "$d"
	cp "$model" "$d/queue.pml"
	# shellcheck disable=SC2086
	if ! (cd "$d" && spin $opts -a queue.pml > spin.log 2>&1); then
		ktap_fail "model: $name" "spin -a: $(tail -n 5 "$d/spin.log")"
		continue
	fi
	if ! gcc -O2 -w -DSAFETY -DCOLLAPSE -DMEMLIM="$memlim" \
		-o "$d/pan" "$d/pan.c" 2> "$d/gcc.log"; then
		ktap_fail "model: $name" "gcc: $(tail -n 5 "$d/gcc.log")"
		continue
	fi
	start=$(date +%s.%N)
	(cd "$d" && ./pan -m10000 -w24 > pan.log 2>&1)
	secs=$(echo "$(date +%s.%N) - $start" | bc)
	states=$(sed -nE 's/^ *([0-9]+) states, stored.*/\1/p' "$d/pan.log")
	errors=$(sed -nE 's/.*errors: ([0-9]+).*/\1/p' "$d/pan.log")
	echo "# $name: spin $opts: ${states:-?} states, ${errors:-?} errors, $(printf %.1f "$secs") s"
	if grep -q "out of memory\|Search not completed\|max search depth too small" "$d/pan.log" &&
	   [ "$expect" = pass ]; then
		ktap_fail "model: $name" "search incomplete: $(grep -m1 -E 'memory|completed|depth' "$d/pan.log")"
		continue
	fi
	if [ "$expect" = pass ]; then
		if [ "$errors" = 0 ]; then
			ktap_ok "model: $name"
		else
			ktap_fail "model: $name" "$(grep -m1 -E 'pan:1:' "$d/pan.log")"
			# The counterexample, step by step.
			# shellcheck disable=SC2086
			(cd "$d" && spin $opts -t -p -g queue.pml 2>&1 | tail -n 60 |
				sed 's/^/# /')
		fi
	elif grep -qF "$expect" "$d/pan.log"; then
		ktap_ok "model: $name: counterexample found, as expected"
	else
		ktap_fail "model: $name" "expected '$expect' (a known bug), not found: fixed? make the case expect pass"
	fi
done
ktap_done
