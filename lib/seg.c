// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * seg.c - segments: creation, mapping, the per-context cache of attached
 * segments, release notification (module poll / fallback lease sockets) and
 * handle passing.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tshm-private.h"

/* Unconsumed grants a receiver batches before giving them back. */
#define DROP_BATCH	64

static unsigned bucket(uint64_t id)
{
	id ^= id >> 33;
	id *= 0xff51afd7ed558ccdULL;
	id ^= id >> 33;
	return id % TSHM_CACHE_BUCKETS;
}

struct tshm_seg *seg_cache_lookup_locked(struct tshm_ctx *ctx, uint64_t id)
{
	uint64_t gen = ctx_gen(ctx);
	struct tshm_seg *seg;

	for (seg = ctx->cache[bucket(id)]; seg; seg = seg->hnext) {
		int refs;

		if (seg->id != id || seg->gen != gen)
			continue;
		/* A segment on its way out (refs 0) is not resurrected. */
		refs = atomic_load_explicit(&seg->refs, memory_order_relaxed);
		while (refs > 0) {
			if (atomic_compare_exchange_weak(&seg->refs, &refs,
							 refs + 1))
				return seg;
		}
	}
	return NULL;
}

void seg_cache_insert_locked(struct tshm_ctx *ctx, struct tshm_seg *seg)
{
	unsigned b = bucket(seg->id);

	seg->hnext = ctx->cache[b];
	ctx->cache[b] = seg;
}

static void seg_cache_remove_locked(struct tshm_ctx *ctx, struct tshm_seg *seg)
{
	struct tshm_seg **pp;

	for (pp = &ctx->cache[bucket(seg->id)]; *pp; pp = &(*pp)->hnext) {
		if (*pp == seg) {
			*pp = seg->hnext;
			return;
		}
	}
}

static int seg_new(struct tshm_ctx *ctx, int fd, uint64_t id, size_t size,
		   struct tshm_seg **out)
{
	struct tshm_seg *seg;
	void *data;

	if (!size)
		return -EBADMSG;
	data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (data == MAP_FAILED)
		return -errno;
	seg = calloc(1, sizeof(*seg));
	if (!seg) {
		munmap(data, size);
		return -ENOMEM;
	}
	atomic_init(&seg->refs, 1);
	seg->ctx = ctx_get(ctx);
	seg->gen = ctx_gen(ctx);
	seg->id = id;
	seg->data = data;
	seg->size = size;
	seg->fd = fd;
	pthread_mutex_init(&seg->lease_lock, NULL);
	*out = seg;
	return 0;
}

TSHM_EXPORT
int tshm_seg_create(struct tshm_ctx *ctx, size_t size, const char *name,
		    unsigned flags, struct tshm_seg **out)
{
	struct tshm_seg *seg;
	size_t mapsize;
	uint64_t id;
	int fd, ret;

	if (!ctx || !out || !size || size > (SIZE_MAX >> 1) ||
	    (flags & ~(TSHM_SEG_HUGE | TSHM_SEG_PREFAULT)))
		return -EINVAL;
	if (ctx->backend == TSHM_BACKEND_KMOD)
		ret = kmod_seg_create(ctx, size, name, flags, &fd, &id, &mapsize);
	else
		ret = memfd_seg_create(ctx, size, name, flags, &fd, &id, &mapsize);
	if (ret < 0)
		return ret;
	ret = seg_new(ctx, fd, id, mapsize, &seg);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	seg->creator = true;
	if (name)
		strncpy(seg->name, name, TSHM_SEG_NAME_MAX);
	if (ctx->backend == TSHM_BACKEND_MEMFD && (flags & TSHM_SEG_HUGE))
		madvise(seg->data, mapsize, MADV_HUGEPAGE);
	pthread_mutex_lock(&ctx->lock);
	seg_cache_insert_locked(ctx, seg);
	pthread_mutex_unlock(&ctx->lock);
	*out = seg;
	return 0;
}

static void memfd_name(int fd, char *name, size_t len)
{
	char path[32], link[64 + TSHM_SEG_NAME_MAX];
	const char *p;
	ssize_t n;
	size_t k;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n <= 0)
		return;
	link[n] = '\0';
	p = strstr(link, "memfd:tshm:");
	if (!p)
		return;
	p += strlen("memfd:tshm:");
	k = strcspn(p, " ");
	if (k >= len)
		k = len - 1;
	memcpy(name, p, k);
	name[k] = '\0';
}

