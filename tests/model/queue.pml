/* SPDX-License-Identifier: GPL-2.0 */
/*
 * queue.pml - a Promela model of the slot ring of lib/queue.c, checked by
 * spin (tests/model/spin-check.sh; Documentation/lib/queue.rst, "The model
 * check", says what it covers and what it does not).
 *
 * One Promela step is one access to shared memory in the C code: a load,
 * a store, or one compare-and-swap (a d_step).  Local computation is
 * folded into the step that precedes it.  Every step names the lines of
 * lib/queue.c it stands for.
 *
 * Configuration (spin -DNAME=VALUE):
 *   CAP      slots (tshm_queue_create's capacity)
 *   NSEND    sender threads, tids 1..NSEND
 *   NMSG     messages each sender sends
 *   NRECV    receiver threads
 *   MAXPOS   the model's bound on queue positions: a thread that reads a
 *            hint at MAXPOS stops there (end_bound, "hitbound"); nothing
 *            past it is explored, nothing wraps
 *   CHAOS    what may happen once, at any step of the victim: a mask of
 *            1 a sender is SIGKILLed, 2 a receiver is SIGKILLed,
 *            4 a sender is stopped for good (SIGSTOP, never continued),
 *            8 a receiver is stopped for good.  A stop that is later
 *            continued needs no event: spin already explores every
 *            interleaving, including a thread not running for any time.
 *   NEVENTS  how many such events (1 or 2)
 */
#ifndef CAP
#define CAP 1
#endif
#ifndef NSEND
#define NSEND 2
#endif
#ifndef NMSG
#define NMSG 1
#endif
#ifndef NRECV
#define NRECV 1
#endif
#ifndef MAXPOS
#define MAXPOS 6
#endif
#ifndef CHAOS
#define CHAOS 0
#endif
#ifndef NEVENTS
#define NEVENTS 1
#endif

#define NMSGS	(NSEND * NMSG)
#define NPART	(NSEND + NRECV + 1)	/* participant ids; 0 is no thread */
#define NPOS	(MAXPOS + CAP)		/* every position a state can name */

/* lib/queue.h: the state word.  Kind, tid (2 bits here) and position. */
#define EMPTY	0
#define FULL	1
#define CLAIMED	2
#define QFULL	3
#define QEMPTY	4
#define MK(k, p, t)	((p) * 32 + (t) * 8 + (k))
#define KIND(w)		((w) % 8)
#define TID(w)		(((w) / 8) % 4)
#define POS(w)		((w) / 32)
/* publish's give-back: w & ~(QS_TID_MASK << QS_KIND_BITS) */
#define UNTID(w)	(POS(w) * 32 + KIND(w))

/* struct qhdr: the hints and closed */
byte head, tail;
bit closed;
/* struct qslot: the state words, and the payload as two halves written
 * and read in separate steps (len/bytes in q_fill, q_copy), so that a
 * copy mixing two writers shows as halves that differ */
short state[CAP];
byte data_a[CAP], data_b[CAP];

/* q_tid_gone(): gone[0] is tid 0, "nobody" (true) */
bit gone[NPART];
/* the chaos events, seen by their victim before its next step */
bit kill[NPART], stop[NPART];
byte nevents;

/* bookkeeping for the properties, not in the C code */
byte pubmsg[NPOS];	/* the message published at each position */
byte taken[NMSGS + 1];	/* takes of each message (must stay <= 1) */
bit published[NMSGS + 1];
byte npending;		/* published and not yet taken */
byte sdone;		/* senders finished, dead or stopped for good */
byte rlost;		/* receivers dead or stopped for good */
bit hitbound;		/* some thread reached MAXPOS: this run is cut */

/* q_cas(): one compare-and-swap on a slot's state word */
#define CAS(s, old, new, ok) \
	d_step { \
		if \
		:: state[s] == (old) -> \
			assert(POS(new) < NPOS); state[s] = (new); ok = 1 \
		:: else -> ok = 0 \
		fi \
	}

/* q_advance(): CAS the hint from the value read to the next */
#define ADVANCE(hint, from) \
	d_step { \
		if \
		:: hint == (from) -> assert((from) < MAXPOS); hint = (from) + 1 \
		:: else \
		fi \
	}

