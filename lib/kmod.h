/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * kmod.h - what the module backend's files share: the ioctl wrappers
 * (kmod.c), grants a receiver batches before giving them back (kmod-seg.c)
 * and the queue's grants and spare table (kmod-queue.c).  Only kmod*.c
 * include it; the rest of the library goes through kmod_ops (backend.h).
 */
#ifndef _TSHM_KMOD_H
#define _TSHM_KMOD_H

#include "tshm-private.h"

/* ---- kmod.c: /dev/tshm ---- */
int kmod_open(void);
int kmod_is_ctx_fd(int fd);
int kmod_seg_create(struct tshm_ctx *ctx, size_t size, const char *name,
		    unsigned flags, int *fd, uint64_t *id, size_t *mapsize);
int kmod_grant(int seg_fd, int ctx_fd, int count);
int kmod_grant_addr(const void *addr, int ctx_fd, int count);
int kmod_attach(int ctx_fd, uint64_t id, int *fd, size_t *size);
int kmod_drop(int ctx_fd, uint64_t id, int count);
void kmod_seg_name(int seg_fd, char *name, size_t len);

/* ---- kmod-seg.c: segments ---- */
/* Grant @seg to @ctx_fd, by its fd or, received, by its mapping. */
int kmod_seg_grant(struct tshm_seg *seg, int ctx_fd, int count);
/* Record a grant not consumed because the segment was cached. */
void kmod_note_unconsumed_grant(struct tshm_seg *seg, struct tshm_queue *q);
/* Give back every grant this context batched (a receiver about to idle). */
void kmod_ctx_idle(struct tshm_ctx *ctx);
void kmod_seg_adopted(struct tshm_seg *seg);
void kmod_seg_destroy(struct tshm_seg *seg);
int kmod_seg_released_now(struct tshm_seg *seg);
int kmod_seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd,
			     unsigned n);
int kmod_seg_export(struct tshm_seg *seg, struct tshm_handle *h);
int kmod_seg_import(struct tshm_ctx *ctx, const struct tshm_handle *h,
		    struct tshm_seg **out);
int kmod_seg_send_fd(struct tshm_seg *seg, int sock, struct seg_wire *w);
int kmod_seg_recv_fd(struct tshm_ctx *ctx, const struct seg_wire *w,
		     int *fds, struct tshm_seg **out);

/* ---- kmod-queue.c: segments through a queue ---- */
/*
 * Give back the spare grants for @id parked in the tables of every queue
 * this process has open on @ctx (Documentation/lib/queue.rst).
 */
void kmod_reclaim_spares(struct tshm_ctx *ctx, uint64_t id);
int kmod_q_open(int *gfd, int *sfd);
int kmod_q_fds(const struct tshm_queue *q, int *fds);
int kmod_q_check_fds(const int *fds, unsigned n, int *gfd, int *sfd);
int kmod_q_send_segs(struct tshm_queue *q, struct tshm_seg *const *segs,
		     unsigned nsegs, const int *xfds, unsigned nxfds,
		     struct tshm_handle *h, uint64_t *tag);
void kmod_q_send_undo(struct tshm_queue *q, const struct tshm_handle *h,
		      unsigned nsegs);
int kmod_q_recv_take(struct tshm_queue *q, struct q_rx *rx,
		     struct tshm_seg **segs);
void kmod_q_recv_undo(struct tshm_queue *q, struct q_rx *rx,
		      struct tshm_seg **segs);
void kmod_q_recv_commit(struct tshm_queue *q, struct q_rx *rx,
			struct tshm_seg **segs);
int kmod_q_recv_finish(struct tshm_queue *q, struct q_rx *rx,
		       struct tshm_seg **segs);

#endif /* _TSHM_KMOD_H */
