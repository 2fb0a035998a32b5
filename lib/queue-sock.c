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

/* recv() of a socket message's first bytes, its fds not installed. */
static ssize_t sock_recv(int sock, struct qwire *w, int flags)
{
	ssize_t n;

	do {
		n = recv(sock, w, sizeof(*w), flags | MSG_DONTWAIT);
	} while (n < 0 && errno == EINTR);
	return n;
}

/*
 * Under the segment lock: find the socket message tagged @tag, dropping
 * older messages that dead senders or receivers left behind (their fds
 * are never installed here), and peek at its header, into @w.  0: it is
 * the socket's first message; 1: it is gone (a receiver died holding it),
 * skip the slot.
 */
int q_sock_find(struct tshm_queue *q, uint64_t tag, struct qwire *w)
{
	int sock = q->sfd[1];
	struct qwire old;
	ssize_t n;

	for (;;) {
		n = sock_recv(sock, w, MSG_PEEK);
		if (n != sizeof(*w) || w->tag > tag)
			return 1;
		if (w->tag == tag)
			return 0;
		sock_recv(sock, &old, 0);	/* older: dropped, fds and all */
	}
}

/*
 * Under the segment lock, after q_sock_find(): consume the message tagged
 * @tag without installing its fds (the kernel drops its references).  0,
 * or 1 if what was consumed was not that message (nothing else reads).
 */
int q_sock_skip(struct tshm_queue *q, uint64_t tag)
{
	struct qwire w;

	if (sock_recv(q->sfd[1], &w, 0) != sizeof(w) || w.tag != tag)
		return 1;
	return 0;
}

/*
 * Under the segment lock, after q_sock_find(): take the message tagged
 * @tag, which must carry @nsegs segments and @nfds fds, into @w and @fds.
 * 0: taken; 1: malformed, skip the slot; -EMFILE: no room for its fds in
 * this process, nothing consumed.
 *
 * Two system calls: a peek with a control buffer, which installs the fds
 * and leaves the message queued, and a recv() that consumes it without
 * them (the kernel drops its own references).  The header was peeked at
 * first (q_sock_find()), so that no fds but the wanted message's are ever
 * installed here: a close() has side effects (it drops this process's
 * POSIX locks on the file).  Out of fds the peek comes back truncated
 * (MSG_CTRUNC), having installed some, which are closed: the message is
 * left queued.
 */
int q_sock_take_found(struct tshm_queue *q, uint64_t tag, unsigned nsegs,
		      unsigned nfds, struct qwire *w, int *fds)
{
	int sock = q->sfd[1], tries = 0, ret;
	struct qwire head;
	unsigned got, i;
	ssize_t n;

	for (;;) {
		got = SCM_MAX_FDS;
		n = fd_recv(sock, w, sizeof(*w), fds, &got,
			    MSG_PEEK | MSG_DONTWAIT);
		if (n != -EBADMSG)
			break;
		/*
		 * Truncated: out of fds, or malformed (too long, too many
		 * fds).  With room for @nfds, look once more (another thread
		 * may have just closed some), then drop it.
		 */
		ret = fd_reserve(sock, nfds);
		if (ret < 0)
			return ret;
		if (++tries == 2) {
			sock_recv(sock, &head, 0);
			return 1;
		}
	}
	if (n < 0)
		return 1;
	n = sock_recv(sock, &head, 0);
	if (n == sizeof(*w) && head.tag == tag && w->tag == tag &&
	    w->nsegs == nsegs && w->nfds == nfds && got == nfds)
		return 0;
	/* Malformed, or not the message peeked at (nothing else reads). */
	for (i = 0; i < got; i++)
		close(fds[i]);
	return 1;
}

/* q_sock_find(), then q_sock_take_found(): three system calls. */
int q_sock_take(struct tshm_queue *q, uint64_t tag, unsigned nsegs,
		unsigned nfds, struct qwire *w, int *fds)
{
	int ret = q_sock_find(q, tag, w);

	return ret ? ret : q_sock_take_found(q, tag, nsegs, nfds, w, fds);
}
