// SPDX-License-Identifier: GPL-2.0
/*
 * Queue messages that carry fds (tshm_queue_send_fds/recv_fds), on either
 * backend: the receiver gets the sender's files, in the message they were
 * sent with, also after the sender exited; bad input loses nothing; a
 * receiver out of fds leaves the message queued; mixed with segments and
 * byte-only messages across processes, every fd arrives with its own
 * message, and consumers SIGKILLed mid-stream cost only what they took.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "tshm-test.h"

FIXTURE(qf) {
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
	int fds_before;
};

FIXTURE_SETUP(qf)
{
	print_backend();
	self->fds_before = count_fds();
	ASSERT_EQ(0, tshm_ctx_open(&self->ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 16, 64, &self->q));
}

FIXTURE_TEARDOWN(qf)
{
	tshm_queue_unref(self->q);
	tshm_ctx_close(self->ctx);
	EXPECT_EQ(self->fds_before, count_fds());
	EXPECT_EQ(0, count_seg_memfds());
}

static bool same_file(int a, int b)
{
	struct stat sa, sb;

	return !fstat(a, &sa) && !fstat(b, &sb) && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

/* A memfd holding @v, the way producers below label their messages. */
static int labelled_fd(uint64_t v)
{
	int fd = memfd_create("qfd-test", MFD_CLOEXEC);

	if (fd >= 0 && pwrite(fd, &v, sizeof(v), 0) != sizeof(v)) {
		close(fd);
		return -1;
	}
	return fd;
}

static uint64_t label_of(int fd)
{
	uint64_t v = ~0ULL;

	if (pread(fd, &v, sizeof(v), 0) != sizeof(v))
		return ~0ULL;
	return v;
}

TEST_F(qf, errors_lose_nothing)
{
	int p[2], fds[TSHM_QUEUE_MAX_FDS + 1], got[TSHM_QUEUE_MAX_FDS];
	unsigned n, nsegs;
	size_t len;
	char b[8];

	ASSERT_EQ(0, pipe2(p, O_CLOEXEC));
	for (n = 0; n <= TSHM_QUEUE_MAX_FDS; n++)
		fds[n] = p[0];
	EXPECT_EQ(-E2BIG, tshm_queue_send_fds(self->q, "a", 1, NULL, 0, fds,
					      TSHM_QUEUE_MAX_FDS + 1, 0));
	EXPECT_EQ(-EINVAL, tshm_queue_send_fds(self->q, "a", 1, NULL, 0,
					       NULL, 1, 0));
	fds[0] = 1000000;
	EXPECT_EQ(-EBADF, tshm_queue_send_fds(self->q, "a", 1, NULL, 0, fds,
					      1, 0));
	EXPECT_EQ(0, tshm_queue_len(self->q));

	/* Two fds: no room for them leaves the message queued. */
	fds[0] = p[0];
	fds[1] = p[1];
	ASSERT_EQ(0, tshm_queue_send_fds(self->q, "m", 1, NULL, 0, fds, 2,
					 0));
	nsegs = 0;
	EXPECT_EQ(-ENOBUFS, tshm_queue_recv(self->q, b, sizeof(b), &len,
					    NULL, &nsegs, 0));
	n = 1;
	EXPECT_EQ(-ENOBUFS, tshm_queue_recv_fds(self->q, b, sizeof(b), &len,
						NULL, NULL, got, &n, 0));
	EXPECT_EQ(2, n);
	EXPECT_EQ(1, tshm_queue_len(self->q));
	n = TSHM_QUEUE_MAX_FDS;
	ASSERT_EQ(0, tshm_queue_recv_fds(self->q, b, sizeof(b), &len, NULL,
					 NULL, got, &n, 0));
	EXPECT_EQ(1, len);
	EXPECT_EQ('m', b[0]);
	ASSERT_EQ(2, n);
	EXPECT_TRUE(same_file(got[0], p[0]));
	EXPECT_TRUE(same_file(got[1], p[1]));
	EXPECT_NE(got[0], p[0]);
	EXPECT_EQ(FD_CLOEXEC, fcntl(got[0], F_GETFD) & FD_CLOEXEC);
	/* The received write end writes into the sender's pipe. */
	EXPECT_EQ(1, write(got[1], "z", 1));
	EXPECT_EQ(1, read(p[0], b, 1));
	EXPECT_EQ('z', b[0]);
	close(got[0]);
	close(got[1]);
	close(p[0]);
	close(p[1]);

	/* A message without fds arrives through recv_fds with none. */
	ASSERT_EQ(0, tshm_queue_send(self->q, "x", 1, NULL, 0, 0));
	n = TSHM_QUEUE_MAX_FDS;
	ASSERT_EQ(0, tshm_queue_recv_fds(self->q, b, sizeof(b), &len, NULL,
					 NULL, got, &n, 0));
	EXPECT_EQ(0, n);
}

