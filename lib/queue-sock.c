// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * queue-sock.c - the queue's socket: a SEQPACKET pair whose messages carry
 * fds in ring order.  On the fallback a message's segments travel in it
 * (memfd-queue.c); on both backends so do the fds of tshm_queue_send_fds().
 * A ring slot names its socket messages by tag (qhdr.tag, spent before the
 * send so that a retry never reuses one).  Senders write and receivers read
 * under the queue's segment lock, so socket order is tag order is ring
 * order; what a killed sender or receiver leaves behind has an older tag
 * than anything a live receiver looks for, and is dropped
 * (Documentation/lib/queue.rst, "Messages that carry fds").
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "queue.h"

int q_sock_open(int *sfd)
{
	int sndbuf = QUEUE_SNDBUF;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sfd))
		return -errno;
	/* Best effort: wmem_max caps it for unprivileged callers. */
	setsockopt(sfd[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	shutdown(sfd[0], SHUT_RD);
	shutdown(sfd[1], SHUT_WR);
	return 0;
}

/* Received transport fds @fds[0..1] are the socket's two ends. */
int q_sock_check(const int *fds, int *sfd)
{
	int i, ret;

	for (i = 0; i < 2; i++) {
		ret = fd_check_socket(fds[i], SOCK_SEQPACKET);
		if (ret < 0)
			return ret;
		sfd[i] = fds[i];
	}
	return 0;
}

/*
 * Under the segment lock: @w (its tag set here) and @nfds fds as one
 * socket message.  -EAGAIN: the socket is full; -ETOOMANYREFS: the user's
 * fds in flight are at RLIMIT_NOFILE.  Either way nothing was sent.
 */
int q_sock_send(struct tshm_queue *q, struct qwire *w, const int *fds,
		unsigned nfds, uint64_t *tag)
{
	int ret;

	w->tag = ++q->hdr->tag;
	ret = fd_send(q->sfd[0], w, sizeof(*w), fds, nfds, MSG_DONTWAIT);
	if (ret == 0)
		*tag = w->tag;
	return ret;
}

/*
 * The slow path of q_sock_take() for a message whose peek came back
 * truncated: out of fds, or malformed (too long, too many fds).  Peek its
 * header alone; if it is the one wanted, check room for @reserve fds
 * before anything is consumed; then take it.  Returns as q_sock_take(),
 * or 2: an older message was dropped, look again.
 */
static int take_truncated(struct tshm_queue *q, uint64_t tag, unsigned nsegs,
			  unsigned nfds, unsigned reserve, struct qwire *w,
			  int *fds)
{
	unsigned got, i;
	ssize_t n;
	int ret;

	do {
		n = recv(q->sfd[1], w, sizeof(*w), MSG_PEEK | MSG_DONTWAIT);
	} while (n < 0 && errno == EINTR);
	if (n != sizeof(*w) || w->tag > tag)
		return 1;
	if (w->tag == tag && reserve) {
		ret = fd_reserve(q->sfd[1], reserve);
		if (ret < 0)
			return ret;
	}
	got = SCM_MAX_FDS;
	n = fd_recv(q->sfd[1], w, sizeof(*w), fds, &got, MSG_DONTWAIT);
	if (n < 0 && n != -EBADMSG)
		return 1;
	if (n == sizeof(*w) && w->tag == tag && w->nsegs == nsegs &&
	    w->nfds == nfds && got == nfds)
		return 0;
	for (i = 0; i < got; i++)
		close(fds[i]);
	return n == sizeof(*w) && w->tag == tag ? 1 : 2;
}

/*
 * Under the segment lock: take the socket message tagged @tag, which must
 * carry @nsegs segments and @nfds fds, into @w and @fds, dropping older
 * messages that dead senders or receivers left behind.  Room for @reserve
 * fds is checked before anything is consumed.  0: taken; 1: it is gone (a
 * receiver died holding it, or it is malformed), skip the slot; -EMFILE:
 * no room for the fds, nothing was consumed.
 *
 * A peek with a control buffer installs the message's fds and leaves the
 * message queued; out of fds it comes back truncated (MSG_CTRUNC), and
 * then take_truncated() does the careful dance.  Otherwise a plain recv()
 * consumes the message (the kernel drops its own references to the fds):
 * two system calls a message.
 */
int q_sock_take(struct tshm_queue *q, uint64_t tag, unsigned nsegs,
		unsigned nfds, unsigned reserve, struct qwire *w, int *fds)
{
	struct qwire skip;
	unsigned got, i;
	ssize_t n;
	int ret;

	for (;;) {
		got = SCM_MAX_FDS;
		n = fd_recv(q->sfd[1], w, sizeof(*w), fds, &got,
			    MSG_PEEK | MSG_DONTWAIT);
		if (n == -EBADMSG) {
			ret = take_truncated(q, tag, nsegs, nfds, reserve, w,
					     fds);
			if (ret != 2)
				return ret;
			continue;
		}
		if (n < 0)
			return 1;
		if (n != sizeof(*w) || w->tag > tag) {
			for (i = 0; i < got; i++)
				close(fds[i]);
			return 1;
		}
		do {
			n = recv(q->sfd[1], &skip, sizeof(skip), MSG_DONTWAIT);
		} while (n < 0 && errno == EINTR);
		if (w->tag == tag && w->nsegs == nsegs && w->nfds == nfds &&
		    got == nfds)
			return 0;
		for (i = 0; i < got; i++)
			close(fds[i]);
		if (w->tag == tag)
			return 1;
	}
}
