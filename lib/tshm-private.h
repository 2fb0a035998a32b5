/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * libtshm internals shared between the lib/ sources.  Nothing here is ABI.
 */
#ifndef _TSHM_PRIVATE_H
#define _TSHM_PRIVATE_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "tshm.h"
#include "backend.h"
#include "deadline.h"
#include "futex.h"
#include "rlock.h"
#include "scm.h"

#define TSHM_EXPORT	__attribute__((visibility("default")))
#define likely(x)	__builtin_expect(!!(x), 1)
#define unlikely(x)	__builtin_expect(!!(x), 0)
#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))
#define ALIGN_UP(x, a)	(((x) + (a) - 1) & ~((__typeof__(x))(a) - 1))

/* backend_ops.wire: how shared headers and socket messages name one. */
enum tshm_backend {
	TSHM_BACKEND_KMOD = 1,
	TSHM_BACKEND_MEMFD = 2,
};

#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

/* ---- fork (fork.c) ---- */

/* In the order their locks are taken before fork(). */
enum fork_level {
	FORK_POOL,
	FORK_CTX,
	FORK_LEVELS,
};

/*
 * An object with process-local locks.  @prepare takes them before fork();
 * @release drops them in the parent (@child false) or makes them afresh in
 * the child.
 */
struct fork_node {
	struct fork_node *prev, *next;
	enum fork_level level;
	void (*prepare)(struct fork_node *n);
	void (*release)(struct fork_node *n, bool child);
};

void fork_register(struct fork_node *n, enum fork_level level);
void fork_unregister(struct fork_node *n);
/* spawn.c's entry registry lock, taken first. */
void spawn_fork_prepare(void);
void spawn_fork_release(bool child);

/* ---- context ---- */

#define TSHM_CACHE_BUCKETS	256

struct tshm_ctx {
	atomic_int refs;
	const struct backend_ops *ops;	/* chosen once, in ctx.c */
	int fd;				/* /dev/tshm open, or the marker memfd */
	dev_t memfd_dev;		/* memfd: st_dev of this process's memfds */
	size_t page_size;
	pthread_mutex_t lock;		/* protects the cache and seg drop state */
	struct tshm_seg *cache[TSHM_CACHE_BUCKETS];
	/*
	 * Fork detection without a system call: @mark is a MADV_WIPEONFORK
	 * page, so it reads zero in a child, which then takes a new
	 * generation.  Segment objects inherited across fork() belong to the
	 * parent's generation: in the child they share the parent's open file
	 * (the same holder) and must not satisfy cache lookups.
	 */
	_Atomic uint64_t *mark;
	uint64_t gen_base;
	/* Segments with grants to give back (seg->drop_next chain). */
	struct tshm_seg *drops;
	/*
	 * Module: every queue object of this process on this context
	 * (q->ctx_next chain), so that spare grants parked in their tables
	 * can be given back when a segment is released.  Under @qlock, which
	 * nests inside @lock and is never held while taking another lock.
	 */
	pthread_mutex_t qlock;
	struct tshm_queue *queues;
	struct fork_node fork;
};

uint64_t ctx_gen(struct tshm_ctx *ctx);
/* A receiver is about to idle: give back what it batched (module grants). */
void ctx_flush_drops(struct tshm_ctx *ctx);

struct tshm_ctx *ctx_get(struct tshm_ctx *ctx);
void ctx_put(struct tshm_ctx *ctx);

/* ---- segments ---- */

struct tshm_seg {
	atomic_int refs;
	struct tshm_ctx *ctx;
	struct tshm_seg *hnext;		/* cache bucket chain, under ctx->lock */
	uint64_t id;
	uint64_t gen;			/* ctx_gen() when this process made it */
	void *data;
	size_t size;
	int fd;				/* -1: module, received (mapping) */
	bool creator;
	/* @name is to be read from @fd (ops->seg_name_lazy); under ctx->lock. */
	atomic_bool name_pending;
	char name[TSHM_SEG_NAME_MAX + 1];