proctype Sender(byte me)
{
	byte m, t, s, owner;
	short w;
	bit ok, g;

	m = (me - 1) * NMSG + 1;
	{
	do
	:: m > me * NMSG -> break
	:: else ->
		/* q_claim(), queue.c:60: loop until this thread holds a claim */
		do
		:: d_step {	/* t = atomic_load(&hdr->tail) */
			t = tail; s = t % CAP; w = 0; owner = 0; g = 0; ok = 0
		   }
		   if
		   :: t >= MAXPOS -> hitbound = 1; goto bound
		   :: else
		   fi;
		   w = state[s];	/* w = atomic_load(&slot->state) */
		   if
		   :: POS(w) == t && KIND(w) == QEMPTY ->
			owner = TID(w);
#ifdef PLANT_REUSE
			g = 1;	/* a planted bug: reuse a revoked slot at once */
#else
			g = gone[owner];	/* q_tid_gone(owner) */
#endif
			if
			:: !g ->
				/* a revoked claimer may still write: pass it
				 * (queue.c:79-88) */
				CAS(s, w, MK(QFULL, t, owner), ok);
				if
				:: ok -> ADVANCE(tail, t)
				:: else
				fi
			:: else ->	/* its claimer is gone: claim it (queue.c:89) */
				CAS(s, w, MK(CLAIMED, t, me), ok);
				if
				:: ok -> ADVANCE(tail, t); break
				:: else
				fi
			fi
		   :: POS(w) == t && KIND(w) == EMPTY ->
			CAS(s, w, MK(CLAIMED, t, me), ok);
			if
			:: ok -> ADVANCE(tail, t); break  /* *pos = t; return 0 */
			:: else
			fi
		   :: POS(w) > t || (POS(w) == t && KIND(w) != EMPTY &&
				     KIND(w) != QEMPTY) ->
			/* position t is someone's already: move the hint
			 * (queue.c:98) */
			ADVANCE(tail, t)
		   :: POS(w) < t ->
			/* queue.c:105: the previous lap: full; q_wait() on con until a
			 * receiver changes the ring (or a slice passes) */
			if
			:: (state[s] != w || tail != t)
			:: rlost == NRECV -> goto gaveup  /* -ETIMEDOUT */
			fi
		   fi
		od;

		/* q_fill(), queue.c:149: len and bytes, two stores */
		data_a[s] = m;
		data_b[s] = m;

		/* q_publish(), queue.c:118: CLAIMED(t, me) -> FULL(t) */
		d_step {
			if
			:: state[s] == MK(CLAIMED, t, me) ->
				state[s] = MK(FULL, t, 0);
				pubmsg[t] = m; published[m] = 1;
				npending++; ok = 1
			:: else -> ok = 0
			fi
		}
		if
		:: ok -> m++	/* tshm_queue_send() returns 0 */
		:: else ->
			/* revoked: give the slot back (t = 0), queue.c:128 */
			do
			:: w = state[s];
				if
				:: (KIND(w) == QFULL || KIND(w) == QEMPTY) &&
				   TID(w) == me ->
					CAS(s, w, UNTID(w), ok);
					if
					:: ok -> break
					:: else
					fi
				:: else -> break
				fi
			od
			/* the do/while in tshm_queue_send(): claim again */
		fi
	od;
gaveup:	/* no receiver left to make room: the send times out */
	skip
	} unless {
		/* SIGKILL or SIGSTOP, before any step */
		(kill[me] || stop[me]) ->
		if
		:: kill[me] -> gone[me] = 1
		:: else -> sdone++;
end_stopped:
			false
		fi
	};
	sdone++;	/* returned, or died */
	goto done;
bound:	/* the model's limit: no further positions are explored */
	sdone++;
end_bound:
	false;
done:
	skip
}

