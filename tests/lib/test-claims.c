// SPDX-License-Identifier: GPL-2.0
/*
 * libtshm: who may free or revoke a slot claim (issue 15, the slot ring).
 * Found by review of the first slot ring; each failed on it.
 *
 *  zombie_claimer: a claimer killed but not yet reaped (its parent is
 *    busy sending) runs no more code: its claim is freed at once, as a
 *    reaped one's.  kill(pid, 0) succeeds on a zombie, so the ring asks
 *    /proc for its state.
 *  reaped_claimer: the same, reaped (the control).
 *  nonblocking_receiver_behind_stopped_sender: a receiver with timeout 0
 *    (a poll loop on tshm_queue_fd()) revokes a stopped claim once its
 *    calls add up to the claim bound: what is behind it is received.
 *  live_claims_not_probed: whether a claimer died costs a kill() and a
 *    read of /proc, asked where a claim is suspect only.  A receiver
 *    waiting behind a live sender's claim (on the fallback the sender
 *    claims, then sends the segment's fds: several microseconds) asked
 *    at every message, /proc read and all.
 *  other_pid_namespace_refused: claims name threads by id, meaningful in
 *    one pid namespace only.  A receiver in another one used to get ESRCH
 *    for a live sender, free its claim, and the sender's resumed copy tore
 *    the next message in that slot.  Now a process in another pid
 *    namespace than the creator's gets -EXDEV and nothing is lost.
 *
 * The stop technique is test-stall's: the message starts PROT_NONE, the
 * library's copy faults, the SIGSEGV handler raises SIGSTOP.
 */
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <time.h>

#include "tshm-test.h"
#include "stop-in-copy.h"

#define MSG	4096

/* A page-aligned message the library's copy will stop this process in. */
static void *arm_fault(char fill)
{
	char *p = stop_in_copy_buffer(MSG);

	memset(p, fill, MSG);
	stop_in_copy_arm(p, MSG);
	return p;
}

/* A child that stops inside tshm_queue_send() holding a claim. */
static pid_t stopped_sender(struct __test_metadata *_metadata,
			    struct tshm_queue *q, char fill)
{
	int status;
	pid_t pid = fork();

	ASSERT_LE(0, pid);
	if (pid == 0) {
		void *p = arm_fault(fill);

		_exit(tshm_queue_send(q, p, MSG, NULL, 0, 60000) ? 1 : 0);
	}
	ASSERT_EQ(pid, waitpid(pid, &status, WUNTRACED));
	ASSERT_TRUE(WIFSTOPPED(status));
	return pid;
}

/* A receiver running beside the send: exits 0 once it got a 'B' message. */
static pid_t start_receiver(struct tshm_queue *q)
{
	pid_t pid = fork();

	if (pid == 0) {
		static char rb[MSG];
		size_t rlen;
		int r = tshm_queue_recv(q, rb, MSG, &rlen, NULL, NULL, 3000);

		if (r)
			fprintf(stderr, "receiver: %d (%s)\n", r, strerror(-r));
		_exit(r ? 1 : rb[0] == 'B' ? 0 : 2);
	}
	return pid;
}

static int wait_exit(pid_t pid)
{
	int status;

	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

/*
 * The claimer is SIGKILLed but not yet reaped (its parent is the one
 * sending): kill(pid, 0) succeeds on a zombie, so the claim is "alive",
 * revoked, then passed over until the parent reaps; with capacity 1 the
 * parent's own send can never succeed before it reaps.
 */
TEST(zombie_claimer)
{
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
	static char buf[MSG];
	siginfo_t si;
	pid_t pid, rx;
	int ret;

	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(ctx, 1, MSG, &q));
	pid = stopped_sender(_metadata, q, 'S');
	kill(pid, SIGKILL);
	ASSERT_EQ(0, waitid(P_PID, pid, &si, WEXITED | WNOWAIT));
	rx = start_receiver(q);
	memset(buf, 'B', MSG);
	ret = tshm_queue_send(q, buf, MSG, NULL, 0, 2000);
	if (ret)
		TH_LOG("send after the claimer died (unreaped): %d (%s)",
		       ret, strerror(-ret));
	EXPECT_EQ(0, ret);
	EXPECT_EQ(0, wait_exit(rx));
	waitpid(pid, NULL, 0);
	tshm_queue_unref(q);
	tshm_ctx_close(ctx);
}

