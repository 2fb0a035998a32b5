// SPDX-License-Identifier: GPL-2.0
/*
 * Buffer pools: what a get() costs with many buffers out, and unrefs
 * racing tshm_pool_destroy().
 *
 * This program interposes poll() and write(), which the library calls for
 * its release checks and eventfd rings, to count them.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "tshm-test.h"

static atomic_int polls, writes;
static void hold_here(void);

int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	static int (*real)(struct pollfd *, nfds_t, int);

	atomic_fetch_add(&polls, 1);
	if (!real)
		real = (int (*)(struct pollfd *, nfds_t, int))
			dlsym(RTLD_NEXT, "poll");
	return real(fds, n, timeout);
}

ssize_t write(int fd, const void *buf, size_t len)
{
	static ssize_t (*real)(int, const void *, size_t);

	atomic_fetch_add(&writes, 1);
	hold_here();
	if (!real)
		real = (ssize_t (*)(int, const void *, size_t))
			dlsym(RTLD_NEXT, "write");
	return real(fd, buf, len);
}

FIXTURE(pool) {
	struct tshm_ctx *ctx;
	int fds_before;
};

FIXTURE_SETUP(pool)
{
	self->fds_before = count_fds();
	ASSERT_EQ(0, tshm_ctx_open(&self->ctx, 0));
}

FIXTURE_TEARDOWN(pool)
{
	tshm_ctx_close(self->ctx);
	EXPECT_EQ(self->fds_before, count_fds());
}

#define OUT	256

/*
 * 256 buffers sent to a child that holds them, the caller's references
 * dropped: a get() takes the one buffer never handed out without a system
 * call (it used to check each of the 256 with a poll() first), and a get()
 * with nothing back costs one poll(), not 256.  Local unrefs with nobody
 * asleep in get() ring nothing.
 */
TEST_F_TIMEOUT(pool, get_with_many_out, 120)
{
	struct tshm_seg *bufs[OUT + 1], *one, *none, *got[1];
	struct tshm_pool *pool;
	struct tshm_queue *q;
	int sv[2], i, p, w;
	unsigned n;
	size_t len;
	pid_t pid;
	char x;

	ASSERT_EQ(0, tshm_pool_create(self->ctx, OUT + 1, 4096, "many", 0,
				      &pool));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, OUT, 1, &q));
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	for (i = 0; i < OUT; i++) {
		ASSERT_EQ(0, tshm_pool_get(pool, 0, &bufs[i]));
		ASSERT_EQ(0, tshm_queue_send(q, "b", 1, &bufs[i], 1, 0));
	}
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		static struct tshm_seg *held[OUT];

		for (i = 0; i < OUT; i++) {
			n = 1;
			if (tshm_queue_recv(q, &x, 1, &len, got, &n, 5000))
				_exit(1);
			held[i] = got[0];
		}
		if (write(sv[1], "r", 1) != 1 || read(sv[1], &x, 1) != 1)
			_exit(2);
		for (i = 0; i < OUT; i++)
			tshm_seg_unref(held[i]);
		_exit(0);
	}
	ASSERT_EQ(1, read(sv[0], &x, 1));
	atomic_store(&writes, 0);
	for (i = 0; i < OUT; i++)
		tshm_seg_unref(bufs[i]);
	w = atomic_load(&writes);
	EXPECT_EQ(0, w);

	atomic_store(&polls, 0);
	ASSERT_EQ(0, tshm_pool_get(pool, 0, &one));
	p = atomic_load(&polls);
	TH_LOG("get() with %d buffers out and one free: %d poll()s", OUT, p);
	EXPECT_EQ(0, p);
	atomic_store(&polls, 0);
	EXPECT_EQ(-EAGAIN, tshm_pool_get(pool, 0, &none));
	p = atomic_load(&polls);
	TH_LOG("get() with all %d out: %d poll()s", OUT + 1, p);
	EXPECT_GE(1, p);

	/* Released by the child: they come back. */
	ASSERT_EQ(1, write(sv[0], "g", 1));
	EXPECT_EQ(0, wait_ok(pid));
	tshm_seg_unref(one);
	for (i = 0; i <= OUT; i++)
		ASSERT_EQ(0, tshm_pool_get(pool, 5000, &bufs[i]));
	EXPECT_EQ(-EAGAIN, tshm_pool_get(pool, 0, &none));
	for (i = 0; i <= OUT; i++)
		tshm_seg_unref(bufs[i]);
	close(sv[0]);
	close(sv[1]);
	tshm_queue_unref(q);
	tshm_pool_destroy(pool);
}

/*
 * The race below, made deterministic: a write() of the unref thread
 * stops (hold_writes) until the main thread lets it go.
 */
static atomic_int hold_writes, in_write, let_go;

static void hold_here(void)
{
	if (!atomic_load(&hold_writes))
		return;
	atomic_store(&in_write, 1);
	while (!atomic_load(&let_go))
		usleep(100);
}

struct unreffer {
	struct tshm_seg *buf;
	atomic_int done;
};

static void *unref_one(void *arg)
{
	struct unreffer *u = arg;

	tshm_seg_unref(u->buf);
	atomic_store(&u->done, 1);
	return NULL;
}

/* The number of this process's eventfd, or -1. */
static int find_eventfd(void)
{
	char path[64], link[64];
	ssize_t n;
	int fd;

	for (fd = 3; fd < 1024; fd++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = '\0';
		if (!strcmp(link, "anon_inode:[eventfd]"))
			return fd;
	}
	return -1;
}

/*
 * tshm.h allows unrefs after tshm_pool_destroy(), so also during it.  An
 * unref read seg->pool, dropped its reference, and a concurrent destroy
 * freed the pool and closed its eventfd before the unref rang it: a use
 * after free, and a write into whatever reused the fd number.  Here the
 * unref is held inside its write() while the pool is destroyed and a
 * memfd takes the eventfd's number: nothing may land in that memfd.
 */
