// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * GPU buffer pools: one VMM allocation cut into @count buffers.  Receivers
 * import the allocation once (their cache keys imports by allocation) and
 * get each buffer as an offset into it, so steady-state transfers open
 * nothing.
 *
 * When a buffer is free is libtshm's business: the buffers' leases are a
 * tshm_pool of 4 KiB segments, so a buffer is free once this process
 * dropped it and every receiver released its lease, and tshm_pool_get()
 * does the waiting.  A lease is tied to its buffer (slot) the first time
 * the pool hands it out; the slot number is kept in the lease's data and
 * checked against slot_lease[].
 *
 * Lifetime: the buffer objects live in the pool; each one out holds a
 * reference on the pool, so a buffer still out after
 * tshm_cuda_pool_destroy() keeps the pool's memory and the allocation.
 */
#include <errno.h>
#include <stdlib.h>

#include "cuda-private.h"

#define POOL_MAX	65536U
#define POOL_ALIGN	512U	/* buffers start on cudaMalloc's alignment, and more */
#define SLOT_MAGIC	0x74637370U	/* "tcsp" */

/* In a lease's data: which buffer of the pool it is the lease of. */
struct slot_tag {
	uint32_t magic;
	uint32_t slot;
};

struct tshm_cuda_pool {
	_Atomic int refs;		/* the caller's + one per buffer out */
	struct tshm_pool *leases;
	struct tcu_alloc *alloc;
	unsigned count;
	pthread_mutex_t slot_lock;	/* slot_lease[] and next_slot */
	struct tcu_fork_node fork;
	unsigned next_slot;		/* slots given to leases so far */
	struct tshm_seg **slot_lease;	/* slot -> its lease */
	struct tshm_cuda_buf bufs[];
};

void tcu_pool_put(struct tshm_cuda_pool *p)
{
	if (atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	tcu_fork_unregister(&p->fork);
	tshm_pool_destroy(p->leases);
	tcu_alloc_put(p->alloc);
	pthread_mutex_destroy(&p->slot_lock);
	free(p->slot_lease);
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
	size_t stride = align_up(size, POOL_ALIGN);
	struct tshm_cuda_pool *p;
	unsigned i;
	int ret;

	if (!out || !cu || !ctx)
		return -EINVAL;
	*out = NULL;
	if (!cu->gran) {
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
	p = calloc(1, sizeof(*p) + count * sizeof(p->bufs[0]));
	if (!p)
		return -ENOMEM;
	p->refs = 1;
	p->count = count;
	pthread_mutex_init(&p->slot_lock, NULL);
	p->slot_lease = calloc(count, sizeof(*p->slot_lease));
	if (!p->slot_lease) {
		ret = -ENOMEM;
		goto err_free;
	}
	ret = tshm_pool_create(ctx, count, 4096, "cuda-lease", 0, &p->leases);
	if (ret) {
		tcu_err("lease segments: %s", tshm_strerror(ret));
		goto err_free;
	}
	ret = tcu_alloc_create(cu, ctx, align_up(stride * count, cu->gran),
			       &p->alloc);
	if (ret)
		goto err_leases;
	for (i = 0; i < count; i++) {
		struct tshm_cuda_buf *b = &p->bufs[i];

		b->cu = cu;
		b->kind = TSHM_CUDA_VMM;
		b->producer = true;
		b->id = tcu_new_id();
		b->alloc = p->alloc;
		b->pool = p;
		b->off = (uint64_t)i * stride;
		b->ptr = p->alloc->ptr + b->off;
		b->size = size;
	}
	tcu_fork_register(&p->fork, &p->slot_lock);
	*out = p;
	return 0;

err_leases:
	tshm_pool_destroy(p->leases);
err_free:
	pthread_mutex_destroy(&p->slot_lock);
	free(p->slot_lease);
	free(p);
	return ret;
}

/* The slot @lease belongs to, given one the first time it is seen. */
static unsigned slot_of(struct tshm_cuda_pool *p, struct tshm_seg *lease)
{
	struct slot_tag *tag = tshm_seg_data(lease);
	unsigned i;

	if (tag->magic == SLOT_MAGIC && tag->slot < p->count &&
	    p->slot_lease[tag->slot] == lease)
		return tag->slot;
	/* new, or the tag was overwritten (receivers map it too) */
	pthread_mutex_lock(&p->slot_lock);
	for (i = 0; i < p->next_slot; i++)
		if (p->slot_lease[i] == lease)
			break;
	if (i == p->next_slot)	/* at most count distinct leases: room */
		p->slot_lease[p->next_slot++] = lease;
	pthread_mutex_unlock(&p->slot_lock);
	tag->slot = i;
	tag->magic = SLOT_MAGIC;
	return i;
}

int tshm_cuda_pool_get(struct tshm_cuda_pool *p, int timeout_ms,
		       struct tshm_cuda_buf **out)
{
	struct tshm_cuda_buf *b;
	struct tshm_seg *lease;
	int ret;

	if (!p || !out)
		return -EINVAL;
	*out = NULL;
	ret = tshm_pool_get(p->leases, timeout_ms, &lease);
	if (ret)
		return ret;
	/* the lease is ours alone until we unref it: so is its slot */
	b = &p->bufs[slot_of(p, lease)];
	b->lease = lease;
	atomic_fetch_add(&p->refs, 1);
	atomic_store(&b->refs, 1);
	*out = b;
	return 0;
}

unsigned tshm_cuda_pool_available(struct tshm_cuda_pool *p)
{
	return tshm_pool_available(p->leases);
}

void tshm_cuda_pool_destroy(struct tshm_cuda_pool *p)
{
	if (p)
		tcu_pool_put(p);
}
