// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * GPU buffer pools: one VMM allocation cut into @count buffers, each with
 * its own lease.  Receivers import the allocation once (their cache keys
 * imports by allocation) and get each buffer as an offset into it, so
 * steady-state transfers open nothing.
 *
 * A buffer is free when only the pool holds it in this process and every
 * receiver has released its lease.  tshm_cuda_pool_get() waits in one
 * poll(): the leases' release fds of the buffers held by nobody here, plus
 * an eventfd that a local unref back to the pool's reference rings.
 *
 * Lifetime: each buffer holds a reference on the pool (and on the
 * allocation), so a buffer still out after tshm_cuda_pool_destroy() keeps
 * what it needs.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cuda-private.h"

#define POOL_MAX	65536U
#define POOL_ALIGN	512U	/* buffers start on cudaMalloc's alignment, and more */
#define POOL_PFDS	4	/* release fds polled per buffer, at most */

struct tshm_cuda_pool {
	_Atomic int refs;	/* the caller's + one per buffer */
	pthread_mutex_t lock;	/* get */
	int efd;		/* rung by tcu_pool_buf_back() */
	unsigned count;
	unsigned next;		/* where take_free() starts: round robin */
	struct pollfd *pfd;	/* 1 + count * POOL_PFDS, under lock */
	struct tshm_cuda_buf *bufs[];
};

void tcu_pool_buf_back(struct tshm_cuda_pool *p)
{
	uint64_t one = 1;

	if (write(p->efd, &one, sizeof(one)) < 0) {
		/* the counter is full: a wake-up is pending anyway */
	}
}

void tcu_pool_put(struct tshm_cuda_pool *p)
{
	if (atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	close(p->efd);
	pthread_mutex_destroy(&p->lock);
	free(p->pfd);
	free(p);
}

static size_t align_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

int tshm_cuda_pool_create(struct tshm_cuda *cu, struct tshm_ctx *ctx,
			  unsigned count, size_t size,
			  struct tshm_cuda_pool **out)
{
	size_t stride = align_up(size, POOL_ALIGN), total;
	struct tshm_cuda_pool *p;
	struct tcu_alloc *a;
	unsigned i;
	int ret;

	if (!out || !cu || !ctx)
		return -EINVAL;
	*out = NULL;
	if (!cu->vmm) {
		tcu_err("device %d cannot export VMM memory as fds",
			cu->ordinal);
		return -EOPNOTSUPP;
	}
	if (!count || count > POOL_MAX || !size ||
	    stride > (SIZE_MAX - cu->gran) / count) {
		tcu_err("pool of %u buffers of %zu bytes: count must be 1..%u "
			"and size non-zero", count, size, POOL_MAX);
		return -EINVAL;
	}
	total = align_up(stride * count, cu->gran);
	p = calloc(1, sizeof(*p) + count * sizeof(p->bufs[0]));
	if (!p)
		return -ENOMEM;
	p->refs = 1;
	pthread_mutex_init(&p->lock, NULL);
	p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	p->pfd = calloc(1 + (size_t)count * POOL_PFDS, sizeof(*p->pfd));
	if (p->efd < 0 || !p->pfd) {
		ret = p->efd < 0 ? -errno : -ENOMEM;
		goto err_free;
	}
	ret = tcu_alloc_create(cu, ctx, total, &a);
	if (ret)
		goto err_free;
	for (i = 0; i < count; i++) {
		struct tshm_cuda_buf *b;

		ret = tcu_buf_new(cu, ctx, TSHM_CUDA_VMM, &b);
		if (ret)
			break;
		atomic_fetch_add(&a->refs, 1);
		atomic_fetch_add(&p->refs, 1);
		b->alloc = a;
		b->pool = p;
		b->off = (uint64_t)i * stride;
		b->ptr = a->ptr + b->off;
		b->size = size;
		p->bufs[p->count++] = b;
	}
	tcu_alloc_put(a);	/* the buffers hold it */
	if (ret) {
		tshm_cuda_pool_destroy(p);
		return ret;
	}
	*out = p;
	return 0;

err_free:
	if (p->efd >= 0)
		close(p->efd);
	pthread_mutex_destroy(&p->lock);
	free(p->pfd);
	free(p);
	return ret;
}

/* A buffer nobody here holds and no receiver holds: take it.  Under lock. */
static struct tshm_cuda_buf *take_free(struct tshm_cuda_pool *p)
{
	unsigned i, k;

	/* the least recently handed out first: likely released by now */
	for (k = 0; k < p->count; k++) {
		struct tshm_cuda_buf *b;

		i = (p->next + k) % p->count;
		b = p->bufs[i];
		if (atomic_load(&b->refs) == 1 &&
		    tshm_seg_wait_released(b->lease, 0) == 0) {
			p->next = (i + 1) % p->count;
			return tcu_buf_ref(b);
		}
	}
	return NULL;
}

/* What to wait on when none is free.  Under lock. */
static int fill_pollfds(struct tshm_cuda_pool *p)
{
	unsigned i, n = 1;
	uint64_t v;

	/* drain first: a ring after this poll set is made is not lost */
	if (read(p->efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing rang */
	}
	p->pfd[0].fd = p->efd;
	p->pfd[0].events = POLLIN;
	for (i = 0; i < p->count; i++) {
		struct tshm_cuda_buf *b = p->bufs[i];
		int k;

		if (atomic_load(&b->refs) != 1)
			continue;	/* held here: its unref rings efd */
		k = tshm_seg_release_pollfds(b->lease, p->pfd + n, POOL_PFDS);
		if (k < 0)
			return k;
		if (k == 0)
			return 0;	/* released since take_free() */
		n += k;
	}
	return (int)n;
}

int tshm_cuda_pool_get(struct tshm_cuda_pool *p, int timeout_ms,
		       struct tshm_cuda_buf **out)
{
	int64_t deadline = tcu_deadline(timeout_ms);
	int n, left;

	if (!p || !out)
		return -EINVAL;
	*out = NULL;
	pthread_mutex_lock(&p->lock);
	for (;;) {
		*out = take_free(p);
		if (*out)
			break;
		n = fill_pollfds(p);
		if (n < 0) {
			pthread_mutex_unlock(&p->lock);
			return n;
		}
		if (n == 0)
			continue;
		left = tcu_left_ms(deadline);
		if (!left) {
			pthread_mutex_unlock(&p->lock);
			return timeout_ms == 0 ? -EAGAIN : -ETIMEDOUT;
		}
		if (poll(p->pfd, (nfds_t)n, left) < 0 && errno != EINTR) {
			n = -errno;
			pthread_mutex_unlock(&p->lock);
			return n;
		}
	}
	pthread_mutex_unlock(&p->lock);
	return 0;
}

unsigned tshm_cuda_pool_available(struct tshm_cuda_pool *p)
{
	unsigned i, n = 0;

	pthread_mutex_lock(&p->lock);
	for (i = 0; i < p->count; i++)
		if (atomic_load(&p->bufs[i]->refs) == 1 &&
		    tshm_seg_wait_released(p->bufs[i]->lease, 0) == 0)
			n++;
	pthread_mutex_unlock(&p->lock);
	return n;
}

void tshm_cuda_pool_destroy(struct tshm_cuda_pool *p)
{
	unsigned i, count;

	if (!p)
		return;
	count = p->count;
	for (i = 0; i < count; i++)
		tshm_cuda_buf_unref(p->bufs[i]);
	tcu_pool_put(p);
}
