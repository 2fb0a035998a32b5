// SPDX-License-Identifier: GPL-2.0
/*
 * Buffer pools, events and barriers across processes.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#include "tshm-test.h"

FIXTURE(sync) {
	struct tshm_ctx *ctx;
	struct tshm_seg *shm;
	int fds_before;
};

FIXTURE_SETUP(sync)
{
	self->fds_before = count_fds();
	ASSERT_EQ(0, tshm_ctx_open(&self->ctx, 0));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "sync", 0, &self->shm));
}

FIXTURE_TEARDOWN(sync)
{
	tshm_seg_unref(self->shm);
	tshm_ctx_close(self->ctx);
	EXPECT_EQ(self->fds_before, count_fds());
}

TEST_F(sync, event)
{
	struct tshm_event *ev = tshm_seg_data(self->shm), junk;
	pid_t pid;

	memset(&junk, 0x5a, sizeof(junk));
	EXPECT_EQ(-EINVAL, tshm_event_set(&junk));
	EXPECT_EQ(-EINVAL, tshm_event_wait(&junk, 0));
	EXPECT_EQ(-EINVAL, tshm_event_init(NULL));
	ASSERT_EQ(0, tshm_event_init(ev));
	EXPECT_EQ(0, tshm_event_is_set(ev));
	EXPECT_EQ(-EAGAIN, tshm_event_wait(ev, 0));
	EXPECT_EQ(-ETIMEDOUT, tshm_event_wait(ev, 20));

	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0)
		_exit(tshm_event_wait(ev, 10000) == 0 ? 0 : 1);
	usleep(50000);
	ASSERT_EQ(0, tshm_event_set(ev));
	EXPECT_EQ(0, wait_ok(pid));
	EXPECT_EQ(1, tshm_event_is_set(ev));
	EXPECT_EQ(0, tshm_event_wait(ev, 0));
	ASSERT_EQ(0, tshm_event_reset(ev));
	EXPECT_EQ(0, tshm_event_is_set(ev));
	EXPECT_EQ(-EAGAIN, tshm_event_wait(ev, 0));
}

/*
 * A set followed at once by a reset still releases every waiter (it was
 * lost: woken waiters found the event unset and slept again).
 */
#define PULSE_WAITERS	3

TEST_F(sync, event_pulse)
{
	struct tshm_event *ev = tshm_seg_data(self->shm);
	pid_t pid[PULSE_WAITERS];
	int i;

	ASSERT_EQ(0, tshm_event_init(ev));
	for (i = 0; i < PULSE_WAITERS; i++) {
		pid[i] = fork();
		ASSERT_LE(0, pid[i]);
		if (pid[i] == 0)
			_exit(tshm_event_wait(ev, 5000) == 0 ? 0 : 1);
	}
	usleep(300000);		/* all asleep */
	ASSERT_EQ(0, tshm_event_set(ev));
	ASSERT_EQ(0, tshm_event_reset(ev));
	for (i = 0; i < PULSE_WAITERS; i++)
		EXPECT_EQ(0, wait_ok(pid[i]));
	EXPECT_EQ(0, tshm_event_is_set(ev));
	EXPECT_EQ(-EAGAIN, tshm_event_wait(ev, 0));
}

/*
 * Two members that both give up at once (timeout 0), many times: a
 * generation completes only with both counted, so each member sees the
 * same number of completions.  The last arrival's fetch_add then store
 * let a member withdraw in between and time out while the other passed.
 */
#define RACE_ROUNDS	200000

