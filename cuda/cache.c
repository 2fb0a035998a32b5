// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * The receiver's side of a buffer: importing it (VMM fd or legacy IPC
 * handle) and the cache that makes a re-sent buffer cost no CUDA call.
 *
 * VMM imports are keyed by the producer's allocation id and kept after the
 * last receiver buffer in them is released, until the producer frees the
 * allocation (its anchor's dead flag: a memory read, checked on every
 * receive and when the last user lets go) or dies (kill(pid, 0), checked
 * by tshm_cuda_cache_trim() and whenever a receive imports anyway).  A
 * pool is one allocation: its buffers are imported once per receiver.
 *
 * Legacy IPC mappings are keyed by the IPC handle (one open per allocation
 * however many sub-ranges arrive) and closed when their last user goes:
 * the producer frees cudaMalloc memory once the leases say every receiver
 * let go, and a mapping still open then would be undefined behaviour.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-private.h"

void tcu_import_drop(struct tshm_cuda *cu, struct tcu_import *imp)
{
	/* failing (the driver shutting down), the calls go on regardless */
	bool pushed = !tcu_ctx_push(cu);

	if (imp->kind == TSHM_CUDA_VMM) {
		tcu.cuMemUnmap(imp->base, imp->size);
		tcu.cuMemAddressFree(imp->base, imp->size);
		if (imp->anchor)
			tshm_seg_unref(imp->anchor);
	} else {
		tcu.cuIpcCloseMemHandle(imp->base);
	}
	if (pushed)
		tcu_ctx_pop();
	free(imp);
}

/* A reused pid keeps the entry until the anchor says otherwise. */
bool tcu_import_dead(const struct tcu_import *imp, bool check_pid)
{
	struct tcu_anchor *an;

	if (imp->kind != TSHM_CUDA_VMM || !imp->anchor)
		return false;
	an = tshm_seg_data(imp->anchor);
	if (atomic_load(&an->dead))
		return true;
	return check_pid && an->pid > 0 && kill(an->pid, 0) < 0 &&
		errno == ESRCH;
}

static void unlink_locked(struct tshm_cuda *cu, struct tcu_import *imp)
{
	struct tcu_import **pp = &cu->cache;

	while (*pp != imp)
		pp = &(*pp)->next;
	*pp = imp->next;
	cu->st.cached--;
}

int tcu_cache_trim_locked(struct tshm_cuda *cu, bool check_pid)
{
	struct tcu_import **pp = &cu->cache, *imp;
	int n = 0;

	while ((imp = *pp)) {
		if (!imp->users && tcu_import_dead(imp, check_pid)) {
			*pp = imp->next;
			tcu_import_drop(cu, imp);
			cu->st.evictions++;
			cu->st.cached--;
			n++;
			continue;
		}
		pp = &imp->next;
	}
	return n;
}

int tshm_cuda_cache_trim(struct tshm_cuda *cu)
{
	int n;

	pthread_mutex_lock(&cu->lock);
	n = tcu_cache_trim_locked(cu, true);
	pthread_mutex_unlock(&cu->lock);
	return n;
}

void tshm_cuda_stats(struct tshm_cuda *cu, struct tshm_cuda_stats *st)
{
	pthread_mutex_lock(&cu->lock);
	*st = cu->st;
	pthread_mutex_unlock(&cu->lock);
}

void tcu_import_put(struct tshm_cuda *cu, struct tcu_import *imp)
{
	pthread_mutex_lock(&cu->lock);
	if (!--imp->users) {
		bool dead = imp->kind == TSHM_CUDA_LEGACY ||
			    tcu_import_dead(imp, false);

		if (dead) {
			/* the memory goes back now, not at the next receive */
			unlink_locked(cu, imp);
			if (imp->kind == TSHM_CUDA_VMM)
				cu->st.evictions++;
			tcu_import_drop(cu, imp);
		}
	}
	pthread_mutex_unlock(&cu->lock);
}

static int import_vmm(struct tshm_cuda *cu, const struct tcu_wire *w, int fd,
		      struct tshm_seg *anchor, struct tcu_import *imp)
{
	CUmemGenericAllocationHandle h;
	CUmemAccessDesc acc = { 0 };
	int ret;

