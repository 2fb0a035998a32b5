// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * pool.c - buffer pools: segments that come back once everyone let go.
 *
 * A buffer is free when the pool holds the only local reference and the
 * segment's release notification says no other process holds it (module:
 * poll on the segment fd; fallback: every lease socket hung up).  Waiting
 * is one poll() over those fds plus an eventfd that local unrefs ring.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "tshm-private.h"

/* Lease ends watched per buffer on the fallback. */
#define POOL_PFD_PER_BUF	4

struct tshm_pool {
	struct tshm_ctx *ctx;
	pthread_mutex_t lock;
	int efd;
	unsigned count;
	struct tshm_seg **bufs;
	bool *out;
	struct pollfd *pfd;
};

void pool_notify(struct tshm_pool *pool)
{
	uint64_t one = 1;

	if (write(pool->efd, &one, sizeof(one)) < 0) {
		/* The counter is saturated: a wake-up is pending anyway. */
	}
}

TSHM_EXPORT
int tshm_pool_create(struct tshm_ctx *ctx, unsigned count, size_t size,
		     const char *name, unsigned seg_flags,
		     struct tshm_pool **out)
{
	struct tshm_pool *pool;
	unsigned i;
	int ret;

	if (!ctx || !out || !count || count > 65536 || !size)
		return -EINVAL;
	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return -ENOMEM;
	pool->bufs = calloc(count, sizeof(*pool->bufs));
	pool->out = calloc(count, sizeof(*pool->out));
	pool->pfd = calloc(count * POOL_PFD_PER_BUF + 1, sizeof(*pool->pfd));
	pool->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!pool->bufs || !pool->out || !pool->pfd || pool->efd < 0) {
		ret = pool->efd < 0 ? -errno : -ENOMEM;
		goto fail;
	}
	pool->ctx = ctx_get(ctx);
	pool->count = count;
	pthread_mutex_init(&pool->lock, NULL);
	for (i = 0; i < count; i++) {
		ret = tshm_seg_create(ctx, size, name, seg_flags, &pool->bufs[i]);
		if (ret < 0) {
			pool->count = i;
			tshm_pool_destroy(pool);
			return ret;
		}
		atomic_store(&pool->bufs[i]->pool, pool);
	}
	*out = pool;
	return 0;
fail:
	if (pool->efd >= 0)
		close(pool->efd);
	free(pool->pfd);
	free(pool->out);
	free(pool->bufs);
	free(pool);
	return ret;
}

/* Under pool->lock: is buffer @i back? */
static bool pool_is_back(struct tshm_pool *pool, unsigned i)
{
	struct tshm_seg *seg = pool->bufs[i];

	if (!pool->out[i])
		return true;
	if (atomic_load(&seg->refs) != 1)
		return false;
	if (seg_released_now(seg) == 1) {
		pool->out[i] = false;
		return true;
	}
	return false;
}

TSHM_EXPORT
int tshm_pool_get(struct tshm_pool *pool, int timeout_ms,
		  struct tshm_seg **out)
{
	struct deadline dl;
	uint64_t v;
	unsigned i, n;
	int ret;

	if (!pool || !out)
		return -EINVAL;
	deadline_init(&dl, timeout_ms);
	pthread_mutex_lock(&pool->lock);
	for (;;) {
		for (i = 0; i < pool->count; i++) {
			if (pool_is_back(pool, i)) {
				pool->out[i] = true;
				*out = tshm_seg_ref(pool->bufs[i]);
				pthread_mutex_unlock(&pool->lock);
				return 0;
			}
		}
		if (deadline_expired(&dl)) {
			pthread_mutex_unlock(&pool->lock);
			return deadline_err(&dl);
		}
		pool->pfd[0].fd = pool->efd;
		pool->pfd[0].events = POLLIN;
		n = 1;
		for (i = 0; i < pool->count; i++) {
			if (atomic_load(&pool->bufs[i]->refs) != 1)
				continue;	/* the eventfd tells */
			n += seg_release_pollfds(pool->bufs[i], pool->pfd + n,
						 POOL_PFD_PER_BUF);
		}
		ret = poll(pool->pfd, n, deadline_poll_ms(&dl));
		if (ret < 0 && errno != EINTR) {
			ret = -errno;
			pthread_mutex_unlock(&pool->lock);
			return ret;
		}
		if (read(pool->efd, &v, sizeof(v)) < 0) {
			/* Nothing pending. */
		}
	}
}

TSHM_EXPORT
unsigned tshm_pool_available(struct tshm_pool *pool)
{
	unsigned i, n = 0;

	pthread_mutex_lock(&pool->lock);
	for (i = 0; i < pool->count; i++)
		n += pool_is_back(pool, i);
	pthread_mutex_unlock(&pool->lock);
	return n;
}

TSHM_EXPORT
void tshm_pool_destroy(struct tshm_pool *pool)
{
	unsigned i;

	if (!pool)
		return;
	for (i = 0; i < pool->count; i++) {
		atomic_store(&pool->bufs[i]->pool, NULL);
		tshm_seg_unref(pool->bufs[i]);
	}
	close(pool->efd);
	pthread_mutex_destroy(&pool->lock);
	ctx_put(pool->ctx);
	free(pool->pfd);
	free(pool->out);
	free(pool->bufs);
	free(pool);
}
