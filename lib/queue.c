// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * queue.c - bounded MPMC queues in shared memory.
 *
 * The ring lives in a sealed memfd: a header, then @capacity fixed-size
 * slots, each with a 64-bit state word next to its bytes (Vyukov's bounded
 * queue).  A sender claims a slot with one compare-and-swap, writes it and
 * publishes it with another; a receiver copies a FULL slot out and takes it
 * with one more.  No lock is held across any of it, so a sender or receiver
 * stopped or killed anywhere costs the others at most the slot it claimed:
 * a receiver that waits q_claim_bound_ns() for a claim to be published
 * revokes it, and the slow sender, finding its publish refused, sends
 * again.
 *
 * Segments never go through the ring as memory: only their ids.  On the
 * module the sender grants each segment to the queue's own /dev/tshm
 * context before it claims, so the kernel holds every in-flight reference,
 * and the receiver attaches by id after its take (or finds the segment in
 * its cache and parks the grant as a spare).  On the fallback the fds
 * travel in a SEQPACKET socket owned by the queue, whose order must be the
 * ring's: those messages alone are sent and taken under the segment lock,
 * each socket message tagged with its slot so that a receiver can discard
 * what a revoked or dead sender left behind.  Documentation/lib/queue.rst
 * has the whole argument; lib/queue.h lists the queue's files.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "queue.h"

int queue_grant_fd(const struct tshm_queue *q)
{
	return q->gfd;
}

/* ---- the slot ring ---- */

static void q_advance(_Atomic uint64_t *hint, uint64_t from)
{
	atomic_compare_exchange_strong(hint, &from, from + 1);
}

static bool q_cas(struct qslot *slot, uint64_t old, uint64_t new)
{
	return atomic_compare_exchange_strong(&slot->state, &old, new);
}

/*
 * Claim a slot for the calling thread: 0 with *@pos CLAIMED(*@pos, q_tid()),
 * or -EPIPE, -EAGAIN / -ETIMEDOUT, -EINTR.
 */
static int q_claim(struct tshm_queue *q, struct deadline *dl, uint64_t *pos)
{
	struct qhdr *hdr = q->hdr;
	uint32_t me = q_tid(), seen, owner;
	struct qslot *slot;
	uint64_t t, w;
	unsigned spins = 0;
	int64_t d;
	int ret;

	for (;;) {
		if (atomic_load_explicit(&hdr->closed, memory_order_relaxed))
			return -EPIPE;
		seen = atomic_load(&hdr->con);
		t = atomic_load(&hdr->tail);
		slot = q_slot(q, t);
		w = atomic_load(&slot->state);
		d = qs_diff(w, t);
		if (d == 0 && qs_kind(w) == QS_QEMPTY) {
			owner = qs_tid(w);
			if (!q_tid_gone(owner)) {
				/* A revoked claimer may still write: pass it. */
				if (q_cas(slot, w, qs_make_tid(QS_QFULL, t,
								owner))) {
					q_advance(&hdr->tail, t);
					q_wake(&hdr->pub, &hdr->rwait, false);
				}
				continue;
			}
		}
		if (d == 0 && (qs_kind(w) == QS_EMPTY ||
			       qs_kind(w) == QS_QEMPTY)) {
			if (q_cas(slot, w, qs_make_tid(QS_CLAIMED, t, me))) {
				q_advance(&hdr->tail, t);
				*pos = t;
				return 0;
			}
			continue;
		}
		if (d >= 0) {
			/* Position t is someone's already: move the hint. */
			q_advance(&hdr->tail, t);
			if (++spins % 1024 == 0 && deadline_expired(dl))
				return deadline_err(dl);
			continue;
		}
		/* The slot still holds the previous lap: full. */
		ret = q_wait(q, &hdr->con, seen, &hdr->swait, dl);
		if (ret < 0)
			return ret;
	}
}

/*
 * Make the claimed slot at @pos FULL.  false: the claim was revoked while
 * this thread was slow (stopped, preempted); the slot is given back and the
 * caller sends again.
 */
