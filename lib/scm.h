/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * scm.h - fds over AF_UNIX sockets and checks on received fds (scm.c).
 * Nothing here is ABI.
 */
#ifndef _TSHM_SCM_H
#define _TSHM_SCM_H

#include <sys/stat.h>
#include <sys/types.h>

#include "tshm.h"

/*
 * The most fds one message carries: a queue message's segments and their
 * leases (fallback), and the message's own fds.
 */
#define SCM_MAX_FDS	(2 * TSHM_QUEUE_MAX_SEGS + TSHM_QUEUE_MAX_FDS)

/*
 * Send @len bytes and @nfds fds (<= SCM_MAX_FDS) in one message: 0, or
 * -errno (-EAGAIN with MSG_DONTWAIT on a full socket, -EMSGSIZE when the
 * message went short).  EINTR is retried; never SIGPIPE.
 */
int fd_send(int sock, const void *buf, size_t len, const int *fds,
	    unsigned nfds, int flags);
/*
 * Receive one message and its fds (O_CLOEXEC).  *@nfds: in, room; out,
 * received.  Fds beyond the room, or a truncated message, close them all
 * and give -EBADMSG.  Returns bytes or -errno.
 */
ssize_t fd_recv(int sock, void *buf, size_t len, int *fds, unsigned *nfds,
		int flags);
/*
 * Whether @n more fds can be opened now (0, or -EMFILE): asked before a
 * receive that consumes a message whose fds would otherwise be dropped
 * (MSG_CTRUNC).  Another thread opening fds in between can still take the
 * room; that case is reported as a corrupted message.
 */
int fd_reserve(int fd, unsigned n);

/* Checks on received fds (open ones): 0 or -EBADMSG. */
int fd_check_socket(int fd, int type);
int fd_check_eventfd(int fd);

#endif /* _TSHM_SCM_H */