/*
 * The name of a segment that arrived, read before it is shared so that
 * tshm_seg_name() is a plain read (and so that the fd, which a mapping
 * may outlive, is needed only now).
 */
static void seg_fetch_name(struct tshm_ctx *ctx, int fd, char *name,
			   size_t len)
{
	name[0] = '\0';
	if (ctx->backend == TSHM_BACKEND_KMOD)
		kmod_info_name(fd, name, len);
	else
		memfd_name(fd, name, len);
}

int seg_adopt(struct tshm_ctx *ctx, int fd, uint64_t id, size_t size,
	      struct tshm_seg **out, bool *hit)
{
	char name[TSHM_SEG_NAME_MAX + 1];
	struct tshm_seg *seg;
	int ret;

	seg_fetch_name(ctx, fd, name, sizeof(name));
	pthread_mutex_lock(&ctx->lock);
	seg = seg_cache_lookup_locked(ctx, id);
	if (seg) {
		pthread_mutex_unlock(&ctx->lock);
		close(fd);
		*hit = true;
		*out = seg;
		return 0;
	}
	ret = seg_new(ctx, fd, id, size, &seg);
	if (ret == 0) {
		memcpy(seg->name, name, sizeof(seg->name));
		/*
		 * Module: the mapping is the holder (it keeps the file the
		 * fd was open on), so a received segment needs no fd: a
		 * process may hold thousands under RLIMIT_NOFILE.  It is
		 * passed on by the mapping's address (GRANT_BY_ADDR).
		 */
		if (ctx->backend == TSHM_BACKEND_KMOD) {
			close(seg->fd);
			seg->fd = -1;
		}
		seg_cache_insert_locked(ctx, seg);
	}
	pthread_mutex_unlock(&ctx->lock);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	*hit = false;
	*out = seg;
	return 0;
}

int seg_grant(struct tshm_seg *seg, int ctx_fd, int count)
{
	if (seg->fd >= 0)
		return kmod_grant(seg->fd, ctx_fd, count);
	return kmod_grant_addr(seg->data, ctx_fd, count);
}

static void seg_flush_drops_locked(struct tshm_seg *seg)
{
	struct tshm_seg **pp;
	int fd;

	if (!seg->drop_count)
		return;
	for (pp = &seg->ctx->drops; *pp; pp = &(*pp)->drop_next) {
		if (*pp == seg) {
			*pp = seg->drop_next;
			break;
		}
	}
	fd = seg->drop_q ? queue_grant_fd(seg->drop_q) : seg->ctx->fd;
	/*
	 * Nothing useful can be done if this fails: the grants then stay with
	 * their context until it is closed.
	 */
	kmod_drop(fd, seg->id, seg->drop_count);
	seg->drop_count = 0;
	if (seg->drop_q) {
		tshm_queue_unref(seg->drop_q);
		seg->drop_q = NULL;
	}
}

void seg_flush_drops(struct tshm_seg *seg)
{
	pthread_mutex_lock(&seg->ctx->lock);
	seg_flush_drops_locked(seg);
	pthread_mutex_unlock(&seg->ctx->lock);
}

void ctx_flush_drops(struct tshm_ctx *ctx)
{
	if (!ctx->drops)
		return;
	pthread_mutex_lock(&ctx->lock);
	while (ctx->drops)
		seg_flush_drops_locked(ctx->drops);
	pthread_mutex_unlock(&ctx->lock);
}

void seg_note_unconsumed_grant(struct tshm_seg *seg, struct tshm_queue *q)
{
	pthread_mutex_lock(&seg->ctx->lock);
	if (seg->drop_count && seg->drop_q != q)
		seg_flush_drops_locked(seg);
	if (!seg->drop_count) {
		if (q)
			seg->drop_q = tshm_queue_ref(q);
		seg->drop_next = seg->ctx->drops;
		seg->ctx->drops = seg;
	}
	if (++seg->drop_count >= DROP_BATCH)
		seg_flush_drops_locked(seg);
	pthread_mutex_unlock(&seg->ctx->lock);
}

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

int seg_lease_get(struct tshm_seg *seg, struct tshm_lease **out)
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

