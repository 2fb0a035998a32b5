// SPDX-License-Identifier: GPL-2.0
/*
 * spawn: the three start methods exchanging segments through queues,
 * failures (exit code, tshm_worker_fail, SIGSEGV, hang) reported precisely
 * with the rest terminated within the grace period, no orphan when the
 * parent is SIGKILLed, thread budget and affinity, fd hygiene, bad input.
 *
 * The test process is a child subreaper: any worker or supervisor that
 * outlived its parent would become our child, so "no children left" means
 * nothing is left anywhere.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tshm-spawn.h>

#include "kselftest_harness.h"

#define NOBODY		65534

/* ---- helpers ---- */

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t fnv1a(const void *p, size_t n)
{
	const unsigned char *c = p;
	uint64_t h = 0xcbf29ce484222325ULL;

	while (n--)
		h = (h ^ *c++) * 0x100000001b3ULL;
	return h;
}

/* Our children (zombies included) other than @except. */
static int count_children(pid_t except)
{
	char path[300], buf[4096];
	struct dirent *d;
	DIR *dir = opendir("/proc/self/task");
	int n = 0;

	if (!dir)
		return -1;
	while ((d = readdir(dir))) {
		FILE *f;

		if (d->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/children",
			 d->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(buf, sizeof(buf), f)) {
			char *save = NULL;

			for (char *t = strtok_r(buf, " \n", &save); t;
			     t = strtok_r(NULL, " \n", &save))
				if (atoi(t) != except)
					n++;
		}
		fclose(f);
	}
	closedir(dir);
	return n;
}

/* Reap what was reparented to us; wait until no child is left. */
static int settle_children(pid_t except, int ms)
{
	int64_t end = mono_ms() + ms;
	int n;

	for (;;) {
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		n = count_children(except);
		if (n <= 0 || mono_ms() > end)
			return n;
		usleep(5000);
	}
}

static bool pid_gone(pid_t pid)
{
	return kill(pid, 0) < 0 && errno == ESRCH;
}

/* ---- worker entries ---- */

struct xmsg {
	int32_t rank;
	uint32_t size;
	uint64_t sum;
};

struct ack {
	int32_t receiver;
	int32_t sender;
	uint64_t sum;
	int32_t ok;
};

/* Each rank sends one segment on queue 0, receives one, acks on queue 1. */
static int w_exchange(int rank, int nprocs, void *arg)
{
	struct tshm_ctx *ctx = tshm_worker_ctx();
	struct tshm_queue *q = tshm_worker_queue(0), *acks = tshm_worker_queue(1);
	struct tshm_seg *seg, *got[1];
	unsigned nsegs = 1;
	struct xmsg m;
	struct ack a;
	size_t len;
	int ret;

	if (!ctx || !q || !acks)
		tshm_worker_fail("rank %d: no ctx/queues", rank);
	if (tshm_worker_rank() != rank || tshm_worker_nprocs() != nprocs)
		tshm_worker_fail("rank %d: bad identity", rank);
	ret = tshm_seg_create(ctx, 8192, "spawn-x", 0, &seg);
	if (ret < 0)
		tshm_worker_fail("rank %d: seg_create %d", rank, ret);
	for (size_t i = 0; i < 8192; i++)
		((unsigned char *)tshm_seg_data(seg))[i] =
			(unsigned char)(i * 7 + rank * 13);
	m.rank = rank;
	m.size = 8192;
	m.sum = fnv1a(tshm_seg_data(seg), 8192);
	ret = tshm_queue_send(q, &m, sizeof(m), &seg, 1, 10000);
	if (ret < 0)
		tshm_worker_fail("rank %d: send %d", rank, ret);
	tshm_seg_unref(seg);

	ret = tshm_queue_recv(q, &m, sizeof(m), &len, got, &nsegs, 10000);
	if (ret < 0 || nsegs != 1)
		tshm_worker_fail("rank %d: recv %d nsegs %u", rank, ret, nsegs);
	a.receiver = rank;
	a.sender = m.rank;
	a.sum = m.sum;
	a.ok = tshm_seg_size(got[0]) >= m.size &&
	       fnv1a(tshm_seg_data(got[0]), m.size) == m.sum;
	tshm_seg_unref(got[0]);
	ret = tshm_queue_send(acks, &a, sizeof(a), NULL, 0, 10000);
	if (ret < 0)
		tshm_worker_fail("rank %d: ack %d", rank, ret);
	return 0;
}
TSHM_ENTRY("exchange", w_exchange)

enum behave {
	B_OK = 0,
	B_RET3,
	B_FAIL,
	B_SEGV,
	B_HANG,		/* dies on SIGTERM */
	B_HANG_NOTERM,	/* ignores SIGTERM: needs SIGKILL */
	B_SLEEP300,	/* returns 0 after 300 ms */
	B_RETNEG,	/* returns -EINVAL */
	B_CLOSEALL,	/* closes every fd but 0-2, then sleeps 2 s */
	B_SCRIBBLE,	/* overwrites the status board if mapped, returns 0 */
	B_HANG_INT,	/* dies on SIGINT or SIGTERM, even where the caller
			 * blocked them */
};

struct behave_arg {
	int mode[8];
};

/* Siblings (same parent: the set's supervisor) that ignore SIGTERM. */
static int siblings_ignoring_sigterm(void)
{
	char path[300], line[256];
	struct dirent *de;
	int n = 0, ppid;
	DIR *d = opendir("/proc");

	if (!d)
		return -1;
	while ((de = readdir(d))) {
		unsigned long long ign = 0;
		FILE *f;

		if (de->d_name[0] < '1' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/status", de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		ppid = -1;
		while (fgets(line, sizeof(line), f)) {
			sscanf(line, "PPid: %d", &ppid);
			sscanf(line, "SigIgn: %llx", &ign);
		}
		fclose(f);
		if (ppid == getppid() && (ign & (1ULL << (SIGTERM - 1))))
			n++;
	}
	closedir(d);
	return n;
}

/*
 * A failing worker fails only once every B_HANG_NOTERM sibling ignores
 * SIGTERM: otherwise, on a loaded machine, the set's SIGTERM can beat the
 * sibling's signal() and the SIGKILL-after-grace path goes untested.
 */
static void wait_for_noterm_siblings(const struct behave_arg *b, int nprocs)
{
	int want = 0;

	for (int r = 0; r < nprocs; r++)
		want += b->mode[r % 8] == B_HANG_NOTERM;
	while (want && siblings_ignoring_sigterm() < want)
		usleep(1000);
}

/*
 * An adversarial worker: find the status board (a FORK worker inherits
 * its mapping) and write a first failure that is no rank.  The layout is
 * the library's private one (lib/spawn.h): first_fail at byte 28.
 */
static void scribble_board(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	unsigned long lo;

	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (!strstr(line, "tshm-spawn-board") ||
		    sscanf(line, "%lx-", &lo) != 1)
			continue;
		if (strstr(line, " rw"))
			*(volatile int32_t *)(lo + 28) = 0x7fffffff;
	}
	fclose(f);
}

