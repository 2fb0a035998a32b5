/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * libtshm-cuda internals shared by its files: the driver table, errors,
 * the objects' layouts and the wire format.  Nothing here is exported
 * (cuda/libtshm-cuda.map); the tcu_ prefix keeps the static library's
 * symbols out of a program's way.
 *
 * Objects:
 *  - struct tshm_cuda: one process's use of one device, and its receiver
 *    cache (list of struct tcu_import, under tshm_cuda.lock).
 *  - struct tcu_alloc: a producer's VMM allocation (mapping, handle,
 *    exported fd, anchor segment); one per tshm_cuda_buf_alloc(), one per
 *    pool.  Refcounted by the buffers that lie in it.
 *  - struct tshm_cuda_buf: a buffer (a range of an allocation) with its
 *    lease segment; the producer's or a receiver's.
 */
#ifndef _TSHM_CUDA_PRIVATE_H
#define _TSHM_CUDA_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <cuda.h>

#include "tshm-cuda.h"

/* libtshm's self-contained helpers, built in (cuda-vars.mk). */

/* ---- fork (fork.c): process-local locks held across fork() ---- */

struct tcu_fork_node {
	struct tcu_fork_node *prev, *next;
	pthread_mutex_t *lock;
};

void tcu_fork_register(struct tcu_fork_node *n, pthread_mutex_t *lock);
void tcu_fork_unregister(struct tcu_fork_node *n);

/* ---- the driver, loaded at run time (driver.c) ---- */

#define TCU_FN(name)	__typeof__(&name) name

struct tcu_api {
	void *dl;
	TCU_FN(cuInit);
	TCU_FN(cuGetErrorName);
	TCU_FN(cuGetErrorString);
	TCU_FN(cuDeviceGetCount);
	TCU_FN(cuDeviceGet);
	TCU_FN(cuDeviceGetUuid);
	TCU_FN(cuDeviceGetAttribute);
	TCU_FN(cuDevicePrimaryCtxRetain);
	TCU_FN(cuDevicePrimaryCtxRelease);
	TCU_FN(cuCtxSetCurrent);
	TCU_FN(cuCtxPushCurrent);
	TCU_FN(cuCtxPopCurrent);
	TCU_FN(cuMemGetInfo);
	TCU_FN(cuMemGetAllocationGranularity);
	TCU_FN(cuMemCreate);
	TCU_FN(cuMemRelease);
	TCU_FN(cuMemAddressReserve);
	TCU_FN(cuMemAddressFree);
	TCU_FN(cuMemMap);
	TCU_FN(cuMemUnmap);
	TCU_FN(cuMemSetAccess);
	TCU_FN(cuMemExportToShareableHandle);
	TCU_FN(cuMemImportFromShareableHandle);
	TCU_FN(cuMemGetAddressRange);
	TCU_FN(cuIpcGetMemHandle);
	TCU_FN(cuIpcOpenMemHandle);
	TCU_FN(cuIpcCloseMemHandle);
};

extern struct tcu_api tcu;

/* dlopen() the driver once per process: 0, -ENODEV or -ENOSYS. */
int tcu_load(void);

/* Set this thread's tshm_cuda_last_error() message. */
__attribute__((format(printf, 1, 2))) void tcu_err(const char *fmt, ...);

/* Record a failed driver call (@call is "cuFoo(args)") and map it. */
int tcu_fail(const char *call, CUresult r);

/* A driver call: 0, or the mapped errno with the message recorded. */
#define CU_CALL(call) ({						\
		CUresult __r = tcu.call;				\
		__r == CUDA_SUCCESS ? 0 : tcu_fail(#call, __r);		\
	})

/* ---- devices and the receiver cache (device.c, cache.c) ---- */

/*
 * What a producer writes in an allocation's anchor segment.  Receivers'
 * caches hold the anchor with their import and drop the import once the
 * producer has marked it dead (freed its copy) or died.
 */
struct tcu_anchor {
	uint32_t magic;
	_Atomic uint32_t dead;
	uint64_t alloc_id;
	int32_t pid;
	uint32_t pad;
};

#define TCU_ANCHOR_MAGIC	0x74637561U	/* "tcua" */

/* A receiver's mapping of an allocation (VMM) or of an IPC handle. */
struct tcu_import {
	struct tcu_import *next;
	enum tshm_cuda_kind kind;
	uint64_t alloc_id;		/* VMM: the producer's allocation */
	CUipcMemHandle ipc;		/* legacy: the handle opened */
	CUdeviceptr base;
	size_t size;
	struct tshm_seg *anchor;	/* VMM */
	unsigned users;			/* receiver buffers using it now */
};

struct tshm_cuda {
	CUdevice dev;
	int ordinal;
	CUcontext ctx;
	CUuuid uuid;
	size_t gran;			/* VMM fd export: 0 when unsupported */
	pthread_mutex_t lock;		/* cache and st */
	struct tcu_fork_node fork;
	struct tcu_import *cache;
	struct tshm_cuda_stats st;
};

/*
 * Run the driver calls that follow in @cu's primary context: push it,
 * then tcu_ctx_pop() once they are done (only after a push that returned
 * 0).  The library never changes which context a thread has current, the
 * CUDA runtime's current device: what was current before (or nothing) is
 * current again after.
 */
int tcu_ctx_push(struct tshm_cuda *cu);
void tcu_ctx_pop(void);

/* The ordinal of the visible device with @uuid (no context made), -EXDEV. */
int tcu_ordinal_of_uuid(const uint8_t uuid[16]);

