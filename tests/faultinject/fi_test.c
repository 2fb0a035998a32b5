// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko's error paths, driven by fault injection (the debug kernel of
 * scripts/build-debug-kernel: failslab, fail_page_alloc, fail_usercopy).
 *
 * For every operation (each ioctl, opening a context, mmap, a page fault,
 * splitting and forking a mapping, reading /proc/tshm, loading the module)
 * the test makes the Nth slab allocation, page allocation or user copy of
 * the calling thread fail (/proc/thread-self/fail-nth), for N = 1, 2, ...
 * until the operation completes without reaching an Nth point: every
 * failure point on the operation's path is hit once.  Each injected
 * failure must end in the documented errno (ENOMEM, EFAULT) or be absorbed
 * (the operation succeeds: a fallback, a retried fault), and must leave
 * nothing behind: no segment, grant, holder, fd or mapping more than
 * before.  At the end /proc/tshm is empty, Shmem is back at its baseline,
 * the module unloads, and loads again through its own error paths.
 * vm-run --debug then scans kmemleak and fails on any kernel report.
 *
 * Each operation's failure points are reported as "# fi: OP: ..." lines:
 * how many were hit (N values that failed), the errnos they gave, and how
 * many distinct call sites they were (from the injection's stack trace in
 * the kernel log: the first two frames above the allocator).
 *
 * TSHM_FI_MAX_N bounds N per operation (default 3000).
 */
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "kselftest_harness.h"
#include "tshm_test.h"

#define SEGSZ		(64UL * 1024)
#define MAX_SITES	512

static const char * const fi_caps[] = {
	"failslab", "fail_page_alloc", "fail_usercopy",
};

/* Lift the defaults that would skip GFP_KERNEL and order-0 allocations. */
static int fi_knobs(void)
{
	static const char * const knobs[][2] = {
		{ "failslab/ignore-gfp-wait", "N" },
		{ "fail_page_alloc/ignore-gfp-wait", "N" },
		{ "fail_page_alloc/ignore-gfp-highmem", "N" },
		{ "fail_page_alloc/min-order", "0" },
	};
	char path[256];
	unsigned int i;

	if (access("/proc/thread-self/fail-nth", W_OK))
		return -1;
	for (i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++) {
		snprintf(path, sizeof(path), "/sys/kernel/debug/%s", knobs[i][0]);
		if (tt_write_file(path, knobs[i][1]))
			return -1;
	}
	/* A stack trace for every injection, none rate limited. */
	for (i = 0; i < sizeof(fi_caps) / sizeof(fi_caps[0]); i++) {
		snprintf(path, sizeof(path), "/sys/kernel/debug/%s/verbose", fi_caps[i]);
		if (tt_write_file(path, "2"))
			return -1;
		snprintf(path, sizeof(path),
			 "/sys/kernel/debug/%s/verbose_ratelimit_interval_ms", fi_caps[i]);
		if (tt_write_file(path, "0"))
			return -1;
	}
	return 0;
}

#define FI_NEED()							\
	do {								\
		if (fi_knobs())						\
			SKIP(return, "no fault injection (needs the debug kernel, root)"); \
	} while (0)

/* One operation's tally. */
struct fi_op {
	const char *name;
	int fail_nth;		/* /proc/thread-self/fail-nth */
	int kmsg;		/* /dev/kmsg, read after each injection */
	unsigned int points, absorbed, enomem, efault, enospc, other;
	unsigned int injections;	/* seen in the kernel log */
	unsigned int nsites;
	char *sites[MAX_SITES];
};

static void fi_open(struct __test_metadata *_metadata, struct fi_op *op,
		    const char *name)
{
	memset(op, 0, sizeof(*op));
	op->name = name;
	op->fail_nth = open("/proc/thread-self/fail-nth", O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, op->fail_nth);
	op->kmsg = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	ASSERT_LE(0, op->kmsg);
	lseek(op->kmsg, 0, SEEK_END);
}

static void fi_arm(struct fi_op *op, unsigned int n)
{
	char buf[16];
	int len = snprintf(buf, sizeof(buf), "%u", n);

	if (pwrite(op->fail_nth, buf, len, 0) != len)
		abort();
}

/*
 * Disarm; true if the armed failure was injected.  Reading fail-nth copies
 * to user space, itself a failure point: the value read is the one from
 * before that copy, and an EFAULT means the copy took the last count, so
 * the operation did not reach it.  Writing 0 disarms what is left.
 */
