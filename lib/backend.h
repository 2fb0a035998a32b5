/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * backend.h - what a backend does for the rest of the library.  A context
 * picks one at creation (ctx.c) and keeps a pointer to its table; nothing
 * outside the backend's own files (kmod*.c, memfd*.c) asks which one it is.
 *
 *   kmod   /dev/tshm: segments are counted by the module, pass as grants
 *          to a context, and their release is poll() on the segment fd.
 *   memfd  sealed memfds passed as fds, with lease sockets standing in for
 *          the module's holder count (memfd-lease.c).
 *
 * Nothing here is ABI.
 */
#ifndef _TSHM_BACKEND_H
#define _TSHM_BACKEND_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tshm.h"

struct tshm_ctx;
struct tshm_seg;
struct tshm_queue;

/* What tshm_seg_send_fd() writes next to the fds it passes. */
struct seg_wire {
	uint32_t magic;
	uint32_t backend;		/* backend_ops.wire */
	uint64_t gen;			/* kmod: the id; memfd: the lease's gen */
};

#define SEG_WIRE_MAGIC	0x47455354	/* "TSEG" */
#define SEG_WIRE_FDS	2		/* the most any backend passes */

/*
 * A received queue message's segments, between the ring's lock and the
 * caller: the handles copied out of the slot (@h, @n, @tag), how many fds
 * of its own the message carries (@xfds: q_recv_take reserves room for
 * them too), and what the backend took before the commit (@fds, @gen,
 * @overflow; @taken when an ordered transport took the message's socket
 * message, its own fds in @xfd, which the queue then owns).
 */
struct q_rx {
	struct tshm_handle h[TSHM_QUEUE_MAX_SEGS];
	unsigned n;
	uint64_t tag;
	unsigned xfds;
	bool taken;
	bool held;		/* fallback: taken without its fds, @segs set */
	int xfd[TSHM_QUEUE_MAX_FDS];
	int fds[2 * TSHM_QUEUE_MAX_SEGS];
	uint64_t gen[TSHM_QUEUE_MAX_SEGS];
	uint64_t key[TSHM_QUEUE_MAX_SEGS];
	unsigned overflow;
};

/* The hooks marked optional may be NULL. */
struct backend_ops {
	const char *name;		/* tshm_ctx_backend() */
	uint32_t wire;			/* names the backend in shared memory
					 * and in socket messages */

	/* ---- contexts ---- */
	int (*ctx_open)(void);		/* a new context fd, or -errno */
	int (*is_ctx_fd)(int fd);	/* 1 yes, 0 no, <0 error */
	int (*ctx_init)(struct tshm_ctx *ctx);		/* optional */
	/* Optional: a receiver is about to idle, give back what it batched. */
	void (*ctx_idle)(struct tshm_ctx *ctx);

	/* ---- segments ---- */
	int (*seg_create)(struct tshm_ctx *ctx, size_t size, const char *name,
			  unsigned flags, int *fd, uint64_t *id,
			  size_t *mapsize);
	/* Optional: after the creator mapped it. */
	void (*seg_created)(struct tshm_seg *seg, unsigned flags);
	/* The name of a segment that arrived as @fd ("" when none). */
	void (*seg_name)(int fd, char *name, size_t len);
	/*
	 * A received segment keeps its fd for its life: seg_name() is
	 * called at the first tshm_seg_name(), not at every receive (a
	 * readlink() of /proc/self/fd/N, 3 us).  So the name is what that
	 * fd number names then: a process that closed fds it did not open
	 * (a forkserver's child), or lost /proc, gets a wrong or empty one.
	 */
	bool seg_name_lazy;
	/* Optional: a received segment was mapped; under ctx->lock. */
	void (*seg_adopted)(struct tshm_seg *seg);
	/* The last reference went; before it leaves the cache. */
	void (*seg_destroy)(struct tshm_seg *seg);
	/* 1 when only this process holds @seg now, 0 when not, <0 error. */
	int (*seg_released_now)(struct tshm_seg *seg);
	/* The fds poll() reports the release on (a subset when @n is short). */
	int (*seg_release_pollfds)(struct tshm_seg *seg, struct pollfd *pfd,
				   unsigned n);
	int (*seg_export)(struct tshm_seg *seg, struct tshm_handle *h);
	int (*seg_import)(struct tshm_ctx *ctx, const struct tshm_handle *h,
			  struct tshm_seg **out);
	/* tshm_seg_send_fd(): @w has magic and backend; the op does the rest. */
	int (*seg_send_fd)(struct tshm_seg *seg, int sock, struct seg_wire *w);
	/* How many fds a tshm_seg_send_fd() message carries. */
	unsigned seg_wire_fds;
	/* A checked message's fds: ownership passes in. */
	int (*seg_recv_fd)(struct tshm_ctx *ctx, const struct seg_wire *w,
			   int *fds, struct tshm_seg **out);

