// SPDX-License-Identifier: GPL-2.0
/*
 * The library under threads and signals: fork() while other threads are
 * inside tshm calls (the atfork handlers), and blocking calls interrupted
 * by a real signal handler (tshm_thread_set_intr()).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "tshm-test.h"

FIXTURE(thr) {
	struct tshm_ctx *ctx;
	int fds_before;
};

FIXTURE_SETUP(thr)
{
	self->fds_before = count_fds();
	ASSERT_EQ(0, tshm_ctx_open(&self->ctx, 0));
}

FIXTURE_TEARDOWN(thr)
{
	tshm_ctx_close(self->ctx);
	EXPECT_EQ(self->fds_before, count_fds());
}

/* ---- fork while other threads are inside the library ---- */

struct busy {
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
	struct tshm_pool *pool;
	struct tshm_seg *seg;
	atomic_bool stop;
	atomic_uint ops;
};

/* Context lock, segment cache, names. */
static void *busy_segs(void *arg)
{
	struct busy *b = arg;
	struct tshm_seg *s;

	while (!atomic_load(&b->stop)) {
		if (tshm_seg_create(b->ctx, 4096, "busy", 0, &s) == 0) {
			tshm_seg_name(s);
			tshm_seg_unref(s);
		}
		atomic_fetch_add(&b->ops, 1);
	}
	return NULL;
}

/* Pool lock, queue (and its ring lock), lease locks on the fallback. */
static void *busy_pool(void *arg)
{
	struct busy *b = arg;
	struct tshm_seg *s, *got[1];
	unsigned n;
	size_t len;
	char x;

	while (!atomic_load(&b->stop)) {
		if (tshm_pool_get(b->pool, 0, &s) == 0) {
			if (tshm_queue_send(b->q, "x", 1, &s, 1, 0) == 0) {
				n = 1;
				if (tshm_queue_recv(b->q, &x, 1, &len, got, &n,
						    0) == 0)
					tshm_seg_unref(got[0]);
			}
			tshm_seg_unref(s);
		}
		tshm_pool_available(b->pool);
		atomic_fetch_add(&b->ops, 1);
	}
	return NULL;
}

/* Release checks: the lease lock of one segment, hammered. */
static void *busy_release(void *arg)
{
	struct busy *b = arg;
	struct pollfd pfd[4];

	while (!atomic_load(&b->stop)) {
		tshm_seg_wait_released(b->seg, 0);
		tshm_seg_release_pollfds(b->seg, pfd, 4);
		atomic_fetch_add(&b->ops, 1);
	}
	return NULL;
}

/* The child: every kind of lock the busy threads use, then exit. */
static int fork_child(struct busy *b, struct tshm_queue *mine)
{
	struct tshm_seg *s, *got[1];
	unsigned n = 1;
	size_t len;
	char x;

	alarm(10);	/* a deadlock shows as SIGALRM */
	if (tshm_seg_create(b->ctx, 4096, "child", 0, &s))
		return 2;
	tshm_seg_name(s);
	/*
	 * With timeouts: a parent thread may hold the ring's lock (a
	 * process-shared lock: the parent releases it).
	 */
	if (tshm_queue_send(mine, "c", 1, &b->seg, 1, 5000))
		return 3;
	if (tshm_queue_recv(mine, &x, 1, &len, got, &n, 5000) || n != 1)
		return 4;
	tshm_seg_unref(got[0]);
	tshm_seg_wait_released(b->seg, 0);
	tshm_seg_unref(s);
	return 0;
}

#define FORK_ROUNDS	300

