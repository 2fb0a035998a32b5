// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * queue.c - bounded MPMC queues in shared memory.
 *
 * The ring lives in a sealed memfd: a header, then @capacity fixed-size
 * slots.  One robust, process-shared mutex serializes senders and receivers;
 * every change to the ring commits with a single store (tail for a send,
 * head for a receive) made while holding it, so a holder SIGKILLed at any
 * instruction leaves a consistent ring and the next locker only has to call
 * pthread_mutex_consistent().  Waiting happens outside the lock, spinning
 * and then sleeping on futex words that senders and receivers bump after
 * each change.
 *
 * Segments never go through the ring as memory: only their ids.  On the
 * module the sender grants each segment to the queue's own /dev/tshm
 * context, so the kernel holds every in-flight reference, and the receiver
 * attaches by id (or finds the segment in its cache and gives the grant back
 * later).  On the fallback the fds travel in a SEQPACKET socket owned by the
 * queue, sent and received under the same lock so that socket order is ring
 * order; each socket message carries a tag that names its slot, which lets a
 * receiver discard what a dead sender left behind.  Documentation/lib/
 * queue.rst has the whole argument.
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

#include "tshm-private.h"

#define QUEUE_MAGIC		0x51485354U	/* "TSHQ" */
#define QUEUE_VERSION		4
#define QUEUE_MAX_CAPACITY	65536U
#define QUEUE_MAX_MSG		(16UL << 20)
#define QUEUE_MAX_RING		(1UL << 30)
#define QUEUE_SPIN_US		50
#define QUEUE_LOCK_SPINS	64
#define QUEUE_SNDBUF		(8 << 20)
#define CACHELINE		64
/* Module: the spare-grant table (Documentation/lib/queue.rst). */
#define QUEUE_SPARES		64
#define QUEUE_SPARE_PROBE	8

/*
 * @avail grants for segment @id that the queue context holds and no message
 * in the ring accounts for: a sender takes one instead of a GRANT.  An entry
 * with @avail 0 is free.  Only the lock holder touches the table.
 */
struct qspare {
	uint64_t id;
	uint32_t avail;
	uint32_t __pad;
};

struct qhdr {
	/* Written once by the creator; every process keeps its own copy. */
	uint32_t magic;
	uint32_t version;
	uint32_t backend;
	uint32_t capacity;
	uint32_t slot_size;
	uint32_t max_segs;
	uint64_t max_msg;
	uint64_t map_size;

	/* The lock and the state only its holder changes. */
	pthread_mutex_t lock __attribute__((aligned(CACHELINE)));
	/*
	 * Waiting for the lock: @lockseq moves at every unlock; @lockwait is
	 * set by a sleeper and cleared by the unlocker that wakes it.  The
	 * sleeps are sliced, so a holder that dies (no unlock, no wake) is
	 * noticed by the next trylock (EOWNERDEAD) within a slice.
	 */
	_Atomic uint32_t lockseq;
	_Atomic uint32_t lockwait;
	_Atomic uint32_t closed;
	uint64_t tag;			/* fallback: last socket tag used */

	_Atomic uint64_t head __attribute__((aligned(CACHELINE)));
	_Atomic uint64_t tail __attribute__((aligned(CACHELINE)));

	/*
	 * Futex words: bumped after every publish / consume / close.  The
	 * waiters words are a flag, not a count: a sleeper sets it, the waker
	 * that finds it set clears it and wakes everyone, and the sleepers
	 * that must sleep again set it again.  One that dies asleep leaves at
	 * most one needless wake-up behind.
	 */
	_Atomic uint32_t pub __attribute__((aligned(CACHELINE)));
	_Atomic uint32_t rwait;		/* receivers may sleep on @pub */
	_Atomic uint32_t pollwait;	/* a poller armed the eventfd */
	_Atomic uint32_t con __attribute__((aligned(CACHELINE)));
	_Atomic uint32_t swait;		/* senders may sleep on @con */

	/* Module: spare grants, changed under @lock only. */
	struct qspare spare[QUEUE_SPARES] __attribute__((aligned(CACHELINE)));
} __attribute__((aligned(CACHELINE)));

struct qslot {
	uint64_t pos;			/* the position this slot holds */
	uint64_t tag;			/* fallback: its socket message */
	uint32_t len;
	uint32_t nsegs;
	uint64_t __pad;
	struct tshm_handle h[TSHM_QUEUE_MAX_SEGS];
	unsigned char data[];
};

/* What travels through the fallback's socket next to the fds. */
struct qwire {
	uint64_t tag;
	uint32_t nsegs;
	uint32_t __pad;
	uint64_t gen[TSHM_QUEUE_MAX_SEGS];
};