void seg_lease_received(struct tshm_seg *seg, int peer, uint64_t gen)
{
	struct tshm_lease *old = NULL, *lease;

	pthread_mutex_lock(&seg->lease_lock);
	/*
	 * The creator never holds its own peer: that would keep its lease
	 * from ever hanging up.  A holder keeps one peer, the newest.
	 */
	if (seg->creator || (seg->lease && seg->lease->gen == gen)) {
		pthread_mutex_unlock(&seg->lease_lock);
		close(peer);
		return;
	}
	lease = lease_new(peer, gen);
	if (lease) {
		old = seg->lease;
		seg->lease = lease;
	} else if (!seg->lease) {
		/* Keep the fd anyway: it is what marks us as a holder. */
		pthread_mutex_unlock(&seg->lease_lock);
		return;
	}
	pthread_mutex_unlock(&seg->lease_lock);
	if (!lease)
		close(peer);
	lease_put(old);
}

int seg_lease_check(struct tshm_seg *seg, bool close_peer)
{
	struct tshm_lease *old = NULL;
	unsigned i, n;
	int ret;

	pthread_mutex_lock(&seg->lease_lock);
	if (close_peer) {
		old = seg->lease;
		seg->lease = NULL;
	}
	for (i = 0, n = 0; i < seg->nlease_ends; i++) {
		struct pollfd pfd = { .fd = seg->lease_ends[i], .events = POLLIN };

		if (poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLHUP | POLLERR)))
			close(seg->lease_ends[i]);
		else
			seg->lease_ends[n++] = seg->lease_ends[i];
	}
	seg->nlease_ends = n;
	ret = n == 0;
	pthread_mutex_unlock(&seg->lease_lock);
	lease_put(old);
	return ret;
}

int seg_released_now(struct tshm_seg *seg)
{
	struct pollfd pfd = { .fd = seg->fd, .events = POLLIN };

	if (seg->ctx->backend == TSHM_BACKEND_MEMFD)
		return seg->creator ? seg_lease_check(seg, true) : -EOPNOTSUPP;
	if (seg->fd < 0)
		return -EOPNOTSUPP;	/* received: held by its mapping */
	seg_flush_drops(seg);
	/*
	 * Spare grants parked in queues look like holders: give back those
	 * of every queue this process has, whoever parked them (a receiver
	 * that died or exited holding the segment, for one).
	 */
	ctx_reclaim_spares(seg->ctx, seg->id);
	if (poll(&pfd, 1, 0) < 0)
		return -errno;
	return !!(pfd.revents & POLLIN);
}

int seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd, unsigned n)
{
	unsigned i;

	if (seg->ctx->backend == TSHM_BACKEND_KMOD) {
		if (n < 1 || seg->fd < 0)
			return 0;
		pfd[0].fd = seg->fd;
		pfd[0].events = POLLIN;
		return 1;
	}
	pthread_mutex_lock(&seg->lease_lock);
	for (i = 0; i < seg->nlease_ends && i < n; i++) {
		pfd[i].fd = seg->lease_ends[i];
		pfd[i].events = POLLIN;
	}
	pthread_mutex_unlock(&seg->lease_lock);
	return i;
}

TSHM_EXPORT
int tshm_seg_release_pollfds(struct tshm_seg *seg, struct pollfd *pfd,
			     unsigned n)
{
	int ret;

	if (!seg || !pfd || !n)
		return -EINVAL;
	if (!seg->creator)
		return -EOPNOTSUPP;
	ret = seg_released_now(seg);
	if (ret)
		return ret < 0 ? ret : 0;
	/*
	 * A subset is enough: the segment cannot be released before every
	 * fd given here is ready, and the check that follows a wake-up
	 * reaps the ready ones, so the next fill names the others.
	 */
	return seg_release_pollfds(seg, pfd, n);
}

TSHM_EXPORT
int tshm_seg_wait_released(struct tshm_seg *seg, int timeout_ms)
{
	struct pollfd pfd[64];
	struct deadline dl;
	int ret, n;

	if (!seg)
		return -EINVAL;
	if (!seg->creator)
		return -EOPNOTSUPP;
	deadline_init(&dl, timeout_ms);
	for (;;) {
		ret = seg_released_now(seg);
		if (ret)
			return ret < 0 ? ret : 0;
		if (deadline_expired(&dl))
			return deadline_err(&dl);
		n = seg_release_pollfds(seg, pfd, ARRAY_SIZE(pfd));
		ret = wait_poll(pfd, n, &dl);
		if (ret < 0)
			return ret;
	}
}