	ret = CU_CALL(cuMemImportFromShareableHandle(&h,
			(void *)(uintptr_t)fd,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	if (ret)
		return ret;
	ret = CU_CALL(cuMemAddressReserve(&imp->base, imp->size, cu->gran, 0,
					  0));
	if (ret)
		goto err_h;
	ret = CU_CALL(cuMemMap(imp->base, imp->size, 0, h, 0));
	if (ret)
		goto err_addr;
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = cu->dev;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	ret = CU_CALL(cuMemSetAccess(imp->base, imp->size, &acc, 1));
	if (ret)
		goto err_unmap;
	tcu.cuMemRelease(h);	/* the mapping keeps the memory */
	imp->alloc_id = w->alloc_id;
	imp->anchor = tshm_seg_ref(anchor);
	return 0;

err_unmap:
	tcu.cuMemUnmap(imp->base, imp->size);
err_addr:
	tcu.cuMemAddressFree(imp->base, imp->size);
err_h:
	tcu.cuMemRelease(h);
	return ret;
}

/*
 * The allocation size in a legacy description is the sender's word: where
 * the driver tells the opened range, a description that claims more is
 * refused (a call that fails proves nothing and is let pass).
 */
static int open_legacy(struct tshm_cuda *cu, const struct tcu_wire *w,
		       struct tcu_import *imp)
{
	CUdeviceptr base = 0;
	size_t size = 0, room;
	int ret;

	memcpy(imp->ipc.reserved, w->ipc, CU_IPC_HANDLE_SIZE);
	ret = CU_CALL(cuIpcOpenMemHandle(&imp->base, imp->ipc,
					 CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	if (ret)
		return ret;
	if (tcu.cuMemGetAddressRange(&base, &size, imp->base) != CUDA_SUCCESS)
		return 0;
	room = imp->base < base || imp->base - base > size ? 0 :
		size - (size_t)(imp->base - base);
	if (imp->size > room) {
		tcu_err("IPC mapping of %zu bytes, the description says %zu",
			room, imp->size);
		tcu.cuIpcCloseMemHandle(imp->base);
		return -EBADMSG;
	}
	return 0;
}

static bool same(const struct tcu_import *imp, const struct tcu_wire *w)
{
	if (imp->kind != w->kind)
		return false;
	if (imp->kind == TSHM_CUDA_VMM)
		return imp->alloc_id == w->alloc_id;
	return !memcmp(imp->ipc.reserved, w->ipc, CU_IPC_HANDLE_SIZE);
}

int tcu_import_get(struct tshm_cuda *cu, const struct tcu_wire *w, int fd,
		   struct tshm_seg *anchor, struct tcu_import **out)
{
	struct tcu_import *imp;
	int ret;

	pthread_mutex_lock(&cu->lock);
	if (cu->st.cached)
		tcu_cache_trim_locked(cu, false);	/* no system call */
	for (imp = cu->cache; imp; imp = imp->next)
		if (same(imp, w))
			break;
	if (imp && imp->size != w->alloc_size) {
		/* the same allocation (or IPC handle) always has one size */
		tcu_err("%s of %zu bytes described as %llu",
			imp->kind == TSHM_CUDA_VMM ? "VMM allocation" :
			"IPC mapping", imp->size,
			(unsigned long long)w->alloc_size);
		ret = -EBADMSG;
		goto out;
	}
	if (imp) {
		cu->st.cache_hits++;
		goto found;
	}
	if (cu->st.cached)
		tcu_cache_trim_locked(cu, true);	/* importing anyway */
	imp = calloc(1, sizeof(*imp));
	if (!imp) {
		ret = -ENOMEM;
		goto out;
	}
	imp->kind = w->kind;
	imp->size = w->alloc_size;
	ret = tcu_ctx_push(cu);
	if (!ret) {
		ret = w->kind == TSHM_CUDA_VMM ?
			import_vmm(cu, w, fd, anchor, imp) :
			open_legacy(cu, w, imp);
		tcu_ctx_pop();
	}
	if (ret) {
		free(imp);
		goto out;
	}
	imp->next = cu->cache;
	cu->cache = imp;
	cu->st.imports++;
	cu->st.cached++;
found:
	imp->users++;
	*out = imp;
	ret = 0;
out:
	pthread_mutex_unlock(&cu->lock);
	return ret;
}