/* The control: reaped, the claimer's tid is gone and its slot is freed. */
TEST(reaped_claimer)
{
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
	static char buf[MSG];
	pid_t pid, rx;

	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(ctx, 1, MSG, &q));
	pid = stopped_sender(_metadata, q, 'S');
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	rx = start_receiver(q);
	memset(buf, 'B', MSG);
	EXPECT_EQ(0, tshm_queue_send(q, buf, MSG, NULL, 0, 2000));
	EXPECT_EQ(0, wait_exit(rx));
	tshm_queue_unref(q);
	tshm_ctx_close(ctx);
}

/*
 * A receiver that never blocks (timeout 0, as a poll loop on
 * tshm_queue_fd() does: "receive until -EAGAIN") measures a claim's stall
 * in q_find()'s locals, which start over at every call: it never sees
 * the claim bound pass, never revokes, and the message published behind
 * the stopped sender's claim is never received.
 */
TEST(nonblocking_receiver_behind_stopped_sender)
{
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
	static char buf[MSG];
	int i, ret = -EAGAIN, eagain = 0;
	size_t len;
	pid_t pid;

	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(ctx, 4, MSG, &q));
	pid = stopped_sender(_metadata, q, 'S');
	memset(buf, 'B', MSG);
	ASSERT_EQ(0, tshm_queue_send(q, buf, MSG, NULL, 0, 1000));
	/* 2 s of polling, 100 times the claim bound. */
	for (i = 0; i < 200; i++) {
		ret = tshm_queue_recv(q, buf, MSG, &len, NULL, NULL, 0);
		if (ret != -EAGAIN)
			break;
		eagain++;
		usleep(10 * 1000);
	}
	TH_LOG("recv(timeout 0): %d after %d x -EAGAIN over ~%d ms", ret,
	       eagain, eagain * 10);
	EXPECT_EQ(0, ret);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	tshm_queue_unref(q);
	tshm_ctx_close(ctx);
}

/* read() system calls this process has made (/proc/self/io), or -1. */
static long reads_made(void)
{
	char buf[512], *p;
	long n = -1;
	FILE *f = fopen("/proc/self/io", "r");

	if (!f)
		return -1;
	while (fgets(buf, sizeof(buf), f)) {
		p = strstr(buf, "syscr: ");
		if (p == buf)
			n = strtol(p + 7, NULL, 10);
	}
	fclose(f);
	return n;
}

#define PINGS	2000

static void spin_us(int us)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1000000 +
		 (t.tv_nsec - t0.tv_nsec) / 1000 < us);
}

/*
 * Ping-pong of messages that carry a segment: the receiver waits (as a
 * blocking get() does) while each sender holds its claim.  It used to
 * read /proc/<tid>/stat about once per message; now it asks only about a
 * claim that has stood QUEUE_DEAD_CHECK_NS (1 ms), which a busy machine
 * may make a few do.
 */
