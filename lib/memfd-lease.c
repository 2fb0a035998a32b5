// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * memfd-lease.c - segments on the fallback: leases, which stand in for the
 * module's holder count, and passing a segment over a socket.
 *
 * A lease is a SEQPACKET socket pair.  The creator keeps the local ends
 * (@seg->lease_ends) and passes a peer along with the memfd; every holder
 * keeps one peer, the newest.  An end hangs up when every copy of its peer
 * is closed, by close, exit or SIGKILL: when every end has hung up, the
 * creator is the sole holder.  The creator also keeps the current peer
 * (@seg->lease) for its next sends, and drops it before it looks for
 * hang-ups: its own copy would hold its end open.  Locking:
 * @seg->lease_lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "memfd.h"

void lease_put(struct tshm_lease *lease)
{
	if (lease && atomic_fetch_sub(&lease->refs, 1) == 1) {
		close(lease->fd);
		free(lease);
	}
}

static struct tshm_lease *lease_new(int fd, uint64_t gen)
{
	struct tshm_lease *lease = malloc(sizeof(*lease));

	if (!lease)
		return NULL;
	atomic_init(&lease->refs, 1);
	lease->fd = fd;
	lease->gen = gen;
	return lease;
}

int lease_get(struct tshm_seg *seg, struct tshm_lease **out)
{
	struct tshm_lease *lease;
	int sv[2], *ends, ret = 0;

	pthread_mutex_lock(&seg->lease_lock);
	if (!seg->lease) {
		if (!seg->creator) {
			ret = -EBADF;
			goto out;
		}
		ends = realloc(seg->lease_ends,
			       (seg->nlease_ends + 1) * sizeof(*ends));
		if (!ends) {
			ret = -ENOMEM;
			goto out;
		}
		seg->lease_ends = ends;
		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
			ret = -errno;
			goto out;
		}
		lease = lease_new(sv[1], ++seg->lease_gen);
		if (!lease) {
			close(sv[0]);
			close(sv[1]);
			ret = -ENOMEM;
			goto out;
		}
		shutdown(sv[0], SHUT_WR);
		ends[seg->nlease_ends++] = sv[0];
		seg->lease = lease;
	}
	atomic_fetch_add(&seg->lease->refs, 1);
	*out = seg->lease;
out:
	pthread_mutex_unlock(&seg->lease_lock);
	return ret;
}

/*
 * A lease peer arrived with @seg; ownership of @peer passes in.  It is
 * checked (a SEQPACKET socket) only when kept: a peer of the lease this
 * process already holds, or one sent to the creator, is closed unread.
 */
static int lease_received(struct tshm_seg *seg, int peer, uint64_t gen)
{
	struct tshm_lease *old = NULL, *lease;
	int ret;

	pthread_mutex_lock(&seg->lease_lock);
	/*
	 * The creator never holds its own peer: that would keep its lease
	 * from ever hanging up.  A holder keeps one peer, the newest.
	 */
	if (seg->creator || (seg->lease && seg->lease->gen == gen)) {
		pthread_mutex_unlock(&seg->lease_lock);
		close(peer);
		return 0;
	}
	ret = fd_check_socket(peer, SOCK_SEQPACKET);
	if (ret < 0) {
		pthread_mutex_unlock(&seg->lease_lock);
		close(peer);
		return ret;
	}
	lease = lease_new(peer, gen);
	if (lease) {
		old = seg->lease;
		seg->lease = lease;
	} else if (!seg->lease) {
		/* Keep the fd anyway: it is what marks us as a holder. */
		pthread_mutex_unlock(&seg->lease_lock);
		return 0;
	}
	pthread_mutex_unlock(&seg->lease_lock);
	if (!lease)
		close(peer);
	lease_put(old);
	return 0;
}

/*
 * A segment received as its memfd @fd and a lease peer @peer (both
 * consumed).  The fd, not the message, says what the segment is.  A
 * memfd this context already holds (its inode on our mount is in the
 * cache) was checked when it first came, and seals are never removed:
 * only its identity is read again.
 */