TEST_F_TIMEOUT(sync, barrier_withdraw_race, 300)
{
	struct tshm_barrier *bar = tshm_seg_data(self->shm);
	unsigned *passes = (unsigned *)((char *)tshm_seg_data(self->shm) + 64);
	pid_t pid;
	int i, ret;

	ASSERT_EQ(0, tshm_barrier_init(bar, 2));
	passes[0] = passes[1] = 0;
	pid = fork();
	ASSERT_LE(0, pid);
	for (i = 0; i < RACE_ROUNDS; i++) {
		ret = tshm_barrier_wait(bar, 0);
		if (ret >= 0)
			passes[pid == 0]++;
		else if (ret != -EAGAIN)
			break;
	}
	if (pid == 0)
		_exit(i == RACE_ROUNDS ? 0 : 1);
	EXPECT_EQ(RACE_ROUNDS, i);
	EXPECT_EQ(0, wait_ok(pid));
	TH_LOG("%u and %u completions", passes[0], passes[1]);
	EXPECT_EQ(passes[0], passes[1]);
}

#define BAR_MEMBERS	4
#define BAR_ROUNDS	200

TEST_F(sync, barrier)
{
	struct tshm_barrier *b = tshm_seg_data(self->shm), junk;
	_Atomic uint32_t *serial = (void *)((char *)tshm_seg_data(self->shm) + 64);
	_Atomic uint32_t *phase = serial + 1;
	pid_t pid[BAR_MEMBERS];
	int i;

	memset(&junk, 0, sizeof(junk));
	EXPECT_EQ(-EINVAL, tshm_barrier_wait(&junk, 0));
	EXPECT_EQ(-EINVAL, tshm_barrier_init(b, 0));
	EXPECT_EQ(-EINVAL, tshm_barrier_init(b, 70000));

	/* A lone member times out and withdraws; the barrier stays usable. */
	ASSERT_EQ(0, tshm_barrier_init(b, 2));
	EXPECT_EQ(-ETIMEDOUT, tshm_barrier_wait(b, 20));
	EXPECT_EQ(-EAGAIN, tshm_barrier_wait(b, 0));

	ASSERT_EQ(0, tshm_barrier_init(b, BAR_MEMBERS));
	for (i = 0; i < BAR_MEMBERS; i++) {
		pid[i] = fork();
		ASSERT_LE(0, pid[i]);
		if (pid[i])
			continue;
		for (int r = 0; r < BAR_ROUNDS; r++) {
			/* Nobody passes round r before all reached it. */
			if (atomic_load(phase) != (uint32_t)r)
				_exit(1);
			int ret = tshm_barrier_wait(b, 10000);

			if (ret < 0)
				_exit(2);
			if (ret == 1) {
				atomic_fetch_add(serial, 1);
				atomic_store(phase, r + 1);
			}
			if (tshm_barrier_wait(b, 10000) < 0)
				_exit(3);
		}
		_exit(0);
	}
	for (i = 0; i < BAR_MEMBERS; i++)
		EXPECT_EQ(0, wait_ok(pid[i]));
	EXPECT_EQ(BAR_ROUNDS, atomic_load(serial));
}

