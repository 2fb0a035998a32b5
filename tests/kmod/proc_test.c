// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko: /proc/tshm (format, who sees what) and the per-user limits,
 * checked as an unprivileged user (nobody).
 */
#include <signal.h>
#include <grp.h>
#include <sys/prctl.h>
#include "kselftest_harness.h"
#include "tshm_test.h"

#define PARAM(n)	"/sys/module/tshm/parameters/" n

static int drop_to_nobody(void)
{
	if (setgroups(0, NULL) || setgid(TT_NOBODY) || setuid(TT_NOBODY))
		return -1;
	return 0;
}

FIXTURE(proc) {
	int ctx;
	char saved[3][32];
};

static const char *const params[3] = {
	PARAM("max_segment_bytes"), PARAM("max_user_bytes"),
	PARAM("max_user_segments"),
};

FIXTURE_SETUP(proc)
{
	int i, fd;
	ssize_t n;

	self->ctx = -1;
	TT_NEED_MODULE();
	if (geteuid())
		SKIP(return, "needs root to switch to nobody");
	for (i = 0; i < 3; i++) {
		fd = open(params[i], O_RDONLY);
		ASSERT_LE(0, fd);
		n = read(fd, self->saved[i], sizeof(self->saved[i]) - 1);
		ASSERT_LT(0, n);
		self->saved[i][n] = 0;
		close(fd);
	}
	self->ctx = tt_open();
	ASSERT_LE(0, self->ctx);
}

FIXTURE_TEARDOWN(proc)
{
	int i;

	if (self->ctx < 0)
		return;
	for (i = 0; i < 3; i++)
		tt_write_file(params[i], self->saved[i]);
	close(self->ctx);
}

TEST_F(proc, format_and_totals)
{
	char buf[4096], line[256];
	struct tt_line l;
	uint64_t id = 0;
	int fd, n0;
	FILE *f;

	TT_SETUP_SKIPPED();
	n0 = tt_proc_count();
	ASSERT_LE(0, n0);
	fd = tt_create(self->ctx, 3 * 4096, TSHM_CREATE_PREFAULT,
		       "two words", &id);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 4, NULL));
	EXPECT_EQ(n0 + 1, tt_proc_count());
	ASSERT_EQ(1, tt_proc_scan(id, &l));
	EXPECT_EQ(3 * 4096, l.size);
	EXPECT_EQ(3 * 4096, l.resident);
	EXPECT_EQ(1, l.holders);
	EXPECT_EQ(4, l.grants);
	EXPECT_STREQ("p", l.flags);
	EXPECT_EQ(0, l.uid);
	EXPECT_EQ(getpid(), l.pid);
	EXPECT_STREQ("proc_test", l.comm);
	EXPECT_LE(0, l.age);
	EXPECT_STREQ("two\\040words", l.name);

	/* The totals line: "total <segments> <size> <resident>". */
	f = fopen("/proc/tshm", "re");
	ASSERT_NE(NULL, f);
	while (fgets(line, sizeof(line), f))
		snprintf(buf, sizeof(buf), "%s", line);
	fclose(f);
	EXPECT_EQ(0, strncmp(buf, "total ", 6)) TH_LOG("%s", buf);
	close(fd);
	/* Without holders, the grants keep it. */
	EXPECT_EQ(1, tt_proc_has(id));
	EXPECT_EQ(0, tt_drop(self->ctx, id, 4));
	EXPECT_EQ(0, tt_proc_has(id));
}

TEST_F(proc, nobody_sees_own_lines_only)
{
	uint64_t rid = 0;
	int rfd, st;
	pid_t pid;

	TT_SETUP_SKIPPED();
	rfd = tt_create(self->ctx, 4096, 0, "roots", &rid);
	ASSERT_LE(0, rfd);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		struct tt_line l;
		uint64_t nid = 0;
		int c, s;

		if (drop_to_nobody())
			_exit(1);
		c = tt_open();	/* /dev/tshm is 0666 */
		if (c < 0)
			_exit(2);
		s = tt_create(c, 4096, 0, "nobodys", &nid);
		if (s < 0)
			_exit(3);
		if (tt_proc_has(rid) != 0)
			_exit(4);
		if (tt_proc_scan(nid, &l) != 1 || l.uid != TT_NOBODY)
			_exit(5);
		/* Only its own segment in the count and the totals. */
		if (tt_proc_count() != 1)
			_exit(6);
		_exit(0);
	}
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	EXPECT_TRUE(WIFEXITED(st));
	EXPECT_EQ(0, WEXITSTATUS(st));
	/* Root sees the other user's segments; the child's is gone now. */
	EXPECT_EQ(1, tt_proc_has(rid));
	close(rfd);
}

TEST_F(proc, limits_stop_unprivileged_user)
{
	int st;
	pid_t pid;

	TT_SETUP_SKIPPED();
	ASSERT_EQ(0, tt_write_file(PARAM("max_segment_bytes"), "1048576"));
	ASSERT_EQ(0, tt_write_file(PARAM("max_user_bytes"), "3145728"));
	ASSERT_EQ(0, tt_write_file(PARAM("max_user_segments"), "4"));

	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		int c, i, fds[8];

		if (drop_to_nobody())
			_exit(1);
		/* Only root may change the limits. */
		if (tt_write_file(PARAM("max_user_bytes"), "0") != -EACCES)
			_exit(2);
		c = tt_open();
		if (c < 0)
			_exit(3);
		if (tt_create(c, TT_MIB + 1, 0, NULL, NULL) != -EFBIG)
			_exit(4);
		for (i = 0; i < 3; i++)
			if ((fds[i] = tt_create(c, TT_MIB, 0, NULL, NULL)) < 0)
				_exit(5);
		/* 3 MiB used: one more byte is over the byte limit. */
		if (tt_create(c, 1, 0, NULL, NULL) != -EDQUOT)
			_exit(6);
		close(fds[0]);
		/* Freed segments give their bytes back. */
		fds[0] = tt_create(c, 4096, 0, NULL, NULL);
		if (fds[0] < 0)
			_exit(7);
		fds[3] = tt_create(c, 4096, 0, NULL, NULL);
		if (fds[3] < 0)
			_exit(8);
		/* 4 segments: the count limit. */
		if (tt_create(c, 4096, 0, NULL, NULL) != -ENOSPC)
			_exit(9);
		_exit(0);
	}
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	EXPECT_TRUE(WIFEXITED(st));
	EXPECT_EQ(0, WEXITSTATUS(st));

	/* Limits are per user: root is at 0 of 4 segments. */
	int fd = tt_create(self->ctx, 4096, 0, NULL, NULL);

	EXPECT_LE(0, fd);
	close(fd);
}

TEST_HARNESS_MAIN
