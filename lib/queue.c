// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * queue.c - bounded MPMC queues in shared memory.
 *
 * The ring lives in a sealed memfd: a header, then @capacity fixed-size
 * slots.  One robust, process-shared mutex serializes senders and receivers;
 * every change to the ring commits with a single store (tail for a send,
 * head for a receive) made while holding it, so a holder SIGKILLed at any
 * instruction leaves a consistent ring and the next locker only has to call
 * pthread_mutex_consistent().  Waiting happens outside the lock, spinning
 * and then sleeping on futex words that senders and receivers bump after
 * each change.
 *
 * Segments never go through the ring as memory: only their ids.  On the
 * module the sender grants each segment to the queue's own /dev/tshm
 * context, so the kernel holds every in-flight reference, and the receiver
 * attaches by id (or finds the segment in its cache and gives the grant back
 * later).  On the fallback the fds travel in a SEQPACKET socket owned by the
 * queue, sent and received under the same lock so that socket order is ring
 * order; each socket message carries a tag that names its slot, which lets a
 * receiver discard what a dead sender left behind.  Documentation/lib/
 * queue.rst has the whole argument; lib/queue.h lists the queue's files.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "queue.h"

int queue_grant_fd(const struct tshm_queue *q)
{
	return q->gfd;
}

/* ---- send and receive ---- */

TSHM_EXPORT
int tshm_queue_send(struct tshm_queue *q, const void *msg, size_t len,
		    struct tshm_seg *const *segs, unsigned nsegs,
		    int timeout_ms)
{
	struct qhdr *hdr;
	struct qslot *slot;
	struct deadline dl;
	uint64_t head, tail;
	bool recovered;
	uint32_t seen;
	unsigned i;
	int ret;

	if (!q || (len && !msg) || (nsegs && !segs))
		return -EINVAL;
	if (len > q->max_msg)
		return -EMSGSIZE;
	if (nsegs > TSHM_QUEUE_MAX_SEGS)
		return -E2BIG;
	for (i = 0; i < nsegs; i++) {
		if (!segs[i])
			return -EINVAL;
		if (segs[i]->ctx->ops != q->ctx->ops)
			return -EXDEV;
	}
	hdr = q->hdr;
	deadline_init(&dl, timeout_ms);
	for (;;) {
		ret = q_lock(q, &dl);
		if (ret < 0)
			return ret;
		recovered = ret;
		seen = atomic_load(&hdr->con);
		if (atomic_load_explicit(&hdr->closed, memory_order_relaxed)) {
			q_unlock(q, recovered);
			return -EPIPE;
		}
		head = atomic_load_explicit(&hdr->head, memory_order_relaxed);
		tail = atomic_load_explicit(&hdr->tail, memory_order_relaxed);
		if (tail - head < q->capacity) {
			slot = q_slot(q, tail);
			ret = nsegs ? q->ctx->ops->q_send_segs(q, segs, nsegs,
							       slot->h, &slot->tag) : 0;
			if (ret == 0)
				break;
			q_unlock(q, recovered);
			if (ret == -ETOOMANYREFS) {
				/*
				 * The kernel caps the fds a user has in flight
				 * in Unix sockets at RLIMIT_NOFILE: like a full
				 * ring, wait for receivers to take some.
				 */
				ret = q_wait(q, &hdr->con, seen, &hdr->swait,
					     &dl);
				if (ret < 0)
					return ret;
				continue;
			}
			if (ret != -EAGAIN)
				return ret;
			/* The fallback's socket is full: wait for room. */
			if (deadline_expired(&dl))
				return deadline_err(&dl);
			ret = wait_poll(&(struct pollfd){ .fd = q->sfd[0],
						.events = POLLOUT }, 1, &dl);
			if (ret < 0)
				return ret;
			continue;
		}
		q_unlock(q, recovered);
		ret = q_wait(q, &hdr->con, seen, &hdr->swait, &dl);
		if (ret < 0)
			return ret;
	}
	slot->len = len;
	slot->nsegs = nsegs;
	if (len)
		memcpy(slot->data, msg, len);
	slot->pos = tail;
	/* The commit: the message exists once tail moves past it. */
	atomic_store_explicit(&hdr->tail, tail + 1, memory_order_release);
	q_unlock(q, recovered);
	q_wake(&hdr->pub, &hdr->rwait, false);
	q_poll_wake(q, false);
	return 0;
}