/* The most a message carries: 8 segments and 4 fds, one socket message. */
TEST_F(qf, most_segments_and_fds)
{
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS], *got[TSHM_QUEUE_MAX_SEGS];
	int fds[TSHM_QUEUE_MAX_FDS], rfds[TSHM_QUEUE_MAX_FDS];
	unsigned i, nsegs = TSHM_QUEUE_MAX_SEGS, nfds = TSHM_QUEUE_MAX_FDS;
	size_t len;
	char b[8];

	for (i = 0; i < TSHM_QUEUE_MAX_SEGS; i++) {
		ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "most", 0,
					     &segs[i]));
		*(uint64_t *)tshm_seg_data(segs[i]) = 100 + i;
	}
	for (i = 0; i < TSHM_QUEUE_MAX_FDS; i++) {
		fds[i] = labelled_fd(200 + i);
		ASSERT_LE(0, fds[i]);
	}
	ASSERT_EQ(0, tshm_queue_send_fds(self->q, "M", 1, segs,
					 TSHM_QUEUE_MAX_SEGS, fds,
					 TSHM_QUEUE_MAX_FDS, 0));
	ASSERT_EQ(0, tshm_queue_send(self->q, "b", 1, NULL, 0, 0));
	ASSERT_EQ(0, tshm_queue_recv_fds(self->q, b, sizeof(b), &len, got,
					 &nsegs, rfds, &nfds, 0));
	ASSERT_EQ(TSHM_QUEUE_MAX_SEGS, nsegs);
	ASSERT_EQ(TSHM_QUEUE_MAX_FDS, nfds);
	for (i = 0; i < TSHM_QUEUE_MAX_SEGS; i++) {
		EXPECT_EQ(100 + i, *(uint64_t *)tshm_seg_data(got[i]));
		tshm_seg_unref(got[i]);
	}
	for (i = 0; i < TSHM_QUEUE_MAX_FDS; i++) {
		EXPECT_EQ(200 + i, label_of(rfds[i]));
		close(rfds[i]);
		close(fds[i]);
	}
	/* The byte message behind it is not held up. */
	ASSERT_EQ(0, tshm_queue_recv(self->q, b, sizeof(b), &len, NULL, NULL,
				     0));
	EXPECT_EQ('b', b[0]);
	for (i = 0; i < TSHM_QUEUE_MAX_SEGS; i++)
		tshm_seg_unref(segs[i]);
}

/* Take one message and let go of all it brought: its fd count, or -errno. */
static int take_and_drop(struct tshm_queue *q, int timeout_ms)
{
	struct tshm_seg *rs[TSHM_QUEUE_MAX_SEGS];
	unsigned ns = TSHM_QUEUE_MAX_SEGS, nf = TSHM_QUEUE_MAX_FDS, i;
	int got[TSHM_QUEUE_MAX_FDS], ret;
	size_t len;
	char b[8];

	ret = tshm_queue_recv_fds(q, b, sizeof(b), &len, rs, &ns, got, &nf,
				  timeout_ms);
	if (ret)
		return ret;
	for (i = 0; i < nf; i++)
		close(got[i]);
	for (i = 0; i < ns; i++)
		tshm_seg_unref(rs[i]);
	return nf;
}

/*
 * A send that fails because the socket is full sends nothing: not its
 * segments either (they once went in a socket message of their own, which
 * stayed behind as an orphan no receiver dropped, holding the segment and
 * wedging later fd messages).
 */
