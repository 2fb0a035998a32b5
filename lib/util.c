// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * util.c - clocks, futexes and SCM_RIGHTS helpers used across the library.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tshm-private.h"

int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void deadline_init(struct deadline *dl, int timeout_ms)
{
	dl->nowait = timeout_ms == 0;
	if (timeout_ms < 0)
		dl->ns = INT64_MAX;
	else
		dl->ns = now_ns() + (int64_t)timeout_ms * 1000000;
}

bool deadline_expired(const struct deadline *dl)
{
	if (dl->nowait)
		return true;
	return dl->ns != INT64_MAX && now_ns() >= dl->ns;
}

int deadline_poll_ms(const struct deadline *dl)
{
	int64_t left;

	if (dl->nowait)
		return 0;
	if (dl->ns == INT64_MAX)
		return -1;
	left = dl->ns - now_ns();
	if (left <= 0)
		return 0;
	/* Round up so that poll() does not return just before the deadline. */
	left = (left + 999999) / 1000000;
	return left > INT_MAX ? INT_MAX : (int)left;
}

int deadline_err(const struct deadline *dl)
{
	return dl->nowait ? -EAGAIN : -ETIMEDOUT;
}

/*
 * tshm_thread_set_intr(): whether this thread's blocking calls give -EINTR
 * when a signal handler ran while they slept.  Every sleep of the library
 * goes through futex_wait_until(), futex_wait_slice() or wait_poll(), which
 * read it.
 */
static __thread bool thread_intr;

TSHM_EXPORT
int tshm_thread_set_intr(int on)
{
	int old = thread_intr;

	thread_intr = !!on;
	return old;
}

bool intr_enabled(void)
{
	return thread_intr;
}

static int futex_wait_abs(_Atomic uint32_t *word, uint32_t val, int64_t ns)
{
	struct timespec ts, *tsp = NULL;
	long ret;

	if (ns != INT64_MAX) {
		ts.tv_sec = ns / 1000000000;
		ts.tv_nsec = ns % 1000000000;
		tsp = &ts;
	}
	/*
	 * FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline, so
	 * restarts after EINTR or spurious wake-ups need no arithmetic.  Not
	 * FUTEX_PRIVATE: the word may be in memory shared between processes.
	 */
	ret = syscall(SYS_futex, word, FUTEX_WAIT_BITSET, val, tsp, NULL,
		      FUTEX_BITSET_MATCH_ANY);
	if (ret == 0)
		return 0;
	if (errno == ETIMEDOUT)
		return -ETIMEDOUT;
	if (errno == EINTR && thread_intr)
		return -EINTR;
	return 0;
}

int futex_wait_until(_Atomic uint32_t *word, uint32_t val,
		     const struct deadline *dl)
{
	if (dl->nowait)
		return -ETIMEDOUT;
	return futex_wait_abs(word, val, dl->ns);
}

int futex_wait_slice(_Atomic uint32_t *word, uint32_t val,
		     const struct deadline *dl)
{
	int64_t slice = now_ns() + (int64_t)TSHM_SLEEP_SLICE_MS * 1000000;
	int ret;

	if (dl->nowait)
		return -ETIMEDOUT;
	if (slice >= dl->ns)
		return futex_wait_abs(word, val, dl->ns);
	ret = futex_wait_abs(word, val, slice);
	return ret == -ETIMEDOUT ? 0 : ret;
}

int wait_poll(struct pollfd *pfd, unsigned n, const struct deadline *dl)
{
	int ret = poll(pfd, n, deadline_poll_ms(dl));

	if (ret >= 0)
		return ret;
	if (errno == EINTR)
		return thread_intr ? -EINTR : 0;
	return -errno;
}

/*
 * A process-local lock whose waits honour a deadline and
 * tshm_thread_set_intr() (pthread_mutex_timedlock() does neither for
 * signals).  Drepper's three-state futex mutex: 0 free, 1 locked, 2 locked
 * with sleepers.
 */
int tlock_lock(struct tlock *l, const struct deadline *dl)
{
	uint32_t c = 0;
	int ret;

	if (atomic_compare_exchange_strong(&l->word, &c, 1))
		return 0;
	if (c != 2)
		c = atomic_exchange(&l->word, 2);
	while (c != 0) {
		if (deadline_expired(dl))
			return deadline_err(dl);
		ret = futex_wait_until(&l->word, 2, dl);
		if (ret == -EINTR)
			return ret;
		c = atomic_exchange(&l->word, 2);
	}
	return 0;
}

void tlock_unlock(struct tlock *l)
{
	if (atomic_exchange(&l->word, 0) == 2)
		syscall(SYS_futex, &l->word, FUTEX_WAKE_PRIVATE, 1, NULL,
			NULL, 0);
}

void futex_wake_all(_Atomic uint32_t *word)
{
	syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
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
	struct stat st;
	socklen_t len = sizeof(int);
	int t;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISSOCK(st.st_mode) ||
	    getsockopt(fd, SOL_SOCKET, SO_TYPE, &t, &len) < 0 || t != type)
		return -EBADMSG;
	return 0;
}

int fd_reserve(int fd, unsigned n)
{
	int tmp[2 * TSHM_QUEUE_MAX_SEGS];
	unsigned i, got;
	int ret = 0;

	if (n > ARRAY_SIZE(tmp))
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
		char buf[CMSG_SPACE(sizeof(int) * 2 * TSHM_QUEUE_MAX_SEGS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cmsg;
	ssize_t n;

	if (nfds > 2 * TSHM_QUEUE_MAX_SEGS)
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
		char buf[CMSG_SPACE(sizeof(int) * 2 * TSHM_QUEUE_MAX_SEGS)];
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