TSHM_EXPORT
void *tshm_seg_data(struct tshm_seg *seg)
{
	return seg->data;
}

TSHM_EXPORT
size_t tshm_seg_size(const struct tshm_seg *seg)
{
	return seg->size;
}

TSHM_EXPORT
uint64_t tshm_seg_id(const struct tshm_seg *seg)
{
	return seg->id;
}

TSHM_EXPORT
const char *tshm_seg_name(const struct tshm_seg *seg)
{
	return seg->name;	/* set before the segment was shared */
}

TSHM_EXPORT
struct tshm_seg *tshm_seg_ref(struct tshm_seg *seg)
{
	atomic_fetch_add_explicit(&seg->refs, 1, memory_order_relaxed);
	return seg;
}

static void seg_destroy(struct tshm_seg *seg)
{
	struct tshm_ctx *ctx = seg->ctx;
	unsigned i;

	/*
	 * Spare grants this process parked or used in queue tables: nobody
	 * here can hit them in the cache any more, so give them back now
	 * (the producer's release notification waits for them).
	 */
	if (atomic_load_explicit(&seg->spare_touched, memory_order_relaxed))
		ctx_reclaim_spares(ctx, seg->id);
	pthread_mutex_lock(&ctx->lock);
	seg_cache_remove_locked(ctx, seg);
	seg_flush_drops_locked(seg);
	pthread_mutex_unlock(&ctx->lock);
	munmap(seg->data, seg->size);
	if (seg->fd >= 0)
		close(seg->fd);
	lease_put(seg->lease);
	for (i = 0; i < seg->nlease_ends; i++)
		close(seg->lease_ends[i]);
	free(seg->lease_ends);
	pthread_mutex_destroy(&seg->lease_lock);
	pool_notifier_put(seg->notifier);
	free(seg);
	ctx_put(ctx);
}

TSHM_EXPORT
void tshm_seg_unref(struct tshm_seg *seg)
{
	struct pool_notifier *n;
	int old;

	if (!seg)
		return;
	n = seg->notifier;
	if (!n) {
		if (atomic_fetch_sub_explicit(&seg->refs, 1,
					      memory_order_acq_rel) == 1)
			seg_destroy(seg);
		return;
	}
	/*
	 * A pool buffer: once our reference is gone another thread may drop
	 * the last one (tshm_pool_destroy()), so hold the notifier across.
	 */
	atomic_fetch_add(&n->refs, 1);
	old = atomic_fetch_sub(&seg->refs, 1);
	if (old == 1)
		seg_destroy(seg);
	else if (old == 2)
		pool_notify(n);
	pool_notifier_put(n);
}

/* ---- handle passing ---- */

TSHM_EXPORT
int tshm_seg_export(struct tshm_seg *seg, struct tshm_handle *h)
{
	int ret;

	if (!seg || !h)
		return -EINVAL;
	if (seg->ctx->backend != TSHM_BACKEND_KMOD)
		return -EOPNOTSUPP;
	ret = seg_grant(seg, seg->ctx->fd, 1);
	if (ret < 0)
		return ret;
	h->id = seg->id;
	h->grants = 1;
	h->flags = 0;
	return 0;
}

TSHM_EXPORT
int tshm_seg_import(struct tshm_ctx *ctx, const struct tshm_handle *h,
		    struct tshm_seg **out)
{
	struct tshm_seg *seg;
	size_t size;
	bool hit;
	int fd, ret;

	if (!ctx || !h || !out || h->grants != 1 || h->flags)
		return -EINVAL;
	if (ctx->backend != TSHM_BACKEND_KMOD)
		return -EOPNOTSUPP;
	pthread_mutex_lock(&ctx->lock);
	seg = seg_cache_lookup_locked(ctx, h->id);
	pthread_mutex_unlock(&ctx->lock);
	if (seg) {
		/* Held already: no system call; the grant goes back later. */
		seg_note_unconsumed_grant(seg, NULL);
		*out = seg;
		return 0;
	}
	ret = kmod_attach(ctx->fd, h->id, &fd, &size);
	if (ret < 0)
		return ret;
	ret = seg_adopt(ctx, fd, h->id, size, &seg, &hit);
	if (ret < 0)
		return ret;
	*out = seg;
	return 0;
}

