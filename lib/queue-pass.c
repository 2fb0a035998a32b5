// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * queue-pass.c - segments through a queue.  Module: one grant per segment
 * to the queue's own context, taken from the spare table when a receiver
 * parked one, consumed by the receiver's ATTACH or parked again on a cache
 * hit.  Fallback: the memfd and its lease peer in the queue's SEQPACKET
 * socket, tagged with the slot, received under the ring lock.  Called by
 * queue.c with the ring lock held unless a function says otherwise.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "queue.h"

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
bool q_spare_take(struct tshm_queue *q, uint64_t id)
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
bool q_spare_put(struct tshm_queue *q, uint64_t id)
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

/* ---- backend halves of send and receive ---- */

/*
 * Under the queue lock: one grant to the queue context per segment, taken
 * from the spares a receiver parked when it can (no system call), else a
 * GRANT.  Either way the message carries one kernel grant per segment.
 */
int q_grant_segs(struct tshm_queue *q, struct qslot *slot,
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
		ret = took[i] ? 0 : seg_grant(segs[i], q->gfd, 1);
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

int q_send_fds(struct tshm_queue *q, struct qslot *slot,
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
int q_recv_fds(struct tshm_queue *q, uint64_t tag, unsigned nsegs,
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
void q_lookup_segs(struct tshm_queue *q, const struct tshm_handle *h,
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
int q_reserve_attach_fds(struct tshm_queue *q, struct tshm_seg **segs,
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
unsigned q_park_hits(struct tshm_queue *q, const struct tshm_handle *h,
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
int q_attach_segs(struct tshm_queue *q, const struct tshm_handle *h,
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

int q_adopt_fds(struct tshm_queue *q, unsigned nsegs, int *fds,
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