struct tshm_queue {
	atomic_int refs;
	struct tshm_ctx *ctx;
	struct tshm_queue *ctx_next;	/* ctx->queues, under ctx->qlock */
	struct qhdr *hdr;
	unsigned char *slots;
	size_t map_size;
	/* Local copies of the geometry: shared memory is never trusted. */
	uint32_t capacity;
	uint32_t slot_size;
	size_t max_msg;
	int fd;				/* the ring's memfd */
	int gfd;			/* module: the queue's context */
	int sfd[2];			/* fallback: send end, receive end */
	int efd;			/* tshm_queue_fd(): an eventfd */
	bool pollable;			/* this process polls @efd */
	enum tshm_wait wait;
	unsigned spin_us;
};

static size_t slot_size_for(size_t max_msg)
{
	return ALIGN_UP(sizeof(struct qslot) + max_msg, CACHELINE);
}

static size_t hdr_size(void)
{
	return ALIGN_UP(sizeof(struct qhdr), CACHELINE);
}

static struct qslot *q_slot(struct tshm_queue *q, uint64_t pos)
{
	return (struct qslot *)(q->slots + (pos % q->capacity) * q->slot_size);
}

int queue_grant_fd(const struct tshm_queue *q)
{
	return q->gfd;
}

/*
 * The fds that make the queue, in the order they travel: the ring, the
 * module context or the fallback's two socket ends, the eventfd.
 */
#define QUEUE_MAX_FDS	4

static int q_fds(const struct tshm_queue *q, int *fds)
{
	int n = 0;

	fds[n++] = q->fd;
	if (q->ctx->backend == TSHM_BACKEND_KMOD) {
		fds[n++] = q->gfd;
	} else {
		fds[n++] = q->sfd[0];
		fds[n++] = q->sfd[1];
	}
	fds[n++] = q->efd;
	return n;
}

/* A published message or a close: ring the eventfd if a poller armed it. */
static void q_poll_wake(struct tshm_queue *q, bool force)
{
	uint64_t one = 1;

	if (force || (atomic_load(&q->hdr->pollwait) &&
		      atomic_exchange(&q->hdr->pollwait, 0))) {
		if (write(q->efd, &one, sizeof(one)) < 0) {
			/* Saturated: it is readable anyway. */
		}
	}
}

/* Under the lock, the ring found empty: make the next publish ring. */
static void q_poll_arm(struct tshm_queue *q)
{
	uint64_t v;

	if (read(q->efd, &v, sizeof(v)) < 0) {
		/* Nothing pending. */
	}
	atomic_store(&q->hdr->pollwait, 1);
}

/* ---- spare grants (module) ---- */

static unsigned spare_home(uint64_t id)
{
	id ^= id >> 31;
	id *= 0x7fb5d329728ea185ULL;
	id ^= id >> 27;
	return id % QUEUE_SPARES;
}

/*
 * Under the queue lock.  The entry with spares for @id, or NULL.  Every
 * index is bounded locally, whatever the shared memory holds.
 */
static struct qspare *q_spare_find(struct tshm_queue *q, uint64_t id)
{
	unsigned h = spare_home(id), i;

	for (i = 0; i < QUEUE_SPARE_PROBE; i++) {
		struct qspare *e = &q->hdr->spare[(h + i) % QUEUE_SPARES];

		if (e->avail && e->id == id)
			return e;
	}
	return NULL;
}

/* Under the queue lock: take a parked grant for @id.  false: none. */
static bool q_spare_take(struct tshm_queue *q, uint64_t id)
{
	struct qspare *e = q_spare_find(q, id);

	if (!e)
		return false;
	e->avail--;
	return true;
}

/*
 * Under the queue lock: park one grant for @id that a receiver did not
 * consume.  false: the table has no room near @id's home.
 */
static bool q_spare_put(struct tshm_queue *q, uint64_t id)
{
	struct qspare *e = q_spare_find(q, id), *slot = NULL;
	unsigned h = spare_home(id), i;

	if (e) {
		if (e->avail == UINT32_MAX)
			return false;
		e->avail++;
		return true;
	}
	for (i = 0; i < QUEUE_SPARE_PROBE && !slot; i++) {
		e = &q->hdr->spare[(h + i) % QUEUE_SPARES];
		if (!e->avail)
			slot = e;
	}
	if (!slot)
		return false;
	slot->id = id;
	slot->avail = 1;
	return true;
}

static int q_lock(struct tshm_queue *q, const struct deadline *dl);
static void q_unlock(struct tshm_queue *q, bool recovered);

/* Give back the grants parked for @id in @q's table. */
static void q_reclaim_spares(struct tshm_queue *q, uint64_t id)
{
	struct qspare *e;
	struct deadline dl;
	uint32_t n = 0;
	int ret;

	deadline_init(&dl, -1);
	ret = q_lock(q, &dl);
	if (ret < 0)
		return;
	e = q_spare_find(q, id);
	if (e) {
		/* The table first: killed before the DROP, we only leak. */
		n = e->avail;
		e->avail = 0;
	}
	q_unlock(q, ret);
	if (n)
		kmod_drop(q->gfd, id, n);
}