static int w_behave(int rank, int nprocs, void *arg)
{
	const struct behave_arg *b = arg;

	switch (b->mode[rank % 8]) {
	case B_RET3:
	case B_FAIL:
	case B_SEGV:
		wait_for_noterm_siblings(b, nprocs);
		break;
	}
	switch (b->mode[rank % 8]) {
	case B_RET3:
		usleep(20000);
		return 3;
	case B_FAIL:
		usleep(20000);
		tshm_worker_fail("rank %d: bad thing %d", rank, 42);
	case B_SEGV:
		usleep(20000);
		/* Not through a sanitizer's handler: a real crash. */
		signal(SIGSEGV, SIG_DFL);
		{
			volatile int *bad = mmap(NULL, 4096, PROT_NONE,
						 MAP_PRIVATE | MAP_ANONYMOUS,
						 -1, 0);

			*bad = 1;
		}
		return 99;
	case B_HANG_NOTERM:
		signal(SIGTERM, SIG_IGN);
		/* fall through */
	case B_HANG:
		for (;;)
			pause();
	case B_HANG_INT: {
		sigset_t set;

		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		sigemptyset(&set);
		sigaddset(&set, SIGINT);
		sigaddset(&set, SIGTERM);
		sigprocmask(SIG_UNBLOCK, &set, NULL);
		for (;;)
			pause();
	}
	case B_SLEEP300:
		usleep(300000);
		return 0;
	case B_RETNEG:
		return -EINVAL;
	case B_SCRIBBLE:
		scribble_board();
		return 0;
	case B_CLOSEALL:
		syscall(SYS_close_range, 3, ~0U, 0);
		usleep(2000000);
		return 0;
	default:
		return 0;
	}
}
TSHM_ENTRY("behave", w_behave)

struct env_arg {
	int threads;		/* expected budget */
	int pin;
	int ncpus;
	int cpus[64];		/* the parent's usable CPUs */
};

static int w_env(int rank, int nprocs, void *arg)
{
	const struct env_arg *e = arg;
	char want[16];
	const char *v;

	snprintf(want, sizeof(want), "%d", e->threads);
	v = getenv("MKL_NUM_THREADS");
	if (!v || strcmp(v, want))
		tshm_worker_fail("rank %d: MKL_NUM_THREADS=%s, want %s", rank,
				 v ? v : "(unset)", want);
	v = getenv("OPENBLAS_NUM_THREADS");
	if (!v || strcmp(v, want))
		tshm_worker_fail("rank %d: OPENBLAS_NUM_THREADS=%s, want %s",
				 rank, v ? v : "(unset)", want);
	v = getenv("OMP_NUM_THREADS");
	if (!v || strcmp(v, "7"))
		tshm_worker_fail("rank %d: OMP_NUM_THREADS=%s, want 7 (attr)",
				 rank, v ? v : "(unset)");
	v = getenv("TSHM_TEST_VAR");
	if (!v || strcmp(v, "hello"))
		tshm_worker_fail("rank %d: TSHM_TEST_VAR=%s", rank,
				 v ? v : "(unset)");
	if (getenv("TSHM_TEST_UNSET"))
		tshm_worker_fail("rank %d: TSHM_TEST_UNSET still set", rank);
	if (getenv("TSHM_SPAWN_WORKER"))
		tshm_worker_fail("rank %d: TSHM_SPAWN_WORKER leaked", rank);
	if (tshm_worker_threads() != e->threads)
		tshm_worker_fail("rank %d: tshm_worker_threads %d, want %d",
				 rank, tshm_worker_threads(), e->threads);
	if (e->pin) {
		cpu_set_t set;

		if (sched_getaffinity(0, sizeof(set), &set))
			tshm_worker_fail("sched_getaffinity: %m");
		if (CPU_COUNT(&set) != e->threads)
			tshm_worker_fail("rank %d: %d CPUs, want %d", rank,
					 CPU_COUNT(&set), e->threads);
		for (int j = 0; j < e->threads; j++) {
			int cpu = e->cpus[(rank * e->threads + j) % e->ncpus];

			if (!CPU_ISSET(cpu, &set))
				tshm_worker_fail("rank %d: CPU %d not in mask",
						 rank, cpu);
		}
	}
	return 0;
}
TSHM_ENTRY("env", w_env)

struct fd_arg {
	int n;
	dev_t dev[4];
	ino_t ino[4];
};

static int w_fds(int rank, int nprocs, void *arg)
{
	const struct fd_arg *c = arg;
	struct tshm_ctx *ctx = tshm_worker_ctx();
	struct dirent *d;
	DIR *dir = opendir("/proc/self/fd");
	int others = 0;

	if (!dir)
		tshm_worker_fail("opendir: %m");
	while ((d = readdir(dir))) {
		int fd = atoi(d->d_name);
		struct stat st;

		if (d->d_name[0] == '.' || fd < 3 || fd == dirfd(dir))
			continue;
		if (fstat(fd, &st) < 0)
			continue;
		for (int i = 0; i < c->n; i++)
			if (st.st_dev == c->dev[i] && st.st_ino == c->ino[i])
				tshm_worker_fail("rank %d: fd %d leaked from the parent",
						 rank, fd);
		if (ctx && fd == tshm_ctx_fd(ctx))
			continue;
		others++;
	}
	closedir(dir);
	/* Only the status socket. */
	if (others > 1)
		tshm_worker_fail("rank %d: %d unexpected fds", rank, others);
	return 0;
}
TSHM_ENTRY("fds", w_fds)

/* ---- fixture: a context, two queues, a forkserver ---- */

FIXTURE(sp) {
	struct tshm_ctx *ctx;
	struct tshm_queue *q, *acks;
	struct tshm_forkserver *fs;
	struct fd_arg canaries;
	int canary_fds[3];
	int fspid;
};

FIXTURE_VARIANT(sp) {
	enum tshm_start_method method;
};

FIXTURE_VARIANT_ADD(sp, fork) { .method = TSHM_START_FORK };
FIXTURE_VARIANT_ADD(sp, spawn) { .method = TSHM_START_SPAWN };
FIXTURE_VARIANT_ADD(sp, forkserver) { .method = TSHM_START_FORKSERVER };

FIXTURE_SETUP(sp)
{
	int p[2];
	struct stat st;

	ASSERT_EQ(0, prctl(PR_SET_CHILD_SUBREAPER, 1));
	/* Inheritable fds that must not reach spawn/forkserver workers. */
	ASSERT_EQ(0, pipe(p));
	self->canary_fds[0] = p[0];
	self->canary_fds[1] = p[1];
	self->canary_fds[2] = eventfd(0, 0);
	ASSERT_LE(0, self->canary_fds[2]);
	for (int i = 0; i < 3; i++) {
		ASSERT_EQ(0, fstat(self->canary_fds[i], &st));
		self->canaries.dev[i] = st.st_dev;
		self->canaries.ino[i] = st.st_ino;
	}
	self->canaries.n = 3;
	self->fspid = -1;
	if (variant->method == TSHM_START_FORKSERVER) {
		ASSERT_EQ(0, tshm_forkserver_create(&self->fs));
		self->fspid = tshm_forkserver_pid(self->fs);
	}
	ASSERT_EQ(0, tshm_ctx_open(&self->ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 64, sizeof(struct xmsg),
				       &self->q));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 64, sizeof(struct ack),
				       &self->acks));
}

FIXTURE_TEARDOWN(sp)
{
	tshm_queue_unref(self->q);
	tshm_queue_unref(self->acks);
	tshm_ctx_close(self->ctx);
	EXPECT_EQ(0, settle_children(self->fspid, 2000));
	tshm_forkserver_destroy(self->fs);
	for (int i = 0; i < 3; i++)
		close(self->canary_fds[i]);
}