static bool q_publish(struct tshm_queue *q, uint64_t pos, unsigned kind)
{
	struct qslot *slot = q_slot(q, pos);
	uint32_t me = q_tid();
	uint64_t w;

	if (q_cas(slot, qs_make_tid(QS_CLAIMED, pos, me),
		  kind == QS_FULL ? qs_make(QS_FULL, pos) :
		  qs_make_tid(QS_QFULL, pos, 0)))
		return true;
	/*
	 * Revoked: the slot was passed over (QFULL/QEMPTY naming this thread)
	 * while it went on writing.  Done writing now, give it back: t = 0.
	 */
	for (;;) {
		w = atomic_load(&slot->state);
		if ((qs_kind(w) != QS_QFULL && qs_kind(w) != QS_QEMPTY) ||
		    qs_tid(w) != me)
			return false;
		if (q_cas(slot, w, w & ~((uint64_t)QS_TID_MASK << QS_KIND_BITS)))
			return false;
	}
}

/* Give a claim back unused (the segments could not be sent). */
static void q_unclaim(struct tshm_queue *q, uint64_t pos)
{
	q_publish(q, pos, QS_QFULL);
	q_wake(&q->hdr->pub, &q->hdr->rwait, false);
}

static void q_fill(struct tshm_queue *q, uint64_t pos, const void *msg,
		   size_t len, const struct qsegs *qs, unsigned nsegs,
		   unsigned nfds)
{
	struct qslot *slot = q_slot(q, pos);

	slot->len = len;
	slot->nsegs = nsegs;
	slot->nfds = nfds;
	if (len)
		memcpy(slot->data, msg, len);
	if (nsegs || nfds) {
		struct qsegs *dst = q_slot_segs(q, slot);

		dst->tag = qs->tag;
		dst->fdtag = qs->fdtag;
		memcpy(dst->h, qs->h, nsegs * sizeof(qs->h[0]));
	}
}

/*
 * A message that carries fds through the queue's socket (the fallback's
 * segments, tshm_queue_send_fds()'s fds): under the segment lock, so that
 * the order of the socket's messages is the order of their slots.  The
 * module's segments travel as grants, before the lock and kept for a retry.
 */
static int q_send_locked(struct tshm_queue *q, const void *msg, size_t len,
			 struct tshm_seg *const *segs, unsigned nsegs,
			 const int *fds, unsigned nfds, struct deadline *dl)
{
	struct deadline nowait = { .ns = dl->ns, .nowait = true };
	const struct backend_ops *ops = q->ctx->ops;
	bool segs_locked = nsegs && ops->q_ordered;
	struct qhdr *hdr = q->hdr;
	struct qsegs qs = { 0 };
	struct qwire w;
	uint64_t pos;
	uint32_t seen;
	int ret, locked;

	if (nsegs && !segs_locked) {
		ret = ops->q_send_segs(q, segs, nsegs, NULL, 0, qs.h, &qs.tag);
		if (ret < 0)
			return ret;
	}
	for (;;) {
		seen = atomic_load(&hdr->con);
		locked = q_lock(q, dl);
		if (locked < 0) {
			ret = locked;
			break;
		}
		/*
		 * Never wait for room under the lock: the receivers of the
		 * messages that fill the ring need it to take them.
		 */
		ret = q_claim(q, &nowait, &pos);
		if (ret < 0) {
			q_unlock(q, locked);
			if (ret != -EAGAIN || dl->nowait)
				break;
			ret = q_wait(q, &hdr->con, seen, &hdr->swait, dl);
			if (ret < 0)
				break;
			continue;
		}
		/* One socket message: the whole message's fds, or none. */
		if (segs_locked) {
			ret = ops->q_send_segs(q, segs, nsegs, fds, nfds, qs.h,
					       &qs.tag);
			qs.fdtag = qs.tag;
		} else {
			memset(&w, 0, sizeof(w));
			w.nfds = nfds;
			ret = q_sock_send(q, &w, fds, nfds, &qs.fdtag);
		}
		if (ret < 0) {
			q_unclaim(q, pos);
			q_unlock(q, locked);
			if (ret == -ETOOMANYREFS) {
				/*
				 * The kernel caps the fds a user has in flight
				 * in Unix sockets at RLIMIT_NOFILE: like a full
				 * ring, wait for receivers to take some.
				 */
				ret = q_wait(q, &hdr->con, seen, &hdr->swait,
					     dl);
				if (ret < 0)
					break;
				continue;
			}
			if (ret != -EAGAIN)
				break;
			/* The socket is full: wait for room. */
			if (deadline_expired(dl)) {
				ret = deadline_err(dl);
				break;
			}
			ret = wait_poll(&(struct pollfd){ .fd = q->sfd[0],
						.events = POLLOUT }, 1, dl);
			if (ret < 0)
				break;
			continue;
		}
		q_fill(q, pos, msg, len, &qs, nsegs, nfds);
		if (q_publish(q, pos, QS_FULL)) {
			q_unlock(q, locked);
			return 0;
		}
		/* Revoked: its socket messages are orphans receivers drop. */
		q_unlock(q, locked);
	}
	if (nsegs && !segs_locked && ops->q_send_undo)
		ops->q_send_undo(q, qs.h, nsegs);
	return ret;
}