void ctx_reclaim_spares(struct tshm_ctx *ctx, uint64_t id)
{
	struct tshm_queue *one[16], **qs = one, *q;
	unsigned n = 0, i;

	/* Queue locks are never taken under ctx->qlock: collect, then lock. */
	pthread_mutex_lock(&ctx->qlock);
	for (q = ctx->queues; q; q = q->ctx_next)
		n++;
	if (n > ARRAY_SIZE(one)) {
		qs = malloc(n * sizeof(*qs));
		if (!qs) {
			pthread_mutex_unlock(&ctx->qlock);
			return;
		}
	}
	for (i = 0, q = ctx->queues; q; q = q->ctx_next) {
		/* One on its way out (refs 0) is not resurrected. */
		int refs = atomic_load_explicit(&q->refs, memory_order_relaxed);

		while (refs > 0) {
			if (atomic_compare_exchange_weak(&q->refs, &refs,
							 refs + 1)) {
				qs[i++] = q;
				break;
			}
		}
	}
	n = i;
	pthread_mutex_unlock(&ctx->qlock);
	for (i = 0; i < n; i++) {
		q_reclaim_spares(qs[i], id);
		tshm_queue_unref(qs[i]);
	}
	if (qs != one)
		free(qs);
}

/* ---- locking and waiting ---- */

/*
 * 0 locked, 1 locked after a dead holder, < 0: -EAGAIN / -ETIMEDOUT at @dl,
 * -EINTR, or the lock's error.  Never pthread_mutex_lock(): its wait
 * honours neither a deadline nor a signal, and the holder may be a stopped
 * process.
 */
static int q_lock(struct tshm_queue *q, const struct deadline *dl)
{
	struct qhdr *hdr = q->hdr;
	uint32_t seen;
	unsigned i;
	int ret;

	for (i = 0;; i++) {
		seen = atomic_load(&hdr->lockseq);
		ret = pthread_mutex_trylock(&hdr->lock);
		if (likely(ret == 0))
			return 0;
		if (ret == EOWNERDEAD) {
			/*
			 * The holder died inside send or recv.  Its changes
			 * commit with one store to head or tail, and nothing
			 * it wrote past them is visible, so the ring is
			 * consistent as it is.
			 */
			pthread_mutex_consistent(&hdr->lock);
			return 1;
		}
		if (ret != EBUSY)
			return -ret;
		if (i < QUEUE_LOCK_SPINS) {
			cpu_relax();
			continue;
		}
		if (deadline_expired(dl))
			return deadline_err(dl);
		atomic_store(&hdr->lockwait, 1);
		if (atomic_load(&hdr->lockseq) != seen)
			continue;
		ret = futex_wait_slice(&hdr->lockseq, seen, dl);
		if (ret == -EINTR)
			return ret;
	}
}

static void q_wake(_Atomic uint32_t *word, _Atomic uint32_t *waiters,
		   bool force)
{
	atomic_fetch_add(word, 1);
	if (force || (atomic_load(waiters) && atomic_exchange(waiters, 0)))
		futex_wake_all(word);
}

static void q_unlock(struct tshm_queue *q, bool recovered)
{
	pthread_mutex_unlock(&q->hdr->lock);
	q_wake(&q->hdr->lockseq, &q->hdr->lockwait, false);
	if (unlikely(recovered)) {
		/* The dead holder may have owed someone a wake-up. */
		q_wake(&q->hdr->pub, &q->hdr->rwait, true);
		q_wake(&q->hdr->con, &q->hdr->swait, true);
	}
}

/*
 * Wait until *@word moves from @seen, or for one sleep slice: 0 (the caller
 * re-checks the ring), -EAGAIN / -ETIMEDOUT, -EINTR.  The slice is what
 * makes a waker that died between its commit and its wake-up harmless.
 */
static int q_wait(struct tshm_queue *q, _Atomic uint32_t *word, uint32_t seen,
		  _Atomic uint32_t *waiters, const struct deadline *dl)
{
	int64_t until, t;
	unsigned i = 0;

	if (dl->nowait)
		return -EAGAIN;
	if (q->wait != TSHM_WAIT_FUTEX) {
		until = dl->ns;
		if (q->wait == TSHM_WAIT_ADAPTIVE) {
			t = now_ns() + (int64_t)q->spin_us * 1000;
			if (t < until)
				until = t;
		}
		for (;;) {
			if (atomic_load_explicit(word, memory_order_acquire) !=
			    seen)
				return 0;
			cpu_relax();
			if ((++i & 127) == 0) {
				t = now_ns();
				if (t >= dl->ns)
					return -ETIMEDOUT;
				if (t >= until)
					break;
			}
		}
	}
	atomic_store(waiters, 1);
	if (atomic_load(word) != seen)
		return 0;
	return futex_wait_slice(word, seen, dl);
}

/* ---- backend halves of send and receive ---- */

/*
 * Under the queue lock: one grant to the queue context per segment, taken
 * from the spares a receiver parked when it can (no system call), else a
 * GRANT.  Either way the message carries one kernel grant per segment.
 */
