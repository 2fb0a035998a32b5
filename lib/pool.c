// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * pool.c - buffer pools: segments that come back once everyone let go.
 *
 * A buffer is free when the pool holds the only local reference and the
 * segment's release notification says no other process holds it (module:
 * poll on the segment fd; fallback: every lease socket hung up).  Waiting
 * is one poll() over those fds plus an eventfd that local unrefs ring.
 *
 * Locking: @lock covers out[] and the scans, never a sleep, so that a
 * get() with timeout 0 and tshm_pool_available() never wait for another
 * thread's get().  @wait_lock lets one thread at a time sleep: it alone
 * drains the eventfd (always before it scans, so a ring after the scan
 * wakes its poll) and uses pfd[]; other sleepers queue on it.
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
	struct tlock wait_lock;
	int efd;
	unsigned count;
	struct tshm_seg **bufs;
	bool *out;
	struct pollfd *pfd;
	struct fork_node fork;
};

static void pool_fork_prepare(struct fork_node *n)
{
	pthread_mutex_lock(&container_of(n, struct tshm_pool, fork)->lock);
}

/* @wait_lock is not taken: a sleeper holds it (see fork.c). */
static void pool_fork_release(struct fork_node *n, bool child)
{
	struct tshm_pool *pool = container_of(n, struct tshm_pool, fork);

	if (child) {
		pthread_mutex_init(&pool->lock, NULL);
		atomic_store(&pool->wait_lock.word, 0);
	} else {
		pthread_mutex_unlock(&pool->lock);
	}
}

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
	pool->fork.prepare = pool_fork_prepare;
	pool->fork.release = pool_fork_release;
	fork_register(&pool->fork, FORK_POOL);
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

/* Hand out a buffer that is back, if one is: under pool->lock. */
static bool pool_take(struct tshm_pool *pool, struct tshm_seg **out)
{
	unsigned i;

	for (i = 0; i < pool->count; i++) {
		if (pool_is_back(pool, i)) {
			pool->out[i] = true;
			*out = tshm_seg_ref(pool->bufs[i]);
			return true;
		}
	}
	return false;
}

/* What the sleeper polls: the eventfd and the idle buffers' release fds. */
static unsigned pool_pollfds(struct tshm_pool *pool)
{
	unsigned i, n = 1;

	pool->pfd[0].fd = pool->efd;
	pool->pfd[0].events = POLLIN;
	for (i = 0; i < pool->count; i++) {
		if (atomic_load(&pool->bufs[i]->refs) != 1)
			continue;	/* the eventfd tells */
		n += seg_release_pollfds(pool->bufs[i], pool->pfd + n,
					 POOL_PFD_PER_BUF);
	}
	return n;
}

TSHM_EXPORT
int tshm_pool_get(struct tshm_pool *pool, int timeout_ms,
		  struct tshm_seg **out)
{
	struct deadline dl;
	bool took;
	uint64_t v;
	unsigned n;
	int ret;

	if (!pool || !out)
		return -EINVAL;
	deadline_init(&dl, timeout_ms);
	pthread_mutex_lock(&pool->lock);
	took = pool_take(pool, out);
	pthread_mutex_unlock(&pool->lock);
	if (took)
		return 0;
	if (deadline_expired(&dl))
		return deadline_err(&dl);
	ret = tlock_lock(&pool->wait_lock, &dl);
	if (ret < 0)
		return ret;
	for (;;) {
		if (read(pool->efd, &v, sizeof(v)) < 0) {
			/* Nothing pending. */
		}
		pthread_mutex_lock(&pool->lock);
		took = pool_take(pool, out);
		n = took ? 0 : pool_pollfds(pool);
		pthread_mutex_unlock(&pool->lock);
		if (took) {
			ret = 0;
			break;
		}
		if (deadline_expired(&dl)) {
			ret = deadline_err(&dl);
			break;
		}
		ret = wait_poll(pool->pfd, n, &dl);
		if (ret < 0)
			break;
	}
	tlock_unlock(&pool->wait_lock);
	return ret;
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
	fork_unregister(&pool->fork);
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
