// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * kmod.c - the module backend: its operations table, and thin wrappers
 * around the /dev/tshm ioctls (kmod/include/uapi/linux/tshm.h).  Segments
 * are in kmod-seg.c, segments through a queue in kmod-queue.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/tshm.h>

#include "kmod.h"

/* The module's misc device; udev names it after the module. */
#define KMOD_DEVICE	"/dev/tshm"

int kmod_open(void)
{
	int fd = open(KMOD_DEVICE, O_RDWR | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

/* 1 when @fd is an open of /dev/tshm. */
int kmod_is_ctx_fd(int fd)
{
	struct stat st, dev;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISCHR(st.st_mode) || stat(KMOD_DEVICE, &dev) < 0)
		return 0;
	return st.st_rdev == dev.st_rdev;
}

static int xioctl(int fd, unsigned long req, void *arg)
{
	int ret;

	do {
		ret = ioctl(fd, req, arg);
	} while (ret < 0 && errno == EINTR);
	return ret < 0 ? -errno : ret;
}

int kmod_seg_create(struct tshm_ctx *ctx, size_t size, const char *name,
		    unsigned flags, int *fd, uint64_t *id, size_t *mapsize)
{
	struct tshm_create c = { .argsz = sizeof(c) };
	int ret;

	if (flags & TSHM_SEG_HUGE)
		c.flags |= TSHM_CREATE_HUGE;
	if (flags & TSHM_SEG_PREFAULT)
		c.flags |= TSHM_CREATE_PREFAULT;
	c.size = size;
	if (name)
		strncpy(c.name, name, sizeof(c.name) - 1);
	ret = xioctl(ctx->fd, TSHM_IOC_CREATE, &c);
	if (ret < 0)
		return ret;
	*fd = c.fd;
	*id = c.id;
	*mapsize = ALIGN_UP(size, ctx->page_size);
	if (flags & TSHM_SEG_HUGE) {
		struct tshm_info info = { .argsz = sizeof(info) };

		ret = xioctl(c.fd, TSHM_IOC_INFO, &info);
		if (ret < 0) {
			close(c.fd);
			return ret;
		}
		*mapsize = info.size;
	}
	return 0;
}

/* GRANT is issued on the receiving context, naming the segment by fd. */
int kmod_grant(int seg_fd, int ctx_fd, int count)
{
	struct tshm_grant g = {
		.argsz = sizeof(g), .seg_fd = seg_fd, .count = count,
	};

	if (count <= 0)
		return -EINVAL;
	int ret = xioctl(ctx_fd, TSHM_IOC_GRANT, &g);

	return ret < 0 ? ret : 0;
}

/*
 * GRANT of the segment this process maps at @addr: no fd needed, so a
 * received segment kept only mapped can be passed on.
 */
int kmod_grant_addr(const void *addr, int ctx_fd, int count)
{
	struct tshm_grant g = {
		.argsz = sizeof(g), .flags = TSHM_GRANT_BY_ADDR, .seg_fd = -1,
		.count = count, .addr = (uintptr_t)addr,
	};

	if (count <= 0)
		return -EINVAL;
	int ret = xioctl(ctx_fd, TSHM_IOC_GRANT, &g);

	return ret < 0 ? ret : 0;
}

int kmod_attach(int ctx_fd, uint64_t id, int *fd, size_t *size)
{
	struct tshm_attach a = { .argsz = sizeof(a), .id = id };
	int ret;

	ret = xioctl(ctx_fd, TSHM_IOC_ATTACH, &a);
	if (ret < 0)
		return ret;
	*fd = ret;
	*size = a.size;
	return 0;
}

int kmod_drop(int ctx_fd, uint64_t id, int count)
{
	struct tshm_drop d = { .argsz = sizeof(d), .id = id, .count = count };

	if (count <= 0)
		return -EINVAL;
	return xioctl(ctx_fd, TSHM_IOC_DROP, &d);
}

/* The name a segment was created with, read from the module. */
void kmod_seg_name(int seg_fd, char *name, size_t len)
{
	struct tshm_info info = { .argsz = sizeof(info) };

	name[0] = '\0';
	if (xioctl(seg_fd, TSHM_IOC_INFO, &info) < 0)
		return;
	info.name[sizeof(info.name) - 1] = '\0';
	strncpy(name, info.name, len - 1);
	name[len - 1] = '\0';
}

const struct backend_ops kmod_ops = {
	.name			= "kmod",
	.wire			= TSHM_BACKEND_KMOD,
	.ctx_open		= kmod_open,
	.is_ctx_fd		= kmod_is_ctx_fd,
	.ctx_idle		= kmod_ctx_idle,
	.seg_create		= kmod_seg_create,
	.seg_name		= kmod_seg_name,
	.seg_adopted		= kmod_seg_adopted,
	.seg_destroy		= kmod_seg_destroy,
	.seg_released_now	= kmod_seg_released_now,
	.seg_release_pollfds	= kmod_seg_release_pollfds,
	.seg_export		= kmod_seg_export,
	.seg_import		= kmod_seg_import,
	.seg_send_fd		= kmod_seg_send_fd,
	.seg_wire_fds		= 1,	/* a transfer context */
	.seg_recv_fd		= kmod_seg_recv_fd,
	.q_open			= kmod_q_open,
	.q_fds			= kmod_q_fds,
	.q_check_fds		= kmod_q_check_fds,
	.q_send_segs		= kmod_q_send_segs,
	.q_send_undo		= kmod_q_send_undo,
	.q_recv_take		= kmod_q_recv_take,
	.q_recv_undo		= kmod_q_recv_undo,
	.q_recv_commit		= kmod_q_recv_commit,
	.q_recv_finish		= kmod_q_recv_finish,
};
