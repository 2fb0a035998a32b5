/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * tshm.h - libtshm, shared memory between processes without leaks
 *
 * The library's header (spawning workers has its own, tshm-spawn.h).
 * Conventions, liburing style:
 *
 *  - Functions that can fail return 0 (or a non-negative count) on success
 *    and a negative errno on failure; errno itself is not used.
 *    tshm_strerror() explains the codes the library gives a specific
 *    meaning to.
 *  - Objects are opaque and reference counted (ref/unref) or have a
 *    create/destroy pair.  There is no global state: everything the library
 *    keeps lives in the struct tshm_ctx the caller opened.
 *  - Timeouts are in milliseconds: < 0 waits forever, 0 never blocks and
 *    gives -EAGAIN where it would have waited, > 0 gives -ETIMEDOUT when it
 *    runs out.  A wait interrupted by a signal handler is restarted
 *    internally, unless the thread asked for -EINTR
 *    (tshm_thread_set_intr()).
 *  - Every file descriptor the library opens is O_CLOEXEC unless an export
 *    function says otherwise.
 *
 * Thread safety: a tshm_ctx, its segments, queues and pools may be used from
 * any number of threads at once, except where a function says otherwise.
 * Destroying an object (the last unref, tshm_ctx_close, tshm_pool_destroy)
 * while another thread still uses it is the caller's bug, as with free().
 *
 * Fork: a context, segment or queue created before fork() works in the child
 * (the child inherits the fds and mappings), also when other threads of the
 * parent were inside tshm calls at the time: the library holds its locks
 * across fork() (pthread_atfork).  A pool belongs to the process that
 * created it.  See Documentation/lib/guide.rst for handing queues and
 * contexts to exec'ed or unrelated processes.
 */
#ifndef _TSHM_H
#define _TSHM_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSHM_VERSION_MAJOR	0
#define TSHM_VERSION_MINOR	5	/* the newest node of libtshm.map */

struct tshm_ctx;
struct tshm_seg;
struct tshm_queue;
struct tshm_pool;

/* ---- errors ---- */

/*
 * A message for a (negative or positive) errno as the library uses it, e.g.
 * -EPIPE "queue closed and drained".  Never NULL; the string is static.
 */
const char *tshm_strerror(int err);

/*
 * Blocking calls made by the calling thread (queue send and recv,
 * release waits, pool get, event and barrier waits) return -EINTR when
 * a signal handler ran while they waited (@on non-zero) instead of
 * restarting (@on 0, the default).  Returns the previous setting.
 */
int tshm_thread_set_intr(int on);

/* ---- contexts ---- */

/*
 * tshm_ctx_open() flags.  Without either flag the library uses the module
 * when /dev/tshm can be opened and the memfd fallback otherwise; the
 * environment variable TSHM_BACKEND=kmod|memfd forces one when no flag does.
 */
#define TSHM_CTX_MEMFD		(1U << 0)	/* force the memfd fallback */
#define TSHM_CTX_KMOD		(1U << 1)	/* require /dev/tshm (-ENODEV) */

/*
 * A context owns what this process holds: the module context (one open of
 * /dev/tshm) or the fallback's state, and the cache of attached segments
 * keyed by segment id.  Segments, queues and pools keep their context
 * alive: tshm_ctx_close() drops the caller's reference only.
 */
int tshm_ctx_open(struct tshm_ctx **out, unsigned flags);
void tshm_ctx_close(struct tshm_ctx *ctx);

/* "kmod" or "memfd". */
const char *tshm_ctx_backend(const struct tshm_ctx *ctx);

/*
 * The context's file descriptor (a /dev/tshm open on the module, a small
 * sealed memfd on the fallback), owned by the context.  To give the context
 * to an exec'ed child, clear FD_CLOEXEC on it in the child (after fork,
 * before exec) and pass the number; the child calls tshm_ctx_open_fd(),
 * which takes a duplicate and leaves @fd to the caller.  Flags as for
 * tshm_ctx_open(); a backend flag that does not match @fd gives -EINVAL.
 */
int tshm_ctx_fd(const struct tshm_ctx *ctx);
int tshm_ctx_open_fd(int fd, unsigned flags, struct tshm_ctx **out);

/* ---- segments ---- */

/* tshm_seg_create() flags */
#define TSHM_SEG_HUGE		(1U << 0)	/* ask for transparent huge pages */
#define TSHM_SEG_PREFAULT	(1U << 1)	/* allocate every page now */

#define TSHM_SEG_NAME_MAX	31		/* bytes of a name, NUL excluded */