static bool fi_fired(struct fi_op *op)
{
	char buf[16] = "";
	ssize_t n = pread(op->fail_nth, buf, sizeof(buf) - 1, 0);

	if (n < 0)
		return false;
	if (strtoul(buf, NULL, 10) == 0)
		return true;
	(void)!pwrite(op->fail_nth, "0", 1, 0);
	return false;
}

/* Frames of the injection machinery and the allocators: not the site. */
static bool fi_frame_is_allocator(const char *fn)
{
	static const char * const pfx[] = {
		"dump_stack", "should_fail", "__should_fail", "fail_dump",
		"slab_", "kmem_cache_alloc", "__kmem_cache_alloc", "kmalloc",
		"__kmalloc", "kzalloc", "kmem_cache_zalloc", "__alloc_pages",
		"alloc_pages", "__folio_alloc", "folio_alloc", "vma_alloc_folio",
		"prepare_alloc_pages", "_copy_", "copy_", "__copy_",
		"memdup_user", "strndup_user", "kstrdup", "kmemdup",
		"__get_free_pages", "get_zeroed_page", "__vmalloc", "vmalloc",
		"vzalloc", "kvmalloc", "kvzalloc", "__kvmalloc", "allocate_slab",
		"new_slab", "___slab_alloc", "__slab_alloc", "kasan_",
		"__kasan", "alloc_page_interleave", "kmalloc_trace",
		"strncpy_from_user", "__do_kmalloc", "do_kmalloc",
		"kstrtouint_from_user", "simple_read_from_buffer",
	};
	unsigned int i;

	for (i = 0; i < sizeof(pfx) / sizeof(pfx[0]); i++)
		if (!strncmp(fn, pfx[i], strlen(pfx[i])))
			return true;
	return false;
}

/*
 * Read the kernel log written since the last call; for each injection
 * ("FAULT_INJECTION: forcing a failure" then a stack trace) take the first
 * two frames above the allocator as its call site.
 */
static void fi_collect_sites(struct fi_op *op)
{
	char rec[2048], site[256] = "";
	int depth = -1, i;
	ssize_t n;

	for (;;) {
		char *msg, *fn, *end;

		n = read(op->kmsg, rec, sizeof(rec) - 1);
		if (n < 0) {
			if (errno == EPIPE)	/* overwritten: go on */
				continue;
			break;
		}
		rec[n] = 0;
		msg = strchr(rec, ';');
		if (!msg)
			continue;
		msg++;
		if (strstr(msg, "FAULT_INJECTION: forcing a failure")) {
			op->injections++;
			depth = 0;
			site[0] = 0;
			continue;
		}
		if (depth < 0)
			continue;
		/* " func+0x1b/0x40 [module]"; "? func" frames are guesses. */
		fn = msg + strspn(msg, " ");
		if (!strncmp(fn, "? ", 2) || !strchr(fn, '+') || strchr(fn, ':'))
			continue;
		end = strchr(fn, '+');
		*end = 0;
		if (fi_frame_is_allocator(fn) && depth == 0)
			continue;
		if (depth)
			strncat(site, " < ", sizeof(site) - strlen(site) - 1);
		strncat(site, fn, sizeof(site) - strlen(site) - 1);
		if (++depth < 2)
			continue;
		depth = -1;
		for (i = 0; i < (int)op->nsites; i++)
			if (!strcmp(op->sites[i], site))
				break;
		if (i == (int)op->nsites && op->nsites < MAX_SITES)
			op->sites[op->nsites++] = strdup(site);
	}
}

/* Tally one injected failure: the operation's result, -errno or >= 0. */
static void fi_count(struct __test_metadata *_metadata, struct fi_op *op,
		     unsigned int n, long ret, const int *ok_errnos)
{
	op->points++;
	fi_collect_sites(op);
	if (ret >= 0) {
		op->absorbed++;
		return;
	}
	if (ret == -ENOMEM)
		op->enomem++;
	else if (ret == -EFAULT)
		op->efault++;
	else if (ret == -ENOSPC)
		op->enospc++;
	else
		op->other++;
	for (; *ok_errnos; ok_errnos++)
		if (-ret == *ok_errnos)
			return;
	EXPECT_EQ(0, ret) TH_LOG("%s: failure point %u gave %s, not a documented errno",
				 op->name, n, strerror(-ret));
}

