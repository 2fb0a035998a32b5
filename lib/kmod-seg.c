// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * kmod-seg.c - segments on the module: passing them as grants, the grants
 * a receiver batches before giving them back, and the release wait (poll()
 * on the creator's segment fd).  Locking: the drop state of a segment is
 * under ctx->lock; queue locks are never taken under it.
 */
#include <errno.h>
#include <unistd.h>

#include "kmod.h"

/* Unconsumed grants a receiver batches before giving them back. */
#define DROP_BATCH	64

int kmod_seg_grant(struct tshm_seg *seg, int ctx_fd, int count)
{
	if (seg->fd >= 0)
		return kmod_grant(seg->fd, ctx_fd, count);
	return kmod_grant_addr(seg->data, ctx_fd, count);
}

static void flush_drops_locked(struct tshm_seg *seg)
{
	struct tshm_seg **pp;
	int fd;

	if (!seg->drop_count)
		return;
	for (pp = &seg->ctx->drops; *pp; pp = &(*pp)->drop_next) {
		if (*pp == seg) {
			*pp = seg->drop_next;
			break;
		}
	}
	fd = seg->drop_q ? queue_grant_fd(seg->drop_q) : seg->ctx->fd;
	/*
	 * Nothing useful can be done if this fails: the grants then stay with
	 * their context until it is closed.
	 */
	kmod_drop(fd, seg->id, seg->drop_count);
	seg->drop_count = 0;
	if (seg->drop_q) {
		tshm_queue_unref(seg->drop_q);
		seg->drop_q = NULL;
	}
}

static void flush_drops(struct tshm_seg *seg)
{
	pthread_mutex_lock(&seg->ctx->lock);
	flush_drops_locked(seg);
	pthread_mutex_unlock(&seg->ctx->lock);
}

void kmod_ctx_idle(struct tshm_ctx *ctx)
{
	if (!ctx->drops)
		return;
	pthread_mutex_lock(&ctx->lock);
	while (ctx->drops)
		flush_drops_locked(ctx->drops);
	pthread_mutex_unlock(&ctx->lock);
}

void kmod_note_unconsumed_grant(struct tshm_seg *seg, struct tshm_queue *q)
{
	pthread_mutex_lock(&seg->ctx->lock);
	if (seg->drop_count && seg->drop_q != q)
		flush_drops_locked(seg);
	if (!seg->drop_count) {
		if (q)
			seg->drop_q = tshm_queue_ref(q);
		seg->drop_next = seg->ctx->drops;
		seg->ctx->drops = seg;
	}
	if (++seg->drop_count >= DROP_BATCH)
		flush_drops_locked(seg);
	pthread_mutex_unlock(&seg->ctx->lock);
}

/*
 * The mapping is the holder (it keeps the file the fd was open on), so a
 * received segment needs no fd: a process may hold thousands under
 * RLIMIT_NOFILE.  It is passed on by the mapping's address (GRANT_BY_ADDR).
 */
void kmod_seg_adopted(struct tshm_seg *seg)
{
	close(seg->fd);
	seg->fd = -1;
}

void kmod_seg_destroy(struct tshm_seg *seg)
{
	/*
	 * Spare grants this process parked or used in queue tables: nobody
	 * here can hit them in the cache any more, so give them back now
	 * (the producer's release notification waits for them).
	 */
	if (atomic_load_explicit(&seg->spare_touched, memory_order_relaxed))
		kmod_reclaim_spares(seg->ctx, seg->id);
	flush_drops(seg);
}

int kmod_seg_released_now(struct tshm_seg *seg)
{
	struct pollfd pfd = { .fd = seg->fd, .events = POLLIN };

	if (seg->fd < 0)
		return -EOPNOTSUPP;	/* received: held by its mapping */
	flush_drops(seg);
	/*
	 * Spare grants parked in queues look like holders: give back those
	 * of every queue this process has, whoever parked them (a receiver
	 * that died or exited holding the segment, for one).
	 */
	kmod_reclaim_spares(seg->ctx, seg->id);
	if (poll(&pfd, 1, 0) < 0)
		return -errno;
	return !!(pfd.revents & POLLIN);
}

int kmod_seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd,
			     unsigned n)
{
	if (n < 1 || seg->fd < 0)
		return 0;
	/*
	 * Grants this process did not consume (it hit its own cache) and
	 * has not given back yet, and spare grants parked in its queues'
	 * tables, look like holders to the fd: give them back first, or the
	 * fd cannot say "released" (no system call when there are none).
	 */
	flush_drops(seg);
	if (atomic_load_explicit(&seg->spare_touched, memory_order_relaxed))
		kmod_reclaim_spares(seg->ctx, seg->id);
	pfd[0].fd = seg->fd;
	pfd[0].events = POLLIN;
	return 1;
}

int kmod_seg_export(struct tshm_seg *seg, struct tshm_handle *h)
{
	int ret = kmod_seg_grant(seg, seg->ctx->fd, 1);

	if (ret < 0)
		return ret;
	h->id = seg->id;
	h->grants = 1;
	h->flags = 0;
	return 0;
}

int kmod_seg_import(struct tshm_ctx *ctx, const struct tshm_handle *h,
		    struct tshm_seg **out)
{
	struct tshm_seg *seg = seg_cache_find(ctx, h->id);
	size_t size;
	bool hit;
	int fd, ret;

	if (seg) {
		/* Held already: no system call; the grant goes back later. */
		kmod_note_unconsumed_grant(seg, NULL);
		*out = seg;
		return 0;
	}
	ret = kmod_attach(ctx->fd, h->id, &fd, &size);
	if (ret < 0)
		return ret;
	return seg_adopt(ctx, fd, h->id, size, out, &hit);
}

/*
 * Passing the segment fd itself would share this process's open file, and
 * so its holder, with the receiver: release notification could not see the
 * receiver.  Pass a transfer context holding one grant instead; the
 * receiver attaches through it (its own holder) and closes it.  Lost in
 * flight or with a dead receiver, the grant goes with the context.
 */
int kmod_seg_send_fd(struct tshm_seg *seg, int sock, struct seg_wire *w)
{
	int tfd = kmod_open(), ret;

	if (tfd < 0)
		return tfd;
	ret = kmod_seg_grant(seg, tfd, 1);
	w->gen = seg->id;
	if (ret == 0)
		ret = fd_send(sock, w, sizeof(*w), &tfd, 1, 0);
	close(tfd);
	return ret;
}

/* A transfer context with one grant for segment w->gen. */
int kmod_seg_recv_fd(struct tshm_ctx *ctx, const struct seg_wire *w,
		     int *fds, struct tshm_seg **out)
{
	struct tshm_seg *seg;
	int tfd = fds[0], fd, ret;
	size_t size;
	bool hit;

	ret = kmod_is_ctx_fd(tfd);
	if (ret <= 0) {
		close(tfd);
		return ret < 0 ? ret : -EBADMSG;
	}
	seg = seg_cache_find(ctx, w->gen);
	ret = 0;
	if (!seg) {
		ret = kmod_attach(tfd, w->gen, &fd, &size);
		if (ret == 0)
			ret = seg_adopt(ctx, fd, w->gen, size, &seg, &hit);
	}
	close(tfd);	/* an unused grant goes with it */
	if (ret < 0)
		return ret;
	*out = seg;
	return 0;
}
