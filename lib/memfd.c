// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * memfd.c - the fallback backend: its operations table and sealed memfds.
 * The lease sockets that stand in for the module's holder count are in
 * memfd-lease.c, segments through a queue in memfd-queue.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memfd.h"

#define MEMFD_CTX_NAME	"tshm-ctx"

int memfd_ctx_open(void)
{
	int fd = memfd_create(MEMFD_CTX_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0)
		return -errno;
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_GROW | F_SEAL_SHRINK |
		  F_SEAL_WRITE) < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	return fd;
}

/* 1 when @fd is a fallback context: an empty memfd sealed like ours. */
int memfd_is_ctx_fd(int fd)
{
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0)
		return 0;
	if (fstat(fd, &st) < 0)
		return -errno;
	return st.st_size == 0 && (seals & F_SEAL_WRITE);
}

static int memfd_seg_id(int fd, uint64_t *id, size_t *size)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	*id = st.st_ino;
	*size = st.st_size;
	return 0;
}

/* @st: the fd's fstat(), read by the caller. */
static int memfd_check_seals(int fd, const struct stat *st)
{
	int seals;

	if (!S_ISREG(st->st_mode))
		return -EBADMSG;
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 ||
	    (seals & (F_SEAL_GROW | F_SEAL_SHRINK)) !=
	    (F_SEAL_GROW | F_SEAL_SHRINK))
		return -EBADMSG;
	return 0;
}

int memfd_check_sealed(int fd, struct stat *st)
{
	if (fstat(fd, st) < 0)
		return -errno;
	return memfd_check_seals(fd, st);
}

/*
 * A received segment fd must be what memfd_seg_create() makes: a memfd on
 * the same internal shmem mount as the context's own (so the inode number
 * names it: the cache key), sealed against shrinking (a sender that could
 * shrink it would make the receiver take SIGBUS) and growing.  @st: its
 * fstat(), read by the caller.
 */
int memfd_seg_check(struct tshm_ctx *ctx, int fd, const struct stat *st)
{
	int ret = memfd_check_seals(fd, st);

	if (ret < 0)
		return ret;
	if (st->st_dev != ctx->memfd_dev || st->st_size <= 0)
		return -EBADMSG;
	return 0;
}

int memfd_seg_create(struct tshm_ctx *ctx, size_t size, const char *name,
		     unsigned flags, int *out_fd, uint64_t *id, size_t *mapsize)
{
	char tag[8 + TSHM_SEG_NAME_MAX + 1];
	size_t sz = ALIGN_UP(size, ctx->page_size);
	size_t dummy;
	int fd, ret;

	snprintf(tag, sizeof(tag), "tshm:%s", name ? name : "");
	fd = memfd_create(tag, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, sz) < 0)
		goto fail;
	/* Receivers can never see it shrink (no SIGBUS) or grow. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
		goto fail;
	if ((flags & TSHM_SEG_PREFAULT) &&
	    fallocate(fd, 0, 0, sz) < 0 && errno != EOPNOTSUPP)
		goto fail;
	ret = memfd_seg_id(fd, id, &dummy);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	*out_fd = fd;
	*mapsize = sz;
	return 0;
fail:
	ret = -errno;
	close(fd);
	return ret;
}

/* The name given at creation, from the memfd's name ("memfd:tshm:NAME"). */
void memfd_seg_name(int fd, char *name, size_t len)
{
	char path[32], link[64 + TSHM_SEG_NAME_MAX];
	const char *p;
	ssize_t n;
	size_t k;

	name[0] = '\0';
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

/* Where memfds live: received segments must live there too. */
static int memfd_ctx_init(struct tshm_ctx *ctx)
{
	struct stat st;

	if (fstat(ctx->fd, &st) < 0)
		return -errno;
	ctx->memfd_dev = st.st_dev;
	return 0;
}

/*
 * A new queue key for @seg (memfd-queue.c), drawn when it is made and
 * again whenever its creator finds itself the sole holder, so that a key
 * names the segment only while the processes it was disclosed to may
 * hold it.  Without entropy (early boot) no key: every receiver then
 * installs the fds that come with the segment, as before keys.
 */
void memfd_qkey_draw(struct tshm_seg *seg)
{
	uint64_t key = 0;

	if (getrandom(&key, sizeof(key), GRND_NONBLOCK) != sizeof(key))
		key = 0;
	atomic_store(&seg->qkey, key);
}

static void memfd_seg_created(struct tshm_seg *seg, unsigned flags)
{
	memfd_qkey_draw(seg);
	if (flags & TSHM_SEG_HUGE)
		madvise(seg->data, seg->size, MADV_HUGEPAGE);
}

static int memfd_seg_export(struct tshm_seg *seg, struct tshm_handle *h)
{
	return -EOPNOTSUPP;	/* a memfd travels only as an fd */
}

static int memfd_seg_import(struct tshm_ctx *ctx, const struct tshm_handle *h,
			    struct tshm_seg **out)
{
	return -EOPNOTSUPP;
}

const struct backend_ops memfd_ops = {
	.name			= "memfd",
	.wire			= TSHM_BACKEND_MEMFD,
	.ctx_open		= memfd_ctx_open,
	.is_ctx_fd		= memfd_is_ctx_fd,
	.ctx_init		= memfd_ctx_init,
	.seg_create		= memfd_seg_create,
	.seg_created		= memfd_seg_created,
	.seg_name		= memfd_seg_name,
	.seg_name_lazy		= true,	/* readlink(), 3 us a receive */
	.seg_destroy		= memfd_seg_destroy,
	.seg_released_now	= memfd_seg_released_now,
	.seg_release_pollfds	= memfd_seg_release_pollfds,
	.seg_export		= memfd_seg_export,
	.seg_import		= memfd_seg_import,
	.seg_send_fd		= memfd_seg_send_fd,
	.seg_wire_fds		= 2,	/* the memfd, a lease peer */
	.seg_recv_fd		= memfd_seg_recv_fd,
	.q_open			= memfd_q_open,
	.q_fds			= memfd_q_fds,
	.q_check_fds		= memfd_q_check_fds,
	.q_ordered		= true,
	.q_send_segs		= memfd_q_send_segs,
	.q_recv_take		= memfd_q_recv_take,
	.q_recv_undo		= memfd_q_recv_undo,
	.q_recv_finish		= memfd_q_recv_finish,
};