static struct tshm_spawn_attr *mkattr(struct __test_metadata *_metadata,
				      FIXTURE_DATA(sp) *self,
				      const FIXTURE_VARIANT(sp) *variant,
				      const char *entry, int n)
{
	struct tshm_spawn_attr *a;

	if (tshm_spawn_attr_create(&a))
		return NULL;
	tshm_spawn_attr_set_method(a, variant->method);
	tshm_spawn_attr_set_forkserver(a, self->fs);
	tshm_spawn_attr_set_entry(a, entry);
	tshm_spawn_attr_set_nprocs(a, n);
	tshm_spawn_attr_set_grace_ms(a, 500);
	return a;
}

static int do_exchange(struct __test_metadata *_metadata,
		       FIXTURE_DATA(sp) *self,
		       const FIXTURE_VARIANT(sp) *variant, int n)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "exchange", n);
	struct tshm_procs *procs;
	struct tshm_failure f;
	int seen[64] = { 0 }, ret;

	if (!a)
		return -ENOMEM;
	tshm_spawn_attr_add_queue(a, self->q);
	tshm_spawn_attr_add_queue(a, self->acks);
	ret = tshm_spawn(self->ctx, a, &procs);
	tshm_spawn_attr_destroy(a);
	if (ret)
		return ret;
	for (int i = 0; i < n; i++) {
		struct ack k;
		size_t len;

		ret = tshm_queue_recv(self->acks, &k, sizeof(k), &len, NULL,
				      NULL, 20000);
		if (ret < 0)
			break;
		if (!k.ok || k.sender < 0 || k.sender >= n)
			ret = -EBADMSG;
		else
			seen[k.sender]++;
	}
	if (ret >= 0)
		ret = tshm_procs_join(procs, 20000, &f);
	if (ret)
		printf("# join: %d %s\n", ret, f.summary);
	tshm_procs_destroy(procs);
	for (int i = 0; i < n && !ret; i++)
		if (seen[i] != 1)
			ret = -EPROTO;
	return ret;
}

TEST_F(sp, exchange)
{
	ASSERT_EQ(0, do_exchange(_metadata, self, variant, 4));
}

/* Run one failing rank among hanging ones; check report and cleanup. */
static void run_failure(struct __test_metadata *_metadata,
			FIXTURE_DATA(sp) *self,
			const FIXTURE_VARIANT(sp) *variant, int bad_rank,
			int bad_mode, int others, int grace,
			struct tshm_failure *f)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 4);
	struct behave_arg b;
	struct tshm_procs *procs;
	pid_t pids[4];
	int64_t t0, dt;

	ASSERT_NE(NULL, a);
	for (int i = 0; i < 8; i++)
		b.mode[i] = others;
	b.mode[bad_rank] = bad_mode;
	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn_attr_set_grace_ms(a, grace));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	for (int i = 0; i < 4; i++) {
		pids[i] = tshm_procs_pid(procs, i);
		ASSERT_LT(0, pids[i]);
	}
	t0 = mono_ms();
	EXPECT_EQ(-ECANCELED, tshm_procs_join(procs, 20000, f));
	dt = mono_ms() - t0;
	/* Terminated within the grace period (plus scheduling slack). */
	EXPECT_GT(grace + 3000, dt);
	if (others == B_HANG_NOTERM)
		EXPECT_LE(grace, dt);
	for (int i = 0; i < 4; i++)
		EXPECT_TRUE(pid_gone(pids[i]));
	/* Sticky. */
	{
		struct tshm_failure g;

		EXPECT_EQ(-ECANCELED, tshm_procs_join(procs, 0, &g));
		EXPECT_EQ(f->rank, g.rank);
	}
	tshm_procs_destroy(procs);
	EXPECT_EQ(bad_rank, f->rank);
	EXPECT_EQ(pids[bad_rank], f->pid);
	printf("# %s\n", f->summary);
}

TEST_F(sp, fail_exit_code)
{
	struct tshm_failure f;

	run_failure(_metadata, self, variant, 2, B_RET3, B_HANG, 500, &f);
	EXPECT_EQ(3, f.exit_code);
	EXPECT_EQ(0, f.signo);
	EXPECT_STREQ("", f.message);
	EXPECT_NE(NULL, strstr(f.summary, "rank 2"));
	EXPECT_NE(NULL, strstr(f.summary, "exited with status 3"));
}

TEST_F(sp, fail_message)
{
	struct tshm_failure f;

	run_failure(_metadata, self, variant, 1, B_FAIL, B_HANG, 500, &f);
	EXPECT_EQ(1, f.exit_code);
	EXPECT_EQ(0, f.signo);
	EXPECT_STREQ("rank 1: bad thing 42", f.message);
	EXPECT_NE(NULL, strstr(f.summary, "bad thing 42"));
}

TEST_F(sp, fail_segv)
{
	struct tshm_failure f;

	run_failure(_metadata, self, variant, 3, B_SEGV, B_HANG, 500, &f);
	EXPECT_EQ(SIGSEGV, f.signo);
	EXPECT_EQ(-1, f.exit_code);
	EXPECT_NE(NULL, strstr(f.summary, "killed by SIGSEGV"));
}

TEST_F(sp, fail_then_sigkill_after_grace)
{
	struct tshm_failure f;

	/* The others ignore SIGTERM: SIGKILL after the grace period. */
	run_failure(_metadata, self, variant, 0, B_RET3, B_HANG_NOTERM, 400,
		    &f);
	EXPECT_EQ(3, f.exit_code);
}

TEST_F(sp, fail_negative_return)
{
	struct tshm_failure f;

	run_failure(_metadata, self, variant, 1, B_RETNEG, B_HANG, 300, &f);
	EXPECT_EQ(255, f.exit_code);
	EXPECT_NE(NULL, strstr(f.message, "returned -22"));
}

TEST_F(sp, hang_timeout_then_terminate)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 4);
	struct behave_arg b = { { B_OK, B_HANG_NOTERM, B_OK, B_OK } };
	struct tshm_procs *procs;
	struct tshm_failure f;
	int64_t t0, dt;
	pid_t pid;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn_attr_set_grace_ms(a, 300));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	pid = tshm_procs_pid(procs, 1);
	/* Non-blocking first. */
	EXPECT_EQ(-EAGAIN, tshm_procs_join(procs, 0, &f));
	t0 = mono_ms();
	EXPECT_EQ(-ETIMEDOUT, tshm_procs_join(procs, 400, &f));
	dt = mono_ms() - t0;
	EXPECT_LE(390, dt);
	EXPECT_GT(3000, dt);
	EXPECT_EQ(1, f.rank);
	EXPECT_EQ(1, f.timed_out);
	EXPECT_EQ(pid, f.pid);
	EXPECT_NE(NULL, strstr(f.summary, "still running"));
	EXPECT_FALSE(pid_gone(pid));
	printf("# %s\n", f.summary);

	t0 = mono_ms();
	EXPECT_EQ(0, tshm_procs_terminate(procs));
	EXPECT_EQ(0, tshm_procs_join(procs, -1, &f));
	dt = mono_ms() - t0;
	EXPECT_LE(290, dt);
	EXPECT_GT(3000, dt);
	EXPECT_TRUE(pid_gone(pid));
	tshm_procs_destroy(procs);
}

