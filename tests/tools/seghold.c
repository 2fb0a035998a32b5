// SPDX-License-Identifier: GPL-2.0
/*
 * seghold: holds tshm segments in known ways for tshmctl's tests, through
 * the raw UAPI, and waits to be killed.
 *
 *   seghold fd NAME SIZE [NAME SIZE...]  segment fds kept open (first page
 *                                        written, so resident > 0)
 *   seghold pair NAME SIZE   this process keeps the fd only; a child
 *                            attaches by grant, maps it and closes every
 *                            fd: two holders, one by fd, one by mapping
 *   seghold map NAME SIZE    only a mapping holds it (fds and context
 *                            closed)
 *
 * SEGHOLD_FILL=1 writes every page instead of the first.
 *
 * Prints "ready pid=P mappid=Q id=I [id=J...]" once everything is in
 * place, then sleeps; the child dies with its parent.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <linux/tshm.h>

static void die(const char *what)
{
	fprintf(stderr, "seghold: %s: %s\n", what, strerror(errno));
	exit(1);
}

static int create(int ctx, const char *name, uint64_t size, uint64_t *id)
{
	struct tshm_create c = { .argsz = sizeof(c), .size = size };

	snprintf(c.name, sizeof(c.name), "%s", name);
	if (ioctl(ctx, TSHM_IOC_CREATE, &c))
		die("TSHM_IOC_CREATE");
	*id = c.id;
	return c.fd;
}

static void *map(int fd, uint64_t size)
{
	char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		die("mmap");
	/* SEGHOLD_FILL=1: every page resident, not just the first. */
	memset(p, 0x5a, getenv("SEGHOLD_FILL") && *getenv("SEGHOLD_FILL") ? size : 4096);
	return p;
}

int main(int argc, char **argv)
{
	uint64_t ids[16];
	int ctx, fd = -1, n = 0, i, p[2];
	pid_t child = 0;
	char c;

	if (argc < 4 || (argc - 2) % 2 || argc - 2 > 32) {
		fprintf(stderr, "usage: seghold fd|pair|map NAME SIZE [NAME SIZE...]\n");
		return 2;
	}
	ctx = open("/dev/tshm", O_RDWR | O_CLOEXEC);
	if (ctx < 0)
		die("/dev/tshm");
	if (!strcmp(argv[1], "fd")) {
		for (i = 2; i + 1 < argc; i += 2, n++) {
			uint64_t size = strtoull(argv[i + 1], NULL, 0);

			fd = create(ctx, argv[i], size, &ids[n]);
			munmap(map(fd, size), size);
		}
	} else if (!strcmp(argv[1], "pair")) {
		uint64_t size = strtoull(argv[3], NULL, 0);
		struct tshm_grant g = { .argsz = sizeof(g), .count = 1 };

		fd = create(ctx, argv[2], size, &ids[n++]);
		g.seg_fd = fd;
		if (ioctl(ctx, TSHM_IOC_GRANT, &g) < 0)
			die("TSHM_IOC_GRANT");
		if (pipe(p))
			die("pipe");
		child = fork();
		if (child < 0)
			die("fork");
		if (!child) {
			struct tshm_attach a = { .argsz = sizeof(a), .id = ids[0] };
			int afd;

			prctl(PR_SET_PDEATHSIG, SIGKILL);
			close(fd);
			afd = ioctl(ctx, TSHM_IOC_ATTACH, &a);
			if (afd < 0)
				die("TSHM_IOC_ATTACH");
			map(afd, size);
			close(afd);
			close(ctx);
			close(p[0]);
			if (write(p[1], "x", 1) != 1)
				die("write");
			close(p[1]);
			for (;;)
				pause();
		}
		close(p[1]);
		if (read(p[0], &c, 1) != 1)
			die("child failed");
		close(p[0]);
	} else if (!strcmp(argv[1], "map")) {
		uint64_t size = strtoull(argv[3], NULL, 0);

		fd = create(ctx, argv[2], size, &ids[n++]);
		map(fd, size);
		close(fd);
		close(ctx);
	} else {
		fprintf(stderr, "seghold: unknown mode %s\n", argv[1]);
		return 2;
	}
	printf("ready pid=%d mappid=%d", getpid(), child);
	for (i = 0; i < n; i++)
		printf(" id=%" PRIu64, ids[i]);
	printf("\n");
	fflush(stdout);
	for (;;)
		pause();
}
