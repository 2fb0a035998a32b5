// SPDX-License-Identifier: GPL-2.0
/*
 * A participant stopped (SIGSTOP, a debugger, a frozen cgroup) or killed
 * in the middle of a send or a receive costs the others at most its own
 * slot: they keep sending and receiving, every call well within its
 * timeout, and nothing is lost, duplicated or torn.
 *
 * To stop a process exactly while it is inside the queue, the message it
 * sends (or the buffer it receives into) starts out PROT_NONE: the
 * library's copy faults, and the SIGSEGV handler stops the process right
 * there (raise(SIGSTOP)); after SIGCONT it makes the page accessible and
 * the copy resumes.  So the sender is stopped holding a claimed slot, the
 * receiver in the middle of copying a message out.  All real: processes,
 * signals, page faults.
 */
#include <stdatomic.h>
#include <sys/mman.h>

#include "tshm-test.h"
#include "stop-in-copy.h"

#define CAPACITY	4
#define MSG		4096
#define OTHERS		300	/* messages the others move meanwhile */
#define TIMEOUT_MS	5000	/* each call's timeout: none may reach it */
#define STOPPED_ID	0xffffu

static pid_t stopped_child;	/* killed by the teardown if a test failed */

/* A page-aligned buffer the next copy will stop this process in. */
static void *arm_fault(uint32_t fill)
{
	char *p = stop_in_copy_buffer(MSG);

	memcpy(p, &fill, sizeof(fill));
	stop_in_copy_arm(p, MSG);
	return p;
}

FIXTURE(stall) {
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
	_Atomic uint32_t *seen;		/* per message id, in shared memory */
};

FIXTURE_SETUP(stall)
{
	ASSERT_EQ(0, tshm_ctx_open(&self->ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, CAPACITY, MSG, &self->q));
	self->seen = mmap(NULL, (STOPPED_ID + 1) * sizeof(*self->seen),
			  PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
			  -1, 0);
	ASSERT_NE(MAP_FAILED, self->seen);
}

FIXTURE_TEARDOWN(stall)
{
	if (stopped_child > 0) {
		kill(stopped_child, SIGKILL);
		waitpid(stopped_child, NULL, 0);
	}
	munmap(self->seen, (STOPPED_ID + 1) * sizeof(*self->seen));
	tshm_queue_unref(self->q);
	tshm_ctx_close(self->ctx);
}

static void wait_stopped(struct __test_metadata *_metadata, pid_t pid)
{
	int status;

	stopped_child = pid;
	ASSERT_EQ(pid, waitpid(pid, &status, WUNTRACED));
	ASSERT_TRUE(WIFSTOPPED(status));
}

/*
 * A message: its id in the first word, the id's pattern after it, so that
 * a torn message (bytes of two sends) is caught.
 */
static void make_msg(char *buf, uint32_t id)
{
	memcpy(buf, &id, sizeof(id));
	fill_pattern(buf + 8, MSG - 8, id);
}

static int check_msg(_Atomic uint32_t *seen, const char *buf, size_t len)
{
	char want[MSG];
	uint32_t id;

	if (len != MSG)
		return 1;
	memcpy(&id, buf, sizeof(id));
	if (id > STOPPED_ID)
		return 2;
	if (id != STOPPED_ID) {
		make_msg(want, id);
		if (memcmp(want + 8, buf + 8, MSG - 8))
			return 3;
	}
	atomic_fetch_add(&seen[id], 1);
	return 0;
}

/* The others: a producer process and this one receiving, each call timed. */
static void others_make_progress(struct __test_metadata *_metadata,
				 FIXTURE_DATA(stall) *self, bool with_seg)
{
	struct tshm_seg *seg = NULL;
	static char buf[MSG];
	unsigned i, n;
	size_t len;
	pid_t prod;

	if (with_seg)
		ASSERT_EQ(0, tshm_seg_create(self->ctx, 8192, "others", 0,
					     &seg));
	prod = fork();
	ASSERT_LE(0, prod);
	if (prod == 0) {
		char m[MSG];

		for (i = 0; i < OTHERS; i++) {
			make_msg(m, i);
			if (tshm_queue_send(self->q, m, MSG, &seg, !!seg,
					    TIMEOUT_MS))
				_exit(10);
		}
		_exit(0);
	}
	/* Until all of theirs came (one of a stopped receiver may too). */
	for (i = 0; i < OTHERS;) {
		struct tshm_seg *got = NULL;
		uint32_t id;

		n = 1;
		ASSERT_EQ(0, tshm_queue_recv(self->q, buf, MSG, &len, &got,
					     &n, TIMEOUT_MS));
		ASSERT_EQ(0, check_msg(self->seen, buf, len));
		memcpy(&id, buf, sizeof(id));
		if (id != STOPPED_ID) {
			ASSERT_EQ(!!seg, n);
			i++;
		}
		if (got)
			tshm_seg_unref(got);
	}
	EXPECT_EQ(0, wait_ok(prod));
	for (i = 0; i < OTHERS; i++)
		ASSERT_EQ(1, self->seen[i]);
	if (seg)
		tshm_seg_unref(seg);
}

