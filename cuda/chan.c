// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * Channels: a tshm queue (message bytes + the lease and anchor segments)
 * plus an AF_UNIX SOCK_SEQPACKET socketpair on which VMM allocations'
 * exported fds travel with SCM_RIGHTS.  A tshm queue lives in shared
 * memory and cannot carry an fd; while an fd sits in the socket the kernel
 * holds it, so the memory survives the producer freeing its copy, or
 * exiting, before a consumer receives.
 *
 * Order: a producer takes the producers' mutex, draws a sequence number,
 * sends {seq, allocation id} + fd on the socket, then the queue message
 * (carrying the same seq), and unlocks; a consumer takes the consumers'
 * mutex, receives the queue message, takes the datagram with that seq and
 * unlocks.  The locks are robust (lib/rlock.c).  A producer killed between its two
 * sends, or a consumer killed between its two receives, leaves an orphan
 * datagram with a lower seq: the next consumer closes it and goes on (it
 * peeks first, so it never takes a later message's datagram).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cuda-private.h"

#define CHAN_MAX_MSG	(1U << 20)

int tshm_cuda_chan_create(struct tshm_ctx *ctx, unsigned capacity,
			  size_t max_msg, struct tshm_cuda_chan **out)
{
	struct tshm_cuda_chan *ch;
	int ret, sz = 4 << 20;

	if (!out || !ctx)
		return -EINVAL;
	*out = NULL;
	if (max_msg > CHAN_MAX_MSG) {
		tcu_err("max_msg %zu is over %u bytes", max_msg, CHAN_MAX_MSG);
		return -EINVAL;
	}
	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	ch->max_msg = max_msg;
	ret = tshm_queue_create(ctx, capacity,
				sizeof(struct tcu_wire) + max_msg, &ch->q);
	if (ret)
		goto err;
	ret = tshm_seg_create(ctx, 4096, "cuda-chan", 0, &ch->shm);
	if (ret)
		goto err_q;
	ch->sh = tshm_seg_data(ch->shm);
	ret = rlock_init(&ch->sh->send_lock);
	if (!ret)
		ret = rlock_init(&ch->sh->recv_lock);
	if (ret)
		goto err_shm;
	ch->sh->next_seq = 1;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ch->sock)) {
		ret = -errno;
		goto err_shm;
	}
	/* room for many fds in flight: a send blocks only when it is full */
	setsockopt(ch->sock[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(ch->sock[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	*out = ch;
	return 0;

err_shm:
	tshm_seg_unref(ch->shm);
err_q:
	tshm_queue_unref(ch->q);
err:
	free(ch);
	return ret;
}

int tshm_cuda_chan_close(struct tshm_cuda_chan *ch)
{
	return tshm_queue_close(ch->q);
}

struct tshm_queue *tshm_cuda_chan_queue(struct tshm_cuda_chan *ch)
{
	return ch->q;
}

void tshm_cuda_chan_destroy(struct tshm_cuda_chan *ch)
{
	if (!ch)
		return;
	close(ch->sock[0]);
	close(ch->sock[1]);
	tshm_seg_unref(ch->shm);
	tshm_queue_unref(ch->q);
	free(ch);
}

/* The datagram with @fd, waiting for room until @dl. */
static int send_fd(int sock, const struct tcu_fd_msg *m, int fd,
		   const struct deadline *dl)
{
	struct pollfd pfd = { .fd = sock, .events = POLLOUT };
	int ret;

	for (;;) {
		ret = fd_send(sock, m, sizeof(*m), &fd, 1, MSG_DONTWAIT);
		if (ret != -EAGAIN)
			break;
		if (deadline_expired(dl))
			return -ETIMEDOUT;
		poll(&pfd, 1, deadline_poll_ms(dl));
	}
	if (ret)
		tcu_err("sending the buffer's fd: %s", strerror(-ret));
	return ret;
}

int tcu_take_fd(int sock, uint64_t seq, uint64_t alloc_id, int *fdp)
{
	struct pollfd pfd = { .fd = sock, .events = POLLIN };

	for (;;) {
		struct tcu_fd_msg m, got;
		unsigned nfds = 1;
		ssize_t n;
		int fd = -1;

		n = recv(sock, &m, sizeof(m), MSG_PEEK | MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			/* sent before the queue message: should be there */
			if (poll(&pfd, 1, 5000) > 0)
				continue;
			tcu_err("fd of message %llu never arrived",
				(unsigned long long)seq);
			return -EBADMSG;
		}
		if (n != sizeof(m) || m.seq > seq) {
			tcu_err("fd of message %llu is missing",
				(unsigned long long)seq);
			return -EBADMSG;
		}
		/* What was peeked is what is taken: we hold recv_lock. */
		n = fd_recv(sock, &got, sizeof(got), &fd, &nfds, MSG_DONTWAIT);
		if (n < 0 && n != -EBADMSG)
			continue;
		if (n != sizeof(got) || nfds != 1 || m.seq < seq ||
		    m.alloc_id != alloc_id) {
			if (nfds)
				close(fd);
			if (m.seq < seq)
				continue;	/* an orphan */
			tcu_err("fd of message %llu does not match",
				(unsigned long long)seq);
			return -EBADMSG;
		}
		*fdp = fd;
		return 0;
	}
}

/* Fill @w (room for the payload after it) for @b. */
static void wire_fill(struct tcu_wire *w, const struct tshm_cuda_buf *b,
		      const void *msg, size_t len)
{
	memset(w, 0, sizeof(*w));
	w->magic = TCU_WIRE_MAGIC;
	w->kind = (uint8_t)b->kind;
	w->id = b->id;
	w->off = b->off;
	w->size = b->size;
	if (b->kind == TSHM_CUDA_VMM) {
		w->alloc_id = b->alloc->id;
		w->alloc_size = b->alloc->size;
		w->nsegs = 2;		/* lease, anchor */
	} else {
		w->alloc_size = b->alloc_size;
		memcpy(w->ipc, b->ipc.reserved, CU_IPC_HANDLE_SIZE);
		w->nsegs = 1;		/* lease */
	}
	memcpy(w->uuid, b->cu->uuid.bytes, 16);
	w->len = (uint32_t)len;
	if (len)
		memcpy(w + 1, msg, len);
}

int tshm_cuda_send(struct tshm_cuda_chan *ch, struct tshm_cuda_buf *b,
		   const void *msg, size_t len, int timeout_ms)
{
	union tcu_wire_buf stack;
	struct tshm_seg *segs[2];
	struct deadline dl;
	struct tcu_fd_msg fm;
	struct tcu_wire *w;
	int ret;

	if (!ch || !b || (len && !msg))
		return -EINVAL;
	deadline_init(&dl, timeout_ms);
	if (len > ch->max_msg) {
		tcu_err("payload of %zu bytes, the channel takes %zu", len,
			ch->max_msg);
		return -EMSGSIZE;
	}
	if (!b->producer) {
		tcu_err("a received GPU buffer cannot be sent on; send the "
			"producer's buffer");
		return -EOPNOTSUPP;
	}
	w = tcu_wire_buf(&stack, sizeof(*w) + len);
	if (!w)
		return -ENOMEM;
	wire_fill(w, b, msg, len);
	segs[0] = b->lease;
	if (b->kind == TSHM_CUDA_LEGACY) {
		ret = tshm_queue_send(ch->q, w, sizeof(*w) + len, segs, 1,
				      timeout_ms);
		goto out;
	}
	segs[1] = b->alloc->anchor;
	/* A dead holder (1) leaves a gap in the sequence: nothing to repair. */
	ret = rlock_lock(&ch->sh->send_lock, &dl);
	if (ret < 0)
		goto out;
	w->seq = fm.seq = ch->sh->next_seq++;
	fm.alloc_id = b->alloc->id;
	ret = send_fd(ch->sock[0], &fm, b->alloc->fd, &dl);
	if (!ret)
		ret = tshm_queue_send(ch->q, w, sizeof(*w) + len, segs, 2,
				      deadline_poll_ms(&dl));
	rlock_unlock(&ch->sh->send_lock);
out:
	tcu_wire_buf_free(&stack, w);
	return ret;
}