TSHM_EXPORT
int tshm_queue_recv(struct tshm_queue *q, void *buf, size_t cap, size_t *len,
		    struct tshm_seg **segs, unsigned *nsegs, int timeout_ms)
{
	unsigned room = nsegs ? *nsegs : 0, n;
	const struct backend_ops *ops;
	struct q_rx rx;
	struct qhdr *hdr;
	struct qslot *slot;
	struct deadline dl;
	uint64_t head, tail;
	bool recovered;
	uint32_t seen, mlen;
	int ret;

	if (!q || (cap && !buf) || (room && !segs))
		return -EINVAL;
	hdr = q->hdr;
	ops = q->ctx->ops;
	deadline_init(&dl, timeout_ms);
again:
	for (;;) {
		ret = q_lock(q, &dl);
		if (ret < 0)
			return ret;
		recovered = ret;
		seen = atomic_load(&hdr->pub);
		head = atomic_load_explicit(&hdr->head, memory_order_relaxed);
		tail = atomic_load_explicit(&hdr->tail, memory_order_relaxed);
		if (head != tail)
			break;
		if (atomic_load_explicit(&hdr->closed, memory_order_relaxed)) {
			q_unlock(q, recovered);
			ctx_flush_drops(q->ctx);
			return -EPIPE;
		}
		if (q->pollable)
			q_poll_arm(q);
		q_unlock(q, recovered);
		/*
		 * About to idle: give back the grants batched by cache hits,
		 * so that their producers see the segments released.
		 */
		ctx_flush_drops(q->ctx);
		ret = q_wait(q, &hdr->pub, seen, &hdr->rwait, &dl);
		if (ret < 0)
			return ret;
	}

	/* Everything read from the slot is checked against local limits. */
	slot = q_slot(q, head);
	mlen = slot->len;
	n = slot->nsegs;
	if (slot->pos != head || mlen > q->max_msg ||
	    n > TSHM_QUEUE_MAX_SEGS) {
		ret = -EBADMSG;
		goto consume;
	}
	if (mlen > cap) {
		if (len)
			*len = mlen;
		q_unlock(q, recovered);
		return -EMSGSIZE;
	}
	if (n > room) {
		if (nsegs)
			*nsegs = n;
		q_unlock(q, recovered);
		return -ENOBUFS;
	}
	if (mlen)
		memcpy(buf, slot->data, mlen);
	rx.n = n;
	rx.tag = slot->tag;
	memcpy(rx.h, slot->h, n * sizeof(rx.h[0]));
	ret = n ? ops->q_recv_take(q, &rx, segs) : 0;
	if (ret < 0) {
		/* No room for the segments' fds: the message stays. */
		q_unlock(q, recovered);
		if (ops->q_recv_undo)
			ops->q_recv_undo(q, &rx, segs);
		return ret;
	}
consume:
	/* The commit: the message is taken once head moves past it. */
	atomic_store_explicit(&hdr->head, head + 1, memory_order_release);
	/* Then what the backend does once the message is taken. */
	if (ret == 0 && n && ops->q_recv_commit)
		ops->q_recv_commit(q, &rx, segs);
	q_unlock(q, recovered);
	q_wake(&hdr->con, &hdr->swait, false);
	if (ret == 1)
		goto again;	/* a dead receiver took it: skip */
	if (ret < 0)
		return ret;

	if (n) {
		ret = ops->q_recv_finish(q, &rx, segs);
		if (ret < 0)
			return ret;
	}
	if (len)
		*len = mlen;
	if (nsegs)
		*nsegs = n;
	return 0;
}