	/* ---- queues (queue.c, queue-export.c) ---- */
	/*
	 * The queue's transport: a module context (@gfd) and the queue's
	 * socket pair (@sfd, q_sock_open(); both backends have one).
	 */
	int (*q_open)(int *gfd, int *sfd);
	/* The transport's fds as they travel (after the ring's): a count. */
	int (*q_fds)(const struct tshm_queue *q, int *fds);
	/* Check @n received transport fds and sort them into @gfd / @sfd. */
	int (*q_check_fds)(const int *fds, unsigned n, int *gfd, int *sfd);
	/*
	 * The transport is a FIFO whose order must be the ring's (the
	 * fallback's socket): queue.c then calls the q_send_segs ...
	 * q_recv_commit hooks of a message under the queue's segment lock.
	 * Otherwise it calls them with no lock held, and q_send_segs before
	 * it claims a slot.
	 */
	bool q_ordered;
	/*
	 * Before the commit: make @nsegs segments travel with the message,
	 * filling the slot's handles @h (and @tag).  An ordered transport
	 * sends the message's own fds (@xfds) in the same socket message, so
	 * that a message goes whole or not at all; an unordered backend is
	 * given none.  -EAGAIN: the transport is full; -ETOOMANYREFS: the
	 * user's fds in flight are at their limit.  Both leave nothing behind.
	 */
	int (*q_send_segs)(struct tshm_queue *q, struct tshm_seg *const *segs,
			   unsigned nsegs, const int *xfds, unsigned nxfds,
			   struct tshm_handle *h, uint64_t *tag);
	/* Optional: the message will not be sent, undo q_send_segs. */
	void (*q_send_undo)(struct tshm_queue *q, const struct tshm_handle *h,
			    unsigned nsegs);
	/*
	 * Receive, before the commit: take what @rx's handles need (and, on
	 * an ordered transport, the message's own fds), after checking room
	 * for those and @rx->xfds.  0: go on; 1: another receiver's (dead)
	 * leftovers, commit and skip the slot; <0: leave the message queued.
	 * When the message is not taken after all, q_recv_undo (optional,
	 * unlocked).
	 */
	int (*q_recv_take)(struct tshm_queue *q, struct q_rx *rx,
			   struct tshm_seg **segs);
	void (*q_recv_undo)(struct tshm_queue *q, struct q_rx *rx,
			    struct tshm_seg **segs);
	/* Optional: right after the commit. */
	void (*q_recv_commit)(struct tshm_queue *q, struct q_rx *rx,
			      struct tshm_seg **segs);
	/* Unlocked: @segs gets a reference on every segment, or -errno. */
	int (*q_recv_finish)(struct tshm_queue *q, struct q_rx *rx,
			     struct tshm_seg **segs);
};

extern const struct backend_ops kmod_ops;
extern const struct backend_ops memfd_ops;

#endif /* _TSHM_BACKEND_H */
