// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko: lifetimes.  A segment and its pages go when its last holder
 * (fd plus mappings) and its last grant go, whatever ends them: close,
 * munmap, exit, SIGKILL, the close of the context owning the grants.
 * Checked through /proc/tshm and through Shmem in /proc/meminfo.
 */
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include "kselftest_harness.h"
#include "tshm_test.h"

#define SEG	(32 * TT_MIB)
/* Shmem may move a little for unrelated reasons (tmpfs under /tmp). */
#define SLACK_KB	2048

static void wait_byte(int fd)
{
	char c;

	if (read(fd, &c, 1) != 1)
		_exit(90);
}

static void send_byte(int fd)
{
	if (write(fd, "x", 1) != 1)
		_exit(91);
}

static int reap(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return st;
}

FIXTURE(life) {
	int ctx;
	long base_kb;
};

FIXTURE_SETUP(life)
{
	self->ctx = -1;
	TT_NEED_MODULE();
	self->ctx = tt_open();
	ASSERT_LE(0, self->ctx);
	self->base_kb = tt_shmem_kb();
	ASSERT_LE(0, self->base_kb);
}

FIXTURE_TEARDOWN(life)
{
	if (self->ctx >= 0)
		close(self->ctx);
}

/* Shmem is at least @mib above the baseline (pages are in use). */
#define EXPECT_SHMEM_UP(mib) \
	EXPECT_LE(self->base_kb + (long)(mib) * 1024 - SLACK_KB, tt_shmem_kb())
/* Shmem is back to the baseline (pages freed). */
#define EXPECT_SHMEM_BASE() \
	EXPECT_GE(self->base_kb + SLACK_KB, tt_shmem_kb())

TEST_F(life, freed_on_last_close)
{
	uint64_t id = 0;
	char *p;
	int fd, fd2;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, SEG, 0, "close", &id);
	ASSERT_LE(0, fd);
	p = mmap(NULL, SEG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	memset(p, 1, SEG);
	munmap(p, SEG);
	EXPECT_SHMEM_UP(32);
	fd2 = dup(fd);	/* same open file description: same holder */
	close(fd);
	EXPECT_EQ(1, tt_proc_has(id));
	close(fd2);
	EXPECT_EQ(0, tt_proc_has(id));
	EXPECT_SHMEM_BASE();
}

TEST_F(life, freed_on_munmap_after_close)
{
	uint64_t id = 0;
	struct tt_line l;
	char *p;
	int fd;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, SEG, 0, "munmap", &id);
	ASSERT_LE(0, fd);
	p = mmap(NULL, SEG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	close(fd);
	memset(p, 1, SEG);
	ASSERT_EQ(1, tt_proc_scan(id, &l));
	EXPECT_EQ(1, l.holders);
	EXPECT_EQ(SEG, l.resident);
	EXPECT_SHMEM_UP(32);
	/* Half the mapping goes: still held. */
	ASSERT_EQ(0, munmap(p, SEG / 2));
	EXPECT_EQ(1, tt_proc_has(id));
	ASSERT_EQ(0, munmap(p + SEG / 2, SEG / 2));
	EXPECT_EQ(0, tt_proc_has(id));
	EXPECT_SHMEM_BASE();
}

TEST_F(life, freed_when_holder_sigkilled)
{
	int go[2], ready[2], fd;
	uint64_t id = 0;
	pid_t pid;

	TT_SETUP_SKIPPED();
	ASSERT_EQ(0, pipe(go));
	ASSERT_EQ(0, pipe(ready));
	fd = tt_create(self->ctx, SEG, 0, "killed", &id);
	ASSERT_LE(0, fd);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		char *p = mmap(NULL, SEG, PROT_READ | PROT_WRITE, MAP_SHARED,
			       fd, 0);

		if (p == MAP_FAILED)
			_exit(1);
		close(fd);
		memset(p, 2, SEG);
		send_byte(ready[1]);
		pause();
		_exit(0);
	}
	/* The parent lets go: the child's mapping is the only holder. */
	close(fd);
	wait_byte(ready[0]);
	EXPECT_EQ(1, tt_proc_has(id));
	EXPECT_SHMEM_UP(32);
	kill(pid, SIGKILL);
	EXPECT_EQ(SIGKILL, WTERMSIG(reap(pid)));
	EXPECT_EQ(0, tt_proc_has(id));
	EXPECT_SHMEM_BASE();
	close(go[0]);
	close(go[1]);
	close(ready[0]);
	close(ready[1]);
}

