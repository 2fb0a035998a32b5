// SPDX-License-Identifier: GPL-2.0
/*
 * Queue waits against processes that die or stop at the worst moment.
 *
 * This program interposes syscall(), through which the library makes its
 * futex calls: it counts FUTEX_WAKEs, and a process that sets kill_at_wake
 * SIGKILLs itself at its next FUTEX_WAKE, i.e. after a send or receive
 * committed and before the sleeper it owed a wake-up was woken.  The rest
 * is real: real processes, real signals, the real kernel futex.
 */
#include <dlfcn.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>

#include "tshm-test.h"

static atomic_int futex_wakes;
static volatile int kill_at_wake;

long syscall(long nr, ...);
long syscall(long nr, ...)
{
	static long (*real)(long, ...);
	long a[6];
	va_list ap;
	int i;

	va_start(ap, nr);
	for (i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (nr == SYS_futex && (a[1] & FUTEX_CMD_MASK) == FUTEX_WAKE) {
		atomic_fetch_add(&futex_wakes, 1);
		if (kill_at_wake)
			raise(SIGKILL);
	}
	if (!real)
		real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
	return real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

static int64_t ms_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

FIXTURE(w) {
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
};

FIXTURE_SETUP(w)
{
	ASSERT_EQ(0, tshm_ctx_open(&self->ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 1, 16, &self->q));
	ASSERT_EQ(0, tshm_queue_set_wait(self->q, TSHM_WAIT_FUTEX, 0));
}

FIXTURE_TEARDOWN(w)
{
	tshm_queue_unref(self->q);
	tshm_ctx_close(self->ctx);
}

static void expect_sigkilled(struct __test_metadata *_metadata, pid_t pid)
{
	int status;

	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFSIGNALED(status));
	EXPECT_EQ(SIGKILL, WTERMSIG(status));
}

/*
 * Finding 1: a sender killed after its commit, before its wake-up, must
 * not leave a sleeping receiver asleep with a message queued.
 */
TEST_F(w, sender_killed_before_wake)
{
	char buf[16];
	size_t len;
	pid_t pid;

	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		usleep(200000);		/* the receiver is asleep by now */
		kill_at_wake = 1;
		tshm_queue_send(self->q, "m", 1, NULL, 0, 0);
		_exit(1);		/* no wake-up owed: not the test */
	}
	EXPECT_EQ(0, tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL,
				     NULL, 5000));
	EXPECT_EQ(1, len);
	expect_sigkilled(_metadata, pid);
}

/* Finding 1, the other way: a receiver killed before waking a sender. */
TEST_F(w, receiver_killed_before_wake)
{
	char buf[16];
	size_t len;
	pid_t pid;

	ASSERT_EQ(0, tshm_queue_send(self->q, "a", 1, NULL, 0, 0));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		usleep(200000);		/* the sender is asleep by now */
		kill_at_wake = 1;
		tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL, NULL, 0);
		_exit(1);
	}
	EXPECT_EQ(0, tshm_queue_send(self->q, "b", 1, NULL, 0, 5000));
	expect_sigkilled(_metadata, pid);
	ASSERT_EQ(0, tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL,
				     NULL, 0));
	EXPECT_EQ('b', buf[0]);
}

/*
 * Finding 2: a receiver SIGKILLed while asleep must not make every later
 * send pay a FUTEX_WAKE for ever.
 */
TEST_F(w, dead_sleeper_costs_one_wake)
{
	char buf[16];
	size_t len;
	pid_t pid;
	int i;

	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL, NULL,
				-1);
		_exit(1);
	}
	usleep(300000);			/* asleep in the futex by now */
	kill(pid, SIGKILL);
	expect_sigkilled(_metadata, pid);
	atomic_store(&futex_wakes, 0);
	for (i = 0; i < 100; i++) {
		ASSERT_EQ(0, tshm_queue_send(self->q, "x", 1, NULL, 0, 0));
		ASSERT_EQ(0, tshm_queue_recv(self->q, buf, sizeof(buf), &len,
					     NULL, NULL, 0));
	}
	EXPECT_GE(1, atomic_load(&futex_wakes));
}

/*
 * Finding 3: timeouts hold against a participant stopped (SIGSTOP, a
 * debugger) in the middle of a send or receive.  The child sends and
 * receives in a loop; it is stopped at many random points, and each time
 * both calls with a timeout must come back (a bug shows as a hang, which
 * the watchdog alarm turns into a failure).
 */
#define STOP_ROUNDS	200

TEST_F_TIMEOUT(w, timeouts_hold_against_stopped_peer, 120)
{
	char buf[16];
	int64_t t0, worst = 0;
	size_t len;
	pid_t pid;
	int i, ret, status;

	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		for (;;) {
			tshm_queue_send(self->q, "c", 1, NULL, 0, 0);
			tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL,
					NULL, 0);
		}
	}
	for (i = 0; i < STOP_ROUNDS; i++) {
		usleep(500 + (i * 7919) % 2000);
		kill(pid, SIGSTOP);
		ASSERT_EQ(pid, waitpid(pid, &status, WUNTRACED));
		alarm(10);
		t0 = ms_now();
		ret = tshm_queue_send(self->q, "p", 1, NULL, 0, 0);
		EXPECT_TRUE(ret == 0 || ret == -EAGAIN);
		ret = tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL,
				      NULL, 20);
		EXPECT_TRUE(ret == 0 || ret == -ETIMEDOUT);
		if (ms_now() - t0 > worst)
			worst = ms_now() - t0;
		alarm(0);
		kill(pid, SIGCONT);
	}
	/* Killed while stopped, maybe holding the lock: the queue goes on. */
	kill(pid, SIGSTOP);
	waitpid(pid, &status, WUNTRACED);
	kill(pid, SIGKILL);
	expect_sigkilled(_metadata, pid);
	while (tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL, NULL,
			       0) == 0)
		;
	ASSERT_EQ(0, tshm_queue_send(self->q, "z", 1, NULL, 0, 1000));
	ASSERT_EQ(0, tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL,
				     NULL, 1000));
	EXPECT_EQ('z', buf[0]);
	TH_LOG("slowest round with a stopped peer: %lld ms", (long long)worst);
}

TSHM_TEST_MAIN(NULL)
