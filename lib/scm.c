// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * scm.c - fds over AF_UNIX sockets (SCM_RIGHTS) and the checks on fds that
 * arrive, for the library and spawn: the one place that builds and parses
 * the control message.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "scm.h"


int fd_reserve(int fd, unsigned n)
{
	int tmp[SCM_MAX_FDS];
	unsigned i, got;
	int ret = 0;

	if (n > SCM_MAX_FDS)
		return -E2BIG;
	for (got = 0; got < n; got++) {
		tmp[got] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (tmp[got] < 0) {
			ret = errno == EMFILE ? -EMFILE : -errno;
			break;
		}
	}
	for (i = 0; i < got; i++)
		close(tmp[i]);
	return ret;
}

int fd_send(int sock, const void *buf, size_t len, const int *fds,
	    unsigned nfds, int flags)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * SCM_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cmsg;
	ssize_t n;

	if (nfds > SCM_MAX_FDS)
		return -E2BIG;
	if (nfds) {
		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cmsg = CMSG_FIRSTHDR(&msg);
		cmsg->cmsg_level = SOL_SOCKET;
		cmsg->cmsg_type = SCM_RIGHTS;
		cmsg->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * nfds);
	}
	do {
		n = sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EMSGSIZE;
}

ssize_t fd_recv(int sock, void *buf, size_t len, int *fds, unsigned *nfds,
		int flags)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * SCM_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = u.buf, .msg_controllen = sizeof(u.buf),
	};
	struct cmsghdr *cmsg;
	unsigned room = *nfds, got = 0, i, k;
	bool trunc = false;
	ssize_t n;

	*nfds = 0;
	do {
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	for (cmsg = CMSG_FIRSTHDR(&msg); cmsg; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
		if (cmsg->cmsg_level != SOL_SOCKET ||
		    cmsg->cmsg_type != SCM_RIGHTS)
			continue;
		k = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (i = 0; i < k; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int),
			       sizeof(int));
			if (got < room) {
				fds[got++] = fd;
			} else {
				close(fd);
				trunc = true;
			}
		}
	}
	*nfds = got;
	if (trunc || (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
		for (i = 0; i < got; i++)
			close(fds[i]);
		*nfds = 0;
		return -EBADMSG;
	}
	return n;
}

/* 0 when @fd is an eventfd, else -EBADMSG. */
int fd_check_eventfd(int fd)
{
	char path[40], link[32];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n <= 0)
		return -EBADMSG;
	link[n] = '\0';
	return strcmp(link, "anon_inode:[eventfd]") ? -EBADMSG : 0;
}

int fd_check_socket(int fd, int type)
{
	socklen_t len = sizeof(int);
	int t;

	/*
	 * One system call: anything but a socket fails it (ENOTSOCK; EBADF
	 * for an O_PATH fd, which can be passed too).  Callers check an fd
	 * they hold, so no failure means anything but "not a socket".
	 */
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &t, &len) < 0)
		return -EBADMSG;
	if (t != type)
		return -EBADMSG;
	return 0;
}