static int q_grant_segs(struct tshm_queue *q, struct qslot *slot,
			struct tshm_seg *const *segs, unsigned nsegs)
{
	bool took[TSHM_QUEUE_MAX_SEGS];
	unsigned i;
	int ret;

	for (i = 0; i < nsegs; i++) {
		if (!atomic_load_explicit(&segs[i]->spare_touched,
					  memory_order_relaxed))
			atomic_store(&segs[i]->spare_touched, true);
		took[i] = q_spare_take(q, segs[i]->id);
		ret = took[i] ? 0 : kmod_grant(segs[i]->fd, q->gfd, 1);
		if (ret < 0) {
			while (i--) {
				if (took[i])
					q_spare_put(q, segs[i]->id);
				else
					kmod_drop(q->gfd, segs[i]->id, 1);
			}
			return ret;
		}
		slot->h[i].id = segs[i]->id;
		slot->h[i].grants = 1;
		slot->h[i].flags = 0;
	}
	return 0;
}

static int q_send_fds(struct tshm_queue *q, struct qslot *slot,
		      struct tshm_seg *const *segs, unsigned nsegs)
{
	struct tshm_lease *lease[TSHM_QUEUE_MAX_SEGS];
	int fds[2 * TSHM_QUEUE_MAX_SEGS];
	struct qwire w = { .nsegs = nsegs };
	unsigned i, n;
	int ret = 0;

	for (n = 0; n < nsegs; n++) {
		ret = seg_lease_get(segs[n], &lease[n]);
		if (ret < 0)
			goto out;
		fds[2 * n] = segs[n]->fd;
		fds[2 * n + 1] = lease[n]->fd;
		w.gen[n] = lease[n]->gen;
		slot->h[n].id = segs[n]->id;
		slot->h[n].grants = 0;
		slot->h[n].flags = 0;
	}
	/* The tag is spent before the send: a retry never reuses it. */
	w.tag = ++q->hdr->tag;
	ret = fd_send(q->sfd[0], &w, sizeof(w), fds, 2 * nsegs, MSG_DONTWAIT);
	if (ret == 0)
		slot->tag = w.tag;
out:
	for (i = 0; i < n; i++)
		lease_put(lease[i]);
	return ret;
}

/*
 * Fetch the fds of the message tagged @tag, discarding older messages that
 * dead senders left behind.  1: they are gone (a receiver died holding
 * them), the slot must be skipped.  -EMFILE: no room for them in this
 * process; nothing was consumed.
 */
static int q_recv_fds(struct tshm_queue *q, uint64_t tag, unsigned nsegs,
		      int *fds, uint64_t *gen)
{
	struct qwire w;
	unsigned nfds, i;
	ssize_t n;
	int ret;

	for (;;) {
		n = recv(q->sfd[1], &w, sizeof(w), MSG_PEEK | MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n != sizeof(w) || w.tag > tag)
			return 1;
		/*
		 * Out of fds, recvmsg() would take the message and drop its
		 * fds (MSG_CTRUNC): check first, and leave it queued.
		 */
		if (w.tag == tag) {
			ret = fd_reserve(q->sfd[1], 2 * nsegs);
			if (ret < 0)
				return ret;
		}
		nfds = 2 * TSHM_QUEUE_MAX_SEGS;
		n = fd_recv(q->sfd[1], &w, sizeof(w), fds, &nfds, MSG_DONTWAIT);
		if (n < 0 && n != -EBADMSG)
			return 1;
		if (n == sizeof(w) && w.tag == tag && w.nsegs == nsegs &&
		    nfds == 2 * nsegs) {
			memcpy(gen, w.gen, nsegs * sizeof(*gen));
			return 0;
		}
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		if (n == sizeof(w) && w.tag == tag)
			return 1;
	}
}

/*
 * Under the queue lock, before the commit: look the message's segments up
 * in this process's cache.  @segs[i] gets a reference on a hit, NULL on a
 * miss.
 */
static void q_lookup_segs(struct tshm_queue *q, const struct tshm_handle *h,
			  unsigned nsegs, struct tshm_seg **segs)
{
	struct tshm_ctx *ctx = q->ctx;
	unsigned i;

	pthread_mutex_lock(&ctx->lock);
	for (i = 0; i < nsegs; i++)
		segs[i] = seg_cache_lookup_locked(ctx, h[i].id);
	pthread_mutex_unlock(&ctx->lock);
}

/*
 * Under the queue lock, before the commit: room for the fds the cache
 * misses of @segs will ATTACH (0 or -EMFILE).
 */
static int q_reserve_attach_fds(struct tshm_queue *q, struct tshm_seg **segs,
				unsigned nsegs)
{
	unsigned i, miss = 0;

	for (i = 0; i < nsegs; i++)
		miss += !segs[i];
	return miss ? fd_reserve(q->fd, miss) : 0;
}

/*
 * Under the queue lock, after the commit: the grants that hits did not
 * consume become spares in the table (bit i of the result: no room, the
 * caller batches that grant for a DROP instead).
 */
