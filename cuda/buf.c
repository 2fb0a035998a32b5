// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * GPU buffers, either end.  Every buffer has a lease: a 4 KiB tshm segment
 * sent with each message and held by a receiver from tshm_cuda_recv() to
 * tshm_cuda_buf_unref() (libtshm releases it when the receiver exits or is
 * killed, or when a message is dropped in flight).  The producer's
 * release wait is tshm_seg_wait_released() on it.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cuda-private.h"

uint64_t tcu_new_id(void)
{
	uint64_t id = 0;

	while (!id)
		if (getrandom(&id, sizeof(id), 0) != sizeof(id))
			id = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL)
				^ (uint64_t)(uintptr_t)&id;
	return id;
}

int tcu_buf_new(struct tshm_cuda *cu, struct tshm_ctx *ctx,
		enum tshm_cuda_kind kind, struct tshm_cuda_buf **out)
{
	struct tshm_cuda_buf *b = calloc(1, sizeof(*b));
	int ret;

	if (!b)
		return -ENOMEM;
	ret = tshm_seg_create(ctx, 4096, "cuda-lease", 0, &b->lease);
	if (ret) {
		tcu_err("lease segment: %s", tshm_strerror(ret));
		free(b);
		return ret;
	}
	b->refs = 1;
	b->cu = cu;
	b->kind = kind;
	b->producer = true;
	b->id = tcu_new_id();
	*out = b;
	return 0;
}

int tshm_cuda_buf_alloc(struct tshm_cuda *cu, struct tshm_ctx *ctx,
			size_t size, struct tshm_cuda_buf **out)
{
	struct tshm_cuda_buf *b;
	int ret;

	if (!out || !cu || !ctx)
		return -EINVAL;
	*out = NULL;
	if (!cu->gran) {
		tcu_err("device %d cannot export VMM memory as fds; use "
			"tshm_cuda_buf_wrap()", cu->ordinal);
		return -EOPNOTSUPP;
	}
	if (!size || size % cu->gran) {
		tcu_err("size %zu is not a positive multiple of the allocation "
			"granularity %zu (cuMemGetAllocationGranularity)",
			size, cu->gran);
		return -EINVAL;
	}
	ret = tcu_buf_new(cu, ctx, TSHM_CUDA_VMM, &b);
	if (ret)
		return ret;
	ret = tcu_alloc_create(cu, ctx, size, &b->alloc);
	if (ret) {
		tshm_seg_unref(b->lease);
		free(b);
		return ret;
	}
	b->ptr = b->alloc->ptr;
	b->size = size;
	*out = b;
	return 0;
}

/* tshm_cuda_buf_wrap(), in @cu's context. */
static int buf_wrap(struct tshm_cuda *cu, struct tshm_ctx *ctx,
		    CUdeviceptr p, size_t size, struct tshm_cuda_buf **out)
{
	CUdeviceptr base = 0;
	struct tshm_cuda_buf *b;
	size_t bsize = 0;
	int ret;

	ret = CU_CALL(cuMemGetAddressRange(&base, &bsize, p));
	if (ret)
		return ret;
	if (size > bsize || p - base > bsize - size) {
		tcu_err("range %zu bytes at %#llx runs past its allocation "
			"(%zu bytes at %#llx)", size, (unsigned long long)p,
			bsize, (unsigned long long)base);
		return -EINVAL;
	}
	ret = tcu_buf_new(cu, ctx, TSHM_CUDA_LEGACY, &b);
	if (ret)
		return ret;
	ret = CU_CALL(cuIpcGetMemHandle(&b->ipc, base));
	if (ret) {
		tshm_seg_unref(b->lease);
		free(b);
		return ret;
	}
	b->ptr = p;
	b->size = size;
	b->off = p - base;
	b->alloc_size = bsize;
	*out = b;
	return 0;
}

int tshm_cuda_buf_wrap(struct tshm_cuda *cu, struct tshm_ctx *ctx,
		       void *dptr, size_t size, struct tshm_cuda_buf **out)
{
	int ret;

	if (!out || !cu || !ctx)
		return -EINVAL;
	*out = NULL;
	if (!size) {
		tcu_err("size 0");
		return -EINVAL;
	}
	ret = tcu_ctx_push(cu);
	if (ret)
		return ret;
	ret = buf_wrap(cu, ctx, (CUdeviceptr)(uintptr_t)dptr, size, out);
	tcu_ctx_pop();
	return ret;
}

void *tshm_cuda_buf_ptr(const struct tshm_cuda_buf *b)
{
	return (void *)(uintptr_t)b->ptr;
}

size_t tshm_cuda_buf_size(const struct tshm_cuda_buf *b)
{
	return b->size;
}

uint64_t tshm_cuda_buf_id(const struct tshm_cuda_buf *b)
{
	return b->id;
}

enum tshm_cuda_kind tshm_cuda_buf_kind(const struct tshm_cuda_buf *b)
{
	return b->kind;
}

struct tshm_seg *tshm_cuda_buf_lease(struct tshm_cuda_buf *b)
{
	return b->lease;
}

int tshm_cuda_buf_wait_released(struct tshm_cuda_buf *b, int timeout_ms)
{
	if (!b)
		return -EINVAL;
	if (!b->producer) {
		tcu_err("only the producer learns when receivers let go");
		return -EOPNOTSUPP;
	}
	return tshm_seg_wait_released(b->lease, timeout_ms);
}

int tshm_cuda_buf_release_pollfds(struct tshm_cuda_buf *b, struct pollfd *pfd,
				  unsigned n)
{
	if (!b)
		return -EINVAL;
	if (!b->producer) {
		tcu_err("only the producer learns when receivers let go");
		return -EOPNOTSUPP;
	}
	return tshm_seg_release_pollfds(b->lease, pfd, n);
}

struct tshm_cuda_buf *tcu_buf_ref(struct tshm_cuda_buf *b)
{
	atomic_fetch_add(&b->refs, 1);
	return b;
}

static void buf_free(struct tshm_cuda_buf *b)
{
	struct tshm_cuda_pool *pool = b->pool;
	struct tshm_seg *lease = b->lease;

	if (pool) {
		/*
		 * The object stays in the pool; once the lease is unref'd
		 * another get() may hand the buffer out again.
		 */
		b->lease = NULL;
		tshm_seg_unref(lease);
		tcu_pool_put(pool);
		return;
	}
	if (b->producer)
		tcu_alloc_put(b->alloc);	/* NULL for legacy */
	else if (b->imp)
		tcu_import_put(b->cu, b->imp);
	tshm_seg_unref(lease);
	free(b);
}

void tshm_cuda_buf_unref(struct tshm_cuda_buf *b)
{
	if (b && atomic_fetch_sub(&b->refs, 1) == 1)
		buf_free(b);
}