/* How each rank ended, as join left them: exit, SIGTERM, SIGKILL. */
TEST_F(sp, status_per_rank)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 4);
	struct behave_arg b = { { B_OK, B_HANG, B_RET3, B_HANG_NOTERM } };
	struct tshm_procs *procs;
	struct tshm_failure f;
	int st = -1;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn_attr_set_grace_ms(a, 300));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	EXPECT_EQ(0, tshm_procs_status(procs, 1, &st));	/* hangs */
	EXPECT_EQ(-EINVAL, tshm_procs_status(procs, -1, &st));
	EXPECT_EQ(-EINVAL, tshm_procs_status(procs, 4, &st));
	EXPECT_EQ(-EINVAL, tshm_procs_status(procs, 0, NULL));
	EXPECT_EQ(-EINVAL, tshm_procs_status(NULL, 0, &st));
	EXPECT_EQ(-ECANCELED, tshm_procs_join(procs, 20000, &f));
	EXPECT_EQ(2, f.rank);
	ASSERT_EQ(1, tshm_procs_status(procs, 0, &st));
	EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ASSERT_EQ(1, tshm_procs_status(procs, 1, &st));
	EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
	ASSERT_EQ(1, tshm_procs_status(procs, 2, &st));
	EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 3);
	ASSERT_EQ(1, tshm_procs_status(procs, 3, &st));
	EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	tshm_procs_destroy(procs);
}

/* The number @field ("PPid"; "RssAnon", in kB) of /proc/@pid/status, or -1. */
static long status_field(pid_t pid, const char *field)
{
	char path[64], line[256];
	size_t len = strlen(field);
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, len) && line[len] == ':')
			v = strtol(line + len + 1, NULL, 10);
	fclose(f);
	return v;
}

static pid_t parent_of(pid_t pid)
{
	return (pid_t)status_field(pid, "PPid");
}

/* The supervisor dies first: its workers read as killed by SIGKILL. */
TEST_F(sp, status_after_supervisor_died)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 2);
	struct behave_arg b = { { B_HANG, B_OK } };
	struct tshm_procs *procs;
	struct tshm_failure f;
	int st = -1, ret = 0;
	int64_t end;
	pid_t sup;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	/* Rank 1 exits 0 and is reaped; rank 0 hangs. */
	end = mono_ms() + 20000;
	while ((ret = tshm_procs_status(procs, 1, &st)) == 0 &&
	       mono_ms() < end)
		usleep(1000);
	ASSERT_EQ(1, ret);
	EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	sup = parent_of(tshm_procs_pid(procs, 0));
	ASSERT_LT(1, sup);
	ASSERT_NE(getpid(), sup);
	ASSERT_EQ(0, kill(sup, SIGKILL));
	end = mono_ms() + 20000;
	while ((ret = tshm_procs_status(procs, 0, &st)) == 0 &&
	       mono_ms() < end)
		usleep(1000);
	ASSERT_EQ(1, ret);
	EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	/* Rank 1 keeps what it was reaped with. */
	ASSERT_EQ(1, tshm_procs_status(procs, 1, &st));
	EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	EXPECT_EQ(-ECANCELED, tshm_procs_join(procs, 20000, &f));
	EXPECT_EQ(-1, f.rank);
	tshm_procs_destroy(procs);
}

TEST_F(sp, nonblocking_join)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 3);
	struct behave_arg b = { { B_SLEEP300, B_SLEEP300, B_SLEEP300 } };
	struct tshm_procs *procs;
	struct tshm_failure f;
	int polls = 0, ret;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	while ((ret = tshm_procs_join(procs, 0, &f)) == -EAGAIN) {
		polls++;	/* "other work" */
		usleep(10000);
	}
	EXPECT_EQ(0, ret);
	EXPECT_LT(3, polls);
	EXPECT_EQ(-1, f.rank);
	EXPECT_EQ(0, tshm_procs_join(procs, 0, &f));
	tshm_procs_destroy(procs);
}

TEST_F(sp, destroy_terminates)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 4);
	struct behave_arg b = { { B_HANG, B_HANG_NOTERM, B_HANG, B_HANG } };
	struct tshm_procs *procs;
	pid_t pids[4];
	int64_t t0, dt;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn_attr_set_grace_ms(a, 200));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	for (int i = 0; i < 4; i++)
		pids[i] = tshm_procs_pid(procs, i);
	EXPECT_LT(0, tshm_procs_pgid(procs));
	t0 = mono_ms();
	tshm_procs_destroy(procs);
	dt = mono_ms() - t0;
	EXPECT_GT(3000, dt);
	for (int i = 0; i < 4; i++)
		EXPECT_TRUE(pid_gone(pids[i]));
	EXPECT_EQ(0, count_children(self->fspid));
}

TEST_F(sp, kill_signal_reported)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 2);
	struct behave_arg b = { { B_HANG, B_HANG } };
	struct tshm_procs *procs;
	struct tshm_failure f;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	EXPECT_EQ(-EINVAL, tshm_procs_kill(procs, 0));
	EXPECT_EQ(0, tshm_procs_kill(procs, SIGUSR1));
	EXPECT_EQ(-ECANCELED, tshm_procs_join(procs, 20000, &f));
	EXPECT_EQ(SIGUSR1, f.signo);
	EXPECT_STREQ("SIGUSR1", tshm_signal_name(f.signo));
	tshm_procs_destroy(procs);
}

/* The parent dies by SIGKILL: nothing it started may survive. */
TEST_F(sp, parent_sigkill_no_orphans)
{
	int p[2], n = 4;
	pid_t parent, pids[8];

	ASSERT_EQ(0, pipe(p));
	parent = fork();
	ASSERT_LE(0, parent);
	if (parent == 0) {
		struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
						   "behave", n);
		struct behave_arg b = { { B_HANG, B_HANG_NOTERM, B_HANG,
					  B_HANG_NOTERM } };
		struct tshm_procs *procs;

		close(p[0]);
		tshm_spawn_attr_set_arg(a, &b, sizeof(b));
		if (tshm_spawn(self->ctx, a, &procs))
			_exit(1);
		for (int i = 0; i < n; i++)
			pids[i] = tshm_procs_pid(procs, i);
		if (write(p[1], pids, sizeof(pids[0]) * n) < 0)
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
	ASSERT_EQ(sizeof(pids[0]) * n, read(p[0], pids, sizeof(pids[0]) * n));
	close(p[0]);
	for (int i = 0; i < n; i++)
		EXPECT_FALSE(pid_gone(pids[i]));
	ASSERT_EQ(0, kill(parent, SIGKILL));
	ASSERT_EQ(parent, waitpid(parent, NULL, 0));
	/* Whatever was orphaned comes to us (subreaper): wait, reap. */
	EXPECT_EQ(0, settle_children(self->fspid, 5000));
	for (int64_t end = mono_ms() + 5000; mono_ms() < end;) {
		int alive = 0;

		for (int i = 0; i < n; i++)
			alive += !pid_gone(pids[i]);
		if (!alive)
			break;
		usleep(5000);
	}
	for (int i = 0; i < n; i++)
		EXPECT_TRUE(pid_gone(pids[i]));
}

/*
 * In a process group of its own, as a shell's job: Ctrl-C (SIGINT to the
 * group) with and without TSHM_SPAWN_FORWARD_SIGINT.  The caller blocks
 * SIGINT, which fork workers inherit: B_HANG_INT unblocks it once it
 * dies of it, so a SIGINT passed on early still counts.  0: as expected.
 */