static void fi_report(struct fi_op *op)
{
	unsigned int i;

	printf("# fi: %s: %u failure points, %u distinct call sites; ENOMEM %u, EFAULT %u, ENOSPC %u, other %u, absorbed %u\n",
	       op->name, op->points, op->nsites, op->enomem, op->efault,
	       op->enospc, op->other, op->absorbed);
	for (i = 0; i < op->nsites; i++) {
		printf("#   site: %s\n", op->sites[i]);
		free(op->sites[i]);
	}
	/* The harness ends each test with _exit(): flush before. */
	fflush(stdout);
	close(op->fail_nth);
	close(op->kmsg);
}

static long fi_max_n(void)
{
	const char *e = getenv("TSHM_FI_MAX_N");

	return e && atol(e) > 0 ? atol(e) : 3000;
}

static int fi_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/*
 * FI_LOOP(op, ok_errnos) { setup; arm; ret = ...; after; check; teardown }:
 * the body runs for N = 1, 2, ... with op's fail-nth armed by FI_ARM() just
 * before the operation and FI_FIRED() right after it.
 */
static const int fi_ioctl_errnos[] = { ENOMEM, EFAULT, 0 };
/* shmem_file_setup() says ENOSPC when it cannot allocate the inode. */
static const int fi_create_errnos[] = { ENOMEM, EFAULT, ENOSPC, 0 };
static const int fi_mm_errnos[] = { ENOMEM, 0 };
static const int fi_fork_errnos[] = { ENOMEM, EAGAIN, 0 };

/* The state an operation must leave as it found it when it fails. */
struct fi_state {
	int segs, fds;
	unsigned int holders, grants;
};

static void fi_state(struct fi_state *s, int seg)
{
	struct tshm_info info;

	s->segs = tt_proc_count();
	s->fds = fi_count_fds();
	s->holders = s->grants = 0;
	if (seg >= 0 && !tt_info(seg, &info)) {
		s->holders = info.holders;
		s->grants = info.grants;
	}
}

#define FI_SAME_STATE(before, seg)					\
	do {								\
		struct fi_state __after;				\
		fi_state(&__after, seg);				\
		EXPECT_EQ((before).segs, __after.segs);			\
		EXPECT_EQ((before).fds, __after.fds);			\
		EXPECT_EQ((before).holders, __after.holders);		\
		EXPECT_EQ((before).grants, __after.grants);		\
	} while (0)

#define FI_BEGIN(opname)						\
	struct fi_op op;						\
	unsigned int n;							\
	long maxn = fi_max_n();						\
	FI_NEED();							\
	fi_open(_metadata, &op, opname);				\
	for (n = 1; n <= maxn; n++)

#define FI_END()							\
	do {								\
		EXPECT_GT(maxn + 1, n) TH_LOG("%s: more than %ld points", op.name, maxn); \
		fi_report(&op);						\
	} while (0)

/* Each test walks every failure point of one operation: minutes, not 30 s. */
#define FI_TIMEOUT	900

FIXTURE(faults) {
	int unused;
};

FIXTURE_SETUP(faults)
{
}

FIXTURE_TEARDOWN(faults)
{
}

TEST_F_TIMEOUT(faults, ctx_open, FI_TIMEOUT)
{
	FI_BEGIN("open /dev/tshm") {
		struct fi_state before;
		long ret;

		fi_state(&before, -1);
		fi_arm(&op, n);
		ret = tt_open();
		if (!fi_fired(&op)) {
			ASSERT_LE(0, ret);
			close(ret);
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_ioctl_errnos);
		if (ret >= 0) {
			close(ret);
		} else {
			FI_SAME_STATE(before, -1);
		}
	}
	FI_END();
}

static void fi_create(struct __test_metadata *_metadata, const char *name,
		      uint32_t flags, uint64_t size)
{
	int ctx = tt_open();

	ASSERT_LE(0, ctx);
	FI_BEGIN(name) {
		struct fi_state before;
		long ret;

		fi_state(&before, -1);
		fi_arm(&op, n);
		ret = tt_create(ctx, size, flags, "fi", NULL);
		if (!fi_fired(&op)) {
			ASSERT_LE(0, ret);
			close(ret);
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_create_errnos);
		if (ret >= 0) {
			close(ret);
		} else {
			FI_SAME_STATE(before, -1);
		}
	}
	FI_END();
	close(ctx);
	EXPECT_EQ(0, tt_proc_count());
}

