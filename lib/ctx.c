// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * ctx.c - contexts, backend choice, error strings, the thread's -EINTR
 * choice.  The backend is picked here, once per context; everything else
 * goes through ctx->ops.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tshm-private.h"

TSHM_EXPORT
int tshm_thread_set_intr(int on)
{
	return intr_set(on);
}

TSHM_EXPORT
const char *tshm_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "success";
	case EPIPE:
		return "queue closed (and drained)";
	case EMSGSIZE:
		return "message larger than the queue's max_msg or the buffer";
	case E2BIG:
		return "too many segments for one message";
	case ENOBUFS:
		return "not enough room for the message's segments";
	case EBADMSG:
		return "corrupted queue slot, foreign queue or malformed handle";
	case EXDEV:
		return "object belongs to the other backend";
	case ENODEV:
		return "tshm module not loaded (/dev/tshm missing)";
	case EOPNOTSUPP:
		return "not supported by this backend";
	case ETIMEDOUT:
		return "timed out";
	case EAGAIN:
		return "would block";
	case EINTR:
		return "interrupted by a signal (tshm_thread_set_intr)";
	case ENOTRECOVERABLE:
		return "queue lock not recoverable";
	case ENOENT:
		return "no such segment or no grant for it in this context";
	default:
		return strerror(err);
	}
}

/*
 * Before fork(): the context's locks and the lease lock of every segment
 * in its cache (every segment object of the context is there until it is
 * destroyed), in the order the library nests them.
 */
static void ctx_fork_prepare(struct fork_node *n)
{
	struct tshm_ctx *ctx = container_of(n, struct tshm_ctx, fork);
	struct tshm_seg *seg;
	unsigned b;

	pthread_mutex_lock(&ctx->lock);
	pthread_mutex_lock(&ctx->qlock);
	for (b = 0; b < TSHM_CACHE_BUCKETS; b++)
		for (seg = ctx->cache[b]; seg; seg = seg->hnext)
			pthread_mutex_lock(&seg->lease_lock);
}

static void ctx_fork_release(struct fork_node *n, bool child)
{
	struct tshm_ctx *ctx = container_of(n, struct tshm_ctx, fork);
	struct tshm_seg *seg;
	unsigned b;

	for (b = 0; b < TSHM_CACHE_BUCKETS; b++) {
		for (seg = ctx->cache[b]; seg; seg = seg->hnext) {
			if (child)
				pthread_mutex_init(&seg->lease_lock, NULL);
			else
				pthread_mutex_unlock(&seg->lease_lock);
		}
	}
	if (child) {
		pthread_mutex_init(&ctx->qlock, NULL);
		pthread_mutex_init(&ctx->lock, NULL);
	} else {
		pthread_mutex_unlock(&ctx->qlock);
		pthread_mutex_unlock(&ctx->lock);
	}
}

static int ctx_new(int fd, const struct backend_ops *ops,
		   struct tshm_ctx **out)
{
	struct tshm_ctx *ctx = calloc(1, sizeof(*ctx));
	int ret;

	if (!ctx)
		return -ENOMEM;
	ctx->fd = fd;
	ctx->ops = ops;
	ret = ops->ctx_init ? ops->ctx_init(ctx) : 0;
	if (ret < 0) {
		free(ctx);
		return ret;
	}
	ctx->mark = mmap(NULL, sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ctx->mark == MAP_FAILED) {
		free(ctx);
		return -ENOMEM;
	}
	madvise((void *)ctx->mark, sysconf(_SC_PAGESIZE), MADV_WIPEONFORK);
	atomic_init(ctx->mark, 1);
	ctx->gen_base = 1;
	atomic_init(&ctx->refs, 1);
	ctx->page_size = sysconf(_SC_PAGESIZE);
	pthread_mutex_init(&ctx->lock, NULL);
	pthread_mutex_init(&ctx->qlock, NULL);
	ctx->fork.prepare = ctx_fork_prepare;
	ctx->fork.release = ctx_fork_release;
	fork_register(&ctx->fork, FORK_CTX);
	*out = ctx;
	return 0;
}