static int ctrl_c_job(const FIXTURE_VARIANT(sp) *variant, int how)
{
	bool forward = how == 1, term = how == 2;
	struct behave_arg b = { { B_HANG_INT, B_HANG_INT } };
	struct tshm_forkserver *fs = NULL;
	struct tshm_spawn_attr *a;
	struct tshm_procs *procs;
	struct tshm_failure f;
	bool terminated = true;
	sigset_t set;
	int ret;

	sigemptyset(&set);
	sigaddset(&set, term ? SIGTERM : SIGINT);
	if (setpgid(0, 0) || sigprocmask(SIG_BLOCK, &set, NULL))
		return 10;
	/* Forked by this job, so its supervisors are in the job's group. */
	if (variant->method == TSHM_START_FORKSERVER &&
	    tshm_forkserver_create(&fs))
		return 11;
	if (tshm_spawn_attr_create(&a))
		return 12;
	tshm_spawn_attr_set_method(a, variant->method);
	tshm_spawn_attr_set_forkserver(a, fs);
	tshm_spawn_attr_set_entry(a, "behave");
	tshm_spawn_attr_set_nprocs(a, 2);
	tshm_spawn_attr_set_grace_ms(a, 500);
	tshm_spawn_attr_set_arg(a, &b, sizeof(b));
	if (forward && tshm_spawn_attr_set_flags(a, TSHM_SPAWN_FORWARD_SIGINT))
		return 13;
	if (tshm_spawn(NULL, a, &procs))
		return 14;
	tshm_spawn_attr_destroy(a);
	kill(0, term ? SIGTERM : SIGINT);
	ret = tshm_procs_join(procs, forward || term ? 20000 : 1000, &f);
	for (int i = 0; i < 2; i++) {
		int st = 0;

		terminated &= ret == 0 && tshm_procs_status(procs, i, &st) == 1 &&
			      WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM;
	}
	tshm_procs_destroy(procs);
	if (fs)
		tshm_forkserver_destroy(fs);
	/* Terminated by the supervisor (its request: not a failure), not
	 * left to die of their parent-death signal (SIGKILL). */
	if (term)
		return terminated ? 0 : 22;
	if (forward)
		return ret == -ECANCELED && f.signo == SIGINT ? 0 : 20;
	return ret == -ETIMEDOUT ? 0 : 21;
}

/*
 * Ctrl-C reaches the workers only with TSHM_SPAWN_FORWARD_SIGINT (how 0,
 * 1); a SIGTERM to the job's group (timeout(1)) makes the supervisor
 * terminate the set, SIGTERM first, instead of dying of it (how 2).
 */
TEST_F(sp, ctrl_c_reaches_workers_only_when_forwarded)
{
	for (int how = 0; how < 3; how++) {
		pid_t job = fork();
		int status;

		ASSERT_LE(0, job);
		if (job == 0)
			_exit(ctrl_c_job(variant, how));
		ASSERT_EQ(job, waitpid(job, &status, 0));
		EXPECT_TRUE(WIFEXITED(status));
		EXPECT_EQ(0, WEXITSTATUS(status)) {
			TH_LOG("case %d: status %#x", how, status);
		}
	}
}

static void *spawn_thread(void *data)
{
	struct tshm_spawn_attr *a = data;
	struct tshm_procs *procs = NULL;

	if (tshm_spawn(NULL, a, &procs))
		return NULL;
	return procs;
}

/* PR_SET_PDEATHSIG follows the forking thread: its exit must not matter. */
TEST_F(sp, caller_thread_exits)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 2);
	struct behave_arg b = { { B_SLEEP300, B_SLEEP300 } };
	struct tshm_procs *procs;
	struct tshm_failure f;
	pthread_t t;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, pthread_create(&t, NULL, spawn_thread, a));
	ASSERT_EQ(0, pthread_join(t, (void **)&procs));
	tshm_spawn_attr_destroy(a);
	ASSERT_NE(NULL, procs);
	EXPECT_EQ(0, tshm_procs_join(procs, 20000, &f));
	if (f.rank >= 0)
		printf("# %s\n", f.summary);
	tshm_procs_destroy(procs);
}

TEST_F(sp, thread_env)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant, "env", 2);
	struct env_arg e = { 0 };
	struct tshm_procs *procs;
	struct tshm_failure f;
	cpu_set_t set;
	int ret;

	ASSERT_EQ(0, sched_getaffinity(0, sizeof(set), &set));
	e.threads = CPU_COUNT(&set) / 2 ? CPU_COUNT(&set) / 2 : 1;
	/* Inherited values are replaced by the budget... */
	setenv("OPENBLAS_NUM_THREADS", "99", 1);
	setenv("TSHM_TEST_UNSET", "x", 1);
	/* ...the attribute's are not. */
	ASSERT_EQ(0, tshm_spawn_attr_setenv(a, "OMP_NUM_THREADS", "7"));
	ASSERT_EQ(0, tshm_spawn_attr_setenv(a, "TSHM_TEST_VAR", "hello"));
	ASSERT_EQ(0, tshm_spawn_attr_setenv(a, "TSHM_TEST_UNSET", NULL));
	EXPECT_EQ(-EINVAL, tshm_spawn_attr_setenv(a, "A=B", "c"));
	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &e, sizeof(e)));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	ret = tshm_procs_join(procs, 20000, &f);
	EXPECT_EQ(0, ret);
	if (ret)
		printf("# %s\n", f.summary);
	tshm_procs_destroy(procs);
	unsetenv("OPENBLAS_NUM_THREADS");
	unsetenv("TSHM_TEST_UNSET");
}

TEST_F(sp, affinity)
{
	struct tshm_spawn_attr *a;
	struct env_arg e = { 0 };
	struct tshm_procs *procs;
	struct tshm_failure f;
	cpu_set_t set;
	int ret, n;

	ASSERT_EQ(0, sched_getaffinity(0, sizeof(set), &set));
	for (int c = 0; c < CPU_SETSIZE && e.ncpus < 64; c++)
		if (CPU_ISSET(c, &set))
			e.cpus[e.ncpus++] = c;
	/* One CPU each, and more workers than CPUs wrap around. */
	n = e.ncpus + 1;
	if (n > 8)
		n = 8;
	e.threads = 1;
	e.pin = 1;
	a = mkattr(_metadata, self, variant, "env", n);
	ASSERT_EQ(0, tshm_spawn_attr_setenv(a, "OMP_NUM_THREADS", "7"));
	ASSERT_EQ(0, tshm_spawn_attr_setenv(a, "TSHM_TEST_VAR", "hello"));
	ASSERT_EQ(0, tshm_spawn_attr_set_threads(a, 1));
	ASSERT_EQ(0, tshm_spawn_attr_set_flags(a, TSHM_SPAWN_PIN));
	EXPECT_EQ(-EINVAL, tshm_spawn_attr_set_flags(a, 1U << 7));
	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &e, sizeof(e)));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	ret = tshm_procs_join(procs, 20000, &f);
	EXPECT_EQ(0, ret);
	if (ret)
		printf("# %s\n", f.summary);
	tshm_procs_destroy(procs);
}

TEST_F(sp, no_fd_leak)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant, "fds", 2);
	struct tshm_procs *procs;
	struct tshm_failure f;
	int ret;

	if (variant->method == TSHM_START_FORK) {
		tshm_spawn_attr_destroy(a);
		SKIP(return, "fork workers inherit every fd by design");
	}
	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &self->canaries,
					     sizeof(self->canaries)));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	ret = tshm_procs_join(procs, 20000, &f);
	EXPECT_EQ(0, ret);
	if (ret)
		printf("# %s\n", f.summary);
	tshm_procs_destroy(procs);
}