TEST_F_TIMEOUT(faults, create, FI_TIMEOUT)
{
	fi_create(_metadata, "CREATE", 0, SEGSZ);
}

TEST_F_TIMEOUT(faults, create_prefault, FI_TIMEOUT)
{
	fi_create(_metadata, "CREATE prefault", TSHM_CREATE_PREFAULT, SEGSZ);
}

TEST_F_TIMEOUT(faults, create_huge, FI_TIMEOUT)
{
	fi_create(_metadata, "CREATE huge prefault",
		  TSHM_CREATE_HUGE | TSHM_CREATE_PREFAULT, 2 * TT_MIB);
}

/* A context and a segment created in it, for the other operations. */
struct fi_seg {
	int ctx, seg;
	uint64_t id;
};

static void fi_seg_new(struct __test_metadata *_metadata, struct fi_seg *s)
{
	s->ctx = tt_open();
	ASSERT_LE(0, s->ctx);
	s->seg = tt_create(s->ctx, SEGSZ, 0, "fi", &s->id);
	ASSERT_LE(0, s->seg);
}

static void fi_seg_del(struct __test_metadata *_metadata, struct fi_seg *s)
{
	close(s->seg);
	close(s->ctx);
	EXPECT_EQ(0, tt_proc_count());
}

TEST_F_TIMEOUT(faults, grant, FI_TIMEOUT)
{
	struct fi_seg s;

	fi_seg_new(_metadata, &s);
	FI_BEGIN("GRANT") {
		struct fi_state before;
		uint64_t total;
		long ret;

		fi_state(&before, s.seg);
		fi_arm(&op, n);
		ret = tt_grant(s.seg, s.ctx, 1, &total);
		if (!fi_fired(&op)) {
			ASSERT_EQ(0, ret);
			ASSERT_EQ(0, tt_drop(s.ctx, s.id, 1));
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_ioctl_errnos);
		if (ret >= 0) {
			ASSERT_EQ(0, tt_drop(s.ctx, s.id, 1));
		} else {
			FI_SAME_STATE(before, s.seg);
		}
	}
	FI_END();
	fi_seg_del(_metadata, &s);
}

TEST_F_TIMEOUT(faults, attach, FI_TIMEOUT)
{
	struct fi_seg s;

	fi_seg_new(_metadata, &s);
	FI_BEGIN("ATTACH") {
		struct fi_state before;
		long ret;

		ASSERT_EQ(0, tt_grant(s.seg, s.ctx, 1, NULL));
		fi_state(&before, s.seg);
		fi_arm(&op, n);
		ret = tt_attach(s.ctx, s.id, 0, NULL);
		if (!fi_fired(&op)) {
			ASSERT_LE(0, ret);
			close(ret);
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_ioctl_errnos);
		if (ret >= 0) {
			close(ret);
		} else {
			/* The grant is still there to consume. */
			FI_SAME_STATE(before, s.seg);
			ASSERT_EQ(0, tt_drop(s.ctx, s.id, 1));
		}
	}
	FI_END();
	fi_seg_del(_metadata, &s);
}

TEST_F_TIMEOUT(faults, drop, FI_TIMEOUT)
{
	struct fi_seg s;

	fi_seg_new(_metadata, &s);
	FI_BEGIN("DROP") {
		struct fi_state before;
		long ret;

		ASSERT_EQ(0, tt_grant(s.seg, s.ctx, 1, NULL));
		fi_state(&before, s.seg);
		fi_arm(&op, n);
		ret = tt_drop(s.ctx, s.id, 1);
		if (!fi_fired(&op)) {
			ASSERT_EQ(0, ret);
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_ioctl_errnos);
		if (ret < 0) {
			FI_SAME_STATE(before, s.seg);
			ASSERT_EQ(0, tt_drop(s.ctx, s.id, 1));
		}
	}
	FI_END();
	fi_seg_del(_metadata, &s);
}

TEST_F_TIMEOUT(faults, info, FI_TIMEOUT)
{
	struct fi_seg s;

	fi_seg_new(_metadata, &s);
	FI_BEGIN("INFO") {
		struct tshm_info info;
		long ret;

		fi_arm(&op, n);
		ret = tt_info(s.seg, &info);
		if (!fi_fired(&op)) {
			ASSERT_EQ(0, ret);
			ASSERT_EQ(s.id, info.id);
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_ioctl_errnos);
	}
	FI_END();
	fi_seg_del(_metadata, &s);
}

