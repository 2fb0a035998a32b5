// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * pool.c - buffer pools: segments that come back once everyone let go.
 *
 * A buffer is free when the pool holds the only local reference and the
 * segment's release notification says no other process holds it (module:
 * poll on the segment fd; fallback: every lease socket hung up).
 *
 * Cost, the common case first: a get() takes a buffer that is not out
 * without a system call; otherwise one poll() (timeout 0) over the release
 * fds of the buffers that are out but idle (only the pool's reference
 * left) finds those that came back, and only those are checked.  A sleeper
 * also checks every idle buffer once per wake-up and per slice, which
 * gives back spare grants that receivers which died left in queues
 * (module; Documentation/lib/queue.rst), whose release no fd reports.
 * Local unrefs ring an eventfd only while a sleeper waits.
 *
 * Locking: @lock covers out[] and the scans, never a sleep, so that a
 * get() with timeout 0 and tshm_pool_available() never wait for another
 * thread's get().  @wait_lock lets one thread at a time sleep: it alone
 * drains the eventfd (always before it scans, so a ring after the scan
 * wakes its poll) and uses pfd[]; other sleepers queue on it.
 *
 * Lifetime: a buffer keeps the pool's notifier (the eventfd and the
 * sleeper count), not the pool, so that an unref racing
 * tshm_pool_destroy() touches nothing freed; tshm_seg_unref() holds a
 * notifier reference across the drop that may notify.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tshm-private.h"

/* Lease ends watched per buffer on the fallback. */
#define POOL_PFD_PER_BUF	4
/* A sleeper re-checks every idle buffer at least this often. */
#define POOL_RESCAN_MS		1000

struct tshm_pool {
	struct tshm_ctx *ctx;
	pthread_mutex_t lock;
	struct tlock wait_lock;
	struct pool_notifier *notifier;
	unsigned count;
	struct tshm_seg **bufs;
	bool *out;
	bool *used;			/* handed out before: punch if @punch */
	bool punch;			/* TSHM_POOL_PUNCH */
	/* count * POOL_PFD_PER_BUF + 1 entries each */
	struct pollfd *pfd;		/* the sleeper's, under @wait_lock */
	struct pollfd *scan;		/* pool_take()'s, under @lock */
	unsigned *scan_buf;		/* the buffer of each scan[] entry */
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
		atomic_store(&pool->notifier->sleepers, 0);
	} else {
		pthread_mutex_unlock(&pool->lock);
	}
}

void pool_notify(struct pool_notifier *n)
{
	uint64_t one = 1;

	if (!atomic_load(&n->sleepers))
		return;
	if (write(n->efd, &one, sizeof(one)) < 0) {
		/* The counter is saturated: a wake-up is pending anyway. */
	}
}

void pool_notifier_put(struct pool_notifier *n)
{
	if (n && atomic_fetch_sub(&n->refs, 1) == 1) {
		close(n->efd);
		free(n);
	}
}

static struct pool_notifier *pool_notifier_new(void)
{
	struct pool_notifier *n = calloc(1, sizeof(*n));

	if (!n)
		return NULL;
	n->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (n->efd < 0) {
		free(n);
		return NULL;
	}
	atomic_init(&n->refs, 1);
	return n;
}

TSHM_EXPORT
int tshm_pool_create(struct tshm_ctx *ctx, unsigned count, size_t size,
		     const char *name, unsigned seg_flags,
		     struct tshm_pool **out)
{
	struct tshm_pool *pool;
	size_t npfd;
	unsigned i;
	int ret;

	if (!ctx || !out || !count || count > 65536 || !size)
		return -EINVAL;
	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return -ENOMEM;
	npfd = (size_t)count * POOL_PFD_PER_BUF + 1;
	pool->bufs = calloc(count, sizeof(*pool->bufs));
	pool->out = calloc(count, sizeof(*pool->out));
	pool->used = calloc(count, sizeof(*pool->used));
	pool->punch = seg_flags & TSHM_POOL_PUNCH;
	seg_flags &= ~TSHM_POOL_PUNCH;
	pool->pfd = calloc(npfd, sizeof(*pool->pfd));
	pool->scan = calloc(npfd, sizeof(*pool->scan));
	pool->scan_buf = calloc(npfd, sizeof(*pool->scan_buf));
	pool->notifier = pool_notifier_new();
	if (!pool->bufs || !pool->out || !pool->used || !pool->pfd || !pool->scan ||
	    !pool->scan_buf || !pool->notifier) {
		ret = -ENOMEM;
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
		/* Set before the buffer is handed out, never changed. */
		atomic_fetch_add(&pool->notifier->refs, 1);
		pool->bufs[i]->notifier = pool->notifier;
	}
	*out = pool;
	return 0;
fail:
	pool_notifier_put(pool->notifier);
	free(pool->scan_buf);
	free(pool->scan);
	free(pool->pfd);
	free(pool->out);
	free(pool->used);
	free(pool->bufs);
	free(pool);
	return ret;
}

/* Under pool->lock: is buffer @i, out, back now? */
static bool pool_is_back(struct tshm_pool *pool, unsigned i)
{
	if (atomic_load(&pool->bufs[i]->refs) != 1)
		return false;
	if (seg_released_now(pool->bufs[i]) == 1) {
		pool->out[i] = false;
		return true;
	}
	return false;
}