static unsigned backend_from_env(void)
{
	const char *env = getenv("TSHM_BACKEND");

	if (!env || !*env)
		return 0;
	if (!strcmp(env, "memfd"))
		return TSHM_CTX_MEMFD;
	if (!strcmp(env, "kmod"))
		return TSHM_CTX_KMOD;
	return ~0U;
}

TSHM_EXPORT
int tshm_ctx_open(struct tshm_ctx **out, unsigned flags)
{
	const struct backend_ops *ops;
	int fd, ret;

	if (!out || (flags & ~(TSHM_CTX_MEMFD | TSHM_CTX_KMOD)) ||
	    (flags & TSHM_CTX_MEMFD && flags & TSHM_CTX_KMOD))
		return -EINVAL;
	if (!flags) {
		flags = backend_from_env();
		if (flags == ~0U)
			return -EINVAL;
	}

	fd = -ENODEV;
	ops = &kmod_ops;
	if (!(flags & TSHM_CTX_MEMFD)) {
		fd = ops->ctx_open();
		if (fd < 0 && (flags & TSHM_CTX_KMOD))
			return fd == -ENOENT ? -ENODEV : fd;
	}
	if (fd < 0) {
		/* No module (or not wanted): the fallback. */
		ops = &memfd_ops;
		fd = ops->ctx_open();
		if (fd < 0)
			return fd;
	}
	ret = ctx_new(fd, ops, out);
	if (ret < 0)
		close(fd);
	return ret;
}

TSHM_EXPORT
int tshm_ctx_open_fd(int fd, unsigned flags, struct tshm_ctx **out)
{
	const struct backend_ops *ops;
	int nfd, ret;

	if (!out || fd < 0 || (flags & ~(TSHM_CTX_MEMFD | TSHM_CTX_KMOD)))
		return -EINVAL;
	/* Whichever backend recognizes the fd, if the caller allows it. */
	ops = &kmod_ops;
	ret = ops->is_ctx_fd(fd);
	if (ret < 0)
		return ret;
	if (ret && (flags & TSHM_CTX_MEMFD))
		return -EINVAL;
	if (!ret) {
		ops = &memfd_ops;
		ret = ops->is_ctx_fd(fd);
		if (ret < 0)
			return ret;
		if (!ret || (flags & TSHM_CTX_KMOD))
			return -EINVAL;
	}
	nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (nfd < 0)
		return -errno;
	ret = ctx_new(nfd, ops, out);
	if (ret < 0)
		close(nfd);
	return ret;
}

uint64_t ctx_gen(struct tshm_ctx *ctx)
{
	uint64_t gen = atomic_load_explicit(ctx->mark, memory_order_relaxed);

	if (likely(gen))
		return gen;
	/* First use in a forked child: a generation of its own. */
	gen = 0;
	atomic_compare_exchange_strong(ctx->mark, &gen, ctx->gen_base + 1);
	gen = atomic_load(ctx->mark);
	ctx->gen_base = gen;
	return gen;
}

void ctx_flush_drops(struct tshm_ctx *ctx)
{
	if (ctx->ops->ctx_idle)
		ctx->ops->ctx_idle(ctx);
}

struct tshm_ctx *ctx_get(struct tshm_ctx *ctx)
{
	atomic_fetch_add_explicit(&ctx->refs, 1, memory_order_relaxed);
	return ctx;
}

void ctx_put(struct tshm_ctx *ctx)
{
	if (atomic_fetch_sub_explicit(&ctx->refs, 1, memory_order_acq_rel) != 1)
		return;
	fork_unregister(&ctx->fork);
	close(ctx->fd);
	munmap((void *)ctx->mark, sysconf(_SC_PAGESIZE));
	pthread_mutex_destroy(&ctx->lock);
	pthread_mutex_destroy(&ctx->qlock);
	free(ctx);
}

TSHM_EXPORT
void tshm_ctx_close(struct tshm_ctx *ctx)
{
	if (ctx)
		ctx_put(ctx);
}

TSHM_EXPORT
const char *tshm_ctx_backend(const struct tshm_ctx *ctx)
{
	return ctx->ops->name;
}

TSHM_EXPORT
int tshm_ctx_fd(const struct tshm_ctx *ctx)
{
	return ctx->fd;
}
