// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * memfd-queue.c - segments through a queue on the fallback: each memfd and
 * its lease peer travel in the queue's socket (queue-sock.c), one socket
 * message per ring message, tagged and sent and received under the segment
 * lock so that socket order is ring order; the tag lets a receiver discard
 * what a dead or revoked sender left behind.  A receiver that already holds
 * every segment of a message, and is sent the keys it knows for them,
 * consumes the message without installing its fds
 * (Documentation/lib/queue.rst, "The fallback: fds of cached segments").
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "memfd.h"
#include "queue.h"

/* ---- the queue's transport: its socket pair alone ---- */

int memfd_q_open(int *gfd, int *sfd)
{
	return q_sock_open(sfd);
}

int memfd_q_fds(const struct tshm_queue *q, int *fds)
{
	fds[0] = q->sfd[0];
	fds[1] = q->sfd[1];
	return 2;
}

int memfd_q_check_fds(const int *fds, unsigned n, int *gfd, int *sfd)
{
	if (n != 2)
		return -EBADMSG;
	return q_sock_check(fds, sfd);
}

/* ---- send ---- */

/*
 * Under the segment lock: the memfds and lease peers in one message tagged
 * with the slot's new tag, so that socket order is ring order.
 */
int memfd_q_send_segs(struct tshm_queue *q, struct tshm_seg *const *segs,
		      unsigned nsegs, const int *xfds, unsigned nxfds,
		      struct tshm_handle *h, uint64_t *tag)
{
	struct tshm_lease *lease[TSHM_QUEUE_MAX_SEGS];
	int fds[SCM_MAX_FDS];
	struct qwire w = { .nsegs = nsegs, .nfds = 2 * nsegs + nxfds };
	unsigned i, n;
	int ret = 0;

	for (n = 0; n < nsegs; n++) {
		ret = lease_get(segs[n], &lease[n]);
		if (ret < 0)
			goto out;
		fds[2 * n] = segs[n]->fd;
		fds[2 * n + 1] = lease[n]->fd;
		w.gen[n] = lease[n]->gen;
		w.ino[n] = segs[n]->id;
		w.key[n] = atomic_load(&segs[n]->qkey);
		h[n].id = segs[n]->id;
		h[n].grants = 0;
		h[n].flags = 0;
	}
	if (nxfds)
		memcpy(fds + 2 * nsegs, xfds, nxfds * sizeof(*fds));
	ret = q_sock_send(q, &w, fds, 2 * nsegs + nxfds, tag);
out:
	for (i = 0; i < n; i++)
		lease_put(lease[i]);
	return ret;
}

/*
 * Does this process hold segment @i of @w, with the lease the message
 * carries?  Then the message's fds for it would only be closed again.
 * The inode number says which segment, and the key that it is one the
 * sender was sent or made: a key is only ever disclosed with the memfd,
 * so a sender cannot name a segment of ours that it does not hold.  The
 * lease must be ours already (the creator, or a holder of the same
 * generation), as memfd_seg_adopt() would leave it.  @*out gets a
 * reference whatever the answer.
 */
static bool held_one(struct tshm_ctx *ctx, const struct qwire *w,
		     unsigned i, struct tshm_seg **out)
{
	struct tshm_seg *seg;
	bool held;

	*out = NULL;
	if (!w->key[i])
		return false;
	seg = seg_cache_find(ctx, w->ino[i]);
	if (!seg)
		return false;
	*out = seg;
	/* Under @lease_lock: the creator draws a new key there. */
	pthread_mutex_lock(&seg->lease_lock);
	held = atomic_load(&seg->qkey) == w->key[i] &&
	       (seg->creator || (seg->lease && seg->lease->gen == w->gen[i]));
	pthread_mutex_unlock(&seg->lease_lock);
	return held;
}

/*
 * Under the segment lock: if every segment of the message peeked at, @w,
 * is held here, consume it without its fds and put the segments in @segs
 * (a reference each).  1: taken so; 0: its fds are needed; 2: what was
 * consumed was not that message (only a reader outside the lock could
 * make it so): the slot must be skipped.
 */
