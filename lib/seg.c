// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * seg.c - segments: creation, mapping, the per-context cache of attached
 * segments, and the public calls for release notification and handle
 * passing, which the context's backend carries out (kmod-seg.c,
 * memfd-lease.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tshm-private.h"

static unsigned bucket(uint64_t id)
{
	id ^= id >> 33;
	id *= 0xff51afd7ed558ccdULL;
	id ^= id >> 33;
	return id % TSHM_CACHE_BUCKETS;
}

struct tshm_seg *seg_cache_lookup_locked(struct tshm_ctx *ctx, uint64_t id)
{
	uint64_t gen = ctx_gen(ctx);
	struct tshm_seg *seg;

	for (seg = ctx->cache[bucket(id)]; seg; seg = seg->hnext) {
		int refs;

		if (seg->id != id || seg->gen != gen)
			continue;
		/* A segment on its way out (refs 0) is not resurrected. */
		refs = atomic_load_explicit(&seg->refs, memory_order_relaxed);
		while (refs > 0) {
			if (atomic_compare_exchange_weak(&seg->refs, &refs,
							 refs + 1))
				return seg;
		}
	}
	return NULL;
}

void seg_cache_insert_locked(struct tshm_ctx *ctx, struct tshm_seg *seg)
{
	unsigned b = bucket(seg->id);

	seg->hnext = ctx->cache[b];
	ctx->cache[b] = seg;
}

struct tshm_seg *seg_cache_find(struct tshm_ctx *ctx, uint64_t id)
{
	struct tshm_seg *seg;

	pthread_mutex_lock(&ctx->lock);
	seg = seg_cache_lookup_locked(ctx, id);
	pthread_mutex_unlock(&ctx->lock);
	return seg;
}

static void seg_cache_remove_locked(struct tshm_ctx *ctx, struct tshm_seg *seg)
{
	struct tshm_seg **pp;

	for (pp = &ctx->cache[bucket(seg->id)]; *pp; pp = &(*pp)->hnext) {
		if (*pp == seg) {
			*pp = seg->hnext;
			return;
		}
	}
}

static int seg_new(struct tshm_ctx *ctx, int fd, uint64_t id, size_t size,
		   struct tshm_seg **out)
{
	struct tshm_seg *seg;
	void *data;

	if (!size)
		return -EBADMSG;
	data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (data == MAP_FAILED)
		return -errno;
	seg = calloc(1, sizeof(*seg));
	if (!seg) {
		munmap(data, size);
		return -ENOMEM;
	}
	atomic_init(&seg->refs, 1);
	seg->ctx = ctx_get(ctx);
	seg->gen = ctx_gen(ctx);
	seg->id = id;
	seg->data = data;
	seg->size = size;
	seg->fd = fd;
	pthread_mutex_init(&seg->lease_lock, NULL);
	*out = seg;
	return 0;
}

TSHM_EXPORT
int tshm_seg_create(struct tshm_ctx *ctx, size_t size, const char *name,
		    unsigned flags, struct tshm_seg **out)
{
	struct tshm_seg *seg;
	size_t mapsize;
	uint64_t id;
	int fd, ret;

	if (!ctx || !out || !size || size > (SIZE_MAX >> 1) ||
	    (flags & ~(TSHM_SEG_HUGE | TSHM_SEG_PREFAULT)))
		return -EINVAL;
	ret = ctx->ops->seg_create(ctx, size, name, flags, &fd, &id, &mapsize);
	if (ret < 0)
		return ret;
	ret = seg_new(ctx, fd, id, mapsize, &seg);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	seg->creator = true;
	if (name)
		strncpy(seg->name, name, TSHM_SEG_NAME_MAX);
	if (ctx->ops->seg_created)
		ctx->ops->seg_created(seg, flags);
	pthread_mutex_lock(&ctx->lock);
	seg_cache_insert_locked(ctx, seg);
	pthread_mutex_unlock(&ctx->lock);
	*out = seg;
	return 0;
}

int seg_adopt(struct tshm_ctx *ctx, int fd, uint64_t id, size_t size,
	      struct tshm_seg **out, bool *hit)
{
	char name[TSHM_SEG_NAME_MAX + 1];
	struct tshm_seg *seg;
	int ret;

	/*
	 * The name, read before the segment is shared, since the fd, which
	 * a mapping may outlive, may be closed after; or at the first
	 * tshm_seg_name() where the backend keeps the fd.
	 */
	name[0] = '\0';
	if (!ctx->ops->seg_name_lazy)
		ctx->ops->seg_name(fd, name, sizeof(name));
	pthread_mutex_lock(&ctx->lock);
	seg = seg_cache_lookup_locked(ctx, id);
	if (seg) {
		pthread_mutex_unlock(&ctx->lock);
		close(fd);
		*hit = true;
		*out = seg;
		return 0;
	}
	ret = seg_new(ctx, fd, id, size, &seg);
	if (ret == 0) {
		memcpy(seg->name, name, sizeof(seg->name));
		atomic_init(&seg->name_pending, ctx->ops->seg_name_lazy);
		if (ctx->ops->seg_adopted)
			ctx->ops->seg_adopted(seg);
		seg_cache_insert_locked(ctx, seg);
	}
	pthread_mutex_unlock(&ctx->lock);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	*hit = false;
	*out = seg;
	return 0;
}

int seg_released_now(struct tshm_seg *seg)
{
	return seg->ctx->ops->seg_released_now(seg);
}

int seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd, unsigned n)
{
	return seg->ctx->ops->seg_release_pollfds(seg, pfd, n);
}