TEST_F_TIMEOUT(thr, fork_while_threads_in_library, 300)
{
	struct busy b = { .ctx = self->ctx };
	struct tshm_queue *mine;
	pthread_t t[3];
	int i, status, failed = 0;
	pid_t pid;

	ASSERT_EQ(0, tshm_queue_create(self->ctx, 64, 16, &b.q));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 4, 16, &mine));
	ASSERT_EQ(0, tshm_pool_create(self->ctx, 16, 4096, "fork", 0, &b.pool));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "held", 0, &b.seg));
	ASSERT_EQ(0, pthread_create(&t[0], NULL, busy_segs, &b));
	ASSERT_EQ(0, pthread_create(&t[1], NULL, busy_pool, &b));
	ASSERT_EQ(0, pthread_create(&t[2], NULL, busy_release, &b));
	while (atomic_load(&b.ops) < 100)
		usleep(1000);
	for (i = 0; i < FORK_ROUNDS && !failed; i++) {
		pid = fork();
		ASSERT_LE(0, pid);
		if (pid == 0)
			_exit(fork_child(&b, mine));
		ASSERT_EQ(pid, waitpid(pid, &status, 0));
		if (!WIFEXITED(status) || WEXITSTATUS(status)) {
			TH_LOG("fork %d: child %s %d", i,
			       WIFSIGNALED(status) ? "killed by signal" :
			       "exited", WIFSIGNALED(status) ?
			       WTERMSIG(status) : WEXITSTATUS(status));
			failed = 1;
		}
	}
	atomic_store(&b.stop, true);
	for (i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	EXPECT_EQ(0, failed);
	tshm_seg_unref(b.seg);
	tshm_pool_destroy(b.pool);
	tshm_queue_unref(mine);
	tshm_queue_unref(b.q);
}

/* ---- interruptible waits ---- */

static atomic_int handled;

static void on_alarm(int sig)
{
	atomic_fetch_add(&handled, 1);
}

/*
 * SIGALRM every @ms, with a handler and without SA_RESTART.  Repeated: a
 * signal that lands before the call is asleep (a slow machine, emulation)
 * interrupts nothing, so the next one must come.
 */
static void alarm_in(int ms)
{
	struct sigaction sa = { .sa_handler = on_alarm };
	struct timeval tv = { .tv_sec = ms / 1000,
			      .tv_usec = (ms % 1000) * 1000 };
	struct itimerval it = { .it_value = tv, .it_interval = tv };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
}

static void alarm_off(void)
{
	struct itimerval it = { 0 };

	setitimer(ITIMER_REAL, &it, NULL);
}

TEST_F(thr, intr_queue)
{
	struct tshm_queue *q;
	char buf[8];
	size_t len;
	int h;

	ASSERT_EQ(0, tshm_queue_create(self->ctx, 1, 8, &q));
	EXPECT_EQ(0, tshm_thread_set_intr(1));
	EXPECT_EQ(1, tshm_thread_set_intr(1));

	/* recv on an empty queue, for ever: the signal ends it */
	h = atomic_load(&handled);
	alarm_in(50);
	EXPECT_EQ(-EINTR, tshm_queue_recv(q, buf, 8, &len, NULL, NULL, -1));
	alarm_off();
	EXPECT_LE(h + 1, atomic_load(&handled));
	/* the queue is usable: one message fits, the next send blocks */
	ASSERT_EQ(0, tshm_queue_send(q, "a", 1, NULL, 0, 0));
	alarm_in(50);
	EXPECT_EQ(-EINTR, tshm_queue_send(q, "b", 1, NULL, 0, -1));
	alarm_off();
	ASSERT_EQ(0, tshm_queue_recv(q, buf, 8, &len, NULL, NULL, 0));
	EXPECT_EQ(1, len);
	EXPECT_EQ('a', buf[0]);
	EXPECT_EQ(0, tshm_queue_len(q));
	ASSERT_EQ(0, tshm_queue_send(q, "c", 1, NULL, 0, 0));
	ASSERT_EQ(0, tshm_queue_recv(q, buf, 8, &len, NULL, NULL, 0));
	EXPECT_EQ('c', buf[0]);

	/* off again: the same signal restarts the wait, which times out */
	EXPECT_EQ(1, tshm_thread_set_intr(0));
	alarm_in(30);
	EXPECT_EQ(-ETIMEDOUT, tshm_queue_recv(q, buf, 8, &len, NULL, NULL,
					      300));
	alarm_off();
	EXPECT_STREQ("interrupted by a signal (tshm_thread_set_intr)",
		     tshm_strerror(-EINTR));
	tshm_queue_unref(q);
}