/* From /proc/@pid/stat: its parent (@cpu NULL), or its CPU seconds. */
static int proc_stat(pid_t pid, pid_t *ppid, double *cpu)
{
	unsigned long ut, st;
	char path[64], buf[1024], *p;
	ssize_t n;
	int fd, pp;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
			 "%lu %lu", &pp, &ut, &st) != 3)
		return -1;
	if (ppid)
		*ppid = pp;
	if (cpu)
		*cpu = (double)(ut + st) / sysconf(_SC_CLK_TCK);
	return 0;
}

/* How many fds @pid has open, or -1. */
static int proc_nfds(pid_t pid)
{
	char path[64];
	struct dirent *de;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

/*
 * Workers that close their status socket: no busy supervisor.  Its own
 * CPU time is read while both workers sleep with every fd but 0-2 closed:
 * a supervisor spinning on the socket's hang-up burns the whole window,
 * one that sleeps none of it.  (The children's total, read before, also
 * counted fork and exec, which under the debug kernel came near the
 * bound.)
 */
#define CLOSEALL_WINDOW_US	300000

TEST_F(sp, workers_close_all_fds)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 2);
	struct behave_arg b = { { B_CLOSEALL, B_CLOSEALL } };
	struct tshm_procs *procs;
	double c0 = -1, c1 = -1;
	pid_t w[2], sup = -1;
	int t;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	w[0] = tshm_procs_pid(procs, 0);
	w[1] = tshm_procs_pid(procs, 1);
	EXPECT_EQ(0, proc_stat(w[0], &sup, NULL));
	/* Both closed theirs (at most 10 s: slow starts under emulation). */
	for (t = 0; t < 1000; t++) {
		if (proc_nfds(w[0]) == 3 && proc_nfds(w[1]) == 3)
			break;
		usleep(10000);
	}
	EXPECT_GT(1000, t);
	EXPECT_EQ(0, proc_stat(sup, NULL, &c0));
	usleep(CLOSEALL_WINDOW_US);
	EXPECT_EQ(0, proc_stat(sup, NULL, &c1));
	/* Both still sleeping: the window was theirs. */
	EXPECT_EQ(3, proc_nfds(w[0]));
	EXPECT_EQ(3, proc_nfds(w[1]));
	TH_LOG("supervisor %d: %.2f s of CPU in %.2f s", sup, c1 - c0,
	       CLOSEALL_WINDOW_US / 1e6);
	EXPECT_GT(CLOSEALL_WINDOW_US / 2e6, c1 - c0);
	EXPECT_EQ(0, tshm_procs_join(procs, 20000, NULL));
	tshm_procs_destroy(procs);
}

/*
 * A worker that overwrote the shared board's first failure with no rank:
 * join says so (-EBADMSG) instead of indexing the board with it (it
 * crashed).  SPAWN workers have no mapping of the board: nothing to see.
 */
TEST_F(sp, scribbled_board)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 2);
	struct behave_arg b = { { B_SCRIBBLE, B_SCRIBBLE } };
	struct tshm_procs *procs;
	struct tshm_failure f;
	int ret;

	ASSERT_NE(NULL, a);
	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	ret = tshm_procs_join(procs, 20000, &f);
	printf("# %s join: %d %s\n", tshm_start_method_name(variant->method),
	       ret, f.summary);
	if (variant->method == TSHM_START_SPAWN) {
		EXPECT_EQ(0, ret);
	} else {
		EXPECT_EQ(-EBADMSG, ret);
		EXPECT_EQ(-1, f.rank);
		EXPECT_NE(NULL, strstr(f.summary, "overwritten"));
	}
	tshm_procs_destroy(procs);
}

/* Nothing but the set's own processes holds the caller's fds. */
TEST_F(sp, caller_fds_not_held)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 2);
	struct behave_arg b = { { B_SLEEP300, B_SLEEP300 } };
	struct tshm_procs *procs;
	struct pollfd pfd;
	int p[2];

	if (variant->method == TSHM_START_FORK) {
		tshm_spawn_attr_destroy(a);
		SKIP(return, "fork workers inherit every fd by design");
	}
	ASSERT_EQ(0, pipe(p));
	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	tshm_spawn_attr_add_queue(a, self->q);
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	/* Our write end was the only one: the reader sees EOF now. */
	close(p[1]);
	pfd.fd = p[0];
	pfd.events = POLLIN;
	EXPECT_EQ(1, poll(&pfd, 1, 100));
	EXPECT_TRUE(pfd.revents & POLLHUP);
	close(p[0]);
	EXPECT_EQ(0, tshm_procs_join(procs, 20000, NULL));
	tshm_procs_destroy(procs);
}

static bool maps_mention(pid_t pid, const char *what)
{
	char path[64], line[4096];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "r");
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		found |= strstr(line, what) != NULL;
	fclose(f);
	return found;
}

struct spawn_call {
	struct tshm_ctx *ctx;
	struct tshm_spawn_attr *attr;
	struct tshm_procs *procs;
	int ret;
};

static void *spawn_in_thread(void *arg)
{
	struct spawn_call *c = arg;

	c->ret = tshm_spawn(c->ctx, c->attr, &c->procs);
	return NULL;
}

/*
 * An ELF object with written anonymous memory right after it, where an
 * object's .bss would be: this program mapped again, then @len bytes.
 * Returns the start of it all (@*total bytes), or MAP_FAILED.
 */