TSHM_EXPORT
int tshm_seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd,
			     unsigned n)
{
	int ret;

	if (!seg || !pfd || !n)
		return -EINVAL;
	if (!seg->creator)
		return -EOPNOTSUPP;
	ret = seg_released_now(seg);
	if (ret)
		return ret < 0 ? ret : 0;
	/*
	 * A subset is enough: the segment cannot be released before every
	 * fd given here is ready, and the check that follows a wake-up
	 * reaps the ready ones, so the next fill names the others.
	 */
	return seg_release_pollfds(seg, pfd, n);
}

TSHM_EXPORT
int tshm_seg_wait_released(struct tshm_seg *seg, int timeout_ms)
{
	struct pollfd pfd[64];
	struct deadline dl;
	int ret, n;

	if (!seg)
		return -EINVAL;
	if (!seg->creator)
		return -EOPNOTSUPP;
	deadline_init(&dl, timeout_ms);
	for (;;) {
		ret = seg_released_now(seg);
		if (ret)
			return ret < 0 ? ret : 0;
		if (deadline_expired(&dl))
			return deadline_err(&dl);
		n = seg_release_pollfds(seg, pfd, ARRAY_SIZE(pfd));
		ret = wait_poll(pfd, n, &dl);
		if (ret < 0)
			return ret;
	}
}

TSHM_EXPORT
void *tshm_seg_data(struct tshm_seg *seg)
{
	return seg->data;
}

TSHM_EXPORT
size_t tshm_seg_size(const struct tshm_seg *seg)
{
	return seg->size;
}

TSHM_EXPORT
uint64_t tshm_seg_id(const struct tshm_seg *seg)
{
	return seg->id;
}

TSHM_EXPORT
const char *tshm_seg_name(const struct tshm_seg *seg)
{
	struct tshm_seg *s = (struct tshm_seg *)seg;	/* the name, once */

	if (atomic_load_explicit(&s->name_pending, memory_order_acquire)) {
		pthread_mutex_lock(&s->ctx->lock);
		if (atomic_load_explicit(&s->name_pending,
					 memory_order_relaxed)) {
			s->ctx->ops->seg_name(s->fd, s->name, sizeof(s->name));
			atomic_store_explicit(&s->name_pending, false,
					      memory_order_release);
		}
		pthread_mutex_unlock(&s->ctx->lock);
	}
	return seg->name;
}

TSHM_EXPORT
struct tshm_seg *tshm_seg_ref(struct tshm_seg *seg)
{
	atomic_fetch_add_explicit(&seg->refs, 1, memory_order_relaxed);
	return seg;
}

static void seg_destroy(struct tshm_seg *seg)
{
	struct tshm_ctx *ctx = seg->ctx;

	ctx->ops->seg_destroy(seg);
	pthread_mutex_lock(&ctx->lock);
	seg_cache_remove_locked(ctx, seg);
	pthread_mutex_unlock(&ctx->lock);
	munmap(seg->data, seg->size);
	if (seg->fd >= 0)
		close(seg->fd);
	pthread_mutex_destroy(&seg->lease_lock);
	pool_notifier_put(seg->notifier);
	free(seg);
	ctx_put(ctx);
}

TSHM_EXPORT
void tshm_seg_unref(struct tshm_seg *seg)
{
	struct pool_notifier *n;
	int old;

	if (!seg)
		return;
	n = seg->notifier;
	if (!n) {
		if (atomic_fetch_sub_explicit(&seg->refs, 1,
					      memory_order_acq_rel) == 1)
			seg_destroy(seg);
		return;
	}
	/*
	 * A pool buffer: once our reference is gone another thread may drop
	 * the last one (tshm_pool_destroy()), so hold the notifier across.
	 */
	atomic_fetch_add(&n->refs, 1);
	old = atomic_fetch_sub(&seg->refs, 1);
	if (old == 1)
		seg_destroy(seg);
	else if (old == 2)
		pool_notify(n);
	pool_notifier_put(n);
}

/* ---- handle passing ---- */

TSHM_EXPORT
int tshm_seg_export(struct tshm_seg *seg, struct tshm_handle *h)
{
	if (!seg || !h)
		return -EINVAL;
	return seg->ctx->ops->seg_export(seg, h);
}

TSHM_EXPORT
int tshm_seg_import(struct tshm_ctx *ctx, const struct tshm_handle *h,
		    struct tshm_seg **out)
{
	if (!ctx || !h || !out || h->grants != 1 || h->flags)
		return -EINVAL;
	return ctx->ops->seg_import(ctx, h, out);
}

TSHM_EXPORT
int tshm_seg_send_fd(struct tshm_seg *seg, int sock)
{
	struct seg_wire w = { .magic = SEG_WIRE_MAGIC };

	if (!seg || sock < 0)
		return -EINVAL;
	w.backend = seg->ctx->ops->wire;
	return seg->ctx->ops->seg_send_fd(seg, sock, &w);
}

TSHM_EXPORT
int tshm_seg_recv_fd(struct tshm_ctx *ctx, int sock, struct tshm_seg **out)
{
	struct seg_wire w;
	int fds[SEG_WIRE_FDS], ret;
	unsigned nfds = SEG_WIRE_FDS, i;

	if (!ctx || !out || sock < 0)
		return -EINVAL;
	ret = fd_recv(sock, &w, sizeof(w), fds, &nfds, 0);
	if (ret < 0)
		return ret;
	if (ret == 0 && nfds == 0)
		return -EPIPE;
	if (ret == sizeof(w) && w.magic == SEG_WIRE_MAGIC &&
	    nfds == ctx->ops->seg_wire_fds && ctx->ops->wire == w.backend)
		return ctx->ops->seg_recv_fd(ctx, &w, fds, out);
	ret = (ret == sizeof(w) && w.magic == SEG_WIRE_MAGIC) ?
		-EXDEV : -EBADMSG;
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	return ret;
}