static unsigned q_park_hits(struct tshm_queue *q, const struct tshm_handle *h,
			    unsigned nsegs, struct tshm_seg **segs)
{
	unsigned i, overflow = 0;

	for (i = 0; i < nsegs; i++) {
		if (!segs[i])
			continue;
		if (q_spare_put(q, h[i].id))
			atomic_store(&segs[i]->spare_touched, true);
		else
			overflow |= 1U << i;
	}
	return overflow;
}

/*
 * After the commit, unlocked: attach what the cache did not have (each
 * ATTACH consumes the message's grant for that segment).
 */
static int q_attach_segs(struct tshm_queue *q, const struct tshm_handle *h,
			 unsigned nsegs, struct tshm_seg **segs,
			 unsigned overflow)
{
	struct tshm_ctx *ctx = q->ctx;
	unsigned i, j;
	size_t size;
	bool hit, attached = false;
	int fd, ret = 0;

	for (i = 0; i < nsegs; i++) {
		if (segs[i]) {
			/* Held already: no system call. */
			if (overflow & (1U << i))
				seg_note_unconsumed_grant(segs[i], q);
			continue;
		}
		ret = kmod_attach(q->gfd, h[i].id, &fd, &size);
		attached = ret == 0;
		if (ret == 0)
			ret = seg_adopt(ctx, fd, h[i].id, size, &segs[i], &hit);
		if (ret < 0)
			break;
	}
	if (ret == 0)
		return 0;
	/*
	 * Give back the grants the message carried for @i (when the ATTACH
	 * that would have consumed it failed, unless the kernel says there
	 * is none) and for the rest: left with the queue context, outside
	 * the spare table, they would keep the producer's release wait and
	 * pool waiting for ever.
	 */
	if (!attached && ret != -ENOENT)
		kmod_drop(q->gfd, h[i].id, 1);
	for (j = i + 1; j < nsegs; j++) {
		if (!segs[j])
			kmod_drop(q->gfd, h[j].id, 1);
		else if (overflow & (1U << j))
			seg_note_unconsumed_grant(segs[j], q);
	}
	for (j = 0; j < nsegs; j++)
		if (j != i && segs[j])
			tshm_seg_unref(segs[j]);
	return ret == -ENOENT ? -EBADMSG : ret;
}

static int q_adopt_fds(struct tshm_queue *q, unsigned nsegs, int *fds,
		       const uint64_t *gen, struct tshm_seg **segs)
{
	unsigned i, j;
	uint64_t id;
	size_t size;
	bool hit;
	int ret = 0;

	for (i = 0; i < nsegs; i++) {
		ret = memfd_seg_check(q->ctx, fds[2 * i], &id, &size);
		if (ret == 0)
			ret = fd_check_socket(fds[2 * i + 1], SOCK_SEQPACKET);
		if (ret == 0)
			ret = seg_adopt(q->ctx, fds[2 * i], id, size, &segs[i],
					&hit);
		else
			close(fds[2 * i]);
		if (ret < 0) {
			close(fds[2 * i + 1]);
			break;
		}
		seg_lease_received(segs[i], fds[2 * i + 1], gen[i]);
	}
	if (ret == 0)
		return 0;
	for (j = i + 1; j < nsegs; j++) {
		close(fds[2 * j]);
		close(fds[2 * j + 1]);
	}
	while (i--)
		tshm_seg_unref(segs[i]);
	return ret;
}

/* ---- send and receive ---- */