TEST_F(life, kept_while_forked_child_maps)
{
	int go[2], ready[2], fd;
	struct tt_line l;
	uint64_t id = 0;
	char *p;
	pid_t pid;

	TT_SETUP_SKIPPED();
	ASSERT_EQ(0, pipe(go));
	ASSERT_EQ(0, pipe(ready));
	fd = tt_create(self->ctx, SEG, 0, "forked", &id);
	ASSERT_LE(0, fd);
	p = mmap(NULL, SEG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	tt_fill(p, SEG, 42);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		close(fd);
		send_byte(ready[1]);
		wait_byte(go[0]);
		_exit(tt_check(p, SEG, 42) ? 0 : 3);
	}
	wait_byte(ready[0]);
	close(fd);
	munmap(p, SEG);
	/* The child's copy of the mapping counts with the same holder. */
	ASSERT_EQ(1, tt_proc_scan(id, &l));
	EXPECT_EQ(1, l.holders);
	EXPECT_SHMEM_UP(32);
	send_byte(go[1]);
	EXPECT_EQ(0, reap(pid));
	EXPECT_EQ(0, tt_proc_has(id));
	EXPECT_SHMEM_BASE();
	close(go[0]);
	close(go[1]);
	close(ready[0]);
	close(ready[1]);
}

TEST_F(life, grant_attach_across_processes)
{
	int to[2], from[2], fd;
	uint64_t id = 0;
	char *p;
	pid_t pid;

	TT_SETUP_SKIPPED();
	ASSERT_EQ(0, pipe(to));
	ASSERT_EQ(0, pipe(from));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		uint64_t cid, size = 0;
		char *q;
		int sfd;

		/* Only 8 bytes cross: the id.  The context was inherited. */
		if (read(to[0], &cid, sizeof(cid)) != sizeof(cid))
			_exit(1);
		sfd = tt_attach(self->ctx, cid, 0, &size);
		if (sfd < 0 || size != 2 * TT_MIB)
			_exit(2);
		q = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
		if (q == MAP_FAILED || strcmp(q, "from parent"))
			_exit(3);
		strcpy(q + TT_MIB, "from child");
		/* The grant was consumed. */
		if (tt_attach(self->ctx, cid, 0, NULL) != -ENOENT)
			_exit(4);
		send_byte(from[1]);
		_exit(0);
	}
	fd = tt_create(self->ctx, 2 * TT_MIB, 0, "ga", &id);
	ASSERT_LE(0, fd);
	p = mmap(NULL, 2 * TT_MIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	strcpy(p, "from parent");
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));
	ASSERT_EQ(sizeof(id), write(to[1], &id, sizeof(id)));
	wait_byte(from[0]);
	EXPECT_STREQ("from child", p + TT_MIB);
	EXPECT_EQ(0, reap(pid));
	munmap(p, 2 * TT_MIB);
	close(fd);
	EXPECT_EQ(0, tt_proc_has(id));
	close(to[0]);
	close(to[1]);
	close(from[0]);
	close(from[1]);
}

TEST_F(life, attach_after_free_enoent)
{
	uint64_t id = 0;
	int fd;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, TT_MIB, 0, "freed", &id);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));
	ASSERT_EQ(0, tt_drop(self->ctx, id, 1));
	close(fd);
	EXPECT_EQ(0, tt_proc_has(id));
	EXPECT_EQ(-ENOENT, tt_attach(self->ctx, id, 0, NULL));
	EXPECT_EQ(-ENOENT, tt_drop(self->ctx, id, 1));
}

TEST_F(life, grants_keep_segment_and_die_with_context)
{
	struct tt_line l;
	uint64_t id = 0;
	int fd, ctx2, ctx3;

	TT_SETUP_SKIPPED();
	ctx2 = tt_open();
	ASSERT_LE(0, ctx2);
	fd = tt_create(self->ctx, SEG, TSHM_CREATE_PREFAULT, "grants", &id);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_grant(fd, ctx2, 2, NULL));
	close(fd);
	/* No holder, two grants: alive, pages and all. */
	ASSERT_EQ(1, tt_proc_scan(id, &l));
	EXPECT_EQ(0, l.holders);
	EXPECT_EQ(2, l.grants);
	EXPECT_SHMEM_UP(32);
	/* Another context learns nothing. */
	EXPECT_EQ(-ENOENT, tt_attach(self->ctx, id, 0, NULL));
	/* A dup of the context is the same context. */
	ctx3 = dup(ctx2);
	close(ctx2);
	EXPECT_EQ(1, tt_proc_has(id));
	close(ctx3);
	EXPECT_EQ(0, tt_proc_has(id));
	EXPECT_SHMEM_BASE();
}

