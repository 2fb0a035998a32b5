// SPDX-License-Identifier: GPL-2.0
/*
 * plant-trigger: the few calls that walk the paths the planted bugs of
 * tests/hardening/ break, each in the order lockdep needs to see both
 * sides of an inversion.  On a sound module it exits 0.
 *
 *   1. CREATE, mmap, close the fd, munmap: the holder's file goes with
 *      its last VMA and the segment is torn down (the planted UAF wakes
 *      its pollers after freeing it).
 *   2. CREATE again, GRANT, ATTACH (its size is written to user memory,
 *      which may fault: might_fault() tells lockdep about mmap_lock),
 *      DROP, GRANT by address (the planted inversion takes ctx->lock
 *      under mmap_lock there), close: the grant paths.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <linux/tshm.h>

static int fails;

static void check(int ok, const char *what)
{
	printf("# plant-trigger: %s: %s\n", what, ok ? "ok" : strerror(errno));
	fails += !ok;
}

static int create(int ctx, unsigned long long *id)
{
	struct tshm_create c = { .argsz = sizeof(c), .size = 1 << 16 };

	strcpy(c.name, "plant");
	if (ioctl(ctx, TSHM_IOC_CREATE, &c))
		return -1;
	*id = c.id;
	return c.fd;
}

int main(void)
{
	struct tshm_attach a = { .argsz = sizeof(a) };
	struct tshm_grant g = { .argsz = sizeof(g), .count = 2 };
	struct tshm_drop d = { .argsz = sizeof(d), .count = 1 };
	unsigned long long id;
	int ctx, fd, afd;
	char *p;

	ctx = open("/dev/tshm", O_RDWR | O_CLOEXEC);
	check(ctx >= 0, "open " "/dev/tshm");
	if (ctx < 0)
		return 1;

	fd = create(ctx, &id);
	check(fd >= 0, "create");
	p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	check(p != MAP_FAILED, "mmap");
	if (p != MAP_FAILED)
		memset(p, 0x5a, 1 << 16);
	check(!close(fd), "close with a mapping left");
	if (p != MAP_FAILED)
		check(!munmap(p, 1 << 16), "munmap: the last user goes");

	fd = create(ctx, &id);
	check(fd >= 0, "create again");
	g.seg_fd = fd;
	check(ioctl(ctx, TSHM_IOC_GRANT, &g) == 2, "grant 2");
	a.id = id;
	afd = ioctl(ctx, TSHM_IOC_ATTACH, &a);
	check(afd >= 0, "attach");
	d.id = id;
	check(!ioctl(ctx, TSHM_IOC_DROP, &d), "drop 1");
	/* Pass it on by the address of a mapping, with no fd. */
	p = mmap(NULL, 1 << 16, PROT_READ, MAP_SHARED, afd, 0);
	check(p != MAP_FAILED, "mmap the attached segment");
	g.flags = TSHM_GRANT_BY_ADDR;
	g.seg_fd = -1;
	g.count = 1;
	g.addr = (unsigned long)p;
	check(ioctl(ctx, TSHM_IOC_GRANT, &g) == 1, "grant by address");
	check(!ioctl(ctx, TSHM_IOC_DROP, &d), "drop it");
	if (p != MAP_FAILED)
		munmap(p, 1 << 16);
	check(!close(fd), "close the creator's fd");
	check(!close(afd), "close the attached fd: freed");
	check(!close(ctx), "close the context");
	printf("# plant-trigger: %s\n", fails ? "FAILED" : "done");
	return fails ? 1 : 0;
}