TSHM_EXPORT
int tshm_queue_send(struct tshm_queue *q, const void *msg, size_t len,
		    struct tshm_seg *const *segs, unsigned nsegs,
		    int timeout_ms)
{
	struct qhdr *hdr;
	struct qslot *slot;
	struct deadline dl;
	uint64_t head, tail;
	bool recovered;
	uint32_t seen;
	unsigned i;
	int ret;

	if (!q || (len && !msg) || (nsegs && !segs))
		return -EINVAL;
	if (len > q->max_msg)
		return -EMSGSIZE;
	if (nsegs > TSHM_QUEUE_MAX_SEGS)
		return -E2BIG;
	for (i = 0; i < nsegs; i++) {
		if (!segs[i])
			return -EINVAL;
		if (segs[i]->ctx->backend != q->ctx->backend)
			return -EXDEV;
	}
	hdr = q->hdr;
	deadline_init(&dl, timeout_ms);
	for (;;) {
		ret = q_lock(q, &dl);
		if (ret < 0)
			return ret;
		recovered = ret;
		seen = atomic_load(&hdr->con);
		if (atomic_load_explicit(&hdr->closed, memory_order_relaxed)) {
			q_unlock(q, recovered);
			return -EPIPE;
		}
		head = atomic_load_explicit(&hdr->head, memory_order_relaxed);
		tail = atomic_load_explicit(&hdr->tail, memory_order_relaxed);
		if (tail - head < q->capacity) {
			slot = q_slot(q, tail);
			if (!nsegs)
				ret = 0;
			else if (q->ctx->backend == TSHM_BACKEND_KMOD)
				ret = q_grant_segs(q, slot, segs, nsegs);
			else
				ret = q_send_fds(q, slot, segs, nsegs);
			if (ret == 0)
				break;
			q_unlock(q, recovered);
			if (ret == -ETOOMANYREFS) {
				/*
				 * The kernel caps the fds a user has in flight
				 * in Unix sockets at RLIMIT_NOFILE: like a full
				 * ring, wait for receivers to take some.
				 */
				ret = q_wait(q, &hdr->con, seen, &hdr->swait,
					     &dl);
				if (ret < 0)
					return ret;
				continue;
			}
			if (ret != -EAGAIN)
				return ret;
			/* The fallback's socket is full: wait for room. */
			if (deadline_expired(&dl))
				return deadline_err(&dl);
			ret = wait_poll(&(struct pollfd){ .fd = q->sfd[0],
						.events = POLLOUT }, 1, &dl);
			if (ret < 0)
				return ret;
			continue;
		}
		q_unlock(q, recovered);
		ret = q_wait(q, &hdr->con, seen, &hdr->swait, &dl);
		if (ret < 0)
			return ret;
	}
	slot->len = len;
	slot->nsegs = nsegs;
	if (len)
		memcpy(slot->data, msg, len);
	slot->pos = tail;
	/* The commit: the message exists once tail moves past it. */
	atomic_store_explicit(&hdr->tail, tail + 1, memory_order_release);
	q_unlock(q, recovered);
	q_wake(&hdr->pub, &hdr->rwait, false);
	q_poll_wake(q, false);
	return 0;
}

TSHM_EXPORT
int tshm_queue_recv(struct tshm_queue *q, void *buf, size_t cap, size_t *len,
		    struct tshm_seg **segs, unsigned *nsegs, int timeout_ms)
{
	struct tshm_handle h[TSHM_QUEUE_MAX_SEGS];
	uint64_t gen[TSHM_QUEUE_MAX_SEGS];
	int fds[2 * TSHM_QUEUE_MAX_SEGS];
	unsigned room = nsegs ? *nsegs : 0, n, overflow = 0;
	bool kmod = q && q->ctx->backend == TSHM_BACKEND_KMOD;
	struct qhdr *hdr;
	struct qslot *slot;
	struct deadline dl;
	uint64_t head, tail;
	bool recovered;
	uint32_t seen, mlen;
	int ret;

	if (!q || (cap && !buf) || (room && !segs))
		return -EINVAL;
	hdr = q->hdr;
	deadline_init(&dl, timeout_ms);
again:
	for (;;) {
		ret = q_lock(q, &dl);
		if (ret < 0)
			return ret;
		recovered = ret;
		seen = atomic_load(&hdr->pub);
		head = atomic_load_explicit(&hdr->head, memory_order_relaxed);
		tail = atomic_load_explicit(&hdr->tail, memory_order_relaxed);
		if (head != tail)
			break;
		if (atomic_load_explicit(&hdr->closed, memory_order_relaxed)) {
			q_unlock(q, recovered);
			ctx_flush_drops(q->ctx);
			return -EPIPE;
		}
		if (q->pollable)
			q_poll_arm(q);
		q_unlock(q, recovered);
		/*
		 * About to idle: give back the grants batched by cache hits,
		 * so that their producers see the segments released.
		 */
		ctx_flush_drops(q->ctx);
		ret = q_wait(q, &hdr->pub, seen, &hdr->rwait, &dl);
		if (ret < 0)
			return ret;
	}

	/* Everything read from the slot is checked against local limits. */
	slot = q_slot(q, head);
	mlen = slot->len;
	n = slot->nsegs;
	if (slot->pos != head || mlen > q->max_msg ||
	    n > TSHM_QUEUE_MAX_SEGS) {
		ret = -EBADMSG;
		goto consume;
	}
	if (mlen > cap) {
		if (len)
			*len = mlen;
		q_unlock(q, recovered);
		return -EMSGSIZE;
	}
	if (n > room) {
		if (nsegs)
			*nsegs = n;
		q_unlock(q, recovered);
		return -ENOBUFS;
	}
	if (mlen)
		memcpy(buf, slot->data, mlen);
	memcpy(h, slot->h, n * sizeof(h[0]));
	ret = 0;
	if (n && kmod) {
		q_lookup_segs(q, h, n, segs);
		/* Each cache miss ATTACHes after the commit: one fd each. */
		ret = q_reserve_attach_fds(q, segs, n);
	} else if (n) {
		ret = q_recv_fds(q, slot->tag, n, fds, gen);
	}
	if (ret < 0) {
		/* No room for the segments' fds: the message stays. */
		q_unlock(q, recovered);
		for (unsigned i = 0; kmod && i < n; i++)
			tshm_seg_unref(segs[i]);
		return ret;
	}
consume:
	/* The commit: the message is taken once head moves past it. */
	atomic_store_explicit(&hdr->head, head + 1, memory_order_release);
	/*
	 * Then park what hits did not consume.  Killed between the two, the
	 * grants stay with the queue context unaccounted: a leak until the
	 * queue goes, never a spare that does not exist.
	 */
	if (ret == 0 && n && kmod)
		overflow = q_park_hits(q, h, n, segs);
	q_unlock(q, recovered);
	q_wake(&hdr->con, &hdr->swait, false);
	if (ret == 1)
		goto again;	/* a dead receiver took it: skip */
	if (ret < 0)
		return ret;