/*
 * A segment is a fixed-size shared mapping (no grow, no shrink) that lives
 * while any process holds it.  tshm_seg_create() maps it read-write and
 * returns it with one reference.  @name (may be NULL) is shown in
 * /proc/tshm and /proc/PID/maps; longer names are cut.
 */
int tshm_seg_create(struct tshm_ctx *ctx, size_t size, const char *name,
		    unsigned flags, struct tshm_seg **out);
void *tshm_seg_data(struct tshm_seg *seg);
size_t tshm_seg_size(const struct tshm_seg *seg);
/* Module: the kernel's id, never reused.  Fallback: the memfd's inode. */
uint64_t tshm_seg_id(const struct tshm_seg *seg);
const char *tshm_seg_name(const struct tshm_seg *seg);
struct tshm_seg *tshm_seg_ref(struct tshm_seg *seg);
/* The last unref unmaps and closes: this process no longer holds it. */
void tshm_seg_unref(struct tshm_seg *seg);

/*
 * Wait until this process is the segment's only holder: every process it
 * was sent to has released it (unref, exit or death), and no copy is in
 * flight in a queue.  Only in the process that created the segment
 * (-EOPNOTSUPP elsewhere).  Module: poll() on the segment fd (receivers
 * hold a segment by its mapping alone, with no fd, so that a process can
 * hold thousands under RLIMIT_NOFILE).  Fallback: through the segment's
 * lease socket, whose peer travels with the memfd and hangs up when the
 * last receiver lets go.  Returns 0, -ETIMEDOUT or -EAGAIN.
 */
int tshm_seg_wait_released(struct tshm_seg *seg, int timeout_ms);

/*
 * The same wait from an event loop.  Fills at most @n entries of @pfd (fd
 * and events; revents is the caller's) with fds that become readable when
 * the segment may have been released, and returns how many, or 0 when it
 * is released now.  After poll() says one is ready, ask
 * tshm_seg_wait_released(@seg, 0): -EAGAIN means not yet, fill afresh (the
 * set changes as receivers let go).  -EINVAL for a NULL or empty array,
 * -EOPNOTSUPP where tshm_seg_wait_released() gives it.
 */
int tshm_seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd,
			     unsigned n);

/*
 * Handle passing.  A handle is 16 bytes that can cross any channel (a pipe,
 * a socket, a file, your own shared memory).  Module backend only: export
 * grants the segment to the exporting context once; whichever process
 * holding that context imports it first consumes the grant.  Importing a
 * segment the process already holds costs no system call (the cache), and
 * the grant is given back later in a batch.  The fallback cannot name a
 * memfd without passing the fd: both give -EOPNOTSUPP there; use
 * tshm_seg_send_fd()/tshm_seg_recv_fd(), which work on both backends.
 */
struct tshm_handle {
	uint64_t id;
	uint32_t grants;	/* grants the handle carries (1) */
	uint32_t flags;		/* zero */
};

int tshm_seg_export(struct tshm_seg *seg, struct tshm_handle *h);
int tshm_seg_import(struct tshm_ctx *ctx, const struct tshm_handle *h,
		    struct tshm_seg **out);

/* Send one segment over a connected AF_UNIX socket with SCM_RIGHTS. */
int tshm_seg_send_fd(struct tshm_seg *seg, int sock);
int tshm_seg_recv_fd(struct tshm_ctx *ctx, int sock, struct tshm_seg **out);

/* ---- queues ---- */

/* Segments one message can carry. */
#define TSHM_QUEUE_MAX_SEGS	8

/*
 * A bounded multi-producer multi-consumer queue in shared memory.  A
 * message is up to @max_msg bytes (copied into the ring) plus up to
 * TSHM_QUEUE_MAX_SEGS segments (never copied: the receiver maps the same
 * pages).  @capacity messages fit (1 .. 65536).  The queue works across
 * fork(); tshm_queue_export() and tshm_queue_send_fd() hand it to other
 * processes.  A process SIGKILLed inside any queue call neither wedges the
 * queue nor leaks what it carried (Documentation/lib/queue.rst).
 */
int tshm_queue_create(struct tshm_ctx *ctx, unsigned capacity, size_t max_msg,
		      struct tshm_queue **out);

/*
 * Copy @len bytes and pass @nsegs segments (the caller keeps its references;
 * the same segment may be sent many times, received segments may be sent
 * on).  -EMSGSIZE: @len > max_msg.  -E2BIG: too many segments.  -EPIPE: the
 * queue is closed.  -EXDEV: a segment from the other backend, or a caller
 * in another pid namespace than the queue's creator (below).
 *
 * Fallback only: each segment in flight is two fds in a Unix socket, and
 * the kernel lets a user have at most RLIMIT_NOFILE fds in flight (all its
 * queues and sockets together).  A send over that limit waits, as for a
 * full ring, until receivers take messages (-EAGAIN / -ETIMEDOUT at its
 * timeout): at the default soft limit of 1024 about 512 one-segment
 * messages can be queued, whatever the capacity.  The module backend has
 * no such limit.
 */