TEST(live_claims_not_probed)
{
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS], *got[TSHM_QUEUE_MAX_SEGS];
	struct tshm_queue *q, *acks;
	struct tshm_ctx *ctx;
	unsigned int n, j;
	long reads = -1;
	size_t len;
	int i, status;
	pid_t rx;

	if (reads_made() < 0)
		SKIP(return, "no /proc/self/io (CONFIG_TASK_IO_ACCOUNTING)");
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(ctx, 4, 64, &q));
	ASSERT_EQ(0, tshm_queue_create(ctx, 4, 64, &acks));
	/* The most segments: on the fallback, the longest claim (16 fds). */
	for (j = 0; j < TSHM_QUEUE_MAX_SEGS; j++)
		ASSERT_EQ(0, tshm_seg_create(ctx, 4096, "claims", 0, &segs[j]));
	rx = fork();
	ASSERT_LE(0, rx);
	if (rx == 0) {
		long before = reads_made();

		for (i = 0; i < PINGS; i++) {
			n = TSHM_QUEUE_MAX_SEGS;
			if (tshm_queue_recv(q, NULL, 0, &len, got, &n, 5000))
				_exit(1);
			for (j = 0; j < n; j++)
				tshm_seg_unref(got[j]);
			if (i < PINGS - 1 &&
			    tshm_queue_send(acks, "k", 1, NULL, 0, 5000))
				_exit(2);
			/* Back late, as a Python get() is: in the claim. */
			spin_us(i % 16);
		}
		reads = reads_made() - before;
		_exit(tshm_queue_send(acks, &reads, sizeof(reads), NULL, 0,
				      5000) ? 3 : 0);
	}
	for (i = 0; i < PINGS; i++) {
		ASSERT_EQ(0, tshm_queue_send(q, NULL, 0, segs,
					     TSHM_QUEUE_MAX_SEGS, 5000));
		ASSERT_EQ(0, tshm_queue_recv(acks, &reads, sizeof(reads), &len,
					     NULL, NULL, 5000));
	}
	ASSERT_EQ(sizeof(reads), len);
	ASSERT_EQ(rx, waitpid(rx, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_EQ(0, WEXITSTATUS(status));
	TH_LOG("the receiver made %ld read()s for %d messages", reads, PINGS);
	EXPECT_LT(reads, PINGS / 20);
	for (j = 0; j < TSHM_QUEUE_MAX_SEGS; j++)
		tshm_seg_unref(segs[j]);
	tshm_queue_unref(acks);
	tshm_queue_unref(q);
	tshm_ctx_close(ctx);
}

/* 0, or why a child cannot enter a new pid namespace (no CONFIG_PID_NS). */
static int pid_ns_errno(void)
{
	int status;
	pid_t pid = fork();

	if (pid == 0)
		_exit(unshare(CLONE_NEWPID) ? errno : 0);
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return EIO;
	return WEXITSTATUS(status);
}

/*
 * A process in another pid namespace than the queue's creator is refused
 * (-EXDEV) on send and receive, while a sender here is stopped holding a
 * claim; once it runs again every message arrives whole, exactly once.
 */
TEST(other_pid_namespace_refused)
{
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
	static char buf[MSG];
	char got[3] = "";
	int status, i;
	size_t len;
	pid_t s1, ns;

	if (geteuid() != 0)
		SKIP(return, "unshare(CLONE_NEWPID) needs root");
	if (pid_ns_errno())
		SKIP(return, "unshare(CLONE_NEWPID): %s", strerror(pid_ns_errno()));
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(ctx, 2, MSG, &q));
	s1 = stopped_sender(_metadata, q, 'A');
	memset(buf, 'B', MSG);
	ASSERT_EQ(0, tshm_queue_send(q, buf, MSG, NULL, 0, 2000));

	ns = fork();
	ASSERT_LE(0, ns);
	if (ns == 0) {
		pid_t rx;

		if (unshare(CLONE_NEWPID))
			_exit(2);
		rx = fork();
		if (rx < 0)
			_exit(3);
		if (rx == 0) {
			static char rb[MSG];

			/* pid 1 in its namespace: S1's tid means nothing. */
			if (tshm_queue_recv(q, rb, MSG, &len, NULL, NULL,
					    200) != -EXDEV)
				_exit(4);
			if (tshm_queue_send(q, rb, 1, NULL, 0, 0) != -EXDEV)
				_exit(5);
			_exit(0);
		}
		_exit(waitpid(rx, &status, 0) == rx && WIFEXITED(status) ?
		      WEXITSTATUS(status) : 6);
	}
	ASSERT_EQ(ns, waitpid(ns, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_EQ(0, WEXITSTATUS(status));

	kill(s1, SIGCONT);
	for (i = 0; i < 2; i++) {
		ASSERT_EQ(0, tshm_queue_recv(q, buf, MSG, &len, NULL, NULL,
					     5000));
		ASSERT_EQ(MSG, len);
		got[i] = buf[0];
		EXPECT_EQ(0, memcmp(buf, buf + 1, MSG - 1));
	}
	EXPECT_EQ(-EAGAIN, tshm_queue_recv(q, buf, MSG, &len, NULL, NULL, 0));
	TH_LOG("received %.2s", got);
	EXPECT_TRUE(!strcmp(got, "AB") || !strcmp(got, "BA"));
	ASSERT_EQ(s1, waitpid(s1, &status, 0));
	EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	tshm_queue_unref(q);
	tshm_ctx_close(ctx);
}

TSHM_TEST_MAIN(NULL)