	if (n) {
		if (kmod)
			ret = q_attach_segs(q, h, n, segs, overflow);
		else
			ret = q_adopt_fds(q, n, fds, gen, segs);
		if (ret < 0)
			return ret;
	}
	if (len)
		*len = mlen;
	if (nsegs)
		*nsegs = n;
	return 0;
}

TSHM_EXPORT
int tshm_queue_close(struct tshm_queue *q)
{
	struct deadline dl;
	int ret;

	if (!q)
		return -EINVAL;
	deadline_init(&dl, -1);
	ret = q_lock(q, &dl);
	if (ret < 0)
		return ret;
	atomic_store(&q->hdr->closed, 1);
	q_unlock(q, ret);
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

static void q_close_fds(int fd, int gfd, const int *sfd, int efd)
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
static int q_attach(struct tshm_ctx *ctx, int fd, int gfd, const int *sfd,
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
	if (geo.backend != (uint32_t)ctx->backend) {
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
	if (ctx->backend == TSHM_BACKEND_KMOD) {
		pthread_mutex_lock(&ctx->qlock);
		q->ctx_next = ctx->queues;
		ctx->queues = q;
		pthread_mutex_unlock(&ctx->qlock);
	}
	*out = q;
	return 0;
}

TSHM_EXPORT
int tshm_queue_create(struct tshm_ctx *ctx, unsigned capacity, size_t max_msg,
		      struct tshm_queue **out)
{
	int fd = -1, gfd = -1, sfd[2] = { -1, -1 }, efd = -1, ret;
	int sndbuf = QUEUE_SNDBUF;
	pthread_mutexattr_t attr;
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
	hdr->backend = ctx->backend;
	hdr->capacity = capacity;
	hdr->slot_size = slot_size;
	hdr->max_segs = TSHM_QUEUE_MAX_SEGS;
	hdr->max_msg = max_msg;
	hdr->map_size = map_size;
	pthread_mutexattr_init(&attr);
	pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
	ret = -pthread_mutex_init(&hdr->lock, &attr);
	pthread_mutexattr_destroy(&attr);
	munmap(hdr, map_size);
	if (ret < 0)
		goto fail;

	if (ctx->backend == TSHM_BACKEND_KMOD) {
		/* In-flight grants belong to a context of the queue's own. */
		gfd = kmod_open();
		if (gfd < 0) {
			ret = gfd;
			goto fail;
		}
	} else {
		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sfd))
			goto fail_errno;
		/* Best effort: wmem_max caps it for unprivileged callers. */
		setsockopt(sfd[0], SOL_SOCKET, SO_SNDBUF, &sndbuf,
			   sizeof(sndbuf));
		shutdown(sfd[0], SHUT_RD);
		shutdown(sfd[1], SHUT_WR);
	}
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
	if (ctx->backend == TSHM_BACKEND_KMOD) {
		pthread_mutex_lock(&ctx->qlock);
		for (pp = &ctx->queues; *pp; pp = &(*pp)->ctx_next) {
			if (*pp == q) {
				*pp = q->ctx_next;
				break;
			}
		}
		pthread_mutex_unlock(&ctx->qlock);
	}
	munmap(q->hdr, q->map_size);
	q_close_fds(q->fd, q->gfd, q->sfd, q->efd);
	ctx_put(q->ctx);
	free(q);
}

/* ---- handing a queue to another process ---- */

#define QDESC_PREFIX	"tshm-queue:2:"

/* Async-signal-safe: no stdio, no allocation. */
static char *put_str(char *p, char *end, const char *s)
{
	while (*s && p < end)
		*p++ = *s++;
	return p;
}

static char *put_uint(char *p, char *end, unsigned v)
{
	char tmp[12];
	int n = 0;

	do {
		tmp[n++] = '0' + v % 10;
		v /= 10;
	} while (v);
	while (n && p < end)
		*p++ = tmp[--n];
	return p;
}