/* Fork a sender that stops while it holds a claimed slot. */
static pid_t stopped_sender(struct __test_metadata *_metadata,
			    FIXTURE_DATA(stall) *self, bool with_seg)
{
	struct tshm_seg *seg = NULL;
	pid_t pid;

	pid = fork();
	if (pid == 0) {
		void *m;

		if (with_seg && tshm_seg_create(self->ctx, 4096, "stopped",
						0, &seg))
			_exit(20);
		if (seg)
			memset(tshm_seg_data(seg), 0x5a, 4096);
		m = arm_fault(STOPPED_ID);
		_exit(tshm_queue_send(self->q, m, MSG, &seg, !!seg,
				      -1) ? 21 : 0);
	}
	wait_stopped(_metadata, pid);
	return pid;
}

/* The stopped sender's message, once it goes on, arrives whole, once. */
static void receive_late(struct __test_metadata *_metadata,
			 FIXTURE_DATA(stall) *self, bool with_seg)
{
	static char buf[MSG];
	struct tshm_seg *got = NULL;
	unsigned n = 1;
	size_t len;
	uint32_t id;

	ASSERT_EQ(0, tshm_queue_recv(self->q, buf, MSG, &len, &got, &n,
				     TIMEOUT_MS));
	memcpy(&id, buf, sizeof(id));
	EXPECT_EQ(STOPPED_ID, id);
	EXPECT_EQ(MSG, len);
	EXPECT_EQ(with_seg, n);
	if (got) {
		EXPECT_EQ(0x5a, ((unsigned char *)tshm_seg_data(got))[4095]);
		tshm_seg_unref(got);
	}
	EXPECT_EQ(-EAGAIN, tshm_queue_recv(self->q, buf, MSG, &len, NULL,
					   NULL, 0));
}

TEST_F_TIMEOUT(stall, sender_stopped_holding_a_slot, 120)
{
	pid_t pid = stopped_sender(_metadata, self, false);

	others_make_progress(_metadata, self, false);
	kill(pid, SIGCONT);
	EXPECT_EQ(0, wait_ok(pid));
	stopped_child = 0;
	receive_late(_metadata, self, false);
}

/*
 * The stopped sender carries a segment.  On the module the others' own
 * segments go on too; on the fallback the messages with fds are ordered
 * by the segment lock the stopped sender holds, so there the others send
 * bytes only (Documentation/lib/queue.rst).
 */
TEST_F_TIMEOUT(stall, sender_with_segment_stopped_holding_a_slot, 120)
{
	pid_t pid = stopped_sender(_metadata, self, true);

	others_make_progress(_metadata, self, is_kmod(self->ctx));
	kill(pid, SIGCONT);
	EXPECT_EQ(0, wait_ok(pid));
	stopped_child = 0;
	receive_late(_metadata, self, true);
}

/* Killed while stopped holding its slot: the slot comes back. */
TEST_F_TIMEOUT(stall, sender_killed_while_stopped, 120)
{
	pid_t pid = stopped_sender(_metadata, self, true);
	char buf[MSG] = { 0 };
	unsigned i;
	int status;

	others_make_progress(_metadata, self, is_kmod(self->ctx));
	kill(pid, SIGKILL);
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	stopped_child = 0;
	/* Pass the dead claim once, then the whole capacity is there. */
	for (i = 0; i < 2 * CAPACITY; i++) {
		ASSERT_EQ(0, tshm_queue_send(self->q, buf, 8, NULL, 0, 0));
		ASSERT_EQ(0, tshm_queue_recv(self->q, buf, MSG, NULL, NULL,
					     NULL, 0));
	}
	for (i = 0; i < CAPACITY; i++)
		ASSERT_EQ(0, tshm_queue_send(self->q, buf, 8, NULL, 0, 0));
	EXPECT_EQ(-EAGAIN, tshm_queue_send(self->q, buf, 8, NULL, 0, 0));
	EXPECT_EQ(0, self->seen[STOPPED_ID]);
}

/*
 * A receiver stopped in the middle of copying a message out holds
 * nothing: the others go on, and once continued it gets one whole message
 * that nobody else got.
 */
TEST_F_TIMEOUT(stall, receiver_stopped_while_copying, 120)
{
	static char m[MSG];
	unsigned i, total = 0;
	pid_t pid;

	make_msg(m, STOPPED_ID);
	ASSERT_EQ(0, tshm_queue_send(self->q, m, MSG, NULL, 0, 0));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		char *buf = arm_fault(0);
		size_t len;

		if (tshm_queue_recv(self->q, buf, MSG, &len, NULL, NULL, -1))
			_exit(30);
		_exit(check_msg(self->seen, buf, len) ? 31 : 0);
	}
	wait_stopped(_metadata, pid);
	/* The stopped receiver's message is the others' now, or its own. */
	others_make_progress(_metadata, self, false);
	kill(pid, SIGCONT);
	/* If it has none left to take, give it one. */
	ASSERT_EQ(0, tshm_queue_send(self->q, m, MSG, NULL, 0, TIMEOUT_MS));
	EXPECT_EQ(0, wait_ok(pid));
	stopped_child = 0;
	while (tshm_queue_recv(self->q, m, MSG, NULL, NULL, NULL, 0) == 0)
		total++;
	/* Two messages with its id went in; each came out once. */
	EXPECT_EQ(2, self->seen[STOPPED_ID] + total);
	for (i = 0; i < OTHERS; i++)
		EXPECT_EQ(1, self->seen[i]);
}

TSHM_TEST_MAIN(NULL)