static long fi_ret_ptr(void *p)
{
	return p == MAP_FAILED ? -errno : 0;
}

TEST_F_TIMEOUT(faults, mmap_seg, FI_TIMEOUT)
{
	struct fi_seg s;

	fi_seg_new(_metadata, &s);
	FI_BEGIN("mmap") {
		struct fi_state before;
		void *p;
		long ret;

		fi_state(&before, s.seg);
		fi_arm(&op, n);
		p = mmap(NULL, SEGSZ, PROT_READ | PROT_WRITE, MAP_SHARED, s.seg, 0);
		ret = fi_ret_ptr(p);
		if (!fi_fired(&op)) {
			ASSERT_EQ(0, ret);
			ASSERT_EQ(0, munmap(p, SEGSZ));
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_mm_errnos);
		if (ret == 0) {
			ASSERT_EQ(0, munmap(p, SEGSZ));
		} else {
			FI_SAME_STATE(before, s.seg);
		}
	}
	FI_END();
	fi_seg_del(_metadata, &s);
}

/* First write to every page of a fresh segment: shmem's fault path. */
TEST_F_TIMEOUT(faults, fault, FI_TIMEOUT)
{
	FI_NEED();
	struct fi_op op;
	unsigned int n;
	long maxn = fi_max_n();

	fi_open(_metadata, &op, "page fault");
	for (n = 1; n <= maxn; n++) {
		struct fi_seg s;
		uint32_t *p;
		size_t i;
		bool fired;

		fi_seg_new(_metadata, &s);
		p = mmap(NULL, SEGSZ, PROT_READ | PROT_WRITE, MAP_SHARED, s.seg, 0);
		ASSERT_NE(MAP_FAILED, p);
		fi_arm(&op, n);
		for (i = 0; i < SEGSZ / 4; i += 1024)
			p[i] = i;
		fired = fi_fired(&op);
		for (i = 0; i < SEGSZ / 4; i += 1024)
			ASSERT_EQ(i, p[i]);
		ASSERT_EQ(0, munmap(p, SEGSZ));
		fi_seg_del(_metadata, &s);
		if (!fired)
			break;
		/* A failed fault is retried: the write always lands. */
		fi_count(_metadata, &op, n, 0, fi_mm_errnos);
	}
	FI_END();
}

/* munmap of a middle page splits the VMA: allocations on the way. */
TEST_F_TIMEOUT(faults, munmap_split, FI_TIMEOUT)
{
	struct fi_seg s;

	fi_seg_new(_metadata, &s);
	FI_BEGIN("munmap (split)") {
		struct fi_state before;
		char *p;
		long ret;

		p = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, s.seg, 0);
		ASSERT_NE(MAP_FAILED, p);
		p[0] = 1, p[4096] = 2, p[8192] = 3;
		fi_state(&before, s.seg);
		fi_arm(&op, n);
		ret = munmap(p + 4096, 4096) ? -errno : 0;
		if (!fi_fired(&op)) {
			ASSERT_EQ(0, ret);
			munmap(p, 3 * 4096);
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_mm_errnos);
		if (ret) {
			FI_SAME_STATE(before, s.seg);
			ASSERT_EQ(2, p[4096]);
		}
		ASSERT_EQ(1, p[0]);
		ASSERT_EQ(3, p[8192]);
		munmap(p, 3 * 4096);
	}
	FI_END();
	fi_seg_del(_metadata, &s);
}

/* What the expendable runner of fi_fork_run() tells the test. */
struct fi_fork_report {
	long ret;		/* fork(): the child's pid, or -errno */
	int fired;		/* the armed failure was injected */
};

/*
 * The runner: arm fail-nth on itself, fork, disarm, report through the
 * pipe, then wait for the grandchild (which checks the mapping) and exit
 * with its status.  A failure that fork() did not consume can still fire
 * in the runner's own copy-on-write faults after fork() returns (its stack
 * is shared copy-on-write with the grandchild): the runner may die of it,
 * before or after reporting.  That is why it is not the test process.
 */