TSHM_EXPORT
int tshm_queue_export(struct tshm_queue *q, char *buf, size_t len)
{
	int fds[QUEUE_MAX_FDS], nfds, i;
	char *p, *end;

	if (!q || !buf || len < 2)
		return -EINVAL;
	nfds = q_fds(q, fds);
	p = buf;
	end = buf + len - 1;
	p = put_str(p, end, QDESC_PREFIX);
	p = put_str(p, end, tshm_ctx_backend(q->ctx));
	p = put_str(p, end, ":");
	for (i = 0; i < nfds; i++) {
		if (i)
			p = put_str(p, end, ",");
		p = put_uint(p, end, fds[i]);
	}
	if (p >= end)
		return -ENOSPC;
	*p = '\0';
	for (i = 0; i < nfds; i++)
		if (fcntl(fds[i], F_SETFD, 0) < 0)
			return -errno;
	return 0;
}

static int parse_fds(const char *s, int *fds, int max)
{
	int n = 0;
	char *end;
	long v;

	for (;;) {
		if (n == max)
			return -EINVAL;
		v = strtol(s, &end, 10);
		if (end == s || v < 0 || v > 1 << 30)
			return -EINVAL;
		fds[n++] = v;
		if (*end == '\0')
			return n;
		if (*end != ',')
			return -EINVAL;
		s = end + 1;
	}
}

static int q_adopt_fds_checked(struct tshm_ctx *ctx, int *fds, int nfds,
			       struct tshm_queue **out)
{
	int none[2] = { -1, -1 }, i, ret;

	for (i = 0; i < nfds; i++)
		if (fcntl(fds[i], F_GETFD) < 0)
			return -EBADF;
	if (nfds < 3)
		return -EBADMSG;
	ret = fd_check_eventfd(fds[nfds - 1]);
	if (ret < 0)
		return ret;
	if (ctx->backend == TSHM_BACKEND_KMOD) {
		if (nfds != 3)
			return -EBADMSG;
		ret = kmod_is_ctx_fd(fds[1]);
		if (ret <= 0)
			return ret < 0 ? ret : -EBADMSG;
		ret = q_attach(ctx, fds[0], fds[1], none, fds[2], out);
	} else {
		if (nfds != 4)
			return -EBADMSG;
		for (i = 1; i < 3; i++) {
			ret = fd_check_socket(fds[i], SOCK_SEQPACKET);
			if (ret < 0)
				return ret;
		}
		ret = q_attach(ctx, fds[0], -1, fds + 1, fds[3], out);
	}
	if (ret < 0)
		return ret;
	for (i = 0; i < nfds; i++)
		fcntl(fds[i], F_SETFD, FD_CLOEXEC);
	return 0;
}

TSHM_EXPORT
int tshm_queue_import(struct tshm_ctx *ctx, const char *desc,
		      struct tshm_queue **out)
{
	const char *p;
	size_t blen;
	int fds[QUEUE_MAX_FDS], nfds;

	if (!ctx || !desc || !out)
		return -EINVAL;
	if (strncmp(desc, QDESC_PREFIX, strlen(QDESC_PREFIX)))
		return -EINVAL;
	p = desc + strlen(QDESC_PREFIX);
	blen = strcspn(p, ":");
	if (p[blen] != ':')
		return -EINVAL;
	if (strlen(tshm_ctx_backend(ctx)) != blen ||
	    strncmp(p, tshm_ctx_backend(ctx), blen)) {
		if ((blen == 4 && !strncmp(p, "kmod", 4)) ||
		    (blen == 5 && !strncmp(p, "memfd", 5)))
			return -EXDEV;
		return -EINVAL;
	}
	nfds = parse_fds(p + blen + 1, fds, QUEUE_MAX_FDS);
	if (nfds < 0)
		return nfds;
	return q_adopt_fds_checked(ctx, fds, nfds, out);
}

#define QWIRE_MAGIC	0x46515354U	/* "TSQF" */

TSHM_EXPORT
int tshm_queue_send_fd(struct tshm_queue *q, int sock)
{
	int fds[QUEUE_MAX_FDS], nfds;
	uint32_t w[2];

	if (!q || sock < 0)
		return -EINVAL;
	w[0] = QWIRE_MAGIC;
	w[1] = q->ctx->backend;
	nfds = q_fds(q, fds);
	return fd_send(sock, w, sizeof(w), fds, nfds, 0);
}

TSHM_EXPORT
int tshm_queue_recv_fd(struct tshm_ctx *ctx, int sock, struct tshm_queue **out)
{
	unsigned nfds = QUEUE_MAX_FDS, i;
	int fds[QUEUE_MAX_FDS], ret;
	uint32_t w[2];
	ssize_t n;

	if (!ctx || sock < 0 || !out)
		return -EINVAL;
	n = fd_recv(sock, w, sizeof(w), fds, &nfds, 0);
	if (n < 0)
		return n;
	if (n == 0 && nfds == 0)
		return -EPIPE;
	if (n != sizeof(w) || w[0] != QWIRE_MAGIC)
		ret = -EBADMSG;
	else if (w[1] != (uint32_t)ctx->backend)
		ret = -EXDEV;
	else
		ret = q_adopt_fds_checked(ctx, fds, nfds, out);
	if (ret < 0)
		for (i = 0; i < nfds; i++)
			close(fds[i]);
	return ret;
}