TSHM_EXPORT
int tshm_queue_close(struct tshm_queue *q)
{
	struct deadline dl;
	int ret;

	if (!q)
		return -EINVAL;
	deadline_init(&dl, -1);
	ret = q_lock(q, &dl);
	if (ret < 0)
		return ret;
	atomic_store(&q->hdr->closed, 1);
	q_unlock(q, ret);
	q_wake(&q->hdr->pub, &q->hdr->rwait, true);
	q_wake(&q->hdr->con, &q->hdr->swait, true);
	q_poll_wake(q, true);
	return 0;
}

TSHM_EXPORT
unsigned tshm_queue_len(struct tshm_queue *q)
{
	uint64_t head = atomic_load(&q->hdr->head);
	uint64_t tail = atomic_load(&q->hdr->tail);

	return tail - head > q->capacity ? q->capacity : tail - head;
}

TSHM_EXPORT
unsigned tshm_queue_capacity(const struct tshm_queue *q)
{
	return q->capacity;
}

TSHM_EXPORT
size_t tshm_queue_max_msg(const struct tshm_queue *q)
{
	return q->max_msg;
}

TSHM_EXPORT
int tshm_queue_fd(struct tshm_queue *q)
{
	if (!q)
		return -EINVAL;
	if (!q->pollable) {
		q->pollable = true;
		/* Readable at first: the caller receives until -EAGAIN. */
		q_poll_wake(q, true);
	}
	return q->efd;
}

TSHM_EXPORT
int tshm_queue_set_wait(struct tshm_queue *q, enum tshm_wait policy,
			unsigned spin_us)
{
	if (!q || (unsigned)policy > TSHM_WAIT_SPIN)
		return -EINVAL;
	q->wait = policy;
	q->spin_us = spin_us ? spin_us : QUEUE_SPIN_US;
	return 0;
}

TSHM_EXPORT
const char *tshm_wait_name(enum tshm_wait policy)
{
	switch (policy) {
	case TSHM_WAIT_ADAPTIVE:
		return "adaptive";
	case TSHM_WAIT_FUTEX:
		return "futex";
	case TSHM_WAIT_SPIN:
		return "spin";
	}
	return "?";
}

/* ---- creation, attachment, lifetime ---- */

void q_close_fds(int fd, int gfd, const int *sfd, int efd)
{
	if (efd >= 0)
		close(efd);
	if (fd >= 0)
		close(fd);
	if (gfd >= 0)
		close(gfd);
	if (sfd[0] >= 0)
		close(sfd[0]);
	if (sfd[1] >= 0)
		close(sfd[1]);
}

/*
 * Map the ring behind @fd and check that its header describes a queue that
 * fits the mapping.  The fds pass to the queue on success only.
 */
int q_attach(struct tshm_ctx *ctx, int fd, int gfd, const int *sfd,
		    int efd, struct tshm_queue **out)
{
	struct tshm_queue *q;
	struct qhdr *hdr, geo;
	struct stat st;
	size_t need;
	void *map;
	int ret;

	/* The ring: a sealed memfd (it cannot shrink under us). */
	ret = memfd_check_sealed(fd, &st);
	if (ret < 0)
		return ret;
	if ((size_t)st.st_size < hdr_size() ||
	    (size_t)st.st_size > QUEUE_MAX_RING + hdr_size() + ctx->page_size)
		return -EBADMSG;
	map = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return -errno;
	hdr = map;
	/*
	 * Another process can change the header at any time: read it once
	 * into @geo, check that copy, and use only that copy from here on.
	 */
	memcpy(&geo, (const void *)hdr, offsetof(struct qhdr, lock));
	atomic_signal_fence(memory_order_seq_cst);
	need = hdr_size() + (size_t)geo.capacity * geo.slot_size;
	if (geo.magic != QUEUE_MAGIC || geo.version != QUEUE_VERSION ||
	    geo.capacity < 1 || geo.capacity > QUEUE_MAX_CAPACITY ||
	    geo.max_msg > QUEUE_MAX_MSG ||
	    geo.max_segs != TSHM_QUEUE_MAX_SEGS ||
	    geo.slot_size != slot_size_for(geo.max_msg) ||
	    geo.map_size != (uint64_t)st.st_size || need > (size_t)st.st_size) {
		munmap(map, st.st_size);
		return -EBADMSG;
	}
	if (ctx->ops->wire != geo.backend) {
		munmap(map, st.st_size);
		return -EXDEV;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		munmap(map, st.st_size);
		return -ENOMEM;
	}
	atomic_init(&q->refs, 1);
	q->ctx = ctx_get(ctx);
	q->hdr = hdr;
	q->slots = (unsigned char *)map + hdr_size();
	q->map_size = st.st_size;
	q->capacity = geo.capacity;
	q->slot_size = geo.slot_size;
	q->max_msg = geo.max_msg;
	q->fd = fd;
	q->gfd = gfd;
	q->sfd[0] = sfd[0];
	q->sfd[1] = sfd[1];
	q->efd = efd;
	q->wait = TSHM_WAIT_ADAPTIVE;
	q->spin_us = QUEUE_SPIN_US;
	pthread_mutex_lock(&ctx->qlock);
	q->ctx_next = ctx->queues;
	ctx->queues = q;
	pthread_mutex_unlock(&ctx->qlock);
	*out = q;
	return 0;
}

