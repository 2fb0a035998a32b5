// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * kmod-queue.c - segments through a queue on the module: one grant per
 * segment to the queue's own context, taken from the spare table when a
 * receiver parked one, consumed by the receiver's ATTACH or parked again on
 * a cache hit (Documentation/lib/queue.rst).  Called by queue.c with no
 * lock held (but q_recv_take of a message that also carries fds, which
 * touches no table): the spare table is changed under the queue's segment
 * lock only, and only ever tried for (a busy lock costs a GRANT or a DROP,
 * never a wait on a holder that may be stopped).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kmod.h"
#include "queue.h"

/* ---- spare grants ---- */

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
static struct qspare *spare_find(struct tshm_queue *q, uint64_t id)
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
static bool spare_take(struct tshm_queue *q, uint64_t id)
{
	struct qspare *e = spare_find(q, id);

	if (!e)
		return false;
	e->avail--;
	return true;
}

/*
 * Under the queue lock: park one grant for @id that a receiver did not
 * consume.  false: the table has no room near @id's home.
 */
static bool spare_put(struct tshm_queue *q, uint64_t id)
{
	struct qspare *e = spare_find(q, id), *slot = NULL;
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

/* Give back the grants parked for @id in @q's table. */
static void reclaim_spares(struct tshm_queue *q, uint64_t id)
{
	struct qspare *e;
	struct deadline dl;
	uint32_t n = 0;
	int ret;

	deadline_init(&dl, -1);
	ret = q_lock(q, &dl);
	if (ret < 0)
		return;
	e = spare_find(q, id);
	if (e) {
		/* The table first: killed before the DROP, we only leak. */
		n = e->avail;
		e->avail = 0;
	}
	q_unlock(q, ret);
	if (n)
		kmod_drop(q->gfd, id, n);
}

void kmod_reclaim_spares(struct tshm_ctx *ctx, uint64_t id)
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
		reclaim_spares(qs[i], id);
		tshm_queue_unref(qs[i]);
	}
	if (qs != one)
		free(qs);
}

/* ---- the queue's transport: a module context of its own ---- */

/* In-flight grants belong to a context of the queue's own. */
int kmod_q_open(int *gfd, int *sfd)
{
	int fd = kmod_open(), ret;

	if (fd < 0)
		return fd;
	/* The socket carries tshm_queue_send_fds()'s fds (queue-sock.c). */
	ret = q_sock_open(sfd);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	*gfd = fd;
	return 0;
}

int kmod_q_fds(const struct tshm_queue *q, int *fds)
{
	fds[0] = q->gfd;
	fds[1] = q->sfd[0];
	fds[2] = q->sfd[1];
	return 3;
}

int kmod_q_check_fds(const int *fds, unsigned n, int *gfd, int *sfd)
{
	int ret;

	if (n != 3)
		return -EBADMSG;
	ret = kmod_is_ctx_fd(fds[0]);
	if (ret <= 0)
		return ret < 0 ? ret : -EBADMSG;
	ret = q_sock_check(fds + 1, sfd);
	if (ret < 0)
		return ret;
	*gfd = fds[0];
	return 0;
}

/* ---- send ---- */

/*
 * Before the claim: one grant to the queue context per segment, taken from
 * the spares a receiver parked when the table is free (no system call),
 * else a GRANT.  Either way the message carries one kernel grant per
 * segment.
 */
int kmod_q_send_segs(struct tshm_queue *q, struct tshm_seg *const *segs,
		     unsigned nsegs, const int *xfds, unsigned nxfds,
		     struct tshm_handle *h, uint64_t *tag)
{
	bool took[TSHM_QUEUE_MAX_SEGS];
	int locked = q_trylock(q);
	unsigned i;
	int ret = 0;

