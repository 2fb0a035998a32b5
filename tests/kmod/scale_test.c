// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko at scale: TSHM_SCALE_SEGS (default 100,000) live segments, a
 * process mapping and unmapping one of them in a loop, with and without
 * another process reading /proc/tshm in a loop.  Reports munmap latency
 * (each munmap drops a holder: the module's release runs in it) for both
 * runs; checks only correctness (every line listed, nothing left after),
 * never a timing.  Issue 16, finding 5: the reader must not hold a lock
 * that munmap needs.
 */
#include <signal.h>
#include <time.h>
#include "kselftest_harness.h"
#include "tshm_test.h"

#define PARAM	"/sys/module/tshm/parameters/max_user_segments"
#define ROUNDS	2000
#define ROUNDS_MAX	(20 * ROUNDS)
#define READER_PASSES	3

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* A reader that reads all of /proc/tshm again and again; counts passes. */
static void reader(volatile uint64_t *passes)
{
	char buf[65536];
	int fd;

	for (;;) {
		fd = open("/proc/tshm", O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			_exit(1);
		while (read(fd, buf, sizeof(buf)) > 0)
			;
		close(fd);
		__atomic_add_fetch(passes, 1, __ATOMIC_RELAXED);
	}
}

/*
 * @rounds times: attach segment @id (a grant waits in @ctx), map it, close
 * the fd, grant it back by address, then time the munmap that drops the
 * holder.  Fills @lat (microseconds); 0 or -errno.
 */
static int map_unmap_loop(int ctx, uint64_t id, double *lat, int rounds)
{
	const long pg = sysconf(_SC_PAGESIZE);
	double t0;
	char *p;
	int i, fd, err;

	for (i = 0; i < rounds; i++) {
		fd = tt_attach(ctx, id, 0, NULL);
		if (fd < 0)
			return fd;
		p = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (p == MAP_FAILED)
			return -errno;
		p[0] = i;
		err = tt_grant_addr(p, ctx, 1, 0, NULL);
		if (err)
			return err;
		t0 = now_us();
		if (munmap(p, pg))
			return -errno;
		lat[i] = now_us() - t0;
	}
	return 0;
}

static void report(const char *what, double *lat, int n)
{
	qsort(lat, n, sizeof(*lat), cmp_double);
	printf("# munmap %s: median %.1f us, p99 %.1f us, max %.1f us (%d rounds)\n",
	       what, lat[n / 2], lat[n * 99 / 100], lat[n - 1], n);
	/* The harness runs us in a child that ends with _exit(). */
	fflush(stdout);
}

FIXTURE(scale) {
	int unused;
};

FIXTURE_SETUP(scale)
{
}

FIXTURE_TEARDOWN(scale)
{
}

/* Minutes under emulation; the debug kernel runs fewer (check). */
TEST_F_TIMEOUT(scale, munmap_with_proc_reader_at_100k_segments, 900)
{
	const char *env = getenv("TSHM_SCALE_SEGS");
	long nsegs = env ? atol(env) : 100000;
	static double lat[ROUNDS_MAX];
	volatile uint64_t *passes;
	long long old_max;
	char oldbuf[32];
	uint64_t id = 0, mid = 0;
	double t0, t_create;
	pid_t rd;
	int ctx, fd, i, st, n, done;

	TT_NEED_MODULE();
	if (geteuid())
		SKIP(return, "needs root (raises max_user_segments)");
	old_max = tt_read_ll(PARAM);
	ASSERT_LE(0, old_max);
	ASSERT_EQ(0, tt_write_file(PARAM, "0"));
	ctx = tt_open();
	ASSERT_LE(0, ctx);

	/* nsegs segments kept alive by one grant each, no fd, no mapping. */
	t0 = now_us();
	for (i = 0; i < nsegs; i++) {
		fd = tt_create(ctx, 4096, 0, "scale", &id);
		ASSERT_LE(0, fd) TH_LOG("segment %d: %s", i, strerror(-fd));
		ASSERT_EQ(0, tt_grant(fd, ctx, 1, NULL));
		close(fd);
	}
	t_create = now_us() - t0;
	/* The one the loop maps and unmaps. */
	fd = tt_create(ctx, 4096, 0, "scale-mapped", &mid);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_grant(fd, ctx, 1, NULL));
	close(fd);

	t0 = now_us();
	n = tt_proc_count();
	printf("# %ld segments created in %.1f s; one read of /proc/tshm: %d lines in %.2f s\n",
	       nsegs, t_create / 1e6, n, (now_us() - t0) / 1e6);
	fflush(stdout);
	EXPECT_EQ(nsegs + 1, n);

	ASSERT_EQ(0, map_unmap_loop(ctx, mid, lat, ROUNDS));
	report("without reader", lat, ROUNDS);

	passes = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, passes);
	rd = fork();
	ASSERT_LE(0, rd);
	if (!rd)
		reader(passes);
	/* Let the reader get going. */
	while (!__atomic_load_n(passes, __ATOMIC_RELAXED) && !waitpid(rd, &st, WNOHANG))
		usleep(1000);
	/* As many rounds as the reader needs for a few whole passes. */
	t0 = now_us();
	for (done = 0; done < ROUNDS_MAX &&
	     (done < ROUNDS || *passes < READER_PASSES + 1); done += ROUNDS)
		ASSERT_EQ(0, map_unmap_loop(ctx, mid, lat + done, ROUNDS));
	t0 = now_us() - t0;
	kill(rd, SIGKILL);
	ASSERT_EQ(rd, waitpid(rd, &st, 0));
	report("with a /proc/tshm reader", lat, done);
	printf("# the reader read the whole table %" PRIu64 " times meanwhile (%.1f s)\n",
	       *passes, t0 / 1e6);
	fflush(stdout);
	EXPECT_EQ(SIGKILL, WTERMSIG(st));

	/* Closing the context drops every grant: every segment goes. */
	close(ctx);
	EXPECT_EQ(0, tt_proc_count());
	snprintf(oldbuf, sizeof(oldbuf), "%lld", old_max);
	EXPECT_EQ(0, tt_write_file(PARAM, oldbuf));
}

TEST_HARNESS_MAIN