TEST_F(sync, pool)
{
	struct tshm_pool *pool;
	struct tshm_queue *q;
	struct tshm_seg *a, *b, *c, *got;
	unsigned n;
	size_t len;
	pid_t pid;
	char x;

	EXPECT_EQ(-EINVAL, tshm_pool_create(NULL, 2, 4096, "p", 0, &pool));
	EXPECT_EQ(-EINVAL, tshm_pool_create(self->ctx, 0, 4096, "p", 0, &pool));
	EXPECT_EQ(-EINVAL, tshm_pool_create(self->ctx, 2, 0, "p", 0, &pool));
	EXPECT_EQ(-EINVAL, tshm_pool_get(NULL, 0, &a));

	ASSERT_EQ(0, tshm_pool_create(self->ctx, 2, 1 << 20, "pool", 0, &pool));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 4, 8, &q));
	EXPECT_EQ(2, tshm_pool_available(pool));
	ASSERT_EQ(0, tshm_pool_get(pool, 0, &a));
	ASSERT_EQ(0, tshm_pool_get(pool, 0, &b));
	EXPECT_NE(a, b);
	EXPECT_EQ(0, tshm_pool_available(pool));
	EXPECT_EQ(-EAGAIN, tshm_pool_get(pool, 0, &c));
	EXPECT_EQ(-ETIMEDOUT, tshm_pool_get(pool, 20, &c));

	/* Never sent: back as soon as the local reference goes. */
	tshm_seg_unref(b);
	ASSERT_EQ(0, tshm_pool_get(pool, 0, &c));
	EXPECT_EQ(b, c);
	tshm_seg_unref(c);

	/*
	 * Sent to a child that holds it a while: get() waits for the
	 * release, which the child's exit (or death) provides.
	 */
	for (int kill_it = 0; kill_it < 2; kill_it++) {
		ASSERT_EQ(0, tshm_queue_send(q, NULL, 0, &a, 1, 0));
		pid = fork();
		ASSERT_LE(0, pid);
		if (pid == 0) {
			n = 1;
			if (tshm_queue_recv(q, &x, 1, &len, &got, &n, 5000) ||
			    n != 1)
				_exit(1);
			if (kill_it)
				pause();
			usleep(100000);
			tshm_seg_unref(got);
			usleep(100000);
			_exit(0);
		}
		tshm_seg_unref(a);
		ASSERT_EQ(0, tshm_pool_get(pool, 0, &c));	/* the other */
		EXPECT_EQ(-EAGAIN, tshm_pool_get(pool, 0, &b));
		if (kill_it) {
			while (tshm_queue_len(q))
				usleep(1000);
			usleep(50000);
			kill(pid, SIGKILL);
		}
		ASSERT_EQ(0, tshm_pool_get(pool, 10000, &b));
		EXPECT_EQ(a, b);
		waitpid(pid, NULL, 0);
		tshm_seg_unref(c);
		a = b;
	}
	tshm_seg_unref(a);
	EXPECT_EQ(2, tshm_pool_available(pool));
	tshm_queue_unref(q);
	tshm_pool_destroy(pool);
	tshm_pool_destroy(NULL);
}

struct pool_waiter {
	struct tshm_pool *pool;
	struct tshm_seg *got;
	int ret;
	_Atomic int started;
};

static void *pool_wait_thread(void *arg)
{
	struct pool_waiter *w = arg;

	atomic_store(&w->started, 1);
	w->ret = tshm_pool_get(w->pool, 20000, &w->got);
	return NULL;
}

/*
 * A thread asleep in get() holds up nobody: get() with timeout 0 and
 * available() answer while it sleeps, and it still gets the buffer when
 * it comes back (before, they waited on the lock the sleeper held across
 * its poll(), so the sleeper's 20 s ran out first).
 */
TEST_F(sync, pool_waiter_blocks_nobody)
{
	struct pool_waiter w = { 0 };
	struct tshm_seg *a, *c;
	pthread_t th;

	ASSERT_EQ(0, tshm_pool_create(self->ctx, 1, 4096, "pool", 0, &w.pool));
	ASSERT_EQ(0, tshm_pool_get(w.pool, 0, &a));
	ASSERT_EQ(0, pthread_create(&th, NULL, pool_wait_thread, &w));
	while (!atomic_load(&w.started))
		usleep(1000);
	usleep(50000);		/* asleep in poll() by now */
	EXPECT_EQ(-EAGAIN, tshm_pool_get(w.pool, 0, &c));
	EXPECT_EQ(0, tshm_pool_available(w.pool));
	EXPECT_EQ(-ETIMEDOUT, tshm_pool_get(w.pool, 100, &c));
	tshm_seg_unref(a);
	ASSERT_EQ(0, pthread_join(th, NULL));
	ASSERT_EQ(0, w.ret);
	EXPECT_EQ(a, w.got);
	tshm_seg_unref(w.got);
	tshm_pool_destroy(w.pool);
}

TSHM_TEST_MAIN(NULL)
