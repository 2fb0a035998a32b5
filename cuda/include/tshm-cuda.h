/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * tshm-cuda.h - libtshm-cuda, GPU buffers shared between processes through
 * tshm queues, freed when the last process lets go (crash or not).
 *
 * Conventions are libtshm's (tshm.h): 0 or a non-negative count on success,
 * a negative errno on failure, opaque objects, timeouts in milliseconds
 * (< 0 forever, 0 never blocks: -EAGAIN, > 0: -ETIMEDOUT).
 *
 * The CUDA driver is loaded at run time (dlopen("libcuda.so.1")): a program
 * linked with libtshm-cuda starts on a machine without the NVIDIA driver or
 * without a GPU, and tshm_cuda_open() then returns -ENODEV with the reason
 * in tshm_cuda_last_error().
 *
 * CUDA and fork(): create channels (tshm_cuda_chan_create) before fork(),
 * open CUDA (tshm_cuda_open) after it, in each process.  A CUDA context does
 * not survive fork().
 *
 * Documentation/cuda/guide.rst has the design and the errno mapping.
 */
#ifndef _TSHM_CUDA_H
#define _TSHM_CUDA_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include <tshm.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tshm_cuda;		/* one process's use of one device */
struct tshm_cuda_buf;		/* a shared device buffer (either end) */
struct tshm_cuda_chan;		/* a tshm queue that carries GPU buffers */
struct tshm_cuda_pool;		/* recycled VMM buffers (producer side) */

/* ---- errors ---- */

/*
 * The negative errno a CUresult maps to (0 for CUDA_SUCCESS); the table is
 * in Documentation/cuda/guide.rst.  tshm_cuda_strerror() explains the
 * codes this library gives a meaning to and falls back to tshm_strerror().
 */
int tshm_cuda_errno(int curesult);
const char *tshm_cuda_strerror(int err);

/*
 * The last failure's readable message in this thread, e.g.
 * "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (out of memory)" or "buffer is on
 * GPU-1234..., this process uses GPU-abcd...".  Never NULL.
 */
const char *tshm_cuda_last_error(void);

/* ---- devices ---- */

/*
 * Load the driver, cuInit(), pick device @ordinal (among those
 * CUDA_VISIBLE_DEVICES leaves visible) and retain its primary context (the
 * one the CUDA runtime uses too).  Every call of this library runs its
 * driver calls in that context and leaves the calling thread's current
 * context (the runtime's current device) as it found it, none included.
 * -ENODEV: no driver, no device or @ordinal out of range; -ENOSYS: driver
 * too old.
 */
int tshm_cuda_open(int ordinal, struct tshm_cuda **out);
void tshm_cuda_close(struct tshm_cuda *cu);
/*
 * Make the device's primary context current in the calling thread (for
 * the caller's own driver calls; this library needs no current context).
 */
int tshm_cuda_make_current(struct tshm_cuda *cu);
int tshm_cuda_device(const struct tshm_cuda *cu);	/* CUdevice */
void tshm_cuda_uuid(const struct tshm_cuda *cu, uint8_t uuid[16]);
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" into @buf (>= 41 bytes). */
void tshm_cuda_uuid_str(const uint8_t uuid[16], char *buf, size_t len);
/* 0 when @uuid is this process's device, -EXDEV (with a message) if not. */
int tshm_cuda_check_uuid(struct tshm_cuda *cu, const uint8_t uuid[16]);
/* 1 when the device can share VMM allocations as fds, 0 when not. */
int tshm_cuda_vmm_supported(struct tshm_cuda *cu);
/* Allocation granularity for shareable VMM buffers (bytes), or -errno. */
int64_t tshm_cuda_granularity(struct tshm_cuda *cu);
/* cuMemGetInfo on this device. */
int tshm_cuda_mem_info(struct tshm_cuda *cu, size_t *free_b, size_t *total_b);

/* ---- buffers ---- */

enum tshm_cuda_kind {
	TSHM_CUDA_VMM = 1,	/* cuMemCreate + POSIX fd export */
	TSHM_CUDA_LEGACY = 2,	/* cudaMalloc memory + cuIpcGetMemHandle */
};

/*
 * A VMM buffer of @size bytes, a multiple of tshm_cuda_granularity()
 * (-EINVAL otherwise, and for 0).  The memory lives while any process
 * holds it: the producer may unref right after sending.
 */
int tshm_cuda_buf_alloc(struct tshm_cuda *cu, struct tshm_ctx *ctx,
			size_t size, struct tshm_cuda_buf **out);