int tshm_queue_send(struct tshm_queue *q, const void *msg, size_t len,
		    struct tshm_seg *const *segs, unsigned nsegs,
		    int timeout_ms);

/*
 * Receive one message: its bytes into @buf (@cap bytes of room, *@len set to
 * the length), its segments into @segs (*@nsegs: in, room in @segs; out, how
 * many arrived; each comes with a reference the caller unrefs).  @segs and
 * @nsegs may be NULL for byte-only queues.  -EMSGSIZE (*@len set to the
 * length needed) or -ENOBUFS (*@nsegs set to the count needed): the message
 * stays queued.  -EMFILE: no room in this process for the segments' fds
 * (RLIMIT_NOFILE); the message stays queued.  -EPIPE: closed and drained.
 * -EBADMSG: the slot was corrupted, or what arrived with it was not what
 * the library sends (an unsealed memfd, a foreign fd); it has been
 * skipped.  -EXDEV: the caller is in another pid namespace than the
 * queue's creator: the ring names the threads that hold slots by their
 * ids, which mean something in one pid namespace only, so every process
 * that uses a queue must share its creator's.
 */
int tshm_queue_recv(struct tshm_queue *q, void *buf, size_t cap, size_t *len,
		    struct tshm_seg **segs, unsigned *nsegs, int timeout_ms);

/* File descriptors one message can carry. */
#define TSHM_QUEUE_MAX_FDS	4

/*
 * Messages that carry file descriptors, for what is neither bytes nor a
 * segment (a GPU allocation's exported handle, a pipe, a socket), on both
 * backends.  tshm_queue_send_fds() is tshm_queue_send() plus @nfds (up to
 * TSHM_QUEUE_MAX_FDS) of the caller's fds, which it keeps: the receiver
 * gets its own (O_CLOEXEC), in the same message as the bytes and segments.
 * While the message is queued the kernel holds the fds' files in the
 * queue's socket, so the sender may close them, or exit.  -EBADF: an fd is
 * not open; nothing was sent.  Such messages take the queue's segment lock
 * (Documentation/lib/queue.rst), and each fd in flight counts against the
 * sender's RLIMIT_NOFILE as the fallback's segments do (above).
 *
 * tshm_queue_recv_fds() is tshm_queue_recv() plus @fds (*@nfds: in, room;
 * out, how many arrived; the caller closes them).  The fds are what a
 * peer sent: check what they are before use.  -ENOBUFS (*@nfds set to the
 * count needed), -EMFILE: the message stays queued.  tshm_queue_recv()
 * answers -ENOBUFS for a message with fds, and leaves it queued.
 */
int tshm_queue_send_fds(struct tshm_queue *q, const void *msg, size_t len,
			struct tshm_seg *const *segs, unsigned nsegs,
			const int *fds, unsigned nfds, int timeout_ms);
int tshm_queue_recv_fds(struct tshm_queue *q, void *buf, size_t cap,
			size_t *len, struct tshm_seg **segs, unsigned *nsegs,
			int *fds, unsigned *nfds, int timeout_ms);

/*
 * Close the queue for every process: sends then fail with -EPIPE; receivers
 * get what is queued, then -EPIPE.  Waiters are woken.  Idempotent.
 */
int tshm_queue_close(struct tshm_queue *q);
struct tshm_queue *tshm_queue_ref(struct tshm_queue *q);
void tshm_queue_unref(struct tshm_queue *q);

/* Messages queued right now (a snapshot), capacity, max_msg. */
unsigned tshm_queue_len(struct tshm_queue *q);
unsigned tshm_queue_capacity(const struct tshm_queue *q);
size_t tshm_queue_max_msg(const struct tshm_queue *q);

/*
 * For event loops: an fd (the queue's, do not close it) that poll() reports
 * readable when a message may be waiting or the queue was closed.  It is
 * readable at first; once it is, receive with timeout 0 until -EAGAIN (or
 * -EPIPE): the receive that finds the queue empty re-arms it.  Any process
 * holding the queue may ask for it.
 */
int tshm_queue_fd(struct tshm_queue *q);

/*
 * How this process waits on this queue (local, not shared).
 * ADAPTIVE (default): spin @spin_us microseconds, then sleep on a futex.
 * FUTEX: sleep at once.  SPIN: never sleep (burns a CPU; timeouts still
 * hold).  @spin_us is ignored by FUTEX and SPIN; 0 picks the default (50).
 */