static int q_send(struct tshm_queue *q, const void *msg, size_t len,
		  struct tshm_seg *const *segs, unsigned nsegs,
		  const int *fds, unsigned nfds, int timeout_ms)
{
	const struct backend_ops *ops;
	struct qhdr *hdr;
	struct qsegs qs;
	struct deadline dl;
	uint64_t pos;
	unsigned i;
	int ret;

	if (!q || (len && !msg) || (nsegs && !segs) || (nfds && !fds))
		return -EINVAL;
	if (len > q->max_msg)
		return -EMSGSIZE;
	if (nsegs > TSHM_QUEUE_MAX_SEGS || nfds > TSHM_QUEUE_MAX_FDS)
		return -E2BIG;
	if (!q_pidns_ok(q))
		return -EXDEV;
	for (i = 0; i < nsegs; i++) {
		if (!segs[i])
			return -EINVAL;
		if (segs[i]->ctx->ops != q->ctx->ops)
			return -EXDEV;
	}
	for (i = 0; i < nfds; i++)
		if (fcntl(fds[i], F_GETFD) < 0)
			return -EBADF;
	hdr = q->hdr;
	ops = q->ctx->ops;
	deadline_init(&dl, timeout_ms);
	if (atomic_load_explicit(&hdr->closed, memory_order_relaxed))
		return -EPIPE;
	if (nfds || (nsegs && ops->q_ordered)) {
		ret = q_send_locked(q, msg, len, segs, nsegs, fds, nfds, &dl);
		if (ret < 0)
			return ret;
	} else {
		/*
		 * The segments' passage does not depend on the slot (module:
		 * grants to the queue context): before the claim, and kept
		 * for the retry when the claim is revoked.
		 */
		if (nsegs) {
			ret = ops->q_send_segs(q, segs, nsegs, NULL, 0, qs.h,
					       &qs.tag);
			if (ret < 0)
				return ret;
		}
		do {
			ret = q_claim(q, &dl, &pos);
			if (ret < 0) {
				if (nsegs && ops->q_send_undo)
					ops->q_send_undo(q, qs.h, nsegs);
				return ret;
			}
			q_fill(q, pos, msg, len, &qs, nsegs, 0);
		} while (!q_publish(q, pos, QS_FULL));
	}
	q_wake(&hdr->pub, &hdr->rwait, false);
	q_poll_wake(q, false);
	return 0;
}

TSHM_EXPORT
int tshm_queue_send(struct tshm_queue *q, const void *msg, size_t len,
		    struct tshm_seg *const *segs, unsigned nsegs,
		    int timeout_ms)
{
	return q_send(q, msg, len, segs, nsegs, NULL, 0, timeout_ms);
}

TSHM_EXPORT
int tshm_queue_send_fds(struct tshm_queue *q, const void *msg, size_t len,
			struct tshm_seg *const *segs, unsigned nsegs,
			const int *fds, unsigned nfds, int timeout_ms)
{
	return q_send(q, msg, len, segs, nsegs, fds, nfds, timeout_ms);
}

/* What a receiver copied out of a FULL slot before taking it. */
struct qmsg {
	uint64_t pos;
	uint64_t state;
	uint32_t len;
	unsigned nsegs;
	unsigned nfds;
	uint64_t tag;
	uint64_t fdtag;
	struct tshm_handle h[TSHM_QUEUE_MAX_SEGS];
};

