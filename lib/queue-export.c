// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * queue-export.c - handing a queue to another process: the descriptor an
 * exec'ed child imports, and the fds over a Unix socket.  Whatever arrives
 * is checked before queue.c maps it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "queue.h"

/*
 * The fds that make the queue, in the order they travel: the ring, the
 * module context or the fallback's two socket ends, the eventfd.
 */
int q_fds(const struct tshm_queue *q, int *fds)
{
	int n = 0;

	fds[n++] = q->fd;
	n += q->ctx->ops->q_fds(q, fds + n);
	fds[n++] = q->efd;
	return n;
}

/* ---- handing a queue to another process ---- */

#define QDESC_PREFIX	"tshm-queue:2:"

/* Async-signal-safe: no stdio, no allocation. */
static char *put_str(char *p, char *end, const char *s)
{
	while (*s && p < end)
		*p++ = *s++;
	return p;
}

static char *put_uint(char *p, char *end, unsigned v)
{
	char tmp[12];
	int n = 0;

	do {
		tmp[n++] = '0' + v % 10;
		v /= 10;
	} while (v);
	while (n && p < end)
		*p++ = tmp[--n];
	return p;
}

TSHM_EXPORT
int tshm_queue_export(struct tshm_queue *q, char *buf, size_t len)
{
	int fds[QUEUE_MAX_FDS], nfds, i;
	char *p, *end;

	if (!q || !buf || len < 2)
		return -EINVAL;
	nfds = q_fds(q, fds);
	p = buf;
	end = buf + len - 1;
	p = put_str(p, end, QDESC_PREFIX);
	p = put_str(p, end, tshm_ctx_backend(q->ctx));
	p = put_str(p, end, ":");
	for (i = 0; i < nfds; i++) {
		if (i)
			p = put_str(p, end, ",");
		p = put_uint(p, end, fds[i]);
	}
	if (p >= end)
		return -ENOSPC;
	*p = '\0';
	for (i = 0; i < nfds; i++)
		if (fcntl(fds[i], F_SETFD, 0) < 0)
			return -errno;
	return 0;
}

static int parse_fds(const char *s, int *fds, int max)
{
	int n = 0;
	char *end;
	long v;

	for (;;) {
		if (n == max)
			return -EINVAL;
		v = strtol(s, &end, 10);
		if (end == s || v < 0 || v > 1 << 30)
			return -EINVAL;
		fds[n++] = v;
		if (*end == '\0')
			return n;
		if (*end != ',')
			return -EINVAL;
		s = end + 1;
	}
}

static int q_adopt_fds_checked(struct tshm_ctx *ctx, int *fds, int nfds,
			       struct tshm_queue **out)
{
	int gfd = -1, sfd[2] = { -1, -1 }, i, ret;

	for (i = 0; i < nfds; i++)
		if (fcntl(fds[i], F_GETFD) < 0)
			return -EBADF;
	if (nfds < 3)
		return -EBADMSG;
	ret = fd_check_eventfd(fds[nfds - 1]);
	if (ret < 0)
		return ret;
	/* The ring, the backend's transport, the eventfd. */
	ret = ctx->ops->q_check_fds(fds + 1, nfds - 2, &gfd, sfd);
	if (ret == 0)
		ret = q_attach(ctx, fds[0], gfd, sfd, fds[nfds - 1], out);
	if (ret < 0)
		return ret;
	for (i = 0; i < nfds; i++)
		fcntl(fds[i], F_SETFD, FD_CLOEXEC);
	return 0;
}

TSHM_EXPORT
int tshm_queue_import(struct tshm_ctx *ctx, const char *desc,
		      struct tshm_queue **out)
{
	const char *p;
	size_t blen;
	int fds[QUEUE_MAX_FDS], nfds;

	if (!ctx || !desc || !out)
		return -EINVAL;
	if (strncmp(desc, QDESC_PREFIX, strlen(QDESC_PREFIX)))
		return -EINVAL;
	p = desc + strlen(QDESC_PREFIX);
	blen = strcspn(p, ":");
	if (p[blen] != ':')
		return -EINVAL;
	if (strlen(tshm_ctx_backend(ctx)) != blen ||
	    strncmp(p, tshm_ctx_backend(ctx), blen)) {
		if ((blen == 4 && !strncmp(p, "kmod", 4)) ||
		    (blen == 5 && !strncmp(p, "memfd", 5)))
			return -EXDEV;
		return -EINVAL;
	}
	nfds = parse_fds(p + blen + 1, fds, QUEUE_MAX_FDS);
	if (nfds < 0)
		return nfds;
	return q_adopt_fds_checked(ctx, fds, nfds, out);
}

#define QWIRE_MAGIC	0x46515354U	/* "TSQF" */

TSHM_EXPORT
int tshm_queue_send_fd(struct tshm_queue *q, int sock)
{
	int fds[QUEUE_MAX_FDS], nfds;
	uint32_t w[2];

	if (!q || sock < 0)
		return -EINVAL;
	w[0] = QWIRE_MAGIC;
	w[1] = q->ctx->ops->wire;
	nfds = q_fds(q, fds);
	return fd_send(sock, w, sizeof(w), fds, nfds, 0);
}

TSHM_EXPORT
int tshm_queue_recv_fd(struct tshm_ctx *ctx, int sock, struct tshm_queue **out)
{
	unsigned nfds = QUEUE_MAX_FDS, i;
	int fds[QUEUE_MAX_FDS], ret;
	uint32_t w[2];
	ssize_t n;

	if (!ctx || sock < 0 || !out)
		return -EINVAL;
	n = fd_recv(sock, w, sizeof(w), fds, &nfds, 0);
	if (n < 0)
		return n;
	if (n == 0 && nfds == 0)
		return -EPIPE;
	if (n != sizeof(w) || w[0] != QWIRE_MAGIC)
		ret = -EBADMSG;
	else if (w[1] != ctx->ops->wire)
		ret = -EXDEV;
	else
		ret = q_adopt_fds_checked(ctx, fds, nfds, out);
	if (ret < 0)
		for (i = 0; i < nfds; i++)
			close(fds[i]);
	return ret;
}