#define SEG_WIRE_MAGIC	0x47455354	/* "TSEG" */

struct seg_wire {
	uint32_t magic;
	uint32_t backend;
	uint64_t gen;
};

TSHM_EXPORT
int tshm_seg_send_fd(struct tshm_seg *seg, int sock)
{
	struct seg_wire w = { .magic = SEG_WIRE_MAGIC };
	struct tshm_lease *lease = NULL;
	int fds[2] = { seg ? seg->fd : -1, -1 }, ret;

	if (!seg || sock < 0)
		return -EINVAL;
	w.backend = seg->ctx->backend;
	if (seg->ctx->backend == TSHM_BACKEND_KMOD) {
		/*
		 * Passing the segment fd itself would share this process's
		 * open file, and so its holder, with the receiver: release
		 * notification could not see the receiver.  Pass a transfer
		 * context holding one grant instead; the receiver attaches
		 * through it (its own holder) and closes it.  Lost in flight
		 * or with a dead receiver, the grant goes with the context.
		 */
		fds[0] = kmod_open();
		if (fds[0] < 0)
			return fds[0];
		ret = seg_grant(seg, fds[0], 1);
		w.gen = seg->id;
		if (ret == 0)
			ret = fd_send(sock, &w, sizeof(w), fds, 1, 0);
		close(fds[0]);
		return ret;
	}
	ret = seg_lease_get(seg, &lease);
	if (ret < 0)
		return ret;
	fds[1] = lease->fd;
	w.gen = lease->gen;
	ret = fd_send(sock, &w, sizeof(w), fds, 2, 0);
	lease_put(lease);
	return ret;
}

TSHM_EXPORT
int tshm_seg_recv_fd(struct tshm_ctx *ctx, int sock, struct tshm_seg **out)
{
	struct seg_wire w;
	struct tshm_seg *seg;
	unsigned nfds = 2, want;
	int fds[2], ret;
	uint64_t id;
	size_t size;
	bool hit;

	if (!ctx || !out || sock < 0)
		return -EINVAL;
	ret = fd_recv(sock, &w, sizeof(w), fds, &nfds, 0);
	if (ret < 0)
		return ret;
	if (ret == 0 && nfds == 0)
		return -EPIPE;
	want = ctx->backend == TSHM_BACKEND_MEMFD ? 2 : 1;
	if (ret != sizeof(w) || w.magic != SEG_WIRE_MAGIC || nfds != want ||
	    w.backend != (uint32_t)ctx->backend) {
		ret = (ret == sizeof(w) && w.magic == SEG_WIRE_MAGIC) ?
			-EXDEV : -EBADMSG;
		goto fail;
	}
	if (ctx->backend == TSHM_BACKEND_KMOD) {
		int tfd = fds[0];

		/* A transfer context with one grant for segment w.gen. */
		ret = kmod_is_ctx_fd(tfd);
		if (ret <= 0) {
			ret = ret < 0 ? ret : -EBADMSG;
			goto fail;
		}
		id = w.gen;
		pthread_mutex_lock(&ctx->lock);
		seg = seg_cache_lookup_locked(ctx, id);
		pthread_mutex_unlock(&ctx->lock);
		if (!seg) {
			ret = kmod_attach(tfd, id, &fds[0], &size);
			if (ret == 0)
				ret = seg_adopt(ctx, fds[0], id, size, &seg,
						&hit);
		}
		close(tfd);	/* an unused grant goes with it */
		if (ret < 0)
			return ret;
		*out = seg;
		return 0;
	}
	/* Trust the fd, not the message, for what the segment is. */
	ret = memfd_seg_check(ctx, fds[0], &id, &size);
	if (ret == 0)
		ret = fd_check_socket(fds[1], SOCK_SEQPACKET);
	if (ret < 0)
		goto fail;
	ret = seg_adopt(ctx, fds[0], id, size, &seg, &hit);
	fds[0] = -1;
	if (ret < 0)
		goto fail;
	if (want == 2)
		seg_lease_received(seg, fds[1], w.gen);
	*out = seg;
	return 0;
fail:
	for (unsigned i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return ret;
}
