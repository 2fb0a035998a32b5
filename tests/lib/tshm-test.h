/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers for the libtshm suites.  Every suite runs on whichever backend
 * the library picks (TSHM_BACKEND=memfd|kmod forces one) and says which.
 */
#ifndef _TSHM_TEST_H
#define _TSHM_TEST_H

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tshm.h>

#include "kselftest_harness.h"

static inline uint64_t fnv1a(const void *p, size_t n)
{
	const unsigned char *c = p;
	uint64_t h = 0xcbf29ce484222325ULL;

	while (n--)
		h = (h ^ *c++) * 0x100000001b3ULL;
	return h;
}

/* Deterministic fill so receivers can check what they got. */
static inline void fill_pattern(void *p, size_t n, uint64_t seed)
{
	uint64_t *w = p, x = seed * 0x9e3779b97f4a7c15ULL + 1;
	size_t i;

	for (i = 0; i < n / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		w[i] = x;
	}
	memset((char *)p + (n & ~7UL), (int)seed, n & 7);
}

/* The highest fd number open in this process. */
static inline int highest_fd(void)
{
	struct dirent *d;
	DIR *dir = opendir("/proc/self/fd");
	int max = -1, fd;

	if (!dir)
		return -1;
	while ((d = readdir(dir))) {
		fd = atoi(d->d_name);
		if (d->d_name[0] != '.' && fd > max)
			max = fd;
	}
	closedir(dir);
	return max;	/* the DIR's own fd included: one more than needed */
}

/*
 * Leave this process no fd number to open: RLIMIT_NOFILE down to what is
 * open, every free number below it taken.  fds_unsqueeze() undoes it.
 */
struct fd_squeeze {
	struct rlimit old;
	int fill[4096];
	int n;
};

static inline int fds_squeeze(struct fd_squeeze *s)
{
	struct rlimit low;

	s->n = 0;
	if (getrlimit(RLIMIT_NOFILE, &s->old))
		return -1;
	low = s->old;
	low.rlim_cur = highest_fd() + 1;
	if (setrlimit(RLIMIT_NOFILE, &low))
		return -1;
	while (s->n < 4096 &&
	       (s->fill[s->n] = open("/dev/null", O_RDONLY)) >= 0)
		s->n++;
	return 0;
}

/* Give back @n of the numbers taken (all when @n is larger). */
static inline void fds_give(struct fd_squeeze *s, int n)
{
	while (s->n && n--)
		close(s->fill[--s->n]);
}

static inline int fds_unsqueeze(struct fd_squeeze *s)
{
	fds_give(s, s->n);
	return setrlimit(RLIMIT_NOFILE, &s->old);
}

/* Open segment memfds of this process ("/memfd:tshm:..."). */
static inline int count_seg_memfds(void)
{
	char path[300], link[256];
	struct dirent *d;
	DIR *dir = opendir("/proc/self/fd");
	int n = 0;
	ssize_t len;

	if (!dir)
		return -1;
	while ((d = readdir(dir))) {
		snprintf(path, sizeof(path), "/proc/self/fd/%s", d->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len <= 0)
			continue;
		link[len] = '\0';
		if (!strncmp(link, "/memfd:tshm:", 12))
			n++;
	}
	closedir(dir);
	return n;
}

/* Open fds of this process. */
static inline int count_fds(void)
{
	struct dirent *d;
	DIR *dir = opendir("/proc/self/fd");
	int n = 0;

	if (!dir)
		return -1;
	while ((d = readdir(dir)))
		if (d->d_name[0] != '.')
			n++;
	closedir(dir);
	return n - 1;	/* the DIR's own fd */
}

/*
 * Live segments in /proc/tshm (module backend): lines whose first field is
 * a number.  -1 when the file does not exist.
 */
static inline int count_proc_tshm(void)
{
	FILE *f = fopen("/proc/tshm", "r");
	char line[512];
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		const char *p = line;

		while (*p == ' ')
			p++;
		if (*p >= '0' && *p <= '9')
			n++;
	}
	fclose(f);
	return n;
}

static inline bool is_kmod(struct tshm_ctx *ctx)
{
	return !strcmp(tshm_ctx_backend(ctx), "kmod");
}

/* Wait for a child; 0 when it exited with status 0. */
static inline int wait_ok(pid_t pid)
{
	int status;

	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : status;
}

static inline void print_backend(void)
{
	struct tshm_ctx *ctx;
	int ret = tshm_ctx_open(&ctx, 0);

	if (ret < 0) {
		printf("# tshm backend: none (%s)\n", tshm_strerror(ret));
		return;
	}
	printf("# tshm backend: %s\n", tshm_ctx_backend(ctx));
	fflush(stdout);
	tshm_ctx_close(ctx);
}

/*
 * main(): say which backend, then run the harness; argv[1] == "--child"
 * runs @child instead (for tests that exec this binary again).
 */
#define TSHM_TEST_MAIN(child) \
	static void __attribute__((constructor)) \
	__constructor_order_last(void) \
	{ \
		if (!__constructor_order) \
			__constructor_order = _CONSTRUCTOR_ORDER_BACKWARD; \
	} \
	int main(int argc, char **argv) \
	{ \
		int (*fn)(int, char **) = child; \
		if (fn && argc > 1 && !strcmp(argv[1], "--child")) \
			return fn(argc, argv); \
		print_backend(); \
		return test_harness_run(argc, argv); \
	}

#endif /* _TSHM_TEST_H */