TEST_F(qf, full_socket_send_leaves_nothing)
{
	int p[2], ret, sent = 0, fails = 0;
	struct tshm_queue *q;
	struct tshm_seg *seg;

	ASSERT_EQ(0, tshm_queue_create(self->ctx, 16384, 64, &q));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "victim", 0, &seg));
	ASSERT_EQ(0, pipe2(p, O_CLOEXEC));
	while ((ret = tshm_queue_send_fds(q, "f", 1, NULL, 0, &p[0], 1, 0)) ==
	       0)
		sent++;
	EXPECT_EQ(-EAGAIN, ret);
	ASSERT_LT(sent, 16384);		/* the socket filled, not the ring */
	EXPECT_EQ(-EAGAIN, tshm_queue_send_fds(q, "s", 1, &seg, 1, p, 2, 0));
	/*
	 * Room for one small message: the segments' fds and the message's
	 * own fit, or nothing goes (they were two socket messages once, and
	 * the second did not fit).
	 */
	for (int round = 0; round < 50; round++) {
		ASSERT_LE(0, take_and_drop(q, 0));
		ret = tshm_queue_send_fds(q, "s", 1, &seg, 1, p, 2, 0);
		ASSERT_TRUE(ret == 0 || ret == -EAGAIN);
		if (ret == 0)
			sent++;
		else
			fails++;
	}
	while (tshm_queue_len(q))
		ASSERT_LE(0, take_and_drop(q, 0));
	TH_LOG("%d sent, %d refused while the socket was full", sent, fails);
	/* Nothing of the refused sends holds the segment or the socket. */
	EXPECT_EQ(0, tshm_seg_wait_released(seg, 2000));
	EXPECT_EQ(0, tshm_queue_send_fds(q, "s", 1, &seg, 1, p, 2, 2000));
	EXPECT_EQ(2, take_and_drop(q, 2000));
	close(p[0]);
	close(p[1]);
	tshm_seg_unref(seg);
	tshm_queue_unref(q);
}

/* The kernel holds a queued message's files: the sender may exit. */
TEST_F(qf, sender_exits_before_receive)
{
	int got[TSHM_QUEUE_MAX_FDS];
	unsigned n = TSHM_QUEUE_MAX_FDS;
	size_t len;
	pid_t pid;
	char b[8];

	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		int p[2];

		if (pipe2(p, O_CLOEXEC) || write(p[1], "hi", 2) != 2)
			_exit(1);
		_exit(tshm_queue_send_fds(self->q, "p", 1, NULL, 0, p, 2, 0) ?
		      2 : 0);
	}
	ASSERT_EQ(0, wait_ok(pid));
	ASSERT_EQ(0, tshm_queue_recv_fds(self->q, b, sizeof(b), &len, NULL,
					 NULL, got, &n, 1000));
	ASSERT_EQ(2, n);
	EXPECT_EQ(2, read(got[0], b, sizeof(b)));
	EXPECT_EQ(0, memcmp(b, "hi", 2));
	close(got[1]);
	/* The last write end is gone with it: end of file. */
	EXPECT_EQ(0, read(got[0], b, sizeof(b)));
	close(got[0]);
}

static int out_of_fds_child(struct tshm_queue *q)
{
	static struct fd_squeeze sq;
	struct tshm_seg *segs[1];
	unsigned nsegs = 1, n = 2;
	int got[2], ret;
	size_t len;
	char x;

	if (fds_squeeze(&sq))
		return 10;
	ret = tshm_queue_recv_fds(q, &x, 1, &len, segs, &nsegs, got, &n, 2000);
	if (ret != -EMFILE) {
		fprintf(stderr, "# recv out of fds: %d (%s)\n", ret,
			tshm_strerror(ret));
		return 12;
	}
	/* Room for one is not: the message's fds come with the segment. */
	fds_give(&sq, 1);
	ret = tshm_queue_recv_fds(q, &x, 1, &len, segs, &nsegs, got, &n, 0);
	if (ret != -EMFILE)
		return 13;
	if (fds_unsqueeze(&sq))
		return 14;
	nsegs = 1;
	n = 2;
	ret = tshm_queue_recv_fds(q, &x, 1, &len, segs, &nsegs, got, &n, 0);
	if (ret || nsegs != 1 || n != 2 || x != 'e')
		return 15;
	if (label_of(got[0]) != 41 || label_of(got[1]) != 42)
		return 16;
	if (*(uint64_t *)tshm_seg_data(segs[0]) != 43)
		return 17;
	close(got[0]);
	close(got[1]);
	tshm_seg_unref(segs[0]);
	return 0;
}