static char *object_then_memory(size_t len, size_t *total)
{
	size_t page = (size_t)getpagesize(), file;
	struct stat st;
	char *at;
	int fd;

	fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0)
		return MAP_FAILED;
	file = ((size_t)st.st_size + page - 1) & ~(page - 1);
	*total = file + len;
	at = mmap(NULL, *total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (at != MAP_FAILED &&
	    (mmap(at, file, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED,
		  fd, 0) == MAP_FAILED ||
	     mmap(at + file, len, PROT_READ | PROT_WRITE,
		  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)) {
		munmap(at, *total);
		at = MAP_FAILED;
	}
	close(fd);
	if (at != MAP_FAILED)
		memset(at + file, 1, len);
	return at;
}

/*
 * Once the set runs, the supervisor holds none of the caller's memory: not
 * its private pages (a copy-on-write image the caller's later writes would
 * double: mmap()ed, malloc()ed, right after an ELF object where its .bss
 * would be), not its shared mappings (segments it would keep alive).
 * @thread: tshm_spawn() is called from a thread whose stack is the top of
 * a mapping that also holds 64 MiB of data: the supervisor runs on that
 * stack, keeps its TLS, and must let go of the rest.
 */
static void let_go(struct __test_metadata *_metadata, FIXTURE_DATA(sp) *self,
		   const FIXTURE_VARIANT(sp) *variant, bool thread)
{
	const size_t big = 128 << 20, shared = 64 << 20;
	const size_t data = 64 << 20, stack = 8 << 20;
	struct behave_arg b = { { B_HANG, B_HANG } };
	struct spawn_call c = { .ctx = self->ctx };
	char *priv, *heap, *shm, *obj, *region;
	size_t obj_len;
	pthread_attr_t ta;
	long anon = -1;
	pthread_t t;
	pid_t sup;
	int fd;

	priv = mmap(NULL, big, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, priv);
	memset(priv, 1, big);
	heap = malloc(big);
	ASSERT_NE(NULL, heap);
	memset(heap, 1, big);
	obj = object_then_memory(32 << 20, &obj_len);
	ASSERT_NE(MAP_FAILED, obj);
	fd = memfd_create("tshm-test-let-go", MFD_CLOEXEC);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ftruncate(fd, shared));
	shm = mmap(NULL, shared, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, shm);
	memset(shm, 1, shared);
	close(fd);
	region = mmap(NULL, data + stack, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, region);
	memset(region, 1, data);

	c.attr = mkattr(_metadata, self, variant, "behave", 2);
	ASSERT_EQ(0, tshm_spawn_attr_set_arg(c.attr, &b, sizeof(b)));
	if (thread) {
		ASSERT_EQ(0, pthread_attr_init(&ta));
		ASSERT_EQ(0, pthread_attr_setstack(&ta, region + data, stack));
		ASSERT_EQ(0, pthread_create(&t, &ta, spawn_in_thread, &c));
		ASSERT_EQ(0, pthread_join(t, NULL));
		pthread_attr_destroy(&ta);
	} else {
		spawn_in_thread(&c);
	}
	tshm_spawn_attr_destroy(c.attr);
	ASSERT_EQ(0, c.ret);
	sup = parent_of(tshm_procs_pid(c.procs, 0));
	ASSERT_LT(1, sup);
	/* It lets go right after telling us the set runs. */
	for (int i = 0; i < 1000; i++) {
		anon = status_field(sup, "RssAnon");
		if (anon >= 0 && anon < 16 << 10 &&
		    !maps_mention(sup, "tshm-test-let-go"))
			break;
		usleep(10000);
	}
	TH_LOG("supervisor %d: RssAnon %ld kB, RssShmem %ld kB", sup, anon,
	       status_field(sup, "RssShmem"));
	EXPECT_LE(0, anon);
	EXPECT_GT(16 << 10, anon);
	EXPECT_FALSE(maps_mention(sup, "tshm-test-let-go"));
	munmap(priv, big);
	free(heap);
	munmap(obj, obj_len);
	munmap(shm, shared);
	munmap(region, data + stack);
	/* It still does its job: terminate, reap, report. */
	EXPECT_EQ(0, tshm_procs_terminate(c.procs));
	EXPECT_EQ(0, tshm_procs_join(c.procs, 20000, NULL));
	tshm_procs_destroy(c.procs);
}

#ifdef __SANITIZE_ADDRESS__
#define SKIP_LET_GO()							\
	SKIP(return, "under ASan the supervisor keeps everything (its shadow)")
#else
#define SKIP_LET_GO()							\
	do {								\
		if (variant->method == TSHM_START_FORKSERVER)		\
			SKIP(return, "forkserver: forked before the memory "\
			     "existed, its supervisors never had it");	\
	} while (0)
#endif

TEST_F(sp, supervisor_lets_go_of_caller_memory)
{
	SKIP_LET_GO();
	let_go(_metadata, self, variant, false);
}

TEST_F(sp, supervisor_of_a_thread_lets_go_of_caller_memory)
{
	SKIP_LET_GO();
	let_go(_metadata, self, variant, true);
}

TEST_F(sp, no_context)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant, "fds", 2);
	struct tshm_procs *procs;
	struct tshm_failure f;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &self->canaries,
					     sizeof(self->canaries)));
	if (variant->method == TSHM_START_FORK) {
		/* Inherited canaries would trip w_fds: run "behave". */
		static struct behave_arg b;

		tshm_spawn_attr_set_entry(a, "behave");
		tshm_spawn_attr_set_arg(a, &b, sizeof(b));
	}
	ASSERT_EQ(0, tshm_spawn(NULL, a, &procs));
	tshm_spawn_attr_destroy(a);
	EXPECT_EQ(0, tshm_procs_join(procs, 20000, &f));
	tshm_procs_destroy(procs);
	/* Queues need a context. */
	a = mkattr(_metadata, self, variant, "exchange", 1);
	tshm_spawn_attr_add_queue(a, self->q);
	EXPECT_EQ(-EINVAL, tshm_spawn(NULL, a, &procs));
	tshm_spawn_attr_destroy(a);
}

TEST_F(sp, many_workers)
{
	struct tshm_spawn_attr *a = mkattr(_metadata, self, variant,
					   "behave", 32);
	struct behave_arg b = { { 0 } };
	struct tshm_procs *procs;
	struct tshm_failure f;

	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &b, sizeof(b)));
	ASSERT_EQ(0, tshm_spawn(self->ctx, a, &procs));
	tshm_spawn_attr_destroy(a);
	EXPECT_EQ(32, tshm_procs_nprocs(procs));
	EXPECT_EQ(0, tshm_procs_join(procs, 30000, &f));
	tshm_procs_destroy(procs);
}

/* ---- bad input ---- */

static int not_registered(int rank, int nprocs, void *arg)
{
	return 0;
}

TEST_F(sp, bad_input)
{
	struct tshm_spawn_attr *a;
	struct tshm_procs *procs = (void *)1;
	int x = 0;

	ASSERT_EQ(0, tshm_spawn_attr_create(&a));
	ASSERT_EQ(0, tshm_spawn_attr_set_method(a, variant->method));
	ASSERT_EQ(0, tshm_spawn_attr_set_forkserver(a, self->fs));
	EXPECT_EQ(-EINVAL, tshm_spawn_attr_set_nprocs(a, 0));
	EXPECT_EQ(-EINVAL, tshm_spawn_attr_set_nprocs(a, -3));
	EXPECT_EQ(-E2BIG, tshm_spawn_attr_set_nprocs(a,
						     TSHM_SPAWN_MAX_PROCS + 1));
	EXPECT_EQ(-EINVAL, tshm_spawn_attr_set_method(a, 17));
	EXPECT_EQ(-EINVAL, tshm_spawn_attr_set_fn(a, NULL));
	EXPECT_EQ(-EINVAL, tshm_spawn_attr_set_entry(a, ""));
	EXPECT_EQ(-EINVAL, tshm_spawn_attr_set_threads(a, -1));
	EXPECT_EQ(-EINVAL, tshm_spawn_attr_set_grace_ms(a, -1));
	EXPECT_EQ(-EINVAL, tshm_spawn(self->ctx, NULL, &procs));
	EXPECT_EQ(NULL, procs);
	/* Nothing to run. */
	EXPECT_EQ(-EINVAL, tshm_spawn(self->ctx, a, &procs));
	/* An unknown entry. */
	ASSERT_EQ(0, tshm_spawn_attr_set_entry(a, "no-such-entry"));
	EXPECT_EQ(-ENOENT, tshm_spawn(self->ctx, a, &procs));
	/* A function spawn cannot find by name. */
	ASSERT_EQ(0, tshm_spawn_attr_set_fn(a, not_registered));
	EXPECT_EQ(variant->method == TSHM_START_SPAWN ? -ENOENT : 0,
		  tshm_spawn(self->ctx, a, &procs));
	if (variant->method != TSHM_START_SPAWN) {
		EXPECT_EQ(0, tshm_procs_join(procs, 20000, NULL));
		tshm_procs_destroy(procs);
	}
	/* A raw pointer means nothing in an exec'ed or forkserver worker. */
	ASSERT_EQ(0, tshm_spawn_attr_set_entry(a, "behave"));
	ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, &x, 0));
	EXPECT_EQ(variant->method == TSHM_START_FORK ? 0 : -EINVAL,
		  tshm_spawn(self->ctx, a, &procs));
	if (variant->method == TSHM_START_FORK) {
		EXPECT_EQ(0, tshm_procs_join(procs, 20000, NULL));
		tshm_procs_destroy(procs);
	}
	/* Forkserver without a server. */
	if (variant->method == TSHM_START_FORKSERVER) {
		ASSERT_EQ(0, tshm_spawn_attr_set_arg(a, NULL, 0));
		ASSERT_EQ(0, tshm_spawn_attr_set_forkserver(a, NULL));
		EXPECT_EQ(-EINVAL, tshm_spawn(self->ctx, a, &procs));
	}
	tshm_spawn_attr_destroy(a);
	EXPECT_EQ(0, count_children(self->fspid));
}

