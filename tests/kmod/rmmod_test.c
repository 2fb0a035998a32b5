// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko: unloading is refused while a context, a segment fd or only a
 * mapping exists (module refcounts, not luck), and accepted after; the
 * module is loaded again at the end so that later suites find it.
 */
#include <libgen.h>
#include <limits.h>
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

TEST_HARNESS_MAIN