/* No room for the fds (RLIMIT_NOFILE): -EMFILE, and the message stays. */
TEST_F(qf, recv_out_of_fds_keeps_message)
{
	struct tshm_seg *seg;
	int fds[2];
	pid_t pid;

	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "qfd", 0, &seg));
	*(uint64_t *)tshm_seg_data(seg) = 43;
	fds[0] = labelled_fd(41);
	fds[1] = labelled_fd(42);
	ASSERT_LE(0, fds[0]);
	ASSERT_LE(0, fds[1]);
	ASSERT_EQ(0, tshm_queue_send_fds(self->q, "e", 1, &seg, 1, fds, 2,
					 0));
	close(fds[0]);
	close(fds[1]);
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0)
		_exit(out_of_fds_child(self->q));
	EXPECT_EQ(0, wait_ok(pid));
	EXPECT_EQ(0, tshm_queue_len(self->q));
	EXPECT_EQ(0, tshm_seg_wait_released(seg, 5000));
	tshm_seg_unref(seg);
}

#define MIX_PRODUCERS	2
#define MIX_CONSUMERS	2
#define MIX_PER		300

struct mix_msg {
	uint32_t producer;
	uint32_t seq;
	uint32_t kind;		/* bit 0: a segment, bit 1: fds */
};

/* Per message: how many times it arrived intact; mismatches. */
struct mix_board {
	_Atomic uint32_t seen[MIX_PRODUCERS * MIX_PER];
	_Atomic uint32_t bad;
	_Atomic uint32_t done;
};

static uint64_t mix_label(uint32_t producer, uint32_t seq, unsigned i)
{
	return (uint64_t)producer << 40 | (uint64_t)seq << 8 | i;
}

static int mix_producer(struct tshm_ctx *ctx, struct tshm_queue *q,
			uint32_t producer)
{
	struct tshm_seg *seg = NULL;
	struct mix_msg m = { .producer = producer };
	int fds[TSHM_QUEUE_MAX_FDS], ret;
	unsigned nfds, i;

	for (m.seq = 0; m.seq < MIX_PER; m.seq++) {
		m.kind = m.seq % 4;
		nfds = m.kind & 2 ? 1 + m.seq % TSHM_QUEUE_MAX_FDS : 0;
		for (i = 0; i < nfds; i++) {
			fds[i] = labelled_fd(mix_label(producer, m.seq, i));
			if (fds[i] < 0)
				return 20;
		}
		if (m.kind & 1) {
			if (tshm_seg_create(ctx, 4096, "mix", 0, &seg))
				return 21;
			*(uint64_t *)tshm_seg_data(seg) =
				mix_label(producer, m.seq, 99);
		}
		ret = tshm_queue_send_fds(q, &m, sizeof(m), &seg,
					  m.kind & 1 ? 1 : 0, fds, nfds, 20000);
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		if (seg)
			tshm_seg_unref(seg);
		seg = NULL;
		if (ret) {
			fprintf(stderr, "# producer %u: %s\n", producer,
				tshm_strerror(ret));
			return 22;
		}
	}
	return 0;
}

