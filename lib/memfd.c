// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * memfd.c - the fallback backend: sealed memfds.  The lease sockets that
 * stand in for the module's holder counting live in seg.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tshm-private.h"

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

int memfd_seg_id(int fd, uint64_t *id, size_t *size)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	*id = st.st_ino;
	*size = st.st_size;
	return 0;
}

int memfd_check_sealed(int fd, struct stat *st)
{
	int seals;

	if (fstat(fd, st) < 0)
		return -errno;
	if (!S_ISREG(st->st_mode))
		return -EBADMSG;
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 ||
	    (seals & (F_SEAL_GROW | F_SEAL_SHRINK)) !=
	    (F_SEAL_GROW | F_SEAL_SHRINK))
		return -EBADMSG;
	return 0;
}

/*
 * A received segment fd must be what memfd_seg_create() makes: a memfd on
 * the same internal shmem mount as the context's own (so the inode number
 * names it: the cache key), sealed against shrinking (a sender that could
 * shrink it would make the receiver take SIGBUS) and growing.
 */
int memfd_seg_check(struct tshm_ctx *ctx, int fd, uint64_t *id, size_t *size)
{
	struct stat st;
	int ret = memfd_check_sealed(fd, &st);

	if (ret < 0)
		return ret;
	if (st.st_dev != ctx->memfd_dev || st.st_size <= 0)
		return -EBADMSG;
	*id = st.st_ino;
	*size = st.st_size;
	return 0;
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