/*
 * Share device memory the caller allocated (cudaMalloc, a framework's
 * allocator): @dptr..@dptr+@size must lie in one allocation.  The caller
 * keeps ownership and must not free it before tshm_cuda_buf_wait_released()
 * says every receiver let go.
 */
int tshm_cuda_buf_wrap(struct tshm_cuda *cu, struct tshm_ctx *ctx,
		       void *dptr, size_t size, struct tshm_cuda_buf **out);

void *tshm_cuda_buf_ptr(const struct tshm_cuda_buf *buf);	/* device */
size_t tshm_cuda_buf_size(const struct tshm_cuda_buf *buf);
uint64_t tshm_cuda_buf_id(const struct tshm_cuda_buf *buf);
enum tshm_cuda_kind tshm_cuda_buf_kind(const struct tshm_cuda_buf *buf);
/* The lease segment (borrowed): poll-able through libtshm. */
struct tshm_seg *tshm_cuda_buf_lease(struct tshm_cuda_buf *buf);

/*
 * Producer: wait until every process this buffer was sent to has released
 * it (unref, exit or death), none is in flight.  As tshm_seg_wait_released().
 */
int tshm_cuda_buf_wait_released(struct tshm_cuda_buf *buf, int timeout_ms);
/*
 * The same wait from the caller's poll() loop: as tshm_seg_release_pollfds()
 * on the lease (0 when released now; when an fd is ready, ask
 * tshm_cuda_buf_wait_released(@buf, 0) and fill afresh on -EAGAIN).
 */
int tshm_cuda_buf_release_pollfds(struct tshm_cuda_buf *buf,
				  struct pollfd *pfd, unsigned n);

/*
 * Drop the caller's reference.  Producer of a VMM buffer: its own mapping
 * and handle go; the memory stays while receivers hold it.  Receiver: the
 * lease is released (the import may stay cached, see the guide).
 */
void tshm_cuda_buf_unref(struct tshm_cuda_buf *buf);

/* ---- channels ---- */

/*
 * A tshm queue plus the Unix socket the VMM fds travel on, and the two
 * process-shared locks that keep both in the same order.  Create before
 * fork(); every process forked afterwards may send and receive.
 * @max_msg: bytes of user payload per message.
 */
int tshm_cuda_chan_create(struct tshm_ctx *ctx, unsigned capacity,
			  size_t max_msg, struct tshm_cuda_chan **out);
int tshm_cuda_chan_close(struct tshm_cuda_chan *ch);
/*
 * The underlying queue (borrowed), for diagnostics and tests: a message
 * put on it by anything but tshm_cuda_send() is rejected by tshm_cuda_recv()
 * with -EBADMSG.
 */
struct tshm_queue *tshm_cuda_chan_queue(struct tshm_cuda_chan *ch);
void tshm_cuda_chan_destroy(struct tshm_cuda_chan *ch);

/*
 * Send @buf with @len bytes of payload.  The caller keeps its reference.
 * -EMSGSIZE: @len > max_msg.  -EPIPE: closed.  -EOPNOTSUPP: @buf was
 * received, not produced, here (forwarding is not supported).
 */
int tshm_cuda_send(struct tshm_cuda_chan *ch, struct tshm_cuda_buf *buf,
		   const void *msg, size_t len, int timeout_ms);
/*
 * Receive a buffer, imported (or found in the cache) and mapped on @cu's
 * device; the payload goes to @msg (@cap bytes, *@len set).  -EXDEV: the
 * buffer is on another device.  -EPIPE: closed and drained.  -EBADMSG: a
 * message this library did not send.  -EMSGSIZE: the payload did not fit
 * in @cap (*@len set); that message is dropped (its lease released).
 * Consumers take a process-shared lock for the duration of the wait.
 */
int tshm_cuda_recv(struct tshm_cuda_chan *ch, struct tshm_cuda *cu,
		   struct tshm_cuda_buf **out, void *msg, size_t cap,
		   size_t *len, int timeout_ms);

/* ---- carrying buffers in messages of your own ---- */

/*
 * A buffer travels on any tshm queue as three things in one message: its
 * description (bytes anywhere in the message), its segments (the lease,
 * and for a VMM buffer the allocation's anchor) and for a VMM buffer the
 * allocation's fd; tshm_queue_send_fds() sends them together and
 * tshm_queue_recv_fds() hands them to the receiver, whose they are to
 * unref and close once unpacked.  Release is as for channels: the
 * producer's tshm_cuda_buf_wait_released() returns once no message with
 * the lease is in flight and no receiver holds it, as a received segment
 * or in an unpacked buffer not yet unref'd (a receiver that died holds
 * nothing).
 */