TEST_F(thr, intr_event_barrier)
{
	struct tshm_event ev;
	struct tshm_barrier *bar;
	struct tshm_seg *shm;
	pid_t pid;

	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "bar", 0, &shm));
	bar = tshm_seg_data(shm);
	ASSERT_EQ(0, tshm_event_init(&ev));
	ASSERT_EQ(0, tshm_barrier_init(bar, 2));
	tshm_thread_set_intr(1);
	alarm_in(50);
	EXPECT_EQ(-EINTR, tshm_event_wait(&ev, -1));
	alarm_off();
	alarm_in(50);
	EXPECT_EQ(-EINTR, tshm_barrier_wait(bar, -1));
	tshm_thread_set_intr(0);
	alarm_off();
	/* the interrupted member withdrew: two more arrivals complete it */
	ASSERT_EQ(0, tshm_event_set(&ev));
	EXPECT_EQ(0, tshm_event_wait(&ev, 0));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0)
		_exit(tshm_barrier_wait(bar, 10000) < 0);
	EXPECT_LE(0, tshm_barrier_wait(bar, 10000));
	EXPECT_EQ(0, wait_ok(pid));
	tshm_seg_unref(shm);
}

struct getter {
	struct tshm_pool *pool;
	int ret;
	atomic_bool in;
};

static void *pool_sleeper(void *arg)
{
	struct getter *g = arg;
	struct tshm_seg *s;
	sigset_t set;

	/* The test's SIGALRMs are for the main thread. */
	sigemptyset(&set);
	sigaddset(&set, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	atomic_store(&g->in, true);
	g->ret = tshm_pool_get(g->pool, 2000, &s);
	if (g->ret == 0)
		tshm_seg_unref(s);
	return NULL;
}

TEST_F(thr, intr_pool_and_release)
{
	struct tshm_pool *pool;
	struct tshm_queue *q;
	struct tshm_seg *a, *b, *got[1];
	struct getter g;
	pthread_t t;
	unsigned n;
	size_t len;
	pid_t pid;
	int sv[2];
	char x;

	ASSERT_EQ(0, tshm_pool_create(self->ctx, 1, 4096, "intr", 0, &pool));
	ASSERT_EQ(0, tshm_pool_get(pool, 0, &a));
	tshm_thread_set_intr(1);
	/* the poll() of the pool's sleeper */
	alarm_in(50);
	EXPECT_EQ(-EINTR, tshm_pool_get(pool, -1, &b));
	alarm_off();
	/* the pool's sleeper lock, held by another thread asleep in get() */
	g.pool = pool;
	g.ret = 1;
	atomic_store(&g.in, false);
	ASSERT_EQ(0, pthread_create(&t, NULL, pool_sleeper, &g));
	while (!atomic_load(&g.in))
		usleep(1000);
	usleep(50000);
	alarm_in(50);
	EXPECT_EQ(-EINTR, tshm_pool_get(pool, -1, &b));
	alarm_off();
	pthread_join(t, NULL);
	EXPECT_EQ(-ETIMEDOUT, g.ret);
	tshm_seg_unref(a);
	tshm_thread_set_intr(0);
	ASSERT_EQ(0, tshm_pool_get(pool, 0, &b));	/* usable */
	tshm_seg_unref(b);
	tshm_pool_destroy(pool);

	/* the release wait, while a child holds the segment */
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 2, 1, &q));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "held", 0, &a));
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	ASSERT_EQ(0, tshm_queue_send(q, "s", 1, &a, 1, 0));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		close(sv[0]);
		n = 1;
		if (tshm_queue_recv(q, &x, 1, &len, got, &n, 5000))
			_exit(1);
		write(sv[1], "r", 1);
		read(sv[1], &x, 1);	/* hold until told */
		_exit(0);
	}
	close(sv[1]);
	ASSERT_EQ(1, read(sv[0], &x, 1));
	tshm_thread_set_intr(1);
	alarm_in(50);
	EXPECT_EQ(-EINTR, tshm_seg_wait_released(a, -1));
	tshm_thread_set_intr(0);
	alarm_off();
	ASSERT_EQ(1, write(sv[0], "g", 1));
	EXPECT_EQ(0, tshm_seg_wait_released(a, 10000));
	EXPECT_EQ(0, wait_ok(pid));
	close(sv[0]);
	tshm_seg_unref(a);
	tshm_queue_unref(q);
}

TSHM_TEST_MAIN(NULL)