/* Count tasks of @uid (threads included: RLIMIT_NPROC counts them). */
static int count_user_tasks(uid_t uid)
{
	struct dirent *d;
	DIR *dir = opendir("/proc");
	int n = 0;

	if (!dir)
		return -1;
	while ((d = readdir(dir))) {
		char path[300], line[256];
		unsigned ruid = ~0U;
		int threads = 0;
		FILE *f;

		if (d->d_name[0] < '1' || d->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/status", d->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			sscanf(line, "Uid: %u", &ruid);
			sscanf(line, "Threads: %d", &threads);
		}
		fclose(f);
		if (ruid == uid)
			n += threads;
	}
	closedir(dir);
	return n;
}

static int become_nobody(void)
{
	if (setgroups(0, NULL) || setgid(NOBODY) || setuid(NOBODY))
		return -errno;
	return 0;
}

/* As nobody: every method works; RLIMIT_NPROC gives -EAGAIN, nothing left. */
TEST_F(sp, as_nobody)
{
	pid_t pid = fork();

	ASSERT_LE(0, pid);
	if (pid == 0) {
		struct tshm_spawn_attr *a;
		struct tshm_procs *procs;
		struct tshm_forkserver *fs = NULL;
		struct behave_arg b = { { B_HANG, B_HANG, B_HANG, B_HANG,
					  B_HANG, B_HANG, B_HANG, B_HANG } };
		struct rlimit rl;
		int ret, n;

		if (become_nobody())
			_exit(10);
		/* The fixture's server runs as root: make our own. */
		if (variant->method == TSHM_START_FORKSERVER &&
		    tshm_forkserver_create(&fs))
			_exit(11);
		self->fs = fs;
		ret = do_exchange(_metadata, self, variant, 3);
		if (ret) {
			printf("# exchange as nobody: %d\n", ret);
			fflush(stdout);
			_exit(12);
		}
		/* A server keeps the limits it was created with. */
		tshm_forkserver_destroy(fs);
		fs = NULL;
		if (settle_children(-1, 2000))
			_exit(18);
		/* Room for a server, the supervisor and two workers. */
		n = count_user_tasks(NOBODY);
		rl.rlim_cur = rl.rlim_max = (rlim_t)n + 4;
		if (setrlimit(RLIMIT_NPROC, &rl))
			_exit(13);
		if (variant->method == TSHM_START_FORKSERVER &&
		    tshm_forkserver_create(&fs))
			_exit(11);
		self->fs = fs;
		a = mkattr(_metadata, self, variant, "behave", 8);
		tshm_spawn_attr_set_arg(a, &b, sizeof(b));
		ret = tshm_spawn(self->ctx, a, &procs);
		if (ret != -EAGAIN) {
			printf("# RLIMIT_NPROC spawn: %d, want -EAGAIN\n", ret);
			fflush(stdout);
			_exit(14);
		}
		if (settle_children(fs ? tshm_forkserver_pid(fs) : -1, 2000))
			_exit(15);
		/* Nothing to run at all. */
		rl.rlim_cur = rl.rlim_max = 1;
		setrlimit(RLIMIT_NPROC, &rl);
		ret = tshm_spawn(self->ctx, a, &procs);
		if (ret != -EAGAIN) {
			printf("# RLIMIT_NPROC=1 spawn: %d, want -EAGAIN\n", ret);
			fflush(stdout);
			_exit(16);
		}
		tshm_spawn_attr_destroy(a);
		tshm_forkserver_destroy(fs);
		_exit(settle_children(-1, 2000) ? 17 : 0);
	}
	ASSERT_EQ(pid, waitpid(pid, &pid, 0));
	EXPECT_TRUE(WIFEXITED(pid));
	EXPECT_EQ(0, WEXITSTATUS(pid));
}

/* execve() of the program fails: the error comes back, nothing runs. */
TEST(exec_failure)
{
	char path[] = "/tmp/tshm-spawn-test-XXXXXX";
	int in, out, st;
	char buf[65536];
	ssize_t n;
	pid_t pid;

	ASSERT_EQ(0, prctl(PR_SET_CHILD_SUBREAPER, 1));
	out = mkstemp(path);
	ASSERT_LE(0, out);
	in = open("/proc/self/exe", O_RDONLY);
	ASSERT_LE(0, in);
	while ((n = read(in, buf, sizeof(buf))) > 0)
		ASSERT_EQ(n, write(out, buf, n));
	close(in);
	ASSERT_EQ(0, fchmod(out, 0755));
	close(out);
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		execl(path, path, "--exec-failure-child", NULL);
		_exit(100);
	}
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	unlink(path);
	EXPECT_TRUE(WIFEXITED(st));
	EXPECT_EQ(0, WEXITSTATUS(st));
	EXPECT_EQ(0, settle_children(-1, 2000));
}

/* In the copy: make ourselves unexecutable, then spawn. */
static int exec_failure_child(void)
{
	struct tshm_spawn_attr *a;
	struct tshm_procs *procs;
	struct behave_arg b = { { 0 } };
	siginfo_t si;
	int ret;

	if (chmod("/proc/self/exe", 0))
		return 1;
	if (tshm_spawn_attr_create(&a) ||
	    tshm_spawn_attr_set_method(a, TSHM_START_SPAWN) ||
	    tshm_spawn_attr_set_entry(a, "behave") ||
	    tshm_spawn_attr_set_nprocs(a, 3) ||
	    tshm_spawn_attr_set_arg(a, &b, sizeof(b)))
		return 2;
	ret = tshm_spawn(NULL, a, &procs);
	tshm_spawn_attr_destroy(a);
	if (ret != -EACCES) {
		printf("# spawn of an unexecutable program: %d, want -EACCES\n",
		       ret);
		return 3;
	}
	/* The supervisor was reaped, and it reaped its workers. */
	if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG) == 0 || errno != ECHILD)
		return 4;
	return 0;
}

static void __attribute__((constructor)) __constructor_order_last(void)
{
	if (!__constructor_order)
		__constructor_order = _CONSTRUCTOR_ORDER_BACKWARD;
}

int main(int argc, char **argv)
{
	struct tshm_ctx *ctx;

	if (argc > 1 && !strcmp(argv[1], "--exec-failure-child"))
		return exec_failure_child();
	if (tshm_ctx_open(&ctx, 0) == 0) {
		printf("# tshm backend: %s\n", tshm_ctx_backend(ctx));
		fflush(stdout);
		tshm_ctx_close(ctx);
	}
	return test_harness_run(argc, argv);
}
