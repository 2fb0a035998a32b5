/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * memfd.h - what the fallback backend's files share: sealed memfds
 * (memfd.c), the lease sockets that stand in for the module's holder count
 * (memfd-lease.c) and fds through a queue's socket (memfd-queue.c).  Only
 * memfd*.c include it; the rest of the library goes through memfd_ops.
 */
#ifndef _TSHM_MEMFD_H
#define _TSHM_MEMFD_H

#include "tshm-private.h"

/* ---- memfd.c ---- */
int memfd_ctx_open(void);
int memfd_is_ctx_fd(int fd);
int memfd_seg_create(struct tshm_ctx *ctx, size_t size, const char *name,
		     unsigned flags, int *fd, uint64_t *id, size_t *mapsize);
/*
 * A received segment fd checked (0 or -EBADMSG), @st its fstat(): a
 * memfd like ours, sealed against shrinking and growing.
 */
int memfd_seg_check(struct tshm_ctx *ctx, int fd, const struct stat *st);
void memfd_seg_name(int fd, char *name, size_t len);
void memfd_qkey_draw(struct tshm_seg *seg);

/* ---- memfd-lease.c ---- */
struct tshm_lease {
	atomic_int refs;
	int fd;
	uint64_t gen;
};

/* A reference on the lease to pass along with @seg (created on demand). */
int lease_get(struct tshm_seg *seg, struct tshm_lease **out);
void lease_put(struct tshm_lease *lease);
/* A segment received: its memfd and lease peer (both consumed). */
int memfd_seg_adopt(struct tshm_ctx *ctx, int fd, int peer, uint64_t gen,
		    struct tshm_seg **out);
void memfd_seg_destroy(struct tshm_seg *seg);
int memfd_seg_released_now(struct tshm_seg *seg);
int memfd_seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd,
			      unsigned n);
int memfd_seg_send_fd(struct tshm_seg *seg, int sock, struct seg_wire *w);
int memfd_seg_recv_fd(struct tshm_ctx *ctx, const struct seg_wire *w,
		      int *fds, struct tshm_seg **out);

/* ---- memfd-queue.c ---- */
int memfd_q_open(int *gfd, int *sfd);
int memfd_q_fds(const struct tshm_queue *q, int *fds);
int memfd_q_check_fds(const int *fds, unsigned n, int *gfd, int *sfd);
int memfd_q_send_segs(struct tshm_queue *q, struct tshm_seg *const *segs,
		      unsigned nsegs, const int *xfds, unsigned nxfds,
		      struct tshm_handle *h, uint64_t *tag);
int memfd_q_recv_take(struct tshm_queue *q, struct q_rx *rx,
		      struct tshm_seg **segs);
void memfd_q_recv_undo(struct tshm_queue *q, struct q_rx *rx,
		       struct tshm_seg **segs);
int memfd_q_recv_finish(struct tshm_queue *q, struct q_rx *rx,
			struct tshm_seg **segs);

#endif /* _TSHM_MEMFD_H */