enum tshm_wait {
	TSHM_WAIT_ADAPTIVE = 0,
	TSHM_WAIT_FUTEX = 1,
	TSHM_WAIT_SPIN = 2,
};
int tshm_queue_set_wait(struct tshm_queue *q, enum tshm_wait policy,
			unsigned spin_us);
const char *tshm_wait_name(enum tshm_wait policy);

/*
 * Hand a queue to an exec'ed process: tshm_queue_export() clears FD_CLOEXEC
 * on the queue's fds in the calling process and writes a descriptor such as
 * "tshm-queue:2:memfd:5,6,7,8" into @buf (TSHM_QUEUE_DESC_MAX is enough).
 * Call it in the child after fork() and before exec(): it is
 * async-signal-safe.  tshm_queue_import() in the new program takes the fds
 * over (they are closed by the last unref) and validates the shared header
 * (-EBADMSG for a foreign or corrupted queue, -EXDEV for a context of the
 * other backend or a process in another pid namespace than the creator's).
 *
 * To an unrelated process: tshm_queue_send_fd() over a connected AF_UNIX
 * socket, tshm_queue_recv_fd() on the other end.
 */
#define TSHM_QUEUE_DESC_MAX	64
int tshm_queue_export(struct tshm_queue *q, char *buf, size_t len);
int tshm_queue_import(struct tshm_ctx *ctx, const char *desc,
		      struct tshm_queue **out);
int tshm_queue_send_fd(struct tshm_queue *q, int sock);
int tshm_queue_recv_fd(struct tshm_ctx *ctx, int sock, struct tshm_queue **out);

/* ---- buffer pools ---- */

/*
 * @count segments of @size bytes, created up front.  tshm_pool_get() hands
 * out a buffer with a reference the caller owns, waiting up to @timeout_ms
 * when all are out.  The caller sends it and unrefs it; the buffer comes
 * back by itself once every process it reached has released it (the
 * segment's release notification, see tshm_seg_wait_released()).  A pool is
 * used in the process that created it; it is thread-safe.  Destroy drops
 * the pool's references; buffers still out live until released.
 */
int tshm_pool_create(struct tshm_ctx *ctx, unsigned count, size_t size,
		     const char *name, unsigned seg_flags,
		     struct tshm_pool **out);
/*
 * tshm_pool_create() flag, given with the segment flags: punch a buffer
 * (MADV_REMOVE) each time it comes back, before it is handed out
 * again.  "Released" means no process holds the segment, not that no page
 * of it is pinned: a receiver that vmspliced a page into a pipe, or had
 * O_DIRECT in flight, would otherwise see what the producer writes next.
 * Costs one system call per reuse and a zeroed page (fault) per page
 * touched afterwards (Documentation/design/lifetimes.rst).
 */
#define TSHM_POOL_PUNCH		(1U << 16)
int tshm_pool_get(struct tshm_pool *pool, int timeout_ms,
		  struct tshm_seg **out);
/* Buffers ready to be handed out now (polls without blocking). */
unsigned tshm_pool_available(struct tshm_pool *pool);
void tshm_pool_destroy(struct tshm_pool *pool);

/* ---- events and barriers ---- */

/*
 * Futex-based, process-shared when placed in shared memory (a segment's
 * data, typically), in-process otherwise.  Initialize once, from one
 * process, before others use them; they need no destroy.  Their contents
 * are private.  A process that dies while waiting does not disturb the
 * others; a barrier member that dies never arrives, so the others' waits
 * time out (use a timeout where members can die).
 *
 * Event: manual-reset flag.  set wakes every waiter and stays set until
 * reset; wait returns at once while set.
 */
struct tshm_event {
	uint32_t __opaque[4];
};
int tshm_event_init(struct tshm_event *ev);
int tshm_event_set(struct tshm_event *ev);
int tshm_event_reset(struct tshm_event *ev);
int tshm_event_wait(struct tshm_event *ev, int timeout_ms);
/* 1 when set, 0 when not. */
int tshm_event_is_set(struct tshm_event *ev);

/*
 * Barrier for @count members (1 .. 65535), reusable.  wait returns 1 in the
 * member that arrived last, 0 in the others, -ETIMEDOUT (having withdrawn
 * its arrival) when the others did not come in time.
 */
struct tshm_barrier {
	uint32_t __opaque[4];
};
int tshm_barrier_init(struct tshm_barrier *b, unsigned count);
int tshm_barrier_wait(struct tshm_barrier *b, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* _TSHM_H */