TEST_F(life, grants_die_with_killed_context_owner)
{
	int ready[2], fd;
	uint64_t id = 0;
	pid_t pid;

	TT_SETUP_SKIPPED();
	ASSERT_EQ(0, pipe(ready));
	fd = tt_create(self->ctx, TT_MIB, 0, "ctxkill", &id);
	ASSERT_LE(0, fd);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		int c = tt_open();

		if (c < 0 || tt_grant(fd, c, 5, NULL))
			_exit(1);
		close(fd);
		send_byte(ready[1]);
		pause();
		_exit(0);
	}
	close(fd);
	wait_byte(ready[0]);
	EXPECT_EQ(1, tt_proc_has(id));
	kill(pid, SIGKILL);
	reap(pid);
	EXPECT_EQ(0, tt_proc_has(id));
	close(ready[0]);
	close(ready[1]);
}

TEST_F(life, poll_wakes_when_consumer_killed)
{
	struct tshm_info before, after;
	int ready[2], fd, ep;
	struct epoll_event ev = { .events = EPOLLIN }, out;
	struct pollfd pfd;
	uint64_t id = 0;
	pid_t pid;

	TT_SETUP_SKIPPED();
	ASSERT_EQ(0, pipe(ready));
	fd = tt_create(self->ctx, TT_MIB, 0, "poll", &id);
	ASSERT_LE(0, fd);
	pfd.fd = fd;
	pfd.events = POLLIN;
	/* Sole holder, no grants: readable. */
	EXPECT_EQ(1, poll(&pfd, 1, 0));
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));
	EXPECT_EQ(0, poll(&pfd, 1, 0));

	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		int s = tt_attach(self->ctx, id, TSHM_ATTACH_RDONLY, NULL);
		char *p;

		if (s < 0)
			_exit(1);
		p = mmap(NULL, TT_MIB, PROT_READ, MAP_SHARED, s, 0);
		if (p == MAP_FAILED)
			_exit(2);
		close(s);	/* the mapping alone keeps the holder */
		send_byte(ready[1]);
		pause();
		_exit(0);
	}
	close(self->ctx);	/* the child has its own copy */
	self->ctx = -1;
	wait_byte(ready[0]);
	ASSERT_EQ(0, tt_info(fd, &before));
	EXPECT_EQ(2, before.holders);
	EXPECT_EQ(0, before.grants);
	EXPECT_EQ(0, poll(&pfd, 1, 0));

	ep = epoll_create1(EPOLL_CLOEXEC);
	ASSERT_LE(0, ep);
	ASSERT_EQ(0, epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
	EXPECT_EQ(0, epoll_wait(ep, &out, 1, 0));

	kill(pid, SIGKILL);
	/* Both wake: the epoll one and a blocking poll(). */
	EXPECT_EQ(1, epoll_wait(ep, &out, 1, 10000));
	EXPECT_EQ(1, poll(&pfd, 1, 10000));
	EXPECT_EQ(POLLIN, pfd.revents & POLLIN);
	ASSERT_EQ(0, tt_info(fd, &after));
	EXPECT_EQ(1, after.holders);
	EXPECT_LT(before.generation, after.generation);
	reap(pid);
	close(ep);
	close(fd);
	close(ready[0]);
	close(ready[1]);
}

TEST_F(life, poll_blocks_until_munmap)
{
	int ready[2], go[2], fd;
	struct pollfd pfd;
	uint64_t id = 0;
	pid_t pid;

	TT_SETUP_SKIPPED();
	ASSERT_EQ(0, pipe(ready));
	ASSERT_EQ(0, pipe(go));
	fd = tt_create(self->ctx, TT_MIB, 0, "pollmunmap", &id);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		int s = tt_attach(self->ctx, id, 0, NULL);
		char *p = s < 0 ? MAP_FAILED :
			  mmap(NULL, TT_MIB, PROT_READ, MAP_SHARED, s, 0);

		if (p == MAP_FAILED)
			_exit(1);
		close(s);
		send_byte(ready[1]);
		wait_byte(go[0]);
		munmap(p, TT_MIB);	/* releases the holder */
		pause();
		_exit(0);
	}
	wait_byte(ready[0]);
	pfd.fd = fd;
	pfd.events = POLLIN;
	EXPECT_EQ(0, poll(&pfd, 1, 100));
	send_byte(go[1]);
	EXPECT_EQ(1, poll(&pfd, 1, 10000));
	kill(pid, SIGKILL);
	reap(pid);
	close(fd);
	close(ready[0]);
	close(ready[1]);
	close(go[0]);
	close(go[1]);
}

TEST_HARNESS_MAIN