static void __attribute__((noreturn))
fi_fork_runner(int wfd, const char *p, unsigned int n)
{
	struct fi_fork_report rep = { 0 };
	char buf[16];
	int fnth, len, status;
	pid_t pid;

	fnth = open("/proc/thread-self/fail-nth", O_RDWR | O_CLOEXEC);
	if (fnth < 0)
		_exit(3);
	len = snprintf(buf, sizeof(buf), "%u", n);
	if (pwrite(fnth, buf, len, 0) != len)
		_exit(3);
	pid = fork();
	if (pid == 0)
		_exit(p[0] == 7 ? 0 : 1);
	rep.ret = pid < 0 ? -errno : pid;
	memset(buf, 0, sizeof(buf));
	if (pread(fnth, buf, sizeof(buf) - 1, 0) > 0 && strtoul(buf, NULL, 10) == 0)
		rep.fired = 1;
	(void)!pwrite(fnth, "0", 1, 0);
	if (write(wfd, &rep, sizeof(rep)) != sizeof(rep))
		_exit(3);
	if (pid < 0)
		_exit(0);
	if (waitpid(pid, &status, 0) != pid)
		_exit(3);
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 4);
}

/*
 * fork() copies a tshm mapping: the VMA gets a second user.  The armed
 * fork is made by an expendable child of the test (fi_fork_runner()), so a
 * failure point left armed after fork() can kill only that child.  The test
 * is a child subreaper: a grandchild orphaned by the runner's death comes
 * back to it and is reaped before the state is compared.  A runner that
 * died is counted (a failure point was hit, in fork() or after it); what
 * must hold either way is the kernel's side: the same segments, holders and
 * grants as before, no report (vm-run), and at the end /proc/tshm empty,
 * Shmem at its baseline and the module unloading (zz_unload_and_load).
 */
TEST_F_TIMEOUT(faults, fork_mapping, FI_TIMEOUT)
{
	unsigned int died = 0, died_before_report = 0;
	struct fi_seg s;
	char *p;

	FI_NEED();
	ASSERT_EQ(0, prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0));
	fi_seg_new(_metadata, &s);
	p = mmap(NULL, SEGSZ, PROT_READ | PROT_WRITE, MAP_SHARED, s.seg, 0);
	ASSERT_NE(MAP_FAILED, p);
	p[0] = 7;
	FI_BEGIN("fork with a mapping") {
		struct fi_fork_report rep;
		struct fi_state before;
		unsigned int seen;
		int pfd[2], status;
		pid_t runner;
		ssize_t got;

		fi_state(&before, s.seg);
		fi_collect_sites(&op);
		seen = op.injections;
		ASSERT_EQ(0, pipe2(pfd, O_CLOEXEC));
		runner = fork();
		ASSERT_LE(0, runner);
		if (runner == 0) {
			close(pfd[0]);
			fi_fork_runner(pfd[1], p, n);
		}
		close(pfd[1]);
		got = read(pfd[0], &rep, sizeof(rep));
		close(pfd[0]);
		ASSERT_EQ(runner, waitpid(runner, &status, 0));
		/* Reap the grandchild if the runner's death orphaned it. */
		while (waitpid(-1, NULL, 0) > 0)
			;
		if (WIFSIGNALED(status)) {
			/* Only an injected failure may kill it. */
			fi_collect_sites(&op);
			EXPECT_LT(seen, op.injections)
				TH_LOG("N=%u: the runner died of signal %d with no failure injected",
				       n, WTERMSIG(status));
			died++;
			TH_LOG("N=%u: the runner died of signal %d%s", n,
			       WTERMSIG(status),
			       got == sizeof(rep) ? " after reporting" : "");
		} else {
			/* 0: the grandchild saw the mapping's data. */
			ASSERT_TRUE(WIFEXITED(status));
			ASSERT_EQ(0, WEXITSTATUS(status));
			ASSERT_EQ(sizeof(rep), got);
		}
		if (got != sizeof(rep)) {
			/* Died before it could say: a point was hit. */
			died_before_report++;
			op.points++;
			fi_collect_sites(&op);
			FI_SAME_STATE(before, s.seg);
			continue;
		}
		if (!rep.fired) {
			ASSERT_LT(0, rep.ret);
			break;
		}
		fi_count(_metadata, &op, n, rep.ret, fi_fork_errnos);
		FI_SAME_STATE(before, s.seg);
	}
	FI_END();
	printf("# fi: %s: the armed runner died %u times (%u before reporting)\n",
	       "fork with a mapping", died, died_before_report);
	fflush(stdout);
	ASSERT_EQ(0, munmap(p, SEGSZ));
	fi_seg_del(_metadata, &s);
}