TSHM_EXPORT
int tshm_queue_create(struct tshm_ctx *ctx, unsigned capacity, size_t max_msg,
		      struct tshm_queue **out)
{
	int fd = -1, gfd = -1, sfd[2] = { -1, -1 }, efd = -1, ret;
	pthread_mutexattr_t attr;
	size_t slot_size, map_size;
	struct qhdr *hdr;

	if (!ctx || !out || capacity < 1 || capacity > QUEUE_MAX_CAPACITY ||
	    max_msg > QUEUE_MAX_MSG)
		return -EINVAL;
	slot_size = slot_size_for(max_msg);
	if ((size_t)capacity * slot_size > QUEUE_MAX_RING)
		return -E2BIG;
	map_size = ALIGN_UP(hdr_size() + capacity * slot_size, ctx->page_size);

	fd = memfd_create("tshm-queue", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, map_size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL))
		goto fail_errno;
	hdr = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (hdr == MAP_FAILED)
		goto fail_errno;
	hdr->magic = QUEUE_MAGIC;
	hdr->version = QUEUE_VERSION;
	hdr->backend = ctx->ops->wire;
	hdr->capacity = capacity;
	hdr->slot_size = slot_size;
	hdr->max_segs = TSHM_QUEUE_MAX_SEGS;
	hdr->max_msg = max_msg;
	hdr->map_size = map_size;
	pthread_mutexattr_init(&attr);
	pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
	ret = -pthread_mutex_init(&hdr->lock, &attr);
	pthread_mutexattr_destroy(&attr);
	munmap(hdr, map_size);
	if (ret < 0)
		goto fail;

	/* What carries the segments: the backend's. */
	ret = ctx->ops->q_open(&gfd, sfd);
	if (ret < 0)
		goto fail;
	efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (efd < 0)
		goto fail_errno;
	ret = q_attach(ctx, fd, gfd, sfd, efd, out);
	if (ret < 0)
		goto fail;
	return 0;
fail_errno:
	ret = -errno;
fail:
	q_close_fds(fd, gfd, sfd, efd);
	return ret;
}

TSHM_EXPORT
struct tshm_queue *tshm_queue_ref(struct tshm_queue *q)
{
	atomic_fetch_add_explicit(&q->refs, 1, memory_order_relaxed);
	return q;
}

TSHM_EXPORT
void tshm_queue_unref(struct tshm_queue *q)
{
	struct tshm_ctx *ctx;
	struct tshm_queue **pp;

	if (!q || atomic_fetch_sub_explicit(&q->refs, 1,
					    memory_order_acq_rel) != 1)
		return;
	ctx = q->ctx;
	pthread_mutex_lock(&ctx->qlock);
	for (pp = &ctx->queues; *pp; pp = &(*pp)->ctx_next) {
		if (*pp == q) {
			*pp = q->ctx_next;
			break;
		}
	}
	pthread_mutex_unlock(&ctx->qlock);
	munmap(q->hdr, q->map_size);
	q_close_fds(q->fd, q->gfd, q->sfd, q->efd);
	ctx_put(q->ctx);
	free(q);
}