/*
 * Find the oldest message: 0 with @m's pos and state (FULL), else -EPIPE,
 * -EAGAIN / -ETIMEDOUT, -EINTR.  Passes over revoked claims, and revokes a
 * claim that stays unpublished for q_claim_bound_ns() (or whose thread is
 * gone).
 */
static int q_find(struct tshm_queue *q, struct deadline *dl, struct qmsg *m)
{
	int64_t d, now, stall_since, stalled, check;
	int64_t bound = q_claim_bound_ns(q->max_msg);
	struct qhdr *hdr = q->hdr;
	uint64_t h, w, next;
	struct deadline sub;
	struct qslot *slot;
	unsigned spins = 0;
	uint32_t seen, owner;
	int ret;

	for (;;) {
		seen = atomic_load(&hdr->pub);
		h = atomic_load(&hdr->head);
		slot = q_slot(q, h);
		w = atomic_load(&slot->state);
		d = qs_diff(w, h);
		if (d > 0) {
			/* Position h is taken or passed: move the hint. */
			q_advance(&hdr->head, h);
			if (++spins % 1024 == 0 && deadline_expired(dl))
				return deadline_err(dl);
			continue;
		}
		next = qs_make(QS_EMPTY, h + q->capacity);
		owner = qs_has_tid(w) ? qs_tid(w) : 0;
		if (d == 0) {
			switch (qs_kind(w)) {
			case QS_FULL:
				m->pos = h;
				m->state = w;
				return 0;
			case QS_QFULL:
				/* No message here: pass it, as a take would. */
				if (!q_tid_gone(owner))
					next = qs_make_tid(QS_QEMPTY,
							   h + q->capacity,
							   owner);
				if (q_cas(slot, w, next)) {
					q_advance(&hdr->head, h);
					q_wake(&hdr->con, &hdr->swait, false);
				}
				continue;
			case QS_CLAIMED:
				/*
				 * Since when this claim stands unpublished:
				 * remembered in @q across calls (a race
				 * between threads only moves the moment, and
				 * revoking a live claim costs it a retry).
				 */
				now = now_ns();
				if (atomic_load(&q->stall_w) != w) {
					stall_since = now;
					atomic_store(&q->stall_since,
						     stall_since);
					atomic_store(&q->stall_w, w);
				} else {
					stall_since =
						atomic_load(&q->stall_since);
				}
				stalled = now - stall_since;
				/*
				 * A claim is published within microseconds,
				 * and asking whether its thread died costs a
				 * kill() and a read of /proc: a receiver that
				 * waits asks only once the claim has stood
				 * QUEUE_DEAD_CHECK_NS (it sleeps until then).
				 */
				if ((dl->nowait ||
				     stalled >= QUEUE_DEAD_CHECK_NS) &&
				    q_tid_gone(owner)) {
					/* Its sender died before publishing. */
					if (q_cas(slot, w, next)) {
						q_advance(&hdr->head, h);
						q_wake(&hdr->con, &hdr->swait,
						       false);
					}
					continue;
				}
				if (stalled >= bound) {
					/* Stopped or slow: revoke the claim. */
					q_cas(slot, w, qs_make_tid(QS_QFULL, h,
								   owner));
					continue;
				}
				/*
				 * Wait for its publish, not past the moment
				 * of the next check.
				 */
				sub = *dl;
				check = stall_since +
					(stalled < QUEUE_DEAD_CHECK_NS ?
					 QUEUE_DEAD_CHECK_NS : bound);
				if (sub.ns > check)
					sub.ns = check;
				ret = q_wait(q, &hdr->pub, seen, &hdr->rwait,
					     &sub);
				if (ret == -ETIMEDOUT && !deadline_expired(dl))
					ret = 0;
				if (ret < 0)
					return ret;
				continue;
			default:
				break;
			}
		}
		/*
		 * EMPTY or QEMPTY: nothing at h yet.  When the tail is past
		 * h anyway, no sender will fill it at h: a hole to pass.
		 */
		if (d == 0 && atomic_load(&hdr->tail) > h) {
			if (qs_kind(w) == QS_QEMPTY && !q_tid_gone(owner))
				next = qs_make_tid(QS_QEMPTY, h + q->capacity,
						   owner);
			if (q_cas(slot, w, next))
				q_advance(&hdr->head, h);
			continue;
		}
		if (atomic_load(&hdr->closed)) {
			/*
			 * A message published at h, or a claim past it, after
			 * the look above and before the close: drain it first
			 * (found by the spin model, tests/model).
			 */
			if (atomic_load(&slot->state) != w ||
			    atomic_load(&hdr->tail) > h ||
			    atomic_load(&hdr->head) != h)
				continue;
			return -EPIPE;
		}
		if (q->pollable) {
			q_poll_arm(q);
			if (atomic_load(&slot->state) != w)
				continue;
		}
		/*
		 * About to idle: give back the grants batched by cache hits,
		 * so that their producers see the segments released.
		 */
		ctx_flush_drops(q->ctx);
		ret = q_wait(q, &hdr->pub, seen, &hdr->rwait, dl);
		if (ret < 0)
			return ret;
	}
}