TEST_F_TIMEOUT(faults, proc_read, FI_TIMEOUT)
{
	struct fi_seg s;

	fi_seg_new(_metadata, &s);
	FI_BEGIN("read /proc/tshm") {
		char buf[4096];
		long ret, got = 0;
		int fd;

		fd = open("/proc/tshm", O_RDONLY | O_CLOEXEC);
		ASSERT_LE(0, fd);
		fi_arm(&op, n);
		while ((ret = read(fd, buf, sizeof(buf))) > 0)
			got += ret;
		if (ret < 0)
			ret = -errno;
		close(fd);
		if (!fi_fired(&op)) {
			ASSERT_EQ(0, ret);
			ASSERT_LT(0, got);
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_ioctl_errnos);
	}
	FI_END();
	fi_seg_del(_metadata, &s);
}

/* GRANT by the address of a mapping, the fd closed (issue 16's ABI). */
TEST_F_TIMEOUT(faults, grant_by_addr, FI_TIMEOUT)
{
	struct fi_seg s;
	void *p;

	fi_seg_new(_metadata, &s);
	p = mmap(NULL, SEGSZ, PROT_READ | PROT_WRITE, MAP_SHARED, s.seg, 0);
	ASSERT_NE(MAP_FAILED, p);
	FI_BEGIN("GRANT by address") {
		struct fi_state before;
		long ret;

		fi_state(&before, s.seg);
		fi_arm(&op, n);
		ret = tt_grant_addr(p, s.ctx, 1, TSHM_GRANT_RDONLY, NULL);
		if (!fi_fired(&op)) {
			ASSERT_EQ(0, ret);
			ASSERT_EQ(0, tt_drop_flags(s.ctx, s.id, 1, TSHM_DROP_RDONLY));
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_ioctl_errnos);
		if (ret >= 0) {
			ASSERT_EQ(0, tt_drop_flags(s.ctx, s.id, 1, TSHM_DROP_RDONLY));
		} else {
			FI_SAME_STATE(before, s.seg);
		}
	}
	FI_END();
	ASSERT_EQ(0, munmap(p, SEGSZ));
	fi_seg_del(_metadata, &s);
}

/*
 * Last: nothing is left, the module unloads, and loading it runs through
 * its init error paths (each ends with the module not loaded and nothing
 * registered), then loads it as it was.
 */
TEST_F_TIMEOUT(faults, zz_unload_and_load, FI_TIMEOUT)
{
	const char *ko = getenv("TSHM_MODULE");
	long base_kb = -1, kb;
	int kfd;

	FI_NEED();
	if (!ko)
		SKIP(return, "TSHM_MODULE not set (vm-run sets it)");
	ASSERT_EQ(0, tt_proc_count());
	if (getenv("TSHM_FI_SHMEM_KB"))
		base_kb = atol(getenv("TSHM_FI_SHMEM_KB"));
	kb = tt_shmem_kb();
	TH_LOG("Shmem %ld kB before the run, %ld kB now", base_kb, kb);
	/* Plus the harness's own results page (shared anonymous: shmem). */
	if (base_kb >= 0)
		EXPECT_GE(base_kb + getpagesize() / 1024, kb);
	ASSERT_EQ(0, syscall(SYS_delete_module, "tshm", O_NONBLOCK))
		TH_LOG("rmmod tshm: %s", strerror(errno));
	ASSERT_NE(0, access("/proc/tshm", F_OK));

	kfd = open(ko, O_RDONLY | O_CLOEXEC);
	ASSERT_LE(0, kfd);
	FI_BEGIN("module load") {
		long ret;

		fi_arm(&op, n);
		ret = syscall(SYS_finit_module, kfd, "", 0) ? -errno : 0;
		if (!fi_fired(&op)) {
			ASSERT_EQ(0, ret);
			break;
		}
		fi_count(_metadata, &op, n, ret, fi_ioctl_errnos);
		if (ret == 0) {
			ASSERT_EQ(0, syscall(SYS_delete_module, "tshm", O_NONBLOCK));
		} else {
			EXPECT_NE(0, access("/proc/tshm", F_OK));
			EXPECT_NE(0, access("/dev/tshm", F_OK));
		}
	}
	FI_END();
	close(kfd);
	ASSERT_EQ(0, access("/proc/tshm", F_OK));
	ASSERT_EQ(0, tt_proc_count());
}

TEST_HARNESS_MAIN
