// SPDX-License-Identifier: GPL-2.0
/*
 * kmod-bench: the cost of a tshm.ko segment against a memfd.
 *
 *   create+map   CREATE + mmap + munmap + close, per second, against
 *                memfd_create + ftruncate + mmap + munmap + close
 *   first touch  writing one byte per page of a fresh 1 GiB segment,
 *                with and without TSHM_CREATE_HUGE (and a memfd)
 *
 * Run it where /dev/tshm exists (scripts/vm-run --mem 3G -- ...); without
 * the module only the memfd rows are printed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <linux/tshm.h>

#define SMALL	(64 * 1024)
#define BIG	(1024UL * 1024 * 1024)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int tshm_seg(int ctx, uint64_t size, uint32_t flags)
{
	struct tshm_create c = { .argsz = sizeof(c), .size = size,
				 .flags = flags };

	strcpy(c.name, "bench");
	return ioctl(ctx, TSHM_IOC_CREATE, &c) ? -1 : c.fd;
}

static int memfd_seg(uint64_t size)
{
	int fd = memfd_create("bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0 || ftruncate(fd, size))
		return -1;
	return fd;
}

/* Segments created, mapped, unmapped and closed per second. */
static double churn(int ctx, double secs)
{
	double t0 = now(), t;
	unsigned long n = 0;
	void *p;
	int fd;

	do {
		for (int i = 0; i < 64; i++, n++) {
			fd = ctx >= 0 ? tshm_seg(ctx, SMALL, 0) : memfd_seg(SMALL);
			if (fd < 0) {
				perror("create");
				exit(1);
			}
			p = mmap(NULL, SMALL, PROT_READ | PROT_WRITE,
				 MAP_SHARED, fd, 0);
			if (p == MAP_FAILED) {
				perror("mmap");
				exit(1);
			}
			munmap(p, SMALL);
			close(fd);
		}
		t = now() - t0;
	} while (t < secs);
	return n / t;
}

/* Seconds to write the first byte of every page of a fresh segment. */
static double first_touch(int fd)
{
	long pg = sysconf(_SC_PAGESIZE);
	volatile char *p;
	double t0, t;

	p = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	t0 = now();
	for (unsigned long off = 0; off < BIG; off += pg)
		p[off] = 1;
	t = now() - t0;
	munmap((void *)p, BIG);
	close(fd);
	return t;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2.0;
	double tshm_rate = 0, memfd_rate;
	int ctx, fd;

	ctx = open("/dev/tshm", O_RDWR | O_CLOEXEC);
	if (ctx < 0)
		fprintf(stderr, "kmod-bench: %s: %s; memfd rows only\n",
			"/dev/tshm", strerror(errno));

	printf("%-44s %14s\n", "benchmark", "result");
	memfd_rate = churn(-1, secs);
	printf("%-44s %10.0f /s\n", "memfd_create+ftruncate+mmap+munmap+close",
	       memfd_rate);
	if (ctx >= 0) {
		tshm_rate = churn(ctx, secs);
		printf("%-44s %10.0f /s\n", "tshm CREATE+mmap+munmap+close",
		       tshm_rate);
		printf("%-44s %12.2f x\n", "ratio tshm/memfd",
		       tshm_rate / memfd_rate);
	}

	fd = memfd_seg(BIG);
	printf("%-44s %12.3f s\n", "first touch 1 GiB, memfd", first_touch(fd));
	if (ctx >= 0) {
		fd = tshm_seg(ctx, BIG, 0);
		printf("%-44s %12.3f s\n", "first touch 1 GiB, tshm",
		       fd < 0 ? -1.0 : first_touch(fd));
		fd = tshm_seg(ctx, BIG, TSHM_CREATE_HUGE);
		if (fd < 0)
			printf("%-44s %14s\n", "first touch 1 GiB, tshm HUGE",
			       strerror(errno));
		else
			printf("%-44s %12.3f s\n", "first touch 1 GiB, tshm HUGE",
			       first_touch(fd));
	}
	return 0;
}