/*
 * Under pool->lock: fill @pfd (from @first) with the release fds of the
 * idle buffers (out, only the pool's reference left), and @buf, when not
 * NULL, with the buffer of each.  An idle buffer with no fd to watch is
 * released already: *@now names it.
 */
static unsigned pool_pollfds(struct tshm_pool *pool, struct pollfd *pfd,
			     unsigned *buf, unsigned first, int *now)
{
	unsigned i, n = first, k, j;

	*now = -1;
	for (i = 0; i < pool->count; i++) {
		if (!pool->out[i] || atomic_load(&pool->bufs[i]->refs) != 1)
			continue;	/* free, or the eventfd tells */
		k = seg_release_pollfds(pool->bufs[i], pfd + n,
					POOL_PFD_PER_BUF);
		if (!k && *now < 0)
			*now = i;
		for (j = 0; buf && j < k; j++)
			buf[n + j] = i;
		n += k;
	}
	return n;
}

static void pool_hand_out(struct tshm_pool *pool, unsigned i,
			  struct tshm_seg **out)
{
	struct tshm_seg *seg = pool->bufs[i];

	/*
	 * Pages a former holder still pins stop being this buffer's:
	 * MADV_REMOVE punches the segment through our writable shared
	 * mapping (no fd needed), and cannot fail on it.
	 */
	if (pool->punch && pool->used[i])
		(void)madvise(seg->data, seg->size, MADV_REMOVE);
	pool->used[i] = true;
	pool->out[i] = true;
	*out = tshm_seg_ref(pool->bufs[i]);
}

/*
 * Hand out a buffer that is back, if one is: under pool->lock.  @full:
 * check every idle buffer, not only those whose fds are ready.
 */
static bool pool_take(struct tshm_pool *pool, bool full,
		      struct tshm_seg **out)
{
	unsigned i, n;
	int now;

	for (i = 0; i < pool->count; i++) {
		if (!pool->out[i]) {
			pool_hand_out(pool, i, out);	/* no system call */
			return true;
		}
	}
	if (full) {
		for (i = 0; i < pool->count; i++) {
			if (pool_is_back(pool, i)) {
				pool_hand_out(pool, i, out);
				return true;
			}
		}
		return false;
	}
	n = pool_pollfds(pool, pool->scan, pool->scan_buf, 0, &now);
	if (now >= 0 && pool_is_back(pool, now)) {
		pool_hand_out(pool, now, out);
		return true;
	}
	if (!n || poll(pool->scan, n, 0) <= 0)
		return false;
	for (i = 0; i < n; i++) {
		unsigned b = pool->scan_buf[i];

		if (pool->scan[i].revents && pool->out[b] &&
		    pool_is_back(pool, b)) {
			pool_hand_out(pool, b, out);
			return true;
		}
	}
	return false;
}

TSHM_EXPORT
int tshm_pool_get(struct tshm_pool *pool, int timeout_ms,
		  struct tshm_seg **out)
{
	struct pool_notifier *nt;
	struct deadline dl, slice;
	bool took;
	uint64_t v;
	unsigned n;
	int ret, now;

	if (!pool || !out)
		return -EINVAL;
	deadline_init(&dl, timeout_ms);
	pthread_mutex_lock(&pool->lock);
	took = pool_take(pool, false, out);
	pthread_mutex_unlock(&pool->lock);
	if (took)
		return 0;
	if (deadline_expired(&dl))
		return deadline_err(&dl);
	nt = pool->notifier;
	ret = tlock_lock(&pool->wait_lock, &dl);
	if (ret < 0)
		return ret;
	/* From here local unrefs ring the eventfd (see pool_notify()). */
	atomic_fetch_add(&nt->sleepers, 1);
	for (;;) {
		if (read(nt->efd, &v, sizeof(v)) < 0) {
			/* Nothing pending. */
		}
		pthread_mutex_lock(&pool->lock);
		took = pool_take(pool, true, out);
		n = 0;
		if (!took) {
			pool->pfd[0].fd = nt->efd;
			pool->pfd[0].events = POLLIN;
			n = pool_pollfds(pool, pool->pfd, NULL, 1, &now);
		}
		pthread_mutex_unlock(&pool->lock);
		if (took) {
			ret = 0;
			break;
		}
		if (deadline_expired(&dl)) {
			ret = deadline_err(&dl);
			break;
		}
		deadline_init(&slice, POOL_RESCAN_MS);
		if (slice.ns > dl.ns)
			slice = dl;
		ret = wait_poll(pool->pfd, n, &slice);
		if (ret < 0)
			break;
	}
	atomic_fetch_sub(&nt->sleepers, 1);
	tlock_unlock(&pool->wait_lock);
	return ret;
}

TSHM_EXPORT
unsigned tshm_pool_available(struct tshm_pool *pool)
{
	unsigned i, n = 0;

	pthread_mutex_lock(&pool->lock);
	for (i = 0; i < pool->count; i++)
		n += !pool->out[i] || pool_is_back(pool, i);
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
	for (i = 0; i < pool->count; i++)
		tshm_seg_unref(pool->bufs[i]);
	pool_notifier_put(pool->notifier);
	pthread_mutex_destroy(&pool->lock);
	ctx_put(pool->ctx);
	free(pool->scan_buf);
	free(pool->scan);
	free(pool->pfd);
	free(pool->out);
	free(pool->used);
	free(pool->bufs);
	free(pool);
}