/* Bytes a packed description takes at most (today's are shorter). */
#define TSHM_CUDA_DESC_SIZE	256
/* Room tshm_cuda_buf_pack() needs in @segs. */
#define TSHM_CUDA_PACK_SEGS	2

/*
 * Describe producer buffer @buf for a message of the caller's own protocol:
 * writes the description to @desc (@cap bytes, >= TSHM_CUDA_DESC_SIZE) and
 * returns its length; sets @segs[0..*@nsegs) (in: room, >=
 * TSHM_CUDA_PACK_SEGS) to the segments and *@fd to the fd (-1: none) that
 * must travel in the same message (tshm_queue_send_fds()).  All borrowed
 * from @buf: valid while the caller holds its reference (the caller may
 * unref right after sending).  -EOPNOTSUPP: a received buffer (as
 * tshm_cuda_send).  -ENOSPC: @cap or *@nsegs too small.  Nothing is
 * written on failure.
 */
int tshm_cuda_buf_pack(struct tshm_cuda_buf *buf, void *desc, size_t cap,
		       struct tshm_seg **segs, unsigned *nsegs, int *fd);
/*
 * The receiving half: the buffer that @desc (@len bytes, any alignment),
 * its segments and fd denote, imported (or found in the receiver cache) on
 * @cu's device, as tshm_cuda_recv() returns it; the caller unrefs it.
 * Takes its own segment references and never closes @fd: the caller still
 * owns what it passed (and may drop it at once).  The same description may
 * be unpacked again, a buffer each time.  -EBADMSG: not a description this
 * library packed, or segments/fd that do not go with it (message set with
 * tshm_cuda_last_error()); -EXDEV: a buffer of another device.
 */
int tshm_cuda_buf_unpack(struct tshm_cuda *cu, const void *desc, size_t len,
			 struct tshm_seg *const *segs, unsigned nsegs, int fd,
			 struct tshm_cuda_buf **out);
/*
 * Which device the buffer @desc (@len bytes, from tshm_cuda_buf_pack())
 * lives on: the ordinal tshm_cuda_open() takes in this process, found by
 * the device's UUID without making a context on any device, so that a
 * receiver on a machine with several GPUs opens only the one it needs.
 * The devices' UUIDs are read once per process: a call makes no driver
 * call after the first.  -EBADMSG: not a description (its head is
 * checked; tshm_cuda_buf_unpack() checks the rest); -EXDEV: on none of
 * the devices this process sees (CUDA_VISIBLE_DEVICES); -EINVAL: @desc
 * NULL with @len not 0; -ENODEV, -ENOSYS: as tshm_cuda_open().
 */
int tshm_cuda_desc_device(const void *desc, size_t len);

/* ---- receiver cache ---- */

struct tshm_cuda_stats {
	uint64_t imports;	/* VMM imports + IPC opens (CUDA calls) */
	uint64_t cache_hits;	/* receives that needed no CUDA call */
	uint64_t evictions;	/* cached imports dropped (producer gone) */
	uint64_t cached;	/* imports in the cache now */
};
void tshm_cuda_stats(struct tshm_cuda *cu, struct tshm_cuda_stats *st);
/*
 * Cached VMM imports are dropped when the producer freed its buffer (checked
 * on every receive, a memory read) or died (checked here and when a receive
 * has to import anyway: kill(pid, 0) per entry).  Returns how many went.
 * tshm_cuda_close() drops them all; receiver buffers must be unref'd first.
 */
int tshm_cuda_cache_trim(struct tshm_cuda *cu);

/* ---- pools ---- */

/*
 * @count buffers of @size bytes (any size: each starts 512-byte aligned)
 * cut from one VMM allocation, allocated and exported once.  get hands one
 * out (a reference the caller sends and unrefs), waiting up to
 * @timeout_ms when none is free; a buffer comes back by itself once this
 * process dropped its references and every receiver released it, killed
 * ones included.  Receivers import the allocation once and then hit their
 * cache: steady-state transfers make no CUDA call on either side.  A pool
 * is used in the process that created it; it is thread-safe.  Destroy
 * drops the pool's references; buffers still out live until released.
 */
int tshm_cuda_pool_create(struct tshm_cuda *cu, struct tshm_ctx *ctx,
			  unsigned count, size_t size,
			  struct tshm_cuda_pool **out);
int tshm_cuda_pool_get(struct tshm_cuda_pool *pool, int timeout_ms,
		       struct tshm_cuda_buf **out);
/* Buffers ready to be handed out now (does not block). */
unsigned tshm_cuda_pool_available(struct tshm_cuda_pool *pool);
void tshm_cuda_pool_destroy(struct tshm_cuda_pool *pool);

#ifdef __cplusplus
}
#endif
#endif /* _TSHM_CUDA_H */