int memfd_seg_adopt(struct tshm_ctx *ctx, int fd, int peer, uint64_t gen,
		    struct tshm_seg **out)
{
	struct tshm_seg *seg = NULL;
	struct stat st;
	bool hit;
	int ret;

	if (fstat(fd, &st) < 0) {
		ret = -errno;
		goto fail;
	}
	if (st.st_dev == ctx->memfd_dev)
		seg = seg_cache_find(ctx, st.st_ino);
	if (seg) {
		close(fd);
	} else {
		ret = memfd_seg_check(ctx, fd, &st);
		if (ret < 0)
			goto fail;
		ret = seg_adopt(ctx, fd, st.st_ino, st.st_size, &seg, &hit);
		if (ret < 0) {
			close(peer);
			return ret;
		}
	}
	ret = lease_received(seg, peer, gen);
	if (ret < 0) {
		tshm_seg_unref(seg);
		return ret;
	}
	*out = seg;
	return 0;
fail:
	close(fd);
	close(peer);
	return ret;
}

/*
 * Under @seg->lease_lock: the creator stops holding its copy of the
 * current peer, so that the end hangs up once the holders close theirs;
 * its next send makes a new lease.  A send in flight holds its own
 * reference to the old one.
 */
static void lease_drop_own(struct tshm_seg *seg)
{
	struct tshm_lease *own = seg->lease;

	seg->lease = NULL;
	lease_put(own);
}

/*
 * The creator's: 1 every lease hung up (sole holder); 0 not yet.  A
 * segment found sole-held after it had holders gets a new queue key: the
 * old one was disclosed to processes that no longer hold it (and it may
 * now be reused, as a pool's buffer is).  No message carrying it can be
 * in flight: each holds a lease end open.
 */
static int lease_check(struct tshm_seg *seg)
{
	unsigned i, n;
	int ret;

	pthread_mutex_lock(&seg->lease_lock);
	lease_drop_own(seg);
	for (i = 0, n = 0; i < seg->nlease_ends; i++) {
		struct pollfd pfd = { .fd = seg->lease_ends[i], .events = POLLIN };

		if (poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLHUP | POLLERR)))
			close(seg->lease_ends[i]);
		else
			seg->lease_ends[n++] = seg->lease_ends[i];
	}
	if (n == 0 && seg->nlease_ends)
		memfd_qkey_draw(seg);
	seg->nlease_ends = n;
	ret = n == 0;
	pthread_mutex_unlock(&seg->lease_lock);
	return ret;
}

void memfd_seg_destroy(struct tshm_seg *seg)
{
	unsigned i;

	lease_put(seg->lease);
	seg->lease = NULL;
	for (i = 0; i < seg->nlease_ends; i++)
		close(seg->lease_ends[i]);
	free(seg->lease_ends);
	seg->lease_ends = NULL;
	seg->nlease_ends = 0;
}

int memfd_seg_released_now(struct tshm_seg *seg)
{
	return seg->creator ? lease_check(seg) : -EOPNOTSUPP;
}

int memfd_seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd,
			      unsigned n)
{
	unsigned i;

	pthread_mutex_lock(&seg->lease_lock);
	if (seg->creator)
		lease_drop_own(seg);
	for (i = 0; i < seg->nlease_ends && i < n; i++) {
		pfd[i].fd = seg->lease_ends[i];
		pfd[i].events = POLLIN;
	}
	pthread_mutex_unlock(&seg->lease_lock);
	return i;
}

/* The memfd and a lease peer. */
int memfd_seg_send_fd(struct tshm_seg *seg, int sock, struct seg_wire *w)
{
	struct tshm_lease *lease;
	int fds[2], ret;

	ret = lease_get(seg, &lease);
	if (ret < 0)
		return ret;
	fds[0] = seg->fd;
	fds[1] = lease->fd;
	w->gen = lease->gen;
	ret = fd_send(sock, w, sizeof(*w), fds, 2, 0);
	lease_put(lease);
	return ret;
}

int memfd_seg_recv_fd(struct tshm_ctx *ctx, const struct seg_wire *w,
		      int *fds, struct tshm_seg **out)
{
	return memfd_seg_adopt(ctx, fds[0], fds[1], w->gen, out);
}