/* Take messages until the queue is closed and drained; check each. */
static int mix_consumer(struct tshm_queue *q, struct mix_board *board)
{
	int fds[TSHM_QUEUE_MAX_FDS], ret;
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS];
	unsigned nsegs, nfds, i, want;
	struct mix_msg m;
	bool ok;
	size_t len;

	for (;;) {
		nsegs = TSHM_QUEUE_MAX_SEGS;
		nfds = TSHM_QUEUE_MAX_FDS;
		ret = tshm_queue_recv_fds(q, &m, sizeof(m), &len, segs, &nsegs,
					  fds, &nfds, 30000);
		if (ret == -EPIPE)
			return 0;
		if (ret) {
			fprintf(stderr, "# consumer: %s\n", tshm_strerror(ret));
			return 30;
		}
		want = m.kind & 2 ? 1 + m.seq % TSHM_QUEUE_MAX_FDS : 0;
		ok = len == sizeof(m) && m.producer < MIX_PRODUCERS &&
		     m.seq < MIX_PER && nfds == want &&
		     nsegs == (m.kind & 1 ? 1U : 0U);
		for (i = 0; ok && i < nfds; i++)
			ok = label_of(fds[i]) == mix_label(m.producer, m.seq, i);
		if (ok && nsegs)
			ok = *(uint64_t *)tshm_seg_data(segs[0]) ==
			     mix_label(m.producer, m.seq, 99);
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		for (i = 0; i < nsegs; i++)
			tshm_seg_unref(segs[i]);
		if (!ok)
			atomic_fetch_add(&board->bad, 1);
		else
			atomic_fetch_add(&board->seen[m.producer * MIX_PER +
						      m.seq], 1);
	}
}

/*
 * Producers mix byte-only, segment, fd and segment+fd messages; consumers
 * check that every message's fds and segment are its own.  With @kill,
 * consumers are SIGKILLed while they take messages and replaced: messages
 * are then delivered at most once, and the ones the dead did not take
 * reach the survivors.
 */
static void mix_case(struct __test_metadata *_metadata, struct tshm_ctx *ctx,
		     struct tshm_queue *q, bool kill_consumers)
{
	struct mix_board *board;
	pid_t prod[MIX_PRODUCERS], cons[MIX_CONSUMERS];
	unsigned i, once = 0, more = 0, killed = 0;

	board = mmap(NULL, sizeof(*board), PROT_READ | PROT_WRITE,
		     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, board);
	for (i = 0; i < MIX_CONSUMERS; i++) {
		cons[i] = fork();
		ASSERT_LE(0, cons[i]);
		if (cons[i] == 0)
			_exit(mix_consumer(q, board));
	}
	for (i = 0; i < MIX_PRODUCERS; i++) {
		prod[i] = fork();
		ASSERT_LE(0, prod[i]);
		if (prod[i] == 0)
			_exit(mix_producer(ctx, q, i));
	}
	while (kill_consumers && killed < 20) {
		struct timespec ts = { 0, 3000000 + rand() % 5000000 };
		unsigned v = rand() % MIX_CONSUMERS;

		nanosleep(&ts, NULL);
		kill(cons[v], SIGKILL);
		waitpid(cons[v], NULL, 0);
		killed++;
		cons[v] = fork();
		ASSERT_LE(0, cons[v]);
		if (cons[v] == 0)
			_exit(mix_consumer(q, board));
	}
	for (i = 0; i < MIX_PRODUCERS; i++)
		EXPECT_EQ(0, wait_ok(prod[i]));
	ASSERT_EQ(0, tshm_queue_close(q));
	for (i = 0; i < MIX_CONSUMERS; i++)
		EXPECT_EQ(0, wait_ok(cons[i]));
	for (i = 0; i < MIX_PRODUCERS * MIX_PER; i++) {
		once += board->seen[i] == 1;
		more += board->seen[i] > 1;
	}
	printf("# %u of %u delivered, %u twice, %u mismatched, %u consumers "
	       "killed\n", once, MIX_PRODUCERS * MIX_PER, more, board->bad,
	       killed);
	fflush(stdout);
	EXPECT_EQ(0, board->bad);
	EXPECT_EQ(0, more);
	/* Each killed consumer took at most one message with it. */
	EXPECT_LE(MIX_PRODUCERS * MIX_PER - killed, once);
	if (!kill_consumers) {
		EXPECT_EQ(MIX_PRODUCERS * MIX_PER, once);
	}
	EXPECT_EQ(0, tshm_queue_len(q));
	munmap(board, sizeof(*board));
}

TEST_F_TIMEOUT(qf, mixed_messages_across_processes, 300)
{
	mix_case(_metadata, self->ctx, self->q, false);
}

TEST_F_TIMEOUT(qf, consumers_killed_mid_stream, 300)
{
	srand(time(NULL));
	mix_case(_metadata, self->ctx, self->q, true);
}

TEST_HARNESS_MAIN