/*
 * Copy the message @m found out of its slot: 0, -EBADMSG (malformed: the
 * caller takes it and reports it), -EMSGSIZE / -ENOBUFS (left queued).
 */
static int q_copy(struct tshm_queue *q, struct qmsg *m, void *buf, size_t cap,
		  size_t *len, unsigned room, unsigned *nsegs,
		  unsigned fdroom, unsigned *nfds)
{
	struct qslot *slot = q_slot(q, m->pos);
	struct qsegs *qs = q_slot_segs(q, slot);

	/* Everything read from the slot is checked against local limits. */
	m->len = slot->len;
	m->nsegs = slot->nsegs;
	m->nfds = slot->nfds;
	atomic_signal_fence(memory_order_seq_cst);
	if (m->len > q->max_msg || m->nsegs > TSHM_QUEUE_MAX_SEGS ||
	    m->nfds > TSHM_QUEUE_MAX_FDS)
		return -EBADMSG;
	if (m->len > cap) {
		if (len)
			*len = m->len;
		return -EMSGSIZE;
	}
	if (m->nsegs > room || m->nfds > fdroom) {
		if (nsegs)
			*nsegs = m->nsegs;
		if (nfds)
			*nfds = m->nfds;
		return -ENOBUFS;
	}
	if (m->len)
		memcpy(buf, slot->data, m->len);
	if (m->nsegs || m->nfds) {
		m->tag = qs->tag;
		m->fdtag = qs->fdtag;
		memcpy(m->h, qs->h, m->nsegs * sizeof(m->h[0]));
	}
	return 0;
}

/* Take the message: true when this receiver won it. */
static bool q_take(struct tshm_queue *q, const struct qmsg *m)
{
	struct qhdr *hdr = q->hdr;

	if (!q_cas(q_slot(q, m->pos), m->state,
		   qs_make(QS_EMPTY, m->pos + q->capacity)))
		return false;
	q_advance(&hdr->head, m->pos);
	q_wake(&hdr->con, &hdr->swait, false);
	return true;
}

/*
 * Under the segment lock, after q_recv_take: the message's own fds when
 * they travel alone (the module, or no segments).  0, 1 (gone: skip the
 * slot) or -EMFILE (nothing consumed).
 */
static int q_take_fds(struct tshm_queue *q, const struct qmsg *m, int *fds)
{
	int got[SCM_MAX_FDS];
	struct qwire w;
	int ret;

	ret = q_sock_take(q, m->fdtag, 0, m->nfds, &w, got);
	if (ret == 0)
		memcpy(fds, got, m->nfds * sizeof(*fds));
	return ret;
}