	/*
	 * Module: grants that reached this process for a segment it already
	 * held (cache hits), not consumed by an ATTACH, given back with one
	 * DROP on @drop_q's context (or the ctx's when NULL) when the count
	 * gets large or the segment is released.  Under ctx->lock.
	 */
	struct tshm_queue *drop_q;
	uint32_t drop_count;
	struct tshm_seg *drop_next;
	/*
	 * Module: this process sent the segment on a queue or parked a spare
	 * grant for it in a queue's table; its release gives the spares of
	 * every queue of the context back (queue_reclaim_spares()).
	 */
	atomic_bool spare_touched;

	/*
	 * Fallback: the lease.  @lease is the peer end this process holds and
	 * passes along with the memfd (refcounted so that a send in flight
	 * keeps the fd open while another thread drops it).  The creator also
	 * keeps the local ends of every lease it handed out, in @lease_ends;
	 * each hangs up when every copy of its peer is closed.  Under
	 * @lease_lock.
	 */
	pthread_mutex_t lease_lock;
	struct tshm_lease *lease;
	uint64_t lease_gen;
	int *lease_ends;
	unsigned nlease_ends;
	/*
	 * Fallback: the segment's queue key, 0 for none.  The creator draws
	 * it at random, and again when it finds itself the sole holder
	 * (memfd_qkey_draw()); it travels with the memfd in a queue's socket
	 * messages, so only processes that were sent the segment learn it.
	 * A receiver that holds the segment and is sent the key it knows
	 * need not install the message's fds (memfd-queue.c).  A holder
	 * keeps the last key that came with the memfd.  Atomic; the creator
	 * redraws it, and a receiver compares it, under @lease_lock.
	 */
	_Atomic uint64_t qkey;

	/*
	 * Pool membership: ring the pool's notifier when only the pool's
	 * reference is left.  Set before the buffer is handed out, then
	 * constant; the segment holds a reference on it.
	 */
	struct pool_notifier *notifier;
};

/* Insert/lookup in ctx's cache.  lookup returns a new reference or NULL. */
struct tshm_seg *seg_cache_lookup_locked(struct tshm_ctx *ctx, uint64_t id);
void seg_cache_insert_locked(struct tshm_ctx *ctx, struct tshm_seg *seg);

/*
 * Build a segment around @fd (ownership passes in) of @size bytes with @id,
 * or return the cached one (then @fd is closed).  *@hit says which.
 */
int seg_adopt(struct tshm_ctx *ctx, int fd, uint64_t id, size_t size,
	      struct tshm_seg **out, bool *hit);
/* A new reference on @id if this process holds it, else NULL. */
struct tshm_seg *seg_cache_find(struct tshm_ctx *ctx, uint64_t id);

/* 1 when only this process holds @seg now, 0 when not, <0 on error. */
int seg_released_now(struct tshm_seg *seg);
/* The fds poll() would report the release on, for pools. */
int seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd, unsigned n);

/*
 * What a pool's buffers keep of it: an eventfd that local unrefs ring,
 * only while @sleepers is non-zero.  Refcounted: the pool and each buffer.
 */
struct pool_notifier {
	atomic_int refs;
	atomic_uint sleepers;
	int efd;
};

void pool_notify(struct pool_notifier *n);
void pool_notifier_put(struct pool_notifier *n);

/* ---- queues ---- */

/* The module context that holds a queue's in-flight grants. */
int queue_grant_fd(const struct tshm_queue *q);

/* ---- checks on received fds (scm.h has the others) ---- */

/*
 * 0 or -EBADMSG (or fstat's errno): a regular file sealed against
 * shrinking and growing (*@st filled).
 */
int memfd_check_sealed(int fd, struct stat *st);

#endif /* _TSHM_PRIVATE_H */