	for (i = 0; i < nsegs; i++) {
		if (!atomic_load_explicit(&segs[i]->spare_touched,
					  memory_order_relaxed))
			atomic_store(&segs[i]->spare_touched, true);
		took[i] = locked >= 0 && spare_take(q, segs[i]->id);
		ret = took[i] ? 0 : kmod_seg_grant(segs[i], q->gfd, 1);
		if (ret < 0) {
			while (i--) {
				if (took[i])
					spare_put(q, segs[i]->id);
				else
					kmod_drop(q->gfd, segs[i]->id, 1);
			}
			break;
		}
		h[i].id = segs[i]->id;
		h[i].grants = 1;
		h[i].flags = 0;
	}
	if (locked >= 0)
		q_unlock(q, locked);
	return ret;
}

/* The message was not sent (timeout, close): give its grants back. */
void kmod_q_send_undo(struct tshm_queue *q, const struct tshm_handle *h,
		      unsigned nsegs)
{
	for (unsigned i = 0; i < nsegs; i++)
		kmod_drop(q->gfd, h[i].id, 1);
}

/* ---- receive ---- */

/*
 * Before the commit: look the message's segments up
 * in this process's cache (@segs[i] gets a reference on a hit, NULL on a
 * miss), and check there is room for the fds the misses will ATTACH
 * (-EMFILE leaves the message queued).
 */
int kmod_q_recv_take(struct tshm_queue *q, struct q_rx *rx,
		     struct tshm_seg **segs)
{
	struct tshm_ctx *ctx = q->ctx;
	unsigned i, miss = 0;

	pthread_mutex_lock(&ctx->lock);
	for (i = 0; i < rx->n; i++) {
		segs[i] = seg_cache_lookup_locked(ctx, rx->h[i].id);
		miss += !segs[i];
	}
	pthread_mutex_unlock(&ctx->lock);
	rx->overflow = 0;
	/* ATTACHes after the commit, with the message's own fds held. */
	return miss + rx->xfds ? fd_reserve(q->fd, miss + rx->xfds) : 0;
}

void kmod_q_recv_undo(struct tshm_queue *q, struct q_rx *rx,
		      struct tshm_seg **segs)
{
	for (unsigned i = 0; i < rx->n; i++)
		tshm_seg_unref(segs[i]);
}

/*
 * After the commit: the grants that hits did not consume become spares in
 * the table (bit i of @rx->overflow: no room, or the table's lock busy,
 * the grant is batched for a DROP instead).  Killed before this, the
 * grants stay with the queue context unaccounted: a leak until the queue
 * goes, never a spare that does not exist.
 */
void kmod_q_recv_commit(struct tshm_queue *q, struct q_rx *rx,
			struct tshm_seg **segs)
{
	int locked = q_trylock(q);
	unsigned i;

	for (i = 0; i < rx->n; i++) {
		if (!segs[i])
			continue;
		if (locked >= 0 && spare_put(q, rx->h[i].id))
			atomic_store(&segs[i]->spare_touched, true);
		else
			rx->overflow |= 1U << i;
	}
	if (locked >= 0)
		q_unlock(q, locked);
}

/*
 * After the commit, unlocked: attach what the cache did not have (each
 * ATTACH consumes the message's grant for that segment).
 */
int kmod_q_recv_finish(struct tshm_queue *q, struct q_rx *rx,
		       struct tshm_seg **segs)
{
	const struct tshm_handle *h = rx->h;
	unsigned i, j, nsegs = rx->n, overflow = rx->overflow;
	struct tshm_ctx *ctx = q->ctx;
	bool hit, attached = false;
	size_t size;
	int fd, ret = 0;

	for (i = 0; i < nsegs; i++) {
		if (segs[i]) {
			/* Held already: no system call. */
			if (overflow & (1U << i))
				kmod_note_unconsumed_grant(segs[i], q);
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
			kmod_note_unconsumed_grant(segs[j], q);
	}
	for (j = 0; j < nsegs; j++)
		if (j != i && segs[j])
			tshm_seg_unref(segs[j]);
	return ret == -ENOENT ? -EBADMSG : ret;
}