proctype Receiver(byte me)
{
	byte h, s, owner, ra, rb;
	short w, next;
	bit ok, g;

	{
	do
	:: /* q_find(), queue.c:316 */
		d_step {	/* h = atomic_load(&hdr->head) */
			h = head; s = h % CAP; w = 0; next = 0;
			owner = 0; g = 0; ok = 0; ra = 0; rb = 0
		}
		if
		:: h >= MAXPOS -> hitbound = 1; goto bound
		:: else
		fi;
		w = state[s];
		if
		:: POS(w) > h ->	/* queue.c:333: taken or passed: move the hint */
			ADVANCE(head, h)
		:: POS(w) == h && KIND(w) == FULL ->
			/* q_copy(), queue.c:437: two loads */
			ra = data_a[s];
			rb = data_b[s];
			/* q_take(), queue.c:469: FULL(h) -> EMPTY(h + CAP) */
			d_step {
				if
				:: state[s] == w ->
					state[s] = MK(EMPTY, h + CAP, 0);
					/* no torn message, exactly once */
					assert(ra == rb && ra == pubmsg[h]);
					assert(published[ra]);
					taken[ra]++; npending--;
					assert(taken[ra] == 1);
					ok = 1
				:: else -> ok = 0
				fi
			}
			if
			:: ok -> ADVANCE(head, h)
			:: else
			fi
		:: POS(w) == h && KIND(w) == QFULL ->	/* queue.c:348 */
			owner = TID(w);
			g = gone[owner];
			if
			:: g -> next = MK(EMPTY, h + CAP, 0)
			:: else -> next = MK(QEMPTY, h + CAP, owner)
			fi;
			CAS(s, w, next, ok);
			if
			:: ok -> ADVANCE(head, h)
			:: else
			fi
		:: POS(w) == h && KIND(w) == CLAIMED ->	/* queue.c:359 */
			owner = TID(w);
			g = gone[owner];
			if
			:: g ->	/* its sender died before publishing */
				CAS(s, w, MK(EMPTY, h + CAP, 0), ok);
				if
				:: ok -> ADVANCE(head, h)
				:: else
				fi
			:: else ->
				if
				:: /* the claim bound is up: revoke it (queue.c:382) */
					CAS(s, w, MK(QFULL, h, owner), ok)
				:: /* q_wait() for the publish */
					(state[s] != w || head != h)
				fi
			fi
		:: POS(w) < h || (POS(w) == h &&
				  (KIND(w) == EMPTY || KIND(w) == QEMPTY)) ->
			/* nothing at h yet; queue.c:403: a hole to pass
			 * when the tail is past h */
			if
			:: POS(w) == h && tail > h ->
				if
				:: KIND(w) == QEMPTY ->
					owner = TID(w);
					g = gone[owner];
					if
					:: !g -> next = MK(QEMPTY, h + CAP, owner)
					:: else -> next = MK(EMPTY, h + CAP, 0)
					fi
				:: else -> next = MK(EMPTY, h + CAP, 0)
				fi;
				CAS(s, w, next, ok);
				if
				:: ok -> ADVANCE(head, h)
				:: else
				fi
			:: else ->
				if
				:: closed && (state[s] != w || tail > h ||
					      head != h) ->
					/* queue.c: closed, but the ring moved
					 * since the look at h: look again.
					 * (One step here, three loads there,
					 * each of which alone sends it round.) */
					skip
				:: closed && state[s] == w && tail <= h &&
				   head == h ->	/* -EPIPE */
#ifdef CHECK_DRAIN
					/* guide.rst: receivers drain what is
					 * queued before they get -EPIPE */
					assert(npending == 0);
#endif
					if
					:: npending == 0 -> break
					:: else ->
						/* too early: a caller that
						 * receives again */
						(npending == 0 ||
						 state[s] != w || head != h)
					fi
				:: else ->
					/* q_wait() on pub until the ring
					 * or closed changes */
					(state[s] != w || head != h ||
					 tail > h || closed)
				fi
			fi
		fi
	od
	} unless {
		/* SIGKILL or SIGSTOP, before any step */
		(kill[me] || stop[me]) ->
		if
		:: kill[me] -> d_step { gone[me] = 1; rlost++ }
		:: else -> rlost++;
end_stopped:
			false
		fi
	};
	goto done;
bound:	/* the model's limit: no further positions are explored */
	rlost++;
end_bound:
	false;
done:
	skip
}

/* SIGKILL or SIGSTOP-for-good, NEVENTS times, at any moment */
active proctype Chaos()
{
	byte v;

	do
	:: nevents < NEVENTS && (CHAOS & 1) ->
		select(v : 1 .. NSEND); kill[v] = 1; nevents++
	:: nevents < NEVENTS && (CHAOS & 2) ->
		select(v : NSEND + 1 .. NSEND + NRECV); kill[v] = 1; nevents++
	:: nevents < NEVENTS && (CHAOS & 4) ->
		select(v : 1 .. NSEND); stop[v] = 1; nevents++
	:: nevents < NEVENTS && (CHAOS & 8) ->
		select(v : NSEND + 1 .. NSEND + NRECV); stop[v] = 1; nevents++
	:: break
	od
}

init
{
	byte i;

	d_step {
		gone[0] = 1;
		for (i : 0 .. CAP - 1) {
			state[i] = MK(EMPTY, i, 0)
		}
	}
	atomic {
		for (i : 1 .. NSEND) {
			run Sender(i)
		}
		for (i : 1 .. NRECV) {
			run Receiver(NSEND + i)
		}
	}
	/* every sender is done, dead or stopped: tshm_queue_close() */
	sdone == NSEND -> closed = 1;

	/* nothing can move any more: what was delivered */
	timeout ->
	d_step {
		if
		:: !hitbound && rlost < NRECV ->
			/* a receiver survived: every published message was
			 * taken, exactly once (each take asserted <= 1) */
			for (i : 1 .. NMSGS) {
				assert(!published[i] || taken[i] == 1)
			}
		:: else
		fi;
		/* a sender alive, not stopped, with a receiver left to make
		 * room, published everything */
		for (i : 1 .. NMSGS) {
			assert(published[i] || kill[(i - 1) / NMSG + 1] ||
			       rlost == NRECV ||
			       stop[(i - 1) / NMSG + 1] || hitbound)
		}
	}
}
