/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * queue.h - what the queue's files share: the ring's layout in shared
 * memory, the process-local queue object, and the functions each file
 * offers the others.  Nothing here is ABI.  Files:
 *
 *   queue.c         creation, attachment, send, receive, close
 *   queue-wait.c    the ring lock, sleeps and wake-ups, the pollable fd
 *   kmod-queue.c    segments through the queue on the module: grants
 *                   and the spare table (backend_ops, backend.h)
 *   memfd-queue.c   the same on the fallback: fds and tags in a socket
 *   queue-export.c  handing a queue to another process
 */
#ifndef _TSHM_QUEUE_H
#define _TSHM_QUEUE_H

#include "tshm-private.h"

#define QUEUE_MAGIC		0x51485354U	/* "TSHQ" */
#define QUEUE_VERSION		4
#define QUEUE_MAX_CAPACITY	65536U
#define QUEUE_MAX_MSG		(16UL << 20)
#define QUEUE_MAX_RING		(1UL << 30)
#define QUEUE_SPIN_US		50
#define QUEUE_LOCK_SPINS	64
#define QUEUE_SNDBUF		(8 << 20)
#define QUEUE_MAX_FDS		4	/* see q_fds() */
#define CACHELINE		64
/* Module: the spare-grant table (Documentation/lib/queue.rst). */
#define QUEUE_SPARES		64
#define QUEUE_SPARE_PROBE	8

/*
 * @avail grants for segment @id that the queue context holds and no message
 * in the ring accounts for: a sender takes one instead of a GRANT.  An entry
 * with @avail 0 is free.  Only the lock holder touches the table.
 */
struct qspare {
	uint64_t id;
	uint32_t avail;
	uint32_t __pad;
};

struct qhdr {
	/* Written once by the creator; every process keeps its own copy. */
	uint32_t magic;
	uint32_t version;
	uint32_t backend;
	uint32_t capacity;
	uint32_t slot_size;
	uint32_t max_segs;
	uint64_t max_msg;
	uint64_t map_size;

	/* The lock and the state only its holder changes. */
	pthread_mutex_t lock __attribute__((aligned(CACHELINE)));
	/*
	 * Waiting for the lock: @lockseq moves at every unlock; @lockwait is
	 * set by a sleeper and cleared by the unlocker that wakes it.  The
	 * sleeps are sliced, so a holder that dies (no unlock, no wake) is
	 * noticed by the next trylock (EOWNERDEAD) within a slice.
	 */
	_Atomic uint32_t lockseq;
	_Atomic uint32_t lockwait;
	_Atomic uint32_t closed;
	uint64_t tag;			/* fallback: last socket tag used */

	_Atomic uint64_t head __attribute__((aligned(CACHELINE)));
	_Atomic uint64_t tail __attribute__((aligned(CACHELINE)));

	/*
	 * Futex words: bumped after every publish / consume / close.  The
	 * waiters words are a flag, not a count: a sleeper sets it, the waker
	 * that finds it set clears it and wakes everyone, and the sleepers
	 * that must sleep again set it again.  One that dies asleep leaves at
	 * most one needless wake-up behind.
	 */
	_Atomic uint32_t pub __attribute__((aligned(CACHELINE)));
	_Atomic uint32_t rwait;		/* receivers may sleep on @pub */
	_Atomic uint32_t pollwait;	/* a poller armed the eventfd */
	_Atomic uint32_t con __attribute__((aligned(CACHELINE)));
	_Atomic uint32_t swait;		/* senders may sleep on @con */

	/* Module: spare grants, changed under @lock only. */
	struct qspare spare[QUEUE_SPARES] __attribute__((aligned(CACHELINE)));
} __attribute__((aligned(CACHELINE)));

struct qslot {
	uint64_t pos;			/* the position this slot holds */
	uint64_t tag;			/* fallback: its socket message */
	uint32_t len;
	uint32_t nsegs;
	uint64_t __pad;
	struct tshm_handle h[TSHM_QUEUE_MAX_SEGS];
	unsigned char data[];
};

/* What travels through the fallback's socket next to the fds. */
struct qwire {
	uint64_t tag;
	uint32_t nsegs;
	uint32_t __pad;
	uint64_t gen[TSHM_QUEUE_MAX_SEGS];
};

struct tshm_queue {
	atomic_int refs;
	struct tshm_ctx *ctx;
	struct tshm_queue *ctx_next;	/* ctx->queues, under ctx->qlock */
	struct qhdr *hdr;
	unsigned char *slots;
	size_t map_size;
	/* Local copies of the geometry: shared memory is never trusted. */
	uint32_t capacity;
	uint32_t slot_size;
	size_t max_msg;
	int fd;				/* the ring's memfd */
	int gfd;			/* module: the queue's context */
	int sfd[2];			/* fallback: send end, receive end */
	int efd;			/* tshm_queue_fd(): an eventfd */
	bool pollable;			/* this process polls @efd */
	enum tshm_wait wait;
	unsigned spin_us;
};

static inline size_t slot_size_for(size_t max_msg)
{
	return ALIGN_UP(sizeof(struct qslot) + max_msg, CACHELINE);
}

static inline size_t hdr_size(void)
{
	return ALIGN_UP(sizeof(struct qhdr), CACHELINE);
}

static inline struct qslot *q_slot(struct tshm_queue *q, uint64_t pos)
{
	return (struct qslot *)(q->slots + (pos % q->capacity) * q->slot_size);
}

/* queue.c */
int q_attach(struct tshm_ctx *ctx, int fd, int gfd, const int *sfd, int efd,
	     struct tshm_queue **out);

/* queue-wait.c: the ring lock, sleeps and wake-ups, the pollable fd */
int q_lock(struct tshm_queue *q, const struct deadline *dl);
void q_unlock(struct tshm_queue *q, bool recovered);
void q_wake(_Atomic uint32_t *word, _Atomic uint32_t *waiters, bool force);
int q_wait(struct tshm_queue *q, _Atomic uint32_t *word, uint32_t seen,
	   _Atomic uint32_t *waiters, const struct deadline *dl);
void q_poll_wake(struct tshm_queue *q, bool force);
void q_poll_arm(struct tshm_queue *q);

/* queue-export.c: the fds that make a queue, in the order they travel */
int q_fds(const struct tshm_queue *q, int *fds);
void q_close_fds(int fd, int gfd, const int *sfd, int efd);

#endif /* _TSHM_QUEUE_H */