TEST_F(pool, destroy_races_unref)
{
	struct unreffer u = { 0 };
	struct tshm_pool *pool;
	struct stat st;
	pthread_t t;
	int efd, m;

	ASSERT_EQ(0, tshm_pool_create(self->ctx, 1, 4096, "race", 0, &pool));
	ASSERT_EQ(0, tshm_pool_get(pool, 0, &u.buf));
	efd = find_eventfd();
	ASSERT_LE(0, efd);
	atomic_store(&hold_writes, 1);
	ASSERT_EQ(0, pthread_create(&t, NULL, unref_one, &u));
	while (!atomic_load(&in_write) && !atomic_load(&u.done))
		usleep(100);
	tshm_pool_destroy(pool);
	m = memfd_create("victim", MFD_CLOEXEC);
	ASSERT_LE(0, m);
	if (m != efd) {
		ASSERT_EQ(efd, dup2(m, efd));
		close(m);
	}
	atomic_store(&let_go, 1);
	pthread_join(t, NULL);
	atomic_store(&hold_writes, 0);
	ASSERT_EQ(0, fstat(efd, &st));
	EXPECT_EQ(0, st.st_size);
	close(efd);
}

/*
 * Issue 16, finding 9: a buffer whose page a receiver vmspliced into a
 * pipe comes back; without TSHM_POOL_PUNCH the pipe sees what the
 * producer writes next, with it the pipe keeps the old bytes and the
 * producer starts from zeroes.
 */
static void punch_case(struct __test_metadata *_metadata,
		       struct tshm_ctx *ctx, bool punch)
{
	struct tshm_pool *pool;
	struct tshm_seg *a, *b;
	char got[16] = "";
	struct iovec iov;
	int p[2];

	ASSERT_EQ(0, tshm_pool_create(ctx, 1, 4096, "punch",
				      punch ? TSHM_POOL_PUNCH : 0, &pool));
	ASSERT_EQ(0, tshm_pool_get(pool, 0, &a));
	strcpy(tshm_seg_data(a), "first owner");
	ASSERT_EQ(0, pipe(p));
	iov.iov_base = tshm_seg_data(a);
	iov.iov_len = 4096;
	ASSERT_EQ(4096, vmsplice(p[1], &iov, 1, 0));
	tshm_seg_unref(a);
	ASSERT_EQ(0, tshm_pool_get(pool, 1000, &b));
	ASSERT_EQ(a, b);
	EXPECT_EQ(punch ? 0 : 'f', *(char *)tshm_seg_data(b));
	strcpy(tshm_seg_data(b), "second owner");
	ASSERT_EQ(sizeof(got), read(p[0], got, sizeof(got)));
	EXPECT_STREQ(punch ? "first owner" : "second owner", got);
	close(p[0]);
	close(p[1]);
	tshm_seg_unref(b);
	tshm_pool_destroy(pool);
}

TEST_F(pool, punch_on_reuse_cuts_pinned_pages)
{
	punch_case(_metadata, self->ctx, false);
	punch_case(_metadata, self->ctx, true);
}

TSHM_TEST_MAIN(NULL)

/*
 * A buffer that went to another process and was let go there is back at
 * once: tshm_pool_available() counts it the first time it is asked and a
 * get() with timeout 0 takes it.  On the fallback both used to miss it,
 * because the creator's own copy of the lease peer, kept for the next
 * send, held the lease end open; only a sleeping get() noticed.
 */
static void hop_and_back(struct __test_metadata *_metadata,
			 struct tshm_ctx *ctx, bool other_process)
{
	struct tshm_seg *buf, *got[1], *again;
	struct tshm_pool *pool;
	struct tshm_queue *q;
	unsigned n, round;
	size_t len;
	pid_t pid;
	char x;

	ASSERT_EQ(0, tshm_pool_create(ctx, 1, 4096, "hop", 0, &pool));
	ASSERT_EQ(0, tshm_queue_create(ctx, 4, 1, &q));
	/* Round 0 asks get() first, round 1 tshm_pool_available(). */
	for (round = 0; round < 2; round++) {
		ASSERT_EQ(0, tshm_pool_get(pool, 0, &buf));
		ASSERT_EQ(0, tshm_queue_send(q, "b", 1, &buf, 1, 0));
		tshm_seg_unref(buf);
		n = 1;
		if (other_process) {
			pid = fork();
			ASSERT_LE(0, pid);
			if (pid == 0) {
				if (tshm_queue_recv(q, &x, 1, &len, got, &n,
						    5000))
					_exit(1);
				tshm_seg_unref(got[0]);
				_exit(0);
			}
			ASSERT_EQ(0, wait_ok(pid));
		} else {
			ASSERT_EQ(0, tshm_queue_recv(q, &x, 1, &len, got, &n,
						     0));
			ASSERT_EQ(1, n);
			tshm_seg_unref(got[0]);
		}
		if (round == 1)
			EXPECT_EQ(1, tshm_pool_available(pool));
		ASSERT_EQ(0, tshm_pool_get(pool, 0, &again));
		EXPECT_EQ(-EAGAIN, tshm_pool_get(pool, 0, &buf));
		EXPECT_EQ(0, tshm_pool_available(pool));
		tshm_seg_unref(again);
	}
	tshm_queue_unref(q);
	tshm_pool_destroy(pool);
}

TEST_F(pool, back_at_once_from_another_process)
{
	hop_and_back(_metadata, self->ctx, true);
}

TEST_F(pool, back_at_once_from_this_process)
{
	hop_and_back(_metadata, self->ctx, false);
}