static void q_close_all(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

static int q_recv(struct tshm_queue *q, void *buf, size_t cap, size_t *len,
		  struct tshm_seg **segs, unsigned *nsegs, int *fds,
		  unsigned *nfds, int timeout_ms)
{
	unsigned room = nsegs ? *nsegs : 0, fdroom = nfds ? *nfds : 0, i;
	const struct backend_ops *ops;
	bool took, ordered, segs_locked;
	struct deadline dl;
	struct q_rx rx;
	struct qmsg m;
	int ret, fret, locked = 0;

	if (!q || (cap && !buf) || (room && !segs) || (fdroom && !fds))
		return -EINVAL;
	if (!q_pidns_ok(q))
		return -EXDEV;
	ops = q->ctx->ops;
	deadline_init(&dl, timeout_ms);
	for (;;) {
		ret = q_find(q, &dl, &m);
		if (ret < 0) {
			if (ret == -EPIPE)
				ctx_flush_drops(q->ctx);
			return ret;
		}
		ret = q_copy(q, &m, buf, cap, len, room, nsegs, fdroom, nfds);
		if (ret == -EBADMSG) {
			if (q_take(q, &m))
				return ret;
			continue;
		}
		if (ret < 0)
			return ret;
		if (!m.nsegs && !m.nfds) {
			if (q_take(q, &m))
				break;
			continue;
		}
		memset(&rx, 0, sizeof(rx));
		rx.n = m.nsegs;
		rx.tag = m.tag;
		rx.xfds = m.nfds;
		memcpy(rx.h, m.h, m.nsegs * sizeof(rx.h[0]));
		/*
		 * The socket gives up its messages in ring order only: only
		 * holders of the segment lock take slots that use it.
		 */
		segs_locked = m.nsegs && ops->q_ordered;
		ordered = segs_locked || m.nfds;
		if (ordered) {
			locked = q_lock(q, &dl);
			if (locked < 0)
				return locked;
			if (atomic_load(&q_slot(q, m.pos)->state) != m.state) {
				q_unlock(q, locked);
				continue;
			}
		}
		ret = m.nsegs ? ops->q_recv_take(q, &rx, segs) : 0;
		fret = 0;
		if (ret == 0 && m.nfds) {
			if (rx.taken) {
				/* With the segments': one socket message. */
				memcpy(fds, rx.xfd, m.nfds * sizeof(*fds));
			} else {
				fret = q_take_fds(q, &m, fds);
				if (fret < 0)
					ret = fret;	/* nothing was taken */
			}
		}
		if (ret < 0) {
			/* No room for the fds: the message stays. */
			if (ordered)
				q_unlock(q, locked);
			if (m.nsegs && ops->q_recv_undo)
				ops->q_recv_undo(q, &rx, segs);
			return ret;
		}
		took = q_take(q, &m);
		if (ordered && !segs_locked)
			q_unlock(q, locked);
		if (took && ret == 0 && m.nsegs && ops->q_recv_commit)
			ops->q_recv_commit(q, &rx, segs);
		if (segs_locked)
			q_unlock(q, locked);
		if (!took || ret == 1 || fret == 1) {
			if (m.nfds && ret == 0 && fret == 0)
				q_close_all(fds, m.nfds);
			if (!took && m.nsegs && ret == 0 && ops->q_recv_undo)
				ops->q_recv_undo(q, &rx, segs);
			if (took && ret == 0 && fret == 1) {
				/* Fds gone: the segments go too. */
				if (ops->q_recv_finish(q, &rx, segs) == 0)
					for (i = 0; i < m.nsegs; i++)
						tshm_seg_unref(segs[i]);
			}
			continue;	/* taken by another, or its fds are gone */
		}
		if (m.nsegs) {
			ret = ops->q_recv_finish(q, &rx, segs);
			if (ret < 0) {
				q_close_all(fds, m.nfds);
				return ret;
			}
		}
		break;
	}
	if (len)
		*len = m.len;
	if (nsegs)
		*nsegs = m.nsegs;
	if (nfds)
		*nfds = m.nfds;
	return 0;
}

TSHM_EXPORT
int tshm_queue_recv(struct tshm_queue *q, void *buf, size_t cap, size_t *len,
		    struct tshm_seg **segs, unsigned *nsegs, int timeout_ms)
{
	return q_recv(q, buf, cap, len, segs, nsegs, NULL, NULL, timeout_ms);
}

TSHM_EXPORT
int tshm_queue_recv_fds(struct tshm_queue *q, void *buf, size_t cap,
			size_t *len, struct tshm_seg **segs, unsigned *nsegs,
			int *fds, unsigned *nfds, int timeout_ms)
{
	return q_recv(q, buf, cap, len, segs, nsegs, fds, nfds, timeout_ms);
}

TSHM_EXPORT
int tshm_queue_close(struct tshm_queue *q)
{
	if (!q)
		return -EINVAL;
	atomic_store(&q->hdr->closed, 1);
	q_wake(&q->hdr->pub, &q->hdr->rwait, true);
	q_wake(&q->hdr->con, &q->hdr->swait, true);
	q_poll_wake(q, true);
	return 0;
}

TSHM_EXPORT
unsigned tshm_queue_len(struct tshm_queue *q)
{
	uint64_t head = atomic_load(&q->hdr->head);
	uint64_t tail = atomic_load(&q->hdr->tail);

	if (tail < head)
		return 0;
	return tail - head > q->capacity ? q->capacity : tail - head;
}

TSHM_EXPORT
unsigned tshm_queue_capacity(const struct tshm_queue *q)
{
	return q->capacity;
}

TSHM_EXPORT
size_t tshm_queue_max_msg(const struct tshm_queue *q)
{
	return q->max_msg;
}

TSHM_EXPORT
int tshm_queue_fd(struct tshm_queue *q)
{
	if (!q)
		return -EINVAL;
	if (!q->pollable) {
		q->pollable = true;
		/* Readable at first: the caller receives until -EAGAIN. */
		q_poll_wake(q, true);
	}
	return q->efd;
}

TSHM_EXPORT
int tshm_queue_set_wait(struct tshm_queue *q, enum tshm_wait policy,
			unsigned spin_us)
{
	if (!q || (unsigned)policy > TSHM_WAIT_SPIN)
		return -EINVAL;
	q->wait = policy;
	q->spin_us = spin_us ? spin_us : QUEUE_SPIN_US;
	return 0;
}

TSHM_EXPORT
const char *tshm_wait_name(enum tshm_wait policy)
{
	switch (policy) {
	case TSHM_WAIT_ADAPTIVE:
		return "adaptive";
	case TSHM_WAIT_FUTEX:
		return "futex";
	case TSHM_WAIT_SPIN:
		return "spin";
	}
	return "?";
}

/* ---- creation, attachment, lifetime ---- */

void q_close_fds(int fd, int gfd, const int *sfd, int efd)
{
	if (efd >= 0)
		close(efd);
	if (fd >= 0)
		close(fd);
	if (gfd >= 0)
		close(gfd);
	if (sfd[0] >= 0)
		close(sfd[0]);
	if (sfd[1] >= 0)
		close(sfd[1]);
}

/*
 * Map the ring behind @fd and check that its header describes a queue that
 * fits the mapping.  The fds pass to the queue on success only.
 */
int q_attach(struct tshm_ctx *ctx, int fd, int gfd, const int *sfd,
		    int efd, struct tshm_queue **out)
{
	struct tshm_queue *q;
	struct qhdr *hdr, geo;
	struct stat st;
	size_t need;
	void *map;
	int ret;

	/* The ring: a sealed memfd (it cannot shrink under us). */
	ret = memfd_check_sealed(fd, &st);
	if (ret < 0)
		return ret;
	if ((size_t)st.st_size < hdr_size() ||
	    (size_t)st.st_size > QUEUE_MAX_RING + hdr_size() + ctx->page_size)
		return -EBADMSG;
	map = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return -errno;
	hdr = map;
	/*
	 * Another process can change the header at any time: read it once
	 * into @geo, check that copy, and use only that copy from here on.
	 */
	memcpy(&geo, (const void *)hdr, offsetof(struct qhdr, lock));
	atomic_signal_fence(memory_order_seq_cst);
	need = hdr_size() + (size_t)geo.capacity * geo.slot_size;
	if (geo.magic != QUEUE_MAGIC || geo.version != QUEUE_VERSION ||
	    geo.capacity < 1 || geo.capacity > QUEUE_MAX_CAPACITY ||
	    geo.max_msg > QUEUE_MAX_MSG ||
	    geo.max_segs != TSHM_QUEUE_MAX_SEGS ||
	    geo.slot_size != slot_size_for(geo.max_msg) ||
	    geo.map_size != (uint64_t)st.st_size || need > (size_t)st.st_size) {
		munmap(map, st.st_size);
		return -EBADMSG;
	}
	if (ctx->ops->wire != geo.backend ||
	    (geo.pidns && q_pidns() && geo.pidns != q_pidns())) {
		munmap(map, st.st_size);
		return -EXDEV;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		munmap(map, st.st_size);
		return -ENOMEM;
	}
	atomic_init(&q->refs, 1);
	q->ctx = ctx_get(ctx);
	q->hdr = hdr;
	q->slots = (unsigned char *)map + hdr_size();
	q->map_size = st.st_size;
	q->capacity = geo.capacity;
	q->slot_size = geo.slot_size;
	q->max_msg = geo.max_msg;
	q->fd = fd;
	q->gfd = gfd;
	q->sfd[0] = sfd[0];
	q->sfd[1] = sfd[1];
	q->efd = efd;
	q->wait = TSHM_WAIT_ADAPTIVE;
	q->spin_us = QUEUE_SPIN_US;
	q->pidns = geo.pidns;
	pthread_mutex_lock(&ctx->qlock);
	q->ctx_next = ctx->queues;
	ctx->queues = q;
	pthread_mutex_unlock(&ctx->qlock);
	*out = q;
	return 0;
}

TSHM_EXPORT
int tshm_queue_create(struct tshm_ctx *ctx, unsigned capacity, size_t max_msg,
		      struct tshm_queue **out)
{
	int fd = -1, gfd = -1, sfd[2] = { -1, -1 }, efd = -1, ret;
	size_t slot_size, map_size;
	struct qhdr *hdr;

	if (!ctx || !out || capacity < 1 || capacity > QUEUE_MAX_CAPACITY ||
	    max_msg > QUEUE_MAX_MSG)
		return -EINVAL;
	slot_size = slot_size_for(max_msg);
	if ((size_t)capacity * slot_size > QUEUE_MAX_RING)
		return -E2BIG;
	map_size = ALIGN_UP(hdr_size() + capacity * slot_size, ctx->page_size);

	fd = memfd_create("tshm-queue", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, map_size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL))
		goto fail_errno;
	hdr = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (hdr == MAP_FAILED)
		goto fail_errno;
	hdr->magic = QUEUE_MAGIC;
	hdr->version = QUEUE_VERSION;
	hdr->backend = ctx->ops->wire;
	hdr->capacity = capacity;
	hdr->slot_size = slot_size;
	hdr->max_segs = TSHM_QUEUE_MAX_SEGS;
	hdr->max_msg = max_msg;
	hdr->map_size = map_size;
	hdr->pidns = q_pidns();
	ret = rlock_init(&hdr->lock);
	for (unsigned i = 0; i < capacity; i++) {
		struct qslot *slot = (struct qslot *)((unsigned char *)hdr +
						      hdr_size() +
						      i * slot_size);

		atomic_init(&slot->state, qs_make(QS_EMPTY, i));
	}
	munmap(hdr, map_size);
	if (ret < 0)
		goto fail;

	/* What carries the segments: the backend's. */
	ret = ctx->ops->q_open(&gfd, sfd);
	if (ret < 0)
		goto fail;
	efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (efd < 0)
		goto fail_errno;
	ret = q_attach(ctx, fd, gfd, sfd, efd, out);
	if (ret < 0)
		goto fail;
	return 0;
fail_errno:
	ret = -errno;
fail:
	q_close_fds(fd, gfd, sfd, efd);
	return ret;
}

TSHM_EXPORT
struct tshm_queue *tshm_queue_ref(struct tshm_queue *q)
{
	atomic_fetch_add_explicit(&q->refs, 1, memory_order_relaxed);
	return q;
}

TSHM_EXPORT
void tshm_queue_unref(struct tshm_queue *q)
{
	struct tshm_ctx *ctx;
	struct tshm_queue **pp;

	if (!q || atomic_fetch_sub_explicit(&q->refs, 1,
					    memory_order_acq_rel) != 1)
		return;
	ctx = q->ctx;
	pthread_mutex_lock(&ctx->qlock);
	for (pp = &ctx->queues; *pp; pp = &(*pp)->ctx_next) {
		if (*pp == q) {
			*pp = q->ctx_next;
			break;
		}
	}
	pthread_mutex_unlock(&ctx->qlock);
	munmap(q->hdr, q->map_size);
	q_close_fds(q->fd, q->gfd, q->sfd, q->efd);
	ctx_put(q->ctx);
	free(q);
}

