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
 * unlocks.  The mutexes are robust.  A producer killed between its two
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
	pthread_mutexattr_t ma;
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
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&ch->sh->send_lock, &ma);
	pthread_mutex_init(&ch->sh->recv_lock, &ma);
	pthread_mutexattr_destroy(&ma);
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

int tcu_lock(pthread_mutex_t *m, int timeout_ms)
{
	struct timespec ts;
	int r;

	if (timeout_ms < 0) {
		r = pthread_mutex_lock(m);
	} else if (timeout_ms == 0) {
		r = pthread_mutex_trylock(m);
	} else {
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += timeout_ms / 1000;
		ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		r = pthread_mutex_timedlock(m, &ts);
	}
	if (r == EOWNERDEAD) {
		/* the holder died; the sequence numbers heal the state */
		pthread_mutex_consistent(m);
		r = 0;
	}
	if (r == EBUSY)
		return -EAGAIN;
	return -r;
}

static int send_fd(int sock, const struct tcu_fd_msg *m, int fd,
		   int64_t deadline)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { (void *)m, sizeof(*m) };
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	struct pollfd pfd = { .fd = sock, .events = POLLOUT };

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	for (;;) {
		if (sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0)
			return 0;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN) {
			tcu_err("sending the buffer's fd: %s", strerror(errno));
			return -errno;
		}
		if (!tcu_left_ms(deadline))
			return deadline < 0 ? -EAGAIN : -ETIMEDOUT;
		poll(&pfd, 1, tcu_left_ms(deadline));
	}
}

int tcu_take_fd(int sock, uint64_t seq, uint64_t alloc_id, int *fdp)
{
	struct pollfd pfd = { .fd = sock, .events = POLLIN };

	for (;;) {
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct tcu_fd_msg m;
		struct iovec iov = { &m, sizeof(m) };
		struct msghdr mh = {
			.msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
		};
		struct cmsghdr *c;
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
		n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0)
			continue;
		for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_level == SOL_SOCKET &&
			    c->cmsg_type == SCM_RIGHTS)
				memcpy(&fd, CMSG_DATA(c), sizeof(int));
		if (m.seq < seq || m.alloc_id != alloc_id || fd < 0) {
			if (fd >= 0)
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
	int64_t deadline = tcu_deadline(timeout_ms);
	union tcu_wire_buf stack;
	struct tshm_seg *segs[2];
	struct tcu_fd_msg fm;
	struct tcu_wire *w;
	int ret;

	if (!ch || !b || (len && !msg))
		return -EINVAL;
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
	ret = tcu_lock(&ch->sh->send_lock, tcu_left_ms(deadline));
	if (ret)
		goto out;
	w->seq = fm.seq = ch->sh->next_seq++;
	fm.alloc_id = b->alloc->id;
	ret = send_fd(ch->sock[0], &fm, b->alloc->fd, deadline);
	if (!ret)
		ret = tshm_queue_send(ch->q, w, sizeof(*w) + len, segs, 2,
				      tcu_left_ms(deadline));
	pthread_mutex_unlock(&ch->sh->send_lock);
out:
	tcu_wire_buf_free(&stack, w);
	return ret;
}
