// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko: unloading is refused while a context, a segment fd or only a
 * mapping exists (module refcounts, not luck), and accepted after; the
 * module is loaded again at the end of each test so that later suites
 * find it.  Also when the last reference to a holder is dropped by a
 * kernel thread (issue 16, finding 4).
 */
#include <libgen.h>
#include <limits.h>
#include <time.h>
#include <linux/io_uring.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include "kselftest_harness.h"
#include "tshm_test.h"

static int unload(void)
{
	return syscall(SYS_delete_module, "tshm", O_NONBLOCK) ? -errno : 0;
}

/*
 * The module vm-run loaded ($TSHM_MODULE: the debug kernel has its own
 * build), else build/tests/kmod/rmmod_test -> build/kmod/tshm.ko.
 */
static int reload(void)
{
	char exe[PATH_MAX], ko[PATH_MAX + 32];
	const char *env = getenv("TSHM_MODULE");
	ssize_t n;
	int fd, err;

	if (env && *env) {
		snprintf(ko, sizeof(ko), "%s", env);
	} else {
		n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		if (n < 0)
			return -errno;
		exe[n] = 0;
		snprintf(ko, sizeof(ko), "%s/../../kmod/tshm.ko", dirname(exe));
	}
	fd = open(ko, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	err = syscall(SYS_finit_module, fd, "", 0) ? -errno : 0;
	close(fd);
	return err;
}

TEST(unload_refused_while_anything_lives)
{
	uint64_t id = 0;
	int ctx, fd, err;
	char *p;

	TT_NEED_MODULE();
	if (geteuid())
		SKIP(return, "needs root");
	ctx = tt_open();
	ASSERT_LE(0, ctx);
	err = unload();
	EXPECT_TRUE(err == -EWOULDBLOCK || err == -EBUSY) TH_LOG("ctx: %d", err);

	fd = tt_create(ctx, 2 * TT_MIB, 0, "pin", &id);
	ASSERT_LE(0, fd);
	close(ctx);
	err = unload();
	EXPECT_TRUE(err == -EWOULDBLOCK || err == -EBUSY) TH_LOG("fd: %d", err);

	p = mmap(NULL, 2 * TT_MIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	close(fd);
	memset(p, 9, 2 * TT_MIB);
	/* Nothing but a mapping is left. */
	err = unload();
	EXPECT_TRUE(err == -EWOULDBLOCK || err == -EBUSY) TH_LOG("map: %d", err);
	EXPECT_EQ(0, access("/proc/tshm", R_OK));
	EXPECT_EQ(9, p[TT_MIB]);

	munmap(p, 2 * TT_MIB);
	ASSERT_EQ(0, unload());
	EXPECT_NE(0, access("/proc/tshm", F_OK));
	EXPECT_NE(0, access(TT_DEV, F_OK));

	ASSERT_EQ(0, reload());
	ASSERT_EQ(0, access(TT_DEV, R_OK | W_OK));
	EXPECT_EQ(0, tt_proc_count());
}

/*
 * A tracefs instance of our own recording the module_put event of tshm
 * (name == "tshm"): who drops module references, and from where.  NULL when
 * the kernel has no tracefs or no module events.
 */
#define TRACE_ROOT	"/sys/kernel/tracing"
#define TRACE_INST	TRACE_ROOT "/instances/tshm_rmmod_test"

static const char *trace_start(void)
{
	if (access(TRACE_ROOT "/instances", F_OK))
		mount("nodev", TRACE_ROOT, "tracefs", 0, NULL);
	rmdir(TRACE_INST);
	if (mkdir(TRACE_INST, 0700))
		return NULL;
	if (tt_write_file(TRACE_INST "/events/module/module_put/filter",
			  "name == \"tshm\"") ||
	    tt_write_file(TRACE_INST "/events/module/module_put/enable", "1")) {
		rmdir(TRACE_INST);
		return NULL;
	}
	return TRACE_INST;
}

/* Opening "trace" with O_TRUNC empties the instance's buffer. */
static void trace_clear(void)
{
	int fd = open(TRACE_INST "/trace", O_WRONLY | O_TRUNC | O_CLOEXEC);

	if (fd >= 0)
		close(fd);
}

/*
 * The module_put events recorded since trace_clear(), one per line of
 * @out: "COMM call_site=FUNC+OFF/LEN refcnt=N".
 */
static int trace_read(char *out, size_t len)
{
	FILE *f = fopen(TRACE_INST "/trace", "r");
	char line[512];
	size_t used = 0;

	if (!f)
		return -errno;
	out[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		char comm[64], *ev;

		if (line[0] == '#' || !(ev = strstr(line, "module_put: ")))
			continue;
		/* "           COMM-PID     [CPU] FLAGS  TIME: module_put: ..." */
		if (sscanf(line, " %63s", comm) != 1)
			continue;
		if (strrchr(comm, '-'))
			*strrchr(comm, '-') = 0;
		ev += strlen("module_put: tshm ");
		used += snprintf(out + used, used < len ? len - used : 0,
				 "%s %s", comm, ev);
	}
	fclose(f);
	return 0;
}

static void trace_stop(void)
{
	tt_write_file(TRACE_INST "/events/module/module_put/enable", "0");
	rmdir(TRACE_INST);
}

static int uring_setup(unsigned int entries)
{
	struct io_uring_params p = { 0 };

	return syscall(SYS_io_uring_setup, entries, &p);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * Issue 16, finding 4: the final release of a holder may run in a kernel
 * thread.  A holder is registered as an io_uring fixed file, its fd closed
 * and its mapping unmapped: the ring's file table holds the last
 * reference.  Closing the ring makes io_uring's exit work (a kworker) drop
 * it; fput() from a kernel thread defers __fput() to the delayed_fput
 * worker.  Meanwhile delete_module() is tried in a loop: it must be refused
 * (EWOULDBLOCK, EBUSY) while the file lives and succeed after, so that no
 * module code runs after the last module reference (KASAN and kmemleak on
 * the debug kernel, vm-run's scan of the kernel log).  The module_put
 * tracepoint shows who dropped the references after close(ring): one put,
 * by a kworker, in __fput(), leaving none.
 */
TEST(unload_after_last_fput_in_kthread)
{
	char *p, *puts_ = NULL;
	const char *trace;
	int ctx, fd, ring, err, refused = 0;
	double deadline;
	uint64_t id;

	TT_NEED_MODULE();
	if (geteuid())
		SKIP(return, "needs root");
	ring = uring_setup(4);
	if (ring < 0)
		SKIP(return, "no io_uring: %s", strerror(errno));
	trace = trace_start();

	ctx = tt_open();
	ASSERT_LE(0, ctx);
	fd = tt_create(ctx, 2 * TT_MIB, 0, "kthread-fput", &id);
	ASSERT_LE(0, fd);
	close(ctx);
	p = mmap(NULL, 2 * TT_MIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	memset(p, 5, 2 * TT_MIB);
	ASSERT_EQ(0, syscall(SYS_io_uring_register, ring, IORING_REGISTER_FILES,
			     &fd, 1)) TH_LOG("IORING_REGISTER_FILES: %s", strerror(errno));
	close(fd);
	munmap(p, 2 * TT_MIB);
	/* Only the ring's file table holds the holder now. */
	EXPECT_EQ(1, tt_proc_count());
	err = unload();
	EXPECT_TRUE(err == -EWOULDBLOCK || err == -EBUSY) TH_LOG("fixed file: %d", err);

	if (trace)
		trace_clear();
	close(ring);
	/* Generous: only a hang (a leaked reference) reaches it. */
	deadline = now_s() + 120;
	while ((err = unload())) {
		ASSERT_TRUE(err == -EWOULDBLOCK || err == -EBUSY) TH_LOG("rmmod: %d", err);
		refused++;
		ASSERT_GT(deadline, now_s()) TH_LOG("still refused after 120 s");
		usleep(200);
	}
	TH_LOG("delete_module refused %d times after the ring was closed", refused);
	EXPECT_NE(0, access("/proc/tshm", F_OK));
	EXPECT_NE(0, access(TT_DEV, F_OK));

	if (trace) {
		puts_ = calloc(1, 8192);
		ASSERT_NE(NULL, puts_);
		ASSERT_EQ(0, trace_read(puts_, 8192));
		trace_stop();
		TH_LOG("module_put of tshm after close(ring):\n%s", puts_);
		/*
		 * One put, the holder's, from __fput() in a kworker, leaving
		 * no reference (the event's refcnt counts MODULE_REF_BASE, 1).
		 */
		ASSERT_NE(0, puts_[0]) TH_LOG("no module_put recorded");
		puts_[strlen(puts_) - 1] = 0;	/* the last '\n' */
		EXPECT_EQ(NULL, strchr(puts_, '\n'));
		EXPECT_EQ(0, strncmp(puts_, "kworker/", 8));
		EXPECT_NE(NULL, strstr(puts_, "call_site=__fput"));
		EXPECT_NE(NULL, strstr(puts_, "refcnt=1"));
		free(puts_);
	} else {
		TH_LOG("no tracefs module events: who dropped it is not checked");
	}

	ASSERT_EQ(0, reload());
	ASSERT_EQ(0, access(TT_DEV, R_OK | W_OK));
	EXPECT_EQ(0, tt_proc_count());
}

TEST_HARNESS_MAIN
