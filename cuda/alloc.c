// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * A producer's VMM allocation: cuMemCreate requesting POSIX fd handles,
 * mapped read-write for the device, exported once (that fd is what every
 * send passes), and an anchor segment that receivers' caches hold with
 * their import.  Buffers (one for tshm_cuda_buf_alloc(), one per slot for
 * a pool) hold references; the last one unmaps, releases the handle,
 * closes the fd and marks the anchor dead, and the memory stays while a
 * receiver's mapping or an fd in flight still holds it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda-private.h"

static int anchor_create(struct tshm_ctx *ctx, struct tcu_alloc *a)
{
	struct tcu_anchor *an;
	int ret;

	ret = tshm_seg_create(ctx, 4096, "cuda-anchor", 0, &a->anchor);
	if (ret) {
		tcu_err("anchor segment: %s", tshm_strerror(ret));
		return ret;
	}
	an = tshm_seg_data(a->anchor);
	an->magic = TCU_ANCHOR_MAGIC;
	an->alloc_id = a->id;
	an->pid = getpid();
	atomic_store(&an->dead, 0);
	return 0;
}

/* tcu_alloc_create(), in @cu's context. */
static int alloc_create(struct tshm_cuda *cu, struct tshm_ctx *ctx,
			size_t size, struct tcu_alloc **out)
{
	CUmemAllocationProp prop = { 0 };
	CUmemAccessDesc acc = { 0 };
	struct tcu_alloc *a;
	int ret;

	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->refs = 1;
	a->cu = cu;
	a->id = tcu_new_id();
	a->size = size;
	a->fd = -1;

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = cu->dev;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	ret = CU_CALL(cuMemCreate(&a->h, size, &prop, 0));
	if (ret)
		goto err_free;
	ret = CU_CALL(cuMemAddressReserve(&a->ptr, size, cu->gran, 0, 0));
	if (ret)
		goto err_release;
	ret = CU_CALL(cuMemMap(a->ptr, size, 0, a->h, 0));
	if (ret)
		goto err_addr;
	acc.location = prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	ret = CU_CALL(cuMemSetAccess(a->ptr, size, &acc, 1));
	if (ret)
		goto err_unmap;
	ret = CU_CALL(cuMemExportToShareableHandle(&a->fd, a->h,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	if (ret)
		goto err_unmap;
	/* a child exec()ed by the caller must not pin the memory */
	fcntl(a->fd, F_SETFD, FD_CLOEXEC);
	ret = anchor_create(ctx, a);
	if (ret)
		goto err_fd;
	*out = a;
	return 0;

err_fd:
	close(a->fd);
err_unmap:
	tcu.cuMemUnmap(a->ptr, size);
err_addr:
	tcu.cuMemAddressFree(a->ptr, size);
err_release:
	tcu.cuMemRelease(a->h);
err_free:
	free(a);
	return ret;
}

int tcu_alloc_create(struct tshm_cuda *cu, struct tshm_ctx *ctx, size_t size,
		     struct tcu_alloc **out)
{
	int ret = tcu_ctx_push(cu);

	if (ret)
		return ret;
	ret = alloc_create(cu, ctx, size, out);
	tcu_ctx_pop();
	return ret;
}

void tcu_alloc_put(struct tcu_alloc *a)
{
	struct tcu_anchor *an;
	bool pushed;

	if (!a || atomic_fetch_sub(&a->refs, 1) != 1)
		return;
	/* failing (the driver shutting down), the calls go on regardless */
	pushed = !tcu_ctx_push(a->cu);
	tcu.cuMemUnmap(a->ptr, a->size);
	tcu.cuMemAddressFree(a->ptr, a->size);
	tcu.cuMemRelease(a->h);
	if (pushed)
		tcu_ctx_pop();
	close(a->fd);
	/* receivers' caches drop their imports: the memory can go back */
	an = tshm_seg_data(a->anchor);
	atomic_store(&an->dead, 1);
	tshm_seg_unref(a->anchor);
	free(a);
}