static int held_all(struct tshm_queue *q, struct q_rx *rx,
		    const struct qwire *w, struct tshm_seg **segs)
{
	unsigned i, n = 0;
	bool held = !rx->xfds && w->nsegs == rx->n && w->nfds == 2 * rx->n;
	int ret = 0;

	while (held && n < rx->n) {
		held = held_one(q->ctx, w, n, &segs[n]);
		if (segs[n])
			n++;
	}
	if (held) {
		if (q_sock_skip(q, rx->tag) == 0) {
			rx->held = rx->taken = true;
			return 1;
		}
		ret = 2;
	}
	for (i = 0; i < n; i++)
		tshm_seg_unref(segs[i]);
	return ret;
}

/*
 * Fetch the fds of the message tagged @rx->tag: its segments' and its
 * own, unless every segment is held here already (held_all()).  1: they
 * are gone (a receiver died holding them), the slot must be skipped.
 * -EMFILE: no room for them in this process; nothing was consumed.
 */
static int recv_fds(struct tshm_queue *q, struct q_rx *rx,
		    struct tshm_seg **segs)
{
	unsigned nsegs = rx->n, n = 2 * nsegs + rx->xfds;
	int fds[SCM_MAX_FDS];
	struct qwire w;
	int ret;

	ret = q_sock_find(q, rx->tag, &w);
	if (ret)
		return ret;
	ret = held_all(q, rx, &w, segs);
	if (ret)
		return ret == 1 ? 0 : 1;
	ret = q_sock_take_found(q, rx->tag, nsegs, n, &w, fds);
	if (ret)
		return ret;
	memcpy(rx->gen, w.gen, nsegs * sizeof(rx->gen[0]));
	memcpy(rx->key, w.key, nsegs * sizeof(rx->key[0]));
	memcpy(rx->fds, fds, 2 * nsegs * sizeof(*fds));
	memcpy(rx->xfd, fds + 2 * nsegs, rx->xfds * sizeof(*fds));
	rx->taken = true;
	return 0;
}

static int adopt_fds(struct tshm_queue *q, unsigned nsegs, int *fds,
		     const uint64_t *gen, const uint64_t *key,
		     struct tshm_seg **segs)
{
	unsigned i, j;
	int ret = 0;

	for (i = 0; i < nsegs; i++) {
		ret = memfd_seg_adopt(q->ctx, fds[2 * i], fds[2 * i + 1],
				      gen[i], &segs[i]);
		if (ret < 0)
			break;
		/* The memfd says what it is; the creator's key stands. */
		if (!segs[i]->creator)
			atomic_store(&segs[i]->qkey, key[i]);
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

/* Under the segment lock, before the commit. */
int memfd_q_recv_take(struct tshm_queue *q, struct q_rx *rx,
		      struct tshm_seg **segs)
{
	return recv_fds(q, rx, segs);
}

/* After the commit, unlocked. */
int memfd_q_recv_finish(struct tshm_queue *q, struct q_rx *rx,
			struct tshm_seg **segs)
{
	if (rx->held)
		return 0;	/* @segs set by held_all() */
	return adopt_fds(q, rx->n, rx->fds, rx->gen, rx->key, segs);
}

/*
 * The message was not taken after all: drop what its socket message gave,
 * the segments' fds or the references held_all() took (its own fds,
 * @rx->xfd, are the queue's to close).
 */
void memfd_q_recv_undo(struct tshm_queue *q, struct q_rx *rx,
		       struct tshm_seg **segs)
{
	unsigned i;

	if (!rx->taken)
		return;
	if (rx->held) {
		for (i = 0; i < rx->n; i++)
			tshm_seg_unref(segs[i]);
	} else {
		for (i = 0; i < 2 * rx->n; i++)
			close(rx->fds[i]);
	}
	rx->taken = rx->held = false;
}