/* Unmap and free @imp (not on the list any more).  Any thread. */
void tcu_import_drop(struct tshm_cuda *cu, struct tcu_import *imp);
/* The producer freed the allocation (@check_pid: or died). */
bool tcu_import_dead(const struct tcu_import *imp, bool check_pid);
/* Drop unused dead imports; returns how many.  Under cu->lock. */
int tcu_cache_trim_locked(struct tshm_cuda *cu, bool check_pid);
/*
 * The import @w's buffer lies in, from the cache or made now (@fd and
 * @anchor: VMM), with one more user.  Takes cu->lock.
 */
struct tcu_wire;
int tcu_import_get(struct tshm_cuda *cu, const struct tcu_wire *w, int fd,
		   struct tshm_seg *anchor, struct tcu_import **out);
/* A receiver buffer let go of @imp.  Takes cu->lock. */
void tcu_import_put(struct tshm_cuda *cu, struct tcu_import *imp);

/* ---- buffers (alloc.c, buf.c) ---- */

struct tcu_alloc {
	_Atomic int refs;
	struct tshm_cuda *cu;
	uint64_t id;
	CUmemGenericAllocationHandle h;
	CUdeviceptr ptr;
	size_t size;
	int fd;				/* exported: what every send passes */
	struct tshm_seg *anchor;
};

/* cuMemCreate, map, export and an anchor: @size a granularity multiple. */
int tcu_alloc_create(struct tshm_cuda *cu, struct tshm_ctx *ctx, size_t size,
		     struct tcu_alloc **out);
void tcu_alloc_put(struct tcu_alloc *a);

struct tshm_cuda_buf {
	_Atomic int refs;
	struct tshm_cuda *cu;
	enum tshm_cuda_kind kind;
	bool producer;
	uint64_t id;
	CUdeviceptr ptr;
	size_t size;
	uint64_t off;			/* in the allocation or IPC mapping */
	size_t alloc_size;		/* producer, legacy: the allocation */
	struct tshm_seg *lease;
	struct tcu_alloc *alloc;	/* producer, VMM (a pool's: not held) */
	struct tshm_cuda_pool *pool;	/* producer, a pool's buffer */
	CUipcMemHandle ipc;		/* producer, legacy */
	struct tcu_import *imp;		/* receiver */
};

uint64_t tcu_new_id(void);
/* A producer buffer: id, lease segment, one reference. */
int tcu_buf_new(struct tshm_cuda *cu, struct tshm_ctx *ctx,
		enum tshm_cuda_kind kind, struct tshm_cuda_buf **out);
struct tshm_cuda_buf *tcu_buf_ref(struct tshm_cuda_buf *b);

/* pool.c: a pool buffer came back (its lease is unref'd): drop its hold. */
void tcu_pool_put(struct tshm_cuda_pool *pool);

/* ---- descriptions (pack.c) and channels (chan.c, recv.c) ---- */

#define TCU_WIRE_MAGIC	0x74637732U

/*
 * A buffer's description, as tshm_cuda_buf_pack() writes it (len 0) and
 * as a channel message starts (the user's payload of @len bytes follows).
 * Travels with its lease (and, VMM, the anchor) as segments and, VMM, the
 * allocation's fd.
 */
struct tcu_wire {
	uint32_t magic;
	uint8_t kind;
	uint8_t nsegs;
	uint16_t pad;
	uint64_t id;			/* the buffer */
	uint64_t alloc_id;		/* VMM: the allocation (cache key) */
	uint64_t alloc_size;		/* VMM: bytes a receiver maps */
	uint64_t off;			/* buffer in allocation / IPC mapping */
	uint64_t size;
	uint8_t uuid[16];
	uint8_t ipc[CU_IPC_HANDLE_SIZE];
	uint32_t len;
	uint32_t pad2;
};

/*
 * Room for a message with a small payload on the stack: send and receive
 * allocate only when the channel's max_msg does not fit.
 */
union tcu_wire_buf {
	struct tcu_wire w;
	char bytes[512];
};

/* A message buffer of @len bytes: @stack when it fits, else the heap. */
static inline struct tcu_wire *tcu_wire_buf(union tcu_wire_buf *stack,
					    size_t len)
{
	return len <= sizeof(*stack) ? &stack->w : malloc(len);
}

static inline void tcu_wire_buf_free(union tcu_wire_buf *stack,
				     struct tcu_wire *w)
{
	if (w != &stack->w)
		free(w);
}

/*
 * Describe producer buffer @b in @w (len 0): @segs (room for
 * TSHM_CUDA_PACK_SEGS) and *@nsegs its segments, *@fd its fd or -1, all
 * borrowed from @b.  -EOPNOTSUPP (with the message): a received buffer.
 */
int tcu_desc_fill(struct tshm_cuda_buf *b, struct tcu_wire *w,
		  struct tshm_seg **segs, unsigned *nsegs, int *fd);
/*
 * 0 when @w (its len aside) is a description this library wrote and the
 * @nsegs segments and @fd (-1: none) are the ones that go with it; else
 * -EBADMSG with "not a tshm-cuda @what: why" as the message.  Reads the
 * anchor segment, changes nothing.
 */
int tcu_desc_check(const struct tcu_wire *w, const char *what,
		   struct tshm_seg *const *segs, unsigned nsegs, int fd);
/*
 * The receiver buffer checked @w denotes on @cu's device (-EXDEV: another
 * device): imported or found in the cache, with its own reference on the
 * lease @segs[0].  The caller keeps its segments and @fd.
 */
int tcu_desc_import(struct tshm_cuda *cu, const struct tcu_wire *w,
		    struct tshm_seg *const *segs, int fd,
		    struct tshm_cuda_buf **out);

struct tshm_cuda_chan {
	struct tshm_queue *q;
	size_t max_msg;
};

#endif /* _TSHM_CUDA_PRIVATE_H */
