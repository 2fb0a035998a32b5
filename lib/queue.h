/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * queue.h - what the queue's files share: the ring's layout in shared
 * memory, the process-local queue object, and the functions each file
 * offers the others.  Nothing here is ABI.  Files:
 *
 *   queue.c         creation, attachment, send, receive, close: the
 *                   slot ring (Documentation/lib/queue.rst)
 *   queue-wait.c    the segment lock, sleeps and wake-ups, the pollable fd
 *   kmod-queue.c    segments through the queue on the module: grants
 *                   and the spare table (backend_ops, backend.h)
 *   memfd-queue.c   the same on the fallback: fds and tags in a socket
 *   queue-sock.c    the queue's socket: fds in ring order, on both
 *                   backends (the fallback's segments, tshm_queue_send_fds)
 *   queue-export.c  handing a queue to another process
 */
#ifndef _TSHM_QUEUE_H
#define _TSHM_QUEUE_H

#include "tshm-private.h"

#define QUEUE_MAGIC		0x51485354U	/* "TSHQ" */
#define QUEUE_VERSION		7
#define QUEUE_MAX_CAPACITY	65536U
#define QUEUE_MAX_MSG		(16UL << 20)
#define QUEUE_MAX_RING		(1UL << 30)
#define QUEUE_SPIN_US		50
#define QUEUE_SNDBUF		(8 << 20)
#define QUEUE_MAX_FDS		5	/* see q_fds() */
#define CACHELINE		64
/*
 * A slot claimed this long by a live sender is revoked by the receiver
 * that waits for it (Documentation/lib/queue.rst, "A stopped participant"),
 * plus the time to copy max_msg bytes at a pessimistic 100 MB/s, so that a
 * sender of big messages is not revoked for copying them.
 */
#define QUEUE_CLAIM_NS		(20 * 1000 * 1000LL)
#define QUEUE_CLAIM_NS_PER_BYTE	10
/*
 * A receiver that waits asks whether a claimer's thread died once the
 * claim has stood this long unpublished (q_find()), not at first sight.
 */
#define QUEUE_DEAD_CHECK_NS	(1000 * 1000LL)

static inline int64_t q_claim_bound_ns(size_t max_msg)
{
	return QUEUE_CLAIM_NS + (int64_t)max_msg * QUEUE_CLAIM_NS_PER_BYTE;
}
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
	/*
	 * The creator's pid namespace (st_ino of /proc/self/ns/pid; 0 when
	 * unknown): claims name threads by id, which means something only in
	 * one namespace, so processes of another one are refused (-EXDEV).
	 */
	uint64_t pidns;

	/*
	 * The segment lock.  Never needed by byte-only messages.  Both
	 * backends: serializes the messages that carry fds through the
	 * queue's socket (the fallback's segments, tshm_queue_send_fds()),
	 * so that socket order is ring order.  Module: also guards the spare
	 * table, and is then only ever tried (a busy lock costs a GRANT or a
	 * DROP, never a wait).
	 */
	struct rlock lock __attribute__((aligned(CACHELINE)));
	_Atomic uint32_t closed;
	uint64_t tag;			/* the last socket tag used */

	/*
	 * Hints, not commits: the next position to send to and to receive
	 * from.  Anyone who finds the slot at the hint dealt with moves it
	 * on; the slots' state words are the truth.
	 */
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

/*
 * A slot's state word: what the slot holds and for which queue position.
 * EMPTY and FULL carry the whole position (61 bits); the states that name a
 * thread carry its tid (22 bits, PID_MAX_LIMIT) and the position's low 39
 * bits.  Every transition is one compare-and-swap from a value that names
 * the position, so none can be replayed at another position.
 *
 *   EMPTY(p)        free for the sender of position p
 *   CLAIMED(p, t)   thread t is writing the message of position p
 *   FULL(p)         the message of position p, ready to be taken
 *   QFULL(p, t)     no message at p: t's claim was revoked, receivers pass
 *   QEMPTY(p, t)    as EMPTY, but t may still be writing into the slot:
 *                   senders pass it (making it QFULL) until t is gone or
 *                   has given it back (t = 0)
 */
enum {
	QS_EMPTY,
	QS_FULL,
	QS_CLAIMED,
	QS_QFULL,
	QS_QEMPTY,
};

#define QS_KIND_BITS	3
#define QS_TID_BITS	22
#define QS_POSL_BITS	39
#define QS_TID_MASK	((1U << QS_TID_BITS) - 1)
#define QS_POSL_MASK	((1ULL << QS_POSL_BITS) - 1)

static inline unsigned qs_kind(uint64_t w)
{
	return w & ((1U << QS_KIND_BITS) - 1);
}

static inline bool qs_has_tid(uint64_t w)
{
	return qs_kind(w) >= QS_CLAIMED;
}

static inline uint32_t qs_tid(uint64_t w)
{
	return (w >> QS_KIND_BITS) & QS_TID_MASK;
}

static inline uint64_t qs_make(unsigned kind, uint64_t pos)
{
	return pos << QS_KIND_BITS | kind;
}

static inline uint64_t qs_make_tid(unsigned kind, uint64_t pos, uint32_t tid)
{
	return (pos & QS_POSL_MASK) << (QS_KIND_BITS + QS_TID_BITS) |
	       (uint64_t)(tid & QS_TID_MASK) << QS_KIND_BITS | kind;
}

/* The state's position minus @pos: < 0 an older lap, > 0 a newer one. */
static inline int64_t qs_diff(uint64_t w, uint64_t pos)
{
	uint64_t d;

	if (!qs_has_tid(w))
		return (int64_t)((w >> QS_KIND_BITS) - pos);
	d = ((w >> (QS_KIND_BITS + QS_TID_BITS)) - pos) & QS_POSL_MASK;
	if (d & (1ULL << (QS_POSL_BITS - 1)))
		return (int64_t)(d | ~QS_POSL_MASK);
	return (int64_t)d;
}

/*
 * One slot: the state word, the length and the bytes share the first cache
 * line (a message of up to 48 bytes moves one line); the segments' handles
 * and socket tags follow the bytes, read only when @nsegs or @nfds says so.
 */
struct qslot {
	_Atomic uint64_t state;
	uint32_t len;
	uint16_t nsegs;
	uint16_t nfds;			/* tshm_queue_send_fds()'s */
	unsigned char data[];
};

/* After the bytes of every slot: what else a message carries. */
struct qsegs {
	uint64_t tag;			/* fallback: its segments' socket message */
	uint64_t fdtag;			/* its fds' socket message */
	struct tshm_handle h[TSHM_QUEUE_MAX_SEGS];
};

/*
 * What travels through the queue's socket next to the fds: a fallback
 * message's segments (@nsegs, two fds each, their lease generations, inode
 * numbers and queue keys), or a message's own fds (@nsegs 0, @nfds of
 * them).
 */
struct qwire {
	uint64_t tag;
	uint32_t nsegs;
	uint32_t nfds;
	uint64_t gen[TSHM_QUEUE_MAX_SEGS];
	uint64_t ino[TSHM_QUEUE_MAX_SEGS];
	uint64_t key[TSHM_QUEUE_MAX_SEGS];
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
	int sfd[2];			/* the socket: send end, receive end */
	int efd;			/* tshm_queue_fd(): an eventfd */
	bool pollable;			/* this process polls @efd */
	enum tshm_wait wait;
	unsigned spin_us;
	uint64_t pidns;			/* the snapshot of hdr->pidns */
	/*
	 * The unpublished claim a receiver last found at the head, and since
	 * when: kept across calls, so that receivers with timeouts shorter
	 * than the claim bound (timeout 0, a poll loop) still add up to it.
	 */
	_Atomic uint64_t stall_w;
	_Atomic int64_t stall_since;
};

static inline size_t slot_size_for(size_t max_msg)
{
	return ALIGN_UP(sizeof(struct qslot) + ALIGN_UP(max_msg, 8) +
			sizeof(struct qsegs), CACHELINE);
}

static inline size_t hdr_size(void)
{
	return ALIGN_UP(sizeof(struct qhdr), CACHELINE);
}

static inline struct qslot *q_slot(struct tshm_queue *q, uint64_t pos)
{
	return (struct qslot *)(q->slots + (pos % q->capacity) * q->slot_size);
}

static inline struct qsegs *q_slot_segs(struct tshm_queue *q,
					struct qslot *slot)
{
	return (struct qsegs *)(slot->data + ALIGN_UP(q->max_msg, 8));
}

/* queue.c */
int q_attach(struct tshm_ctx *ctx, int fd, int gfd, const int *sfd, int efd,
	     struct tshm_queue **out);

/* queue-wait.c: the segment lock, sleeps and wake-ups, the pollable fd */
int q_lock(struct tshm_queue *q, const struct deadline *dl);
int q_trylock(struct tshm_queue *q);
void q_unlock(struct tshm_queue *q, bool recovered);
uint32_t q_tid(void);
bool q_tid_gone(uint32_t tid);
uint64_t q_pidns(void);

/* Whether this process shares the queue creator's pid namespace. */
static inline bool q_pidns_ok(const struct tshm_queue *q)
{
	uint64_t ns;

	if (!q->pidns)
		return true;
	ns = q_pidns();
	return !ns || ns == q->pidns;
}
void q_wake(_Atomic uint32_t *word, _Atomic uint32_t *waiters, bool force);
int q_wait(struct tshm_queue *q, _Atomic uint32_t *word, uint32_t seen,
	   _Atomic uint32_t *waiters, const struct deadline *dl);
void q_poll_wake(struct tshm_queue *q, bool force);
void q_poll_arm(struct tshm_queue *q);

/* queue-sock.c: the queue's socket, written and read under the lock */
int q_sock_open(int *sfd);
int q_sock_check(const int *fds, int *sfd);
int q_sock_send(struct tshm_queue *q, struct qwire *w, const int *fds,
		unsigned nfds, uint64_t *tag);
int q_sock_find(struct tshm_queue *q, uint64_t tag, struct qwire *w);
int q_sock_skip(struct tshm_queue *q, uint64_t tag);
int q_sock_take_found(struct tshm_queue *q, uint64_t tag, unsigned nsegs,
		      unsigned nfds, struct qwire *w, int *fds);
int q_sock_take(struct tshm_queue *q, uint64_t tag, unsigned nsegs,
		unsigned nfds, struct qwire *w, int *fds);

/* queue-export.c: the fds that make a queue, in the order they travel */
int q_fds(const struct tshm_queue *q, int *fds);
void q_close_fds(int fd, int gfd, const int *sfd, int efd);

#endif /* _TSHM_QUEUE_H */
