// SPDX-License-Identifier: GPL-2.0
/*
 * Queues: errors, bytes and segments, close and drain, fork, exec and
 * socket hand-over, many producers and consumers, corrupted rings.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include <linux/tshm.h>

#include "tshm-test.h"

struct msg {
	uint32_t producer;
	uint32_t seq;
	uint64_t sum;		/* of the segment's contents */
	uint64_t self_sum;	/* of the fields above */
};

static uint64_t msg_sum(const struct msg *m)
{
	return fnv1a(m, offsetof(struct msg, self_sum));
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The checksum of 4096 bytes of fill_pattern(@seed). */
static uint64_t fill_sum(uint32_t seed)
{
	static unsigned char page[4096];

	fill_pattern(page, sizeof(page), seed);
	return fnv1a(page, sizeof(page));
}

FIXTURE(q) {
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
	int fds_before;
};

FIXTURE_SETUP(q)
{
	self->fds_before = count_fds();
	ASSERT_EQ(0, tshm_ctx_open(&self->ctx, 0));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 8, 256, &self->q));
}

FIXTURE_TEARDOWN(q)
{
	tshm_queue_unref(self->q);
	tshm_ctx_close(self->ctx);
	EXPECT_EQ(self->fds_before, count_fds());
	EXPECT_EQ(0, count_seg_memfds());
}

TEST_F(q, create_errors)
{
	struct tshm_queue *q;

	EXPECT_EQ(-EINVAL, tshm_queue_create(NULL, 8, 64, &q));
	EXPECT_EQ(-EINVAL, tshm_queue_create(self->ctx, 0, 64, &q));
	EXPECT_EQ(-EINVAL, tshm_queue_create(self->ctx, 65537, 64, &q));
	EXPECT_EQ(-EINVAL, tshm_queue_create(self->ctx, 8, 1UL << 40, &q));
	EXPECT_EQ(-EINVAL, tshm_queue_create(self->ctx, 8, 64, NULL));
	EXPECT_EQ(-E2BIG, tshm_queue_create(self->ctx, 65536, 16 << 20, &q));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 1, 0, &q));
	EXPECT_EQ(1, tshm_queue_capacity(q));
	EXPECT_EQ(0, tshm_queue_max_msg(q));
	EXPECT_EQ(q, tshm_queue_ref(q));
	tshm_queue_unref(q);
	tshm_queue_unref(q);
	tshm_queue_unref(NULL);
}

TEST_F(q, bytes)
{
	char buf[512], big[300];
	size_t len;
	unsigned i, n;
	int64_t t0;

	EXPECT_EQ(8, tshm_queue_capacity(self->q));
	EXPECT_EQ(256, tshm_queue_max_msg(self->q));
	EXPECT_EQ(-EINVAL, tshm_queue_send(NULL, "x", 1, NULL, 0, 0));
	EXPECT_EQ(-EINVAL, tshm_queue_send(self->q, NULL, 1, NULL, 0, 0));
	EXPECT_EQ(-EMSGSIZE, tshm_queue_send(self->q, big, sizeof(big), NULL,
					     0, 0));
	EXPECT_EQ(-EAGAIN, tshm_queue_recv(self->q, buf, sizeof(buf), &len,
					   NULL, NULL, 0));
	t0 = mono_ms();
	EXPECT_EQ(-ETIMEDOUT, tshm_queue_recv(self->q, buf, sizeof(buf), &len,
					      NULL, NULL, 50));
	EXPECT_LE(45, mono_ms() - t0);

	for (i = 0; i < 8; i++) {
		snprintf(buf, sizeof(buf), "message %u", i);
		ASSERT_EQ(0, tshm_queue_send(self->q, buf, strlen(buf) + 1,
					     NULL, 0, 0));
	}
	EXPECT_EQ(8, tshm_queue_len(self->q));
	EXPECT_EQ(-EAGAIN, tshm_queue_send(self->q, "x", 1, NULL, 0, 0));
	EXPECT_EQ(-ETIMEDOUT, tshm_queue_send(self->q, "x", 1, NULL, 0, 20));

	/* Too small a buffer: the message stays, the length is reported. */
	EXPECT_EQ(-EMSGSIZE, tshm_queue_recv(self->q, buf, 3, &len, NULL,
					     NULL, 0));
	EXPECT_EQ(10, len);
	for (i = 0; i < 8; i++) {
		char want[32];

		n = 0;
		ASSERT_EQ(0, tshm_queue_recv(self->q, buf, sizeof(buf), &len,
					     NULL, &n, -1));
		snprintf(want, sizeof(want), "message %u", i);
		EXPECT_STREQ(want, buf);
		EXPECT_EQ(strlen(want) + 1, len);
		EXPECT_EQ(0, n);
	}
	/* Empty messages are messages. */
	ASSERT_EQ(0, tshm_queue_send(self->q, NULL, 0, NULL, 0, 0));
	ASSERT_EQ(0, tshm_queue_recv(self->q, NULL, 0, &len, NULL, NULL, 0));
	EXPECT_EQ(0, len);
}

TEST_F(q, wait_policies)
{
	char buf[8];
	size_t len;

	EXPECT_EQ(-EINVAL, tshm_queue_set_wait(self->q, 7, 0));
	EXPECT_EQ(-EINVAL, tshm_queue_set_wait(NULL, TSHM_WAIT_SPIN, 0));
	EXPECT_STREQ("adaptive", tshm_wait_name(TSHM_WAIT_ADAPTIVE));
	EXPECT_STREQ("futex", tshm_wait_name(TSHM_WAIT_FUTEX));
	EXPECT_STREQ("spin", tshm_wait_name(TSHM_WAIT_SPIN));
	for (int p = 0; p <= TSHM_WAIT_SPIN; p++) {
		ASSERT_EQ(0, tshm_queue_set_wait(self->q, p, 10));
		EXPECT_EQ(-ETIMEDOUT, tshm_queue_recv(self->q, buf, 8, &len,
						      NULL, NULL, 10));
		ASSERT_EQ(0, tshm_queue_send(self->q, "ab", 2, NULL, 0, -1));
		ASSERT_EQ(0, tshm_queue_recv(self->q, buf, 8, &len, NULL, NULL,
					     -1));
	}
}

TEST_F(q, segments_same_process)
{
	struct tshm_seg *seg, *seg2, *got[TSHM_QUEUE_MAX_SEGS + 1];
	struct tshm_seg *many[TSHM_QUEUE_MAX_SEGS + 1];
	unsigned n, i;
	size_t len;
	char buf[16];

	ASSERT_EQ(0, tshm_seg_create(self->ctx, 65536, "same", 0, &seg));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "same2", 0, &seg2));
	fill_pattern(tshm_seg_data(seg), 65536, 3);
	for (i = 0; i <= TSHM_QUEUE_MAX_SEGS; i++)
		many[i] = seg;
	EXPECT_EQ(-E2BIG, tshm_queue_send(self->q, "x", 1, many,
					  TSHM_QUEUE_MAX_SEGS + 1, 0));
	EXPECT_EQ(-EINVAL, tshm_queue_send(self->q, "x", 1, NULL, 1, 0));

	/* Send, receive in the same process: the very same object. */
	struct tshm_seg *two[2] = { seg, seg2 };

	ASSERT_EQ(0, tshm_queue_send(self->q, "hi", 3, two, 2, 0));
	n = 1;
	EXPECT_EQ(-ENOBUFS, tshm_queue_recv(self->q, buf, sizeof(buf), &len,
					    got, &n, 0));
	EXPECT_EQ(2, n);
	n = 2;
	ASSERT_EQ(0, tshm_queue_recv(self->q, buf, sizeof(buf), &len, got, &n,
				     0));
	EXPECT_EQ(2, n);
	EXPECT_EQ(seg, got[0]);
	EXPECT_EQ(seg2, got[1]);

	/* Send on what was received, the same segment many times. */
	ASSERT_EQ(0, tshm_queue_send(self->q, NULL, 0, many,
				     TSHM_QUEUE_MAX_SEGS, 0));
	tshm_seg_unref(got[0]);
	tshm_seg_unref(got[1]);
	n = TSHM_QUEUE_MAX_SEGS;
	ASSERT_EQ(0, tshm_queue_recv(self->q, NULL, 0, &len, got, &n, 0));
	ASSERT_EQ(TSHM_QUEUE_MAX_SEGS, n);
	for (i = 0; i < n; i++) {
		EXPECT_EQ(seg, got[i]);
		tshm_seg_unref(got[i]);
	}
	EXPECT_EQ(0, tshm_seg_wait_released(seg, 5000));
	tshm_seg_unref(seg2);
	tshm_seg_unref(seg);
}

TEST_F(q, other_backend)
{
	struct tshm_ctx *other;
	struct tshm_seg *seg;

	if (!is_kmod(self->ctx))
		SKIP(return, "needs the module for a second backend");
	ASSERT_EQ(0, tshm_ctx_open(&other, TSHM_CTX_MEMFD));
	ASSERT_EQ(0, tshm_seg_create(other, 4096, "x", 0, &seg));
	EXPECT_EQ(-EXDEV, tshm_queue_send(self->q, "x", 1, &seg, 1, 0));
	tshm_seg_unref(seg);
	tshm_ctx_close(other);
}

TEST_F(q, close_drain)
{
	char buf[8];
	size_t len;
	pid_t pid;
	int i;

	for (i = 0; i < 5; i++)
		ASSERT_EQ(0, tshm_queue_send(self->q, &i, sizeof(i), NULL, 0,
					     0));
	ASSERT_EQ(0, tshm_queue_close(self->q));
	EXPECT_EQ(0, tshm_queue_close(self->q));
	EXPECT_EQ(-EINVAL, tshm_queue_close(NULL));
	EXPECT_EQ(-EPIPE, tshm_queue_send(self->q, "x", 1, NULL, 0, -1));
	for (i = 0; i < 5; i++) {
		int v;

		ASSERT_EQ(0, tshm_queue_recv(self->q, &v, sizeof(v), &len,
					     NULL, NULL, -1));
		EXPECT_EQ(i, v);
	}
	EXPECT_EQ(-EPIPE, tshm_queue_recv(self->q, buf, 8, &len, NULL, NULL,
					  -1));

	/* A receiver asleep in another process is woken by close. */
	struct tshm_queue *q2;

	ASSERT_EQ(0, tshm_queue_create(self->ctx, 4, 8, &q2));
	tshm_queue_set_wait(q2, TSHM_WAIT_FUTEX, 0);
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0)
		_exit(tshm_queue_recv(q2, buf, 8, &len, NULL, NULL, 10000) ==
		      -EPIPE ? 0 : 1);
	usleep(100000);
	ASSERT_EQ(0, tshm_queue_close(q2));
	EXPECT_EQ(0, wait_ok(pid));
	tshm_queue_unref(q2);
}

/* Receive @count messages with one segment each and check them. */
static int consume_checked(struct tshm_queue *q, unsigned count,
			   struct tshm_queue *reply, struct tshm_ctx *ctx)
{
	struct tshm_seg *seg;
	struct msg m;
	unsigned i, n;
	size_t len;

	for (i = 0; i < count; i++) {
		n = 1;
		if (tshm_queue_recv(q, &m, sizeof(m), &len, &seg, &n, 20000))
			return 20;
		if (len != sizeof(m) || n != 1 || m.self_sum != msg_sum(&m) ||
		    m.seq != i)
			return 21;
		if (fnv1a(tshm_seg_data(seg), tshm_seg_size(seg)) != m.sum)
			return 22;
		tshm_seg_unref(seg);
	}
	if (reply) {
		/* And the other way: a segment of the receiver's own. */
		if (tshm_seg_create(ctx, 12345, "reply", 0, &seg))
			return 23;
		fill_pattern(tshm_seg_data(seg), tshm_seg_size(seg), 99);
		m.sum = fnv1a(tshm_seg_data(seg), tshm_seg_size(seg));
		m.seq = 0;
		m.self_sum = msg_sum(&m);
		if (tshm_queue_send(reply, &m, sizeof(m), &seg, 1, 20000))
			return 24;
		tshm_seg_unref(seg);
	}
	return 0;
}

static void produce(struct __test_metadata *_metadata, struct tshm_ctx *ctx,
		    struct tshm_queue *q, unsigned count, uint32_t producer)
{
	struct tshm_seg *seg;
	struct msg m = { .producer = producer };
	unsigned i;

	for (i = 0; i < count; i++) {
		ASSERT_EQ(0, tshm_seg_create(ctx, 4096 * (1 + i % 5), "prod",
					     0, &seg));
		fill_pattern(tshm_seg_data(seg), tshm_seg_size(seg), i);
		m.seq = i;
		m.sum = fnv1a(tshm_seg_data(seg), tshm_seg_size(seg));
		m.self_sum = msg_sum(&m);
		ASSERT_EQ(0, tshm_queue_send(q, &m, sizeof(m), &seg, 1, 20000));
		tshm_seg_unref(seg);
	}
}

static void check_reply(struct __test_metadata *_metadata,
			struct tshm_queue *reply)
{
	struct tshm_seg *seg;
	struct msg m;
	unsigned n = 1;
	size_t len;

	ASSERT_EQ(0, tshm_queue_recv(reply, &m, sizeof(m), &len, &seg, &n,
				     20000));
	ASSERT_EQ(1, n);
	EXPECT_EQ(m.sum, fnv1a(tshm_seg_data(seg), tshm_seg_size(seg)));
	EXPECT_EQ(12345, tshm_seg_size(seg) < 12345 ? 0 : 12345);
	tshm_seg_unref(seg);
}

TEST_F(q, across_fork)
{
	struct tshm_queue *reply;
	pid_t pid;

	ASSERT_EQ(0, tshm_queue_create(self->ctx, 4, 64, &reply));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0)
		_exit(consume_checked(self->q, 200, reply, self->ctx));
	produce(_metadata, self->ctx, self->q, 200, 0);
	check_reply(_metadata, reply);
	EXPECT_EQ(0, wait_ok(pid));
	tshm_queue_unref(reply);
}

/* argv: --child queue <desc> <reply-desc>   |   --child sock <fd> */
static int child_main(int argc, char **argv)
{
	struct tshm_queue *q, *reply = NULL;
	struct tshm_ctx *ctx;
	int ret;

	if (argc < 4 || tshm_ctx_open(&ctx, 0))
		return 30;
	if (!strcmp(argv[2], "queue")) {
		if (argc < 5 || tshm_queue_import(ctx, argv[3], &q) ||
		    tshm_queue_import(ctx, argv[4], &reply))
			return 31;
	} else {
		if (tshm_queue_recv_fd(ctx, atoi(argv[3]), &q) ||
		    tshm_queue_recv_fd(ctx, atoi(argv[3]), &reply))
			return 32;
		close(atoi(argv[3]));
	}
	ret = consume_checked(q, 100, reply, ctx);
	tshm_queue_unref(q);
	tshm_queue_unref(reply);
	tshm_ctx_close(ctx);
	/* Nothing of ours may be left open behind the queue. */
	if (!ret && count_seg_memfds())
		ret = 33;
	return ret;
}

TEST_F(q, across_exec)
{
	char desc[TSHM_QUEUE_DESC_MAX], rdesc[TSHM_QUEUE_DESC_MAX];
	struct tshm_queue *reply;
	pid_t pid;

	ASSERT_EQ(0, tshm_queue_create(self->ctx, 4, 64, &reply));
	EXPECT_EQ(-ENOSPC, tshm_queue_export(self->q, desc, 8));
	EXPECT_EQ(-EINVAL, tshm_queue_export(NULL, desc, sizeof(desc)));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		if (tshm_queue_export(self->q, desc, sizeof(desc)) ||
		    tshm_queue_export(reply, rdesc, sizeof(rdesc)))
			_exit(40);
		execl("/proc/self/exe", "test-queue", "--child", "queue",
		      desc, rdesc, (char *)NULL);
		_exit(41);
	}
	produce(_metadata, self->ctx, self->q, 100, 0);
	check_reply(_metadata, reply);
	EXPECT_EQ(0, wait_ok(pid));
	tshm_queue_unref(reply);
}

TEST_F(q, over_socket)
{
	struct tshm_queue *reply;
	char fdstr[16];
	int sv[2];
	pid_t pid;

	ASSERT_EQ(0, tshm_queue_create(self->ctx, 4, 64, &reply));
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		/* exec drops everything but the socket: an unrelated process */
		snprintf(fdstr, sizeof(fdstr), "%d", sv[1]);
		fcntl(sv[1], F_SETFD, 0);
		execl("/proc/self/exe", "test-queue", "--child", "sock", fdstr,
		      (char *)NULL);
		_exit(41);
	}
	close(sv[1]);
	ASSERT_EQ(0, tshm_queue_send_fd(self->q, sv[0]));
	ASSERT_EQ(0, tshm_queue_send_fd(reply, sv[0]));
	produce(_metadata, self->ctx, self->q, 100, 0);
	check_reply(_metadata, reply);
	EXPECT_EQ(0, wait_ok(pid));
	close(sv[0]);
	tshm_queue_unref(reply);
}

/*
 * @q's descriptor into @desc and its fds (up to 8: ring, transport,
 * eventfd) into @fds: how many, or -1.
 */
static int queue_desc_fds(struct tshm_queue *q,
			  char desc[TSHM_QUEUE_DESC_MAX], int *fds)
{
	char *p, *end;
	int n = 0;

	if (tshm_queue_export(q, desc, TSHM_QUEUE_DESC_MAX))
		return -1;
	p = strrchr(desc, ':');
	if (!p)
		return -1;
	do {
		fds[n++] = strtol(p + 1, &end, 10);
		p = end;
	} while (*end == ',' && n < 8);
	return n;
}

/*
 * @q's descriptor with its socket ends (the two fds before the eventfd)
 * replaced by what is no socket (the eventfd; an O_PATH fd, which
 * getsockopt() answers EBADF) and by a stream pair: each must be refused
 * as a foreign fd (-EBADMSG).
 */
static void import_bad_sockets(struct __test_metadata *_metadata,
			       struct tshm_ctx *ctx, struct tshm_queue *q)
{
	char desc[TSHM_QUEUE_DESC_MAX], bad[TSHM_QUEUE_DESC_MAX];
	int fds[8], n, st[2], opath, pick, i, len, head;
	struct tshm_queue *got;

	n = queue_desc_fds(q, desc, fds);
	ASSERT_LE(4, n);
	head = strrchr(desc, ':') + 1 - desc;
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, st));
	opath = open("/dev/null", O_PATH | O_CLOEXEC);
	ASSERT_LE(0, opath);
	for (pick = 0; pick < 3; pick++) {
		fds[n - 3] = pick == 2 ? st[0] : pick ? opath : fds[n - 1];
		fds[n - 2] = pick == 2 ? st[1] : pick ? opath : fds[n - 1];
		len = snprintf(bad, sizeof(bad), "%.*s", head, desc);
		for (i = 0; i < n; i++)
			len += snprintf(bad + len, sizeof(bad) - len, "%s%d",
					i ? "," : "", fds[i]);
		EXPECT_EQ(-EBADMSG, tshm_queue_import(ctx, bad, &got));
	}
	close(opath);
	close(st[0]);
	close(st[1]);
}

TEST_F(q, import_errors)
{
	struct tshm_queue *q;
	struct tshm_ctx *other;
	char desc[TSHM_QUEUE_DESC_MAX];
	int fd, efd, sv[2];

	EXPECT_EQ(-EINVAL, tshm_queue_import(self->ctx, "garbage", &q));
	EXPECT_EQ(-EINVAL, tshm_queue_import(self->ctx, "tshm-queue:2:xx:1",
					     &q));
	EXPECT_EQ(-EINVAL, tshm_queue_import(self->ctx,
					     "tshm-queue:1:memfd:5,6,7", &q));
	EXPECT_EQ(-EBADF, tshm_queue_import(self->ctx, is_kmod(self->ctx) ?
					    "tshm-queue:2:kmod:900,901,902,903,904" :
					    "tshm-queue:2:memfd:900,901,902,903",
					    &q));
	EXPECT_EQ(-EXDEV, tshm_queue_import(self->ctx, is_kmod(self->ctx) ?
					    "tshm-queue:2:memfd:0,1,2,3" :
					    "tshm-queue:2:kmod:0,1,2", &q));
	/* A memfd that is not a queue: foreign. */
	fd = memfd_create("foreign", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ftruncate(fd, 1 << 16));
	ASSERT_EQ(0, fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK));
	efd = eventfd(0, EFD_CLOEXEC);
	ASSERT_LE(0, efd);
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv));
	if (is_kmod(self->ctx))
		snprintf(desc, sizeof(desc),
			 "tshm-queue:2:kmod:%d,%d,%d,%d,%d", fd,
			 tshm_ctx_fd(self->ctx), sv[0], sv[1], efd);
	else
		snprintf(desc, sizeof(desc), "tshm-queue:2:memfd:%d,%d,%d,%d",
			 fd, sv[0], sv[1], efd);
	EXPECT_EQ(-EBADMSG, tshm_queue_import(self->ctx, desc, &q));
	/* The ring's fd where the eventfd belongs: not an eventfd. */
	if (is_kmod(self->ctx))
		snprintf(desc, sizeof(desc),
			 "tshm-queue:2:kmod:%d,%d,%d,%d,%d", fd,
			 tshm_ctx_fd(self->ctx), sv[0], sv[1], fd);
	else
		snprintf(desc, sizeof(desc), "tshm-queue:2:memfd:%d,%d,%d,%d",
			 fd, sv[0], sv[1], fd);
	EXPECT_EQ(-EBADMSG, tshm_queue_import(self->ctx, desc, &q));
	close(efd);
	close(fd);
	close(sv[0]);
	close(sv[1]);
	/* A real ring, and socket ends that are no sockets, or streams. */
	import_bad_sockets(_metadata, self->ctx, self->q);

	/* Over a socket: junk, and a queue of the other backend. */
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv));
	ASSERT_EQ(4, write(sv[0], "junk", 4));
	EXPECT_EQ(-EBADMSG, tshm_queue_recv_fd(self->ctx, sv[1], &q));
	if (is_kmod(self->ctx)) {
		struct tshm_queue *oq;

		ASSERT_EQ(0, tshm_ctx_open(&other, TSHM_CTX_MEMFD));
		ASSERT_EQ(0, tshm_queue_create(other, 2, 8, &oq));
		ASSERT_EQ(0, tshm_queue_send_fd(oq, sv[0]));
		EXPECT_EQ(-EXDEV, tshm_queue_recv_fd(self->ctx, sv[1], &q));
		tshm_queue_unref(oq);
		tshm_ctx_close(other);
	}
	close(sv[0]);
	EXPECT_EQ(-EPIPE, tshm_queue_recv_fd(self->ctx, sv[1], &q));
	close(sv[1]);
}

/* Many producers and consumers; every message exactly once, intact. */
#define MP_PRODUCERS	4
#define MP_CONSUMERS	4
#define MP_PER_PRODUCER	1500

TEST_F_TIMEOUT(q, many_producers_consumers, 300)
{
	_Atomic uint32_t *seen;
	pid_t prod[MP_PRODUCERS], cons[MP_CONSUMERS];
	struct tshm_seg *shared[4];
	unsigned i, p, missing = 0, dup = 0;

	seen = mmap(NULL, MP_PRODUCERS * MP_PER_PRODUCER * sizeof(*seen),
		    PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, seen);
	/* A few long-lived segments, sent over and over (the cache path). */
	for (i = 0; i < 4; i++) {
		ASSERT_EQ(0, tshm_seg_create(self->ctx, 1 << 16, "mp", 0,
					     &shared[i]));
		fill_pattern(tshm_seg_data(shared[i]), 1 << 16, i);
	}
	for (i = 0; i < MP_CONSUMERS; i++) {
		cons[i] = fork();
		ASSERT_LE(0, cons[i]);
		if (cons[i])
			continue;
		for (;;) {
			struct tshm_seg *segs[2];
			struct msg m;
			unsigned n = 2;
			size_t len;
			int ret;

			ret = tshm_queue_recv(self->q, &m, sizeof(m), &len,
					      segs, &n, 30000);
			if (ret == -EPIPE)
				_exit(0);
			if (ret || len != sizeof(m) || n != 2 ||
			    m.self_sum != msg_sum(&m) ||
			    m.producer >= MP_PRODUCERS ||
			    m.seq >= MP_PER_PRODUCER)
				_exit(50);
			if (fnv1a(tshm_seg_data(segs[0]),
				  tshm_seg_size(segs[0])) != m.sum ||
			    fnv1a(tshm_seg_data(segs[1]), 1 << 16) !=
			    fnv1a(tshm_seg_data(shared[m.seq % 4]), 1 << 16))
				_exit(51);
			atomic_fetch_add(&seen[m.producer * MP_PER_PRODUCER +
					      m.seq], 1);
			tshm_seg_unref(segs[0]);
			tshm_seg_unref(segs[1]);
		}
	}
	for (p = 0; p < MP_PRODUCERS; p++) {
		prod[p] = fork();
		ASSERT_LE(0, prod[p]);
		if (prod[p])
			continue;
		for (i = 0; i < MP_PER_PRODUCER; i++) {
			struct tshm_seg *segs[2];
			struct msg m = { .producer = p, .seq = i };

			if (tshm_seg_create(self->ctx, 4096 * (1 + i % 3),
					    "mp-fresh", 0, &segs[0]))
				_exit(60);
			fill_pattern(tshm_seg_data(segs[0]),
				     tshm_seg_size(segs[0]), p * 100000 + i);
			m.sum = fnv1a(tshm_seg_data(segs[0]),
				      tshm_seg_size(segs[0]));
			m.self_sum = msg_sum(&m);
			segs[1] = shared[i % 4];
			if (tshm_queue_send(self->q, &m, sizeof(m), segs, 2,
					    30000))
				_exit(61);
			tshm_seg_unref(segs[0]);
		}
		_exit(0);
	}
	for (p = 0; p < MP_PRODUCERS; p++)
		EXPECT_EQ(0, wait_ok(prod[p]));
	ASSERT_EQ(0, tshm_queue_close(self->q));
	for (i = 0; i < MP_CONSUMERS; i++)
		EXPECT_EQ(0, wait_ok(cons[i]));
	for (i = 0; i < MP_PRODUCERS * MP_PER_PRODUCER; i++) {
		missing += seen[i] == 0;
		dup += seen[i] > 1;
	}
	EXPECT_EQ(0, missing);
	EXPECT_EQ(0, dup);
	/* Every consumer let go of the shared segments. */
	for (i = 0; i < 4; i++) {
		EXPECT_EQ(0, tshm_seg_wait_released(shared[i], 10000));
		tshm_seg_unref(shared[i]);
	}
	munmap(seen, MP_PRODUCERS * MP_PER_PRODUCER * sizeof(*seen));
}

/*
 * Module: the kernel's change counter of the segment with @id (bumped by
 * every GRANT, ATTACH, DROP and holder change), found through one of our
 * fds.  0 on the fallback.
 */
static uint64_t seg_generation(struct tshm_ctx *ctx, uint64_t id)
{
	int fd;

	if (!is_kmod(ctx))
		return 0;
	for (fd = 3; fd < 1024; fd++) {
		struct tshm_info info = { .argsz = sizeof(info) };

		if (ioctl(fd, TSHM_IOC_INFO, &info) == 0 && info.id == id)
			return info.generation;
	}
	return ~0ULL;
}

#define CACHED_LAPS	200

/*
 * A segment both sides already hold goes back and forth: after the first
 * laps no system call touches it (module: its generation stays put), the
 * producer still sees the consumer as a holder, and sees it let go, by
 * unref or by SIGKILL, although the consumer's cache hits parked spare
 * grants in the queue.
 */
static void cached_case(struct __test_metadata *_metadata,
			struct tshm_ctx *ctx, struct tshm_queue *q,
			bool kill_it)
{
	struct tshm_queue *back;
	struct tshm_seg *seg, *got;
	uint64_t gen0 = 0, id;
	unsigned n, i;
	size_t len;
	pid_t pid;
	char c;

	ASSERT_EQ(0, tshm_queue_create(ctx, 4, 8, &back));
	ASSERT_EQ(0, tshm_seg_create(ctx, 1 << 20, "cached", 0, &seg));
	id = tshm_seg_id(seg);
	fill_pattern(tshm_seg_data(seg), 1 << 20, 9);
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		struct tshm_seg *keep = NULL;

		tshm_seg_unref(seg);	/* inherited: not ours to hold */
		for (i = 0; i < CACHED_LAPS; i++) {
			n = 1;
			if (tshm_queue_recv(q, &c, 1, &len, &got, &n, 10000) ||
			    n != 1)
				_exit(20);
			if (!keep)
				keep = tshm_seg_ref(got);
			else if (got != keep)
				_exit(21);
			if (tshm_queue_send(back, "r", 1, &got, 1, 10000))
				_exit(22);
			tshm_seg_unref(got);
		}
		if (kill_it)
			pause();
		/* The word to let go comes without a segment. */
		n = 0;
		if (tshm_queue_recv(q, &c, 1, &len, NULL, &n, 10000))
			_exit(23);
		tshm_seg_unref(keep);
		if (tshm_queue_send(back, "d", 1, NULL, 0, 10000))
			_exit(24);
		_exit(0);
	}
	for (i = 0; i < CACHED_LAPS; i++) {
		if (i == CACHED_LAPS / 2)
			gen0 = seg_generation(ctx, id);
		ASSERT_EQ(0, tshm_queue_send(q, "s", 1, &seg, 1, 10000));
		n = 1;
		ASSERT_EQ(0, tshm_queue_recv(back, &c, 1, &len, &got, &n,
					     10000));
		ASSERT_EQ(1, n);
		EXPECT_EQ(seg, got);
		tshm_seg_unref(got);
	}
	/* Steady state: no GRANT, ATTACH or DROP for half the laps. */
	EXPECT_EQ(gen0, seg_generation(ctx, id));
	EXPECT_EQ(-EAGAIN, tshm_seg_wait_released(seg, 0));
	if (kill_it) {
		kill(pid, SIGKILL);
		EXPECT_EQ(0, tshm_seg_wait_released(seg, 10000));
		waitpid(pid, NULL, 0);
	} else {
		ASSERT_EQ(0, tshm_queue_send(q, "b", 1, NULL, 0, 10000));
		ASSERT_EQ(0, tshm_queue_recv(back, &c, 1, &len, NULL, NULL,
					     10000));
		EXPECT_EQ('d', c);
		EXPECT_EQ(0, tshm_seg_wait_released(seg, 10000));
		EXPECT_EQ(0, wait_ok(pid));
	}
	tshm_seg_unref(seg);
	tshm_queue_unref(back);
}

TEST_F(q, cached_resend)
{
	cached_case(_metadata, self->ctx, self->q, false);
}

TEST_F(q, cached_resend_consumer_killed)
{
	cached_case(_metadata, self->ctx, self->q, true);
}

/* Find the ring's memfd and map it, to scribble on it. */
static void *map_ring(size_t *size)
{
	char path[64], link[128];
	struct stat st;
	void *p = NULL;
	int fd;

	for (fd = 3; fd < 1024 && !p; fd++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		ssize_t n = readlink(path, link, sizeof(link) - 1);

		if (n <= 0)
			continue;
		link[n] = '\0';
		if (strncmp(link, "/memfd:tshm-queue", 17) || fstat(fd, &st))
			continue;
		p = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
			 fd, 0);
		*size = st.st_size;
	}
	return p == MAP_FAILED ? NULL : p;
}

TEST_F(q, scribbled_ring)
{
	unsigned char *ring, buf[256];
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS], *seg;
	size_t size = 0, len, off;
	unsigned round, n, i;
	int ret;

	ring = map_ring(&size);
	ASSERT_NE(NULL, ring);
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "scribble", 0, &seg));
	srand(1);
	for (round = 0; round < 2000; round++) {
		tshm_queue_send(self->q, buf, round % 200, &seg, round % 2, 0);
		/* Scribble a few words past the immutable header. */
		for (i = 0; i < 4; i++) {
			off = 64 + (size_t)rand() % (size - 72);
			off &= ~7UL;
			if (off >= 64 && off < 192)
				continue;	/* the lock: that would hang */
			*(uint64_t *)(ring + off) = ((uint64_t)rand() << 32) ^
						    rand();
		}
		n = TSHM_QUEUE_MAX_SEGS;
		ret = tshm_queue_recv(self->q, buf, sizeof(buf), &len, segs,
				      &n, 0);
		if (ret == 0) {
			ASSERT_LE(len, sizeof(buf));
			for (i = 0; i < n; i++)
				tshm_seg_unref(segs[i]);
		} else {
			ASSERT_TRUE(ret == -EAGAIN || ret == -EBADMSG ||
				    ret == -EMSGSIZE || ret == -ENOBUFS ||
				    ret == -EPIPE);
			if (ret == -EPIPE)
				break;
		}
	}
	munmap(ring, size);
	tshm_seg_unref(seg);
}

struct flipper {
	_Atomic uint32_t *word;
	uint32_t a, b;
	atomic_bool stop;
};

static void *flip(void *arg)
{
	struct flipper *f = arg;

	while (!atomic_load_explicit(&f->stop, memory_order_relaxed)) {
		atomic_store_explicit(f->word, f->a, memory_order_relaxed);
		atomic_store_explicit(f->word, f->b, memory_order_relaxed);
	}
	atomic_store(f->word, f->a);
	return NULL;
}

/*
 * A peer flipping the header's capacity while another process imports the
 * queue: the importer validates one snapshot and uses that snapshot (it
 * used to re-read the header after validating it, and could import an
 * 8-slot ring as one of 65536 slots).
 */
#define FLIP_ROUNDS	2000

TEST_F_TIMEOUT(q, header_flipped_during_import, 300)
{
	struct flipper f = { .a = 8, .b = 65536 };
	struct tshm_queue *q2;
	unsigned char *ring;
	unsigned bad = 0, ok = 0, rejected = 0, i;
	size_t size = 0;
	pthread_t t;
	int sv[2], ret;

	ring = map_ring(&size);
	ASSERT_NE(NULL, ring);
	f.word = (_Atomic uint32_t *)(ring + 12);	/* qhdr.capacity */
	ASSERT_EQ(8, atomic_load(f.word));
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0,
				sv));
	ASSERT_EQ(0, pthread_create(&t, NULL, flip, &f));
	for (i = 0; i < FLIP_ROUNDS; i++) {
		ASSERT_EQ(0, tshm_queue_send_fd(self->q, sv[0]));
		ret = tshm_queue_recv_fd(self->ctx, sv[1], &q2);
		if (ret == 0) {
			ok++;
			if (tshm_queue_capacity(q2) != 8)
				bad++;
			tshm_queue_unref(q2);
		} else {
			EXPECT_EQ(-EBADMSG, ret);
			rejected++;
		}
	}
	atomic_store(&f.stop, true);
	pthread_join(t, NULL);
	close(sv[0]);
	close(sv[1]);
	TH_LOG("%u imported, %u rejected, %u with the wrong capacity", ok,
	       rejected, bad);
	EXPECT_EQ(0, bad);
	munmap(ring, size);
	/* The queue itself never read the shared geometry again. */
	ASSERT_EQ(0, tshm_queue_send(self->q, "k", 1, NULL, 0, 0));
	EXPECT_EQ(8, tshm_queue_capacity(self->q));
}

static int out_of_fds_child(struct tshm_queue *q, uint64_t sum, bool kmod)
{
	static struct fd_squeeze sq;
	struct tshm_seg *segs[1];
	unsigned n = 1;
	size_t len;
	int ret;
	char x;

	if (fds_squeeze(&sq))
		return 10;
	ret = tshm_queue_recv(q, &x, 1, &len, segs, &n, 2000);
	if (ret != -EMFILE) {
		fprintf(stderr, "# recv out of fds: %d (%s)\n", ret,
			tshm_strerror(ret));
		return 12;
	}
	/*
	 * Room for one fd: on the fallback the message carries two (memfd
	 * and lease), so a peek installs one of them and is truncated; the
	 * one it installed is closed again (the room is still there).  On
	 * the module the segment needs none.
	 */
	fds_give(&sq, 1);
	n = 1;
	ret = tshm_queue_recv(q, &x, 1, &len, segs, &n, 0);
	if (kmod ? ret || n != 1 || x != 's' : ret != -EMFILE)
		return 16;
	if (ret == -EMFILE) {
		int room = open("/dev/null", O_RDONLY);

		if (room < 0)
			return 17;
		close(room);
	}
	if (fds_unsqueeze(&sq))
		return 13;
	if (ret == 0)
		goto check;
	n = 1;
	ret = tshm_queue_recv(q, &x, 1, &len, segs, &n, 0);
	if (ret || n != 1 || x != 's')
		return 14;
check:
	if (fnv1a(tshm_seg_data(segs[0]), tshm_seg_size(segs[0])) != sum)
		return 15;
	tshm_seg_unref(segs[0]);
	return 0;
}

/*
 * A receiver out of fds (RLIMIT_NOFILE) gets -EMFILE and the message
 * stays queued, segments and all.  On the fallback the fds were dropped by
 * the kernel (MSG_CTRUNC) and the slot skipped; on the module the ATTACH
 * after the commit failed, losing the message and leaking its grant, so
 * the producer's release wait never ended.
 */
/*
 * A segment of patterned bytes sent @sends times as "s"; @child(q, sum of
 * the bytes, module?) takes the messages in a child, which must exit 0;
 * then the queue is empty and the segment released.
 */
static void child_takes(struct __test_metadata *_metadata,
			struct tshm_ctx *ctx, struct tshm_queue *q,
			unsigned sends,
			int (*child)(struct tshm_queue *, uint64_t, bool))
{
	struct tshm_seg *seg;
	uint64_t sum;
	unsigned i;
	pid_t pid;

	ASSERT_EQ(0, tshm_seg_create(ctx, 1 << 16, "nofd", 0, &seg));
	fill_pattern(tshm_seg_data(seg), tshm_seg_size(seg), 7);
	sum = fnv1a(tshm_seg_data(seg), tshm_seg_size(seg));
	for (i = 0; i < sends; i++)
		ASSERT_EQ(0, tshm_queue_send(q, "s", 1, &seg, 1, 0));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0)
		_exit(child(q, sum, is_kmod(ctx)));
	EXPECT_EQ(0, wait_ok(pid));
	EXPECT_EQ(0, tshm_queue_len(q));
	EXPECT_EQ(0, tshm_seg_wait_released(seg, 5000));
	tshm_seg_unref(seg);
}

TEST_F(q, recv_out_of_fds_keeps_message)
{
	child_takes(_metadata, self->ctx, self->q, 1, out_of_fds_child);
}

/*
 * A receiver with no fd to spare still takes a segment it holds: on the
 * module a cache hit needs no ATTACH; on the fallback the message's fds
 * are no longer installed only to be closed (they were, and a receiver at
 * RLIMIT_NOFILE got -EMFILE for a tensor it already had).
 */
static int held_out_of_fds_child(struct tshm_queue *q, uint64_t sum,
				 bool kmod)
{
	static struct fd_squeeze sq;
	struct tshm_seg *first, *again;
	unsigned n = 1;
	size_t len;
	int ret;
	char x;

	if (tshm_queue_recv(q, &x, 1, &len, &first, &n, 2000) || n != 1)
		return 10;
	if (fds_squeeze(&sq))
		return 11;
	n = 1;
	ret = tshm_queue_recv(q, &x, 1, &len, &again, &n, 2000);
	if (fds_unsqueeze(&sq))
		return 12;
	if (ret) {
		fprintf(stderr, "# recv of a held segment out of fds: %d (%s)\n",
			ret, tshm_strerror(ret));
		return 13;
	}
	if (n != 1 || again != first || x != 's')
		return 14;
	if (fnv1a(tshm_seg_data(again), tshm_seg_size(again)) != sum)
		return 15;
	tshm_seg_unref(again);
	tshm_seg_unref(first);
	return 0;
}

TEST_F(q, held_segment_received_out_of_fds)
{
	child_takes(_metadata, self->ctx, self->q, 2, held_out_of_fds_child);
}

/*
 * The fallback's socket message, as lib/queue.h lays it out (struct
 * qwire): what a hostile sender writes there.
 */
struct wire {
	uint64_t tag;
	uint32_t nsegs;
	uint32_t nfds;
	uint64_t gen[TSHM_QUEUE_MAX_SEGS];
	uint64_t ino[TSHM_QUEUE_MAX_SEGS];
	uint64_t key[TSHM_QUEUE_MAX_SEGS];
};

/* The queue's socket ends: the two fds before the eventfd. */
static int queue_socket(struct tshm_queue *q, int *s0, int *s1)
{
	char desc[TSHM_QUEUE_DESC_MAX];
	int fds[8], n = queue_desc_fds(q, desc, fds);

	if (n < 4)
		return -1;
	*s0 = fds[n - 3];
	*s1 = fds[n - 2];
	return 0;
}

/*
 * A sender that names, in its socket message, a segment the receiver holds
 * (its inode number) while it sends the fds of another: the receiver must
 * go by the fds unless the message carries that segment's key, which only
 * a process that was sent the segment knows.  Here the message is
 * rewritten in flight with the held segment's inode and a wrong key (and
 * no key): the receiver gets the segment whose fds came, with its bytes.
 */
TEST_F(q, held_segment_needs_its_key)
{
	struct tshm_seg *held, *other, *got;
	static const uint64_t keys[] = { 0, 0x5eed5eed5eed5eedULL };
	unsigned char cbuf[CMSG_SPACE(2 * sizeof(int))];
	uint64_t other_sum;
	struct wire w;
	struct iovec iov = { &w, sizeof(w) };
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};
	int s0, s1, i;
	unsigned n;
	size_t len;
	char c;

	if (is_kmod(self->ctx))
		SKIP(return, "the fallback's socket messages");
	ASSERT_EQ(0, queue_socket(self->q, &s0, &s1));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "held", 0, &held));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "other", 0, &other));
	fill_pattern(tshm_seg_data(held), 4096, 1);
	fill_pattern(tshm_seg_data(other), 4096, 2);
	other_sum = fnv1a(tshm_seg_data(other), 4096);
	/* Held, and its key known: taken without fds. */
	ASSERT_EQ(0, tshm_queue_send(self->q, "h", 1, &held, 1, 0));
	n = 1;
	ASSERT_EQ(0, tshm_queue_recv(self->q, &c, 1, &len, &got, &n, 0));
	ASSERT_EQ(held, got);
	tshm_seg_unref(got);
	for (i = 0; i < 2; i++) {
		ASSERT_EQ(0, tshm_queue_send(self->q, "o", 1, &other, 1, 0));
		mh.msg_controllen = sizeof(cbuf);
		ASSERT_EQ(sizeof(w), recvmsg(s1, &mh, MSG_CMSG_CLOEXEC));
		ASSERT_EQ(1, w.nsegs);
		ASSERT_EQ(tshm_seg_id(other), w.ino[0]);
		w.ino[0] = tshm_seg_id(held);
		w.key[0] = keys[i];
		ASSERT_EQ(sizeof(w), sendmsg(s0, &mh, 0));
		/* Ours: the sendmsg() took its own references. */
		close(((int *)CMSG_DATA(CMSG_FIRSTHDR(&mh)))[0]);
		close(((int *)CMSG_DATA(CMSG_FIRSTHDR(&mh)))[1]);
		n = 1;
		ASSERT_EQ(0, tshm_queue_recv(self->q, &c, 1, &len, &got, &n,
					     0));
		ASSERT_EQ(1, n);
		EXPECT_EQ(other, got);
		EXPECT_EQ(other_sum, fnv1a(tshm_seg_data(got), 4096));
		tshm_seg_unref(got);
	}
	tshm_seg_unref(other);
	tshm_seg_unref(held);
}

/*
 * A process that was sent a segment and let it go keeps the key it saw:
 * it must not make the creator, who found itself the sole holder since
 * (and may have reused the buffer, as a pool does), take that segment in
 * place of the fds it sends.  It did, until the creator drew a new key on
 * finding itself the sole holder.
 */
static int ex_holder_child(struct tshm_queue *q, struct tshm_queue *back)
{
	unsigned char cbuf[CMSG_SPACE(2 * sizeof(int))];
	struct tshm_seg *x, *y;
	struct wire saved, w;
	struct iovec iov = { &w, sizeof(w) };
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};
	struct tshm_ctx *ctx;
	unsigned n = 1;
	int s0, s1;
	size_t len;
	char c;

	if (queue_socket(q, &s0, &s1))
		return 30;
	/* Sent X: what any receiver of it sees in the header. */
	while (recv(s1, &saved, sizeof(saved), MSG_PEEK) != sizeof(saved))
		usleep(1000);
	if (tshm_queue_recv(q, &c, 1, &len, &x, &n, 5000) || n != 1)
		return 31;
	tshm_seg_unref(x);			/* let go of it */
	if (tshm_queue_send(back, "r", 1, NULL, 0, 5000))
		return 32;
	n = 0;
	if (tshm_queue_recv(q, &c, 1, &len, NULL, &n, 5000) || c != 'g')
		return 33;
	/* A segment of our own, named as X in flight. */
	if (tshm_ctx_open(&ctx, 0) ||
	    tshm_seg_create(ctx, 4096, "mine", 0, &y))
		return 34;
	fill_pattern(tshm_seg_data(y), 4096, 3);
	if (tshm_queue_send(q, "y", 1, &y, 1, 5000))
		return 35;
	if (recvmsg(s1, &mh, MSG_CMSG_CLOEXEC) != sizeof(w))
		return 36;
	w.ino[0] = saved.ino[0];
	w.key[0] = saved.key[0];
	w.gen[0] = saved.gen[0];
	if (sendmsg(s0, &mh, 0) != sizeof(w))
		return 37;
	if (tshm_queue_send(back, "d", 1, NULL, 0, 5000))
		return 38;
	return 0;
}

TEST_F(q, ex_holder_cannot_name_released_segment)
{
	struct tshm_queue *back;
	struct tshm_seg *x, *got;
	unsigned n;
	size_t len;
	pid_t pid;
	char c;

	if (is_kmod(self->ctx))
		SKIP(return, "the fallback's socket messages");
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 4, 8, &back));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "x", 0, &x));
	fill_pattern(tshm_seg_data(x), 4096, 1);
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		tshm_seg_unref(x);	/* inherited: not ours to hold */
		_exit(ex_holder_child(self->q, back));
	}
	ASSERT_EQ(0, tshm_queue_send(self->q, "x", 1, &x, 1, 5000));
	ASSERT_EQ(0, tshm_queue_recv(back, &c, 1, &len, NULL, NULL, 5000));
	ASSERT_EQ('r', c);
	/* The child holds X no more: the creator may reuse it. */
	ASSERT_EQ(0, tshm_seg_wait_released(x, 5000));
	fill_pattern(tshm_seg_data(x), 4096, 42);
	ASSERT_EQ(0, tshm_queue_send(self->q, "g", 1, NULL, 0, 5000));
	ASSERT_EQ(0, tshm_queue_recv(back, &c, 1, &len, NULL, NULL, 5000));
	ASSERT_EQ('d', c);
	EXPECT_EQ(0, wait_ok(pid));
	n = 1;
	ASSERT_EQ(0, tshm_queue_recv(self->q, &c, 1, &len, &got, &n, 5000));
	ASSERT_EQ(1, n);
	EXPECT_EQ('y', c);
	/* What came is the child's segment, not our released X. */
	EXPECT_NE(x, got);
	EXPECT_EQ(fill_sum(3), fnv1a(tshm_seg_data(got), 4096));
	tshm_seg_unref(got);
	tshm_seg_unref(x);
	tshm_queue_unref(back);
}

/*
 * Threads of one receiver taking messages of one or two of three
 * segments, some held already, some not (the creator starts new lease
 * generations now and then), keeping, forwarding and dropping them: every
 * segment arrives whole, nothing leaks, and each is released at the end.
 */
#define RV_SEGS		3
#define RV_MSGS		4000
#define RV_THREADS	3

struct rv_arg {
	struct tshm_queue *q, *back;
	uint64_t sums[RV_SEGS];
	uint64_t ids[RV_SEGS];
	int err;
};

static void *rv_thread(void *p)
{
	struct rv_arg *a = p;
	struct tshm_seg *got[2], *keep = NULL;
	unsigned n, i, k;
	size_t len;
	char c[2];
	int ret;

	for (;;) {
		n = 2;
		ret = tshm_queue_recv(a->q, c, 2, &len, got, &n, 10000);
		if (ret == -EPIPE)
			break;
		if (ret) {
			a->err = 100 - ret;
			break;
		}
		if (c[0] == 'e' && n == 0)
			break;
		for (i = 0; i < n; i++) {
			k = c[i] - '0';
			if (tshm_seg_id(got[i]) != a->ids[k] ||
			    fnv1a(tshm_seg_data(got[i]), 4096) != a->sums[k])
				a->err = 50;
		}
		if (n == 2 && c[0] == c[1] && got[0] != got[1])
			a->err = 51;
		if (rand() % 4 == 0)
			tshm_queue_send(a->back, "b", 1, got, n, 10000);
		if (rand() % 3 == 0) {
			tshm_seg_unref(keep);
			keep = tshm_seg_ref(got[0]);
		}
		for (i = 0; i < n; i++)
			tshm_seg_unref(got[i]);
	}
	tshm_seg_unref(keep);
	return NULL;
}

static int rv_child(struct tshm_queue *q, struct tshm_queue *back,
		    struct rv_arg *tmpl)
{
	pthread_t t[RV_THREADS];
	struct rv_arg a[RV_THREADS];
	int i, err = 0;

	for (i = 0; i < RV_THREADS; i++) {
		a[i] = *tmpl;
		pthread_create(&t[i], NULL, rv_thread, &a[i]);
	}
	for (i = 0; i < RV_THREADS; i++) {
		pthread_join(t[i], NULL);
		if (a[i].err)
			err = a[i].err;
	}
	return err;
}

static void *rv_drain(void *p)
{
	struct rv_arg *a = p;
	struct tshm_seg *got[2];
	unsigned n, i;
	size_t len;
	char c;

	for (;;) {
		n = 2;
		if (tshm_queue_recv(a->back, &c, 1, &len, got, &n, 3000))
			break;
		for (i = 0; i < n; i++)
			tshm_seg_unref(got[i]);
		if (c == 'x')
			break;
	}
	return NULL;
}

TEST_F_TIMEOUT(q, threads_held_and_installed, 300)
{
	struct tshm_queue *q, *back;
	struct tshm_seg *s[RV_SEGS], *m[2];
	struct rv_arg a = { 0 };
	pthread_t drain;
	unsigned i, k0, k1;
	pid_t pid;
	char c[2];

	ASSERT_EQ(0, tshm_queue_create(self->ctx, 64, 8, &q));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 64, 8, &back));
	for (i = 0; i < RV_SEGS; i++) {
		ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "rv", 0, &s[i]));
		fill_pattern(tshm_seg_data(s[i]), 4096, 100 + i);
		a.sums[i] = fill_sum(100 + i);
		a.ids[i] = tshm_seg_id(s[i]);
	}
	a.q = q;
	a.back = back;
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		for (i = 0; i < RV_SEGS; i++)
			tshm_seg_unref(s[i]);
		_exit(rv_child(q, back, &a));
	}
	pthread_create(&drain, NULL, rv_drain, &a);
	srand(1);
	for (i = 0; i < RV_MSGS; i++) {
		k0 = rand() % RV_SEGS;
		k1 = rand() % RV_SEGS;
		c[0] = '0' + k0;
		c[1] = '0' + k1;
		m[0] = s[k0];
		m[1] = s[k1];
		ASSERT_EQ(0, tshm_queue_send(q, c, 2, m, 1 + (i & 1), 10000));
		if (i % 7 == 0)	/* new lease generations now and then */
			tshm_seg_wait_released(s[rand() % RV_SEGS], 0);
	}
	for (i = 0; i < RV_THREADS; i++)
		ASSERT_EQ(0, tshm_queue_send(q, "e", 1, NULL, 0, 10000));
	EXPECT_EQ(0, wait_ok(pid));
	ASSERT_EQ(0, tshm_queue_send(back, "x", 1, NULL, 0, 10000));
	pthread_join(drain, NULL);
	for (i = 0; i < RV_SEGS; i++) {
		EXPECT_EQ(0, tshm_seg_wait_released(s[i], 5000));
		tshm_seg_unref(s[i]);
	}
	tshm_queue_unref(back);
	tshm_queue_unref(q);
}

#define INFLIGHT_MSGS	200

static int inflight_sender(struct tshm_queue *q, struct tshm_seg *seg)
{
	struct rlimit lim = { 256, 256 };
	int i, ret;

	/* The limit does not bind CAP_SYS_RESOURCE: be nobody. */
	if (geteuid() == 0 && (setgid(65534) || setuid(65534)))
		return 9;
	if (getrlimit(RLIMIT_NOFILE, &lim))
		return 10;
	lim.rlim_cur = 256;
	if (setrlimit(RLIMIT_NOFILE, &lim))
		return 11;
	for (i = 0; i < INFLIGHT_MSGS; i++) {
		ret = tshm_queue_send(q, "i", 1, &seg, 1, 10000);
		if (ret) {
			fprintf(stderr, "# send %d: %d (%s)\n", i + 1, ret,
				tshm_strerror(ret));
			return 12;
		}
	}
	return 0;
}

/*
 * Fallback: the kernel lets a user have RLIMIT_NOFILE fds in flight in
 * Unix sockets, two per segment sent.  At a limit of 256 the 129th send
 * failed with an undocumented -ETOOMANYREFS while the ring had room; now
 * it waits, as for a full ring, until the receiver takes messages.
 */
TEST_F(q, inflight_fd_limit_waits)
{
	struct tshm_queue *q;
	struct tshm_seg *seg, *got[1];
	pid_t pid;
	unsigned n;
	size_t len;
	char x;
	int i;

	if (is_kmod(self->ctx))
		SKIP(return, "no fds in flight on the module");
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 256, 1, &q));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "inflight", 0, &seg));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0)
		_exit(inflight_sender(q, seg));
	usleep(500000);		/* the sender is at the limit by now */
	for (i = 0; i < INFLIGHT_MSGS; i++) {
		n = 1;
		ASSERT_EQ(0, tshm_queue_recv(q, &x, 1, &len, got, &n, 10000));
		ASSERT_EQ(1, n);
		tshm_seg_unref(got[0]);
	}
	EXPECT_EQ(0, wait_ok(pid));
	tshm_seg_unref(seg);
	tshm_queue_unref(q);
}

/*
 * The queue's fd for event loops: readable at first, quiet once a receive
 * found the queue empty, readable when another process publishes, and on
 * close.
 */
TEST_F(q, pollable_fd)
{
	struct pollfd pfd = { .events = POLLIN };
	char buf[256];
	size_t len;
	pid_t pid;

	EXPECT_EQ(-EINVAL, tshm_queue_fd(NULL));
	pfd.fd = tshm_queue_fd(self->q);
	ASSERT_LE(0, pfd.fd);
	EXPECT_EQ(pfd.fd, tshm_queue_fd(self->q));
	EXPECT_EQ(1, poll(&pfd, 1, 0));
	EXPECT_EQ(-EAGAIN, tshm_queue_recv(self->q, buf, sizeof(buf), &len,
					   NULL, NULL, 0));
	EXPECT_EQ(0, poll(&pfd, 1, 0));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		usleep(100000);
		if (tshm_queue_send(self->q, "p", 1, NULL, 0, 0) ||
		    tshm_queue_send(self->q, "q", 1, NULL, 0, 0))
			_exit(1);
		usleep(100000);
		_exit(tshm_queue_close(self->q) ? 2 : 0);
	}
	ASSERT_EQ(1, poll(&pfd, 1, 5000));
	ASSERT_EQ(0, tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL,
				     NULL, 0));
	EXPECT_EQ('p', buf[0]);
	/* Drain until -EAGAIN (the second may or may not be there yet). */
	while (tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL, NULL,
			       0) == 0)
		EXPECT_EQ('q', buf[0]);
	ASSERT_EQ(1, poll(&pfd, 1, 5000));	/* the second, or the close */
	while (tshm_queue_recv(self->q, buf, sizeof(buf), &len, NULL, NULL,
			       0) == 0)
		;
	EXPECT_EQ(0, wait_ok(pid));
	EXPECT_EQ(1, poll(&pfd, 1, 5000));	/* closed */
	EXPECT_EQ(-EPIPE, tshm_queue_recv(self->q, buf, sizeof(buf), &len,
					  NULL, NULL, 0));
}

#define KEEP_SEGS	2000
#define KEEP_RESEND	100
#define KEEP_NOFILE	128

static int keeper(struct tshm_queue *in, struct tshm_queue *back)
{
	static struct tshm_seg *held[KEEP_SEGS];
	struct rlimit lim;
	uint32_t id;
	unsigned n;
	size_t len;
	int i, ret;

	if (getrlimit(RLIMIT_NOFILE, &lim))
		return 10;
	lim.rlim_cur = KEEP_NOFILE;
	if (setrlimit(RLIMIT_NOFILE, &lim))
		return 11;
	for (i = 0; i < KEEP_SEGS; i++) {
		n = 1;
		ret = tshm_queue_recv(in, &id, sizeof(id), &len, &held[i], &n,
				      10000);
		if (ret) {
			fprintf(stderr, "# keeper: receive %d: %s\n", i + 1,
				tshm_strerror(ret));
			return 12;
		}
		if (id != (uint32_t)i ||
		    fnv1a(tshm_seg_data(held[i]), 4096) != fill_sum(id))
			return 13;
	}
	/* Re-send some, held by their mappings only. */
	for (i = 0; i < KEEP_RESEND; i++) {
		id = i * (KEEP_SEGS / KEEP_RESEND);
		if (tshm_queue_send(back, &id, sizeof(id), &held[id], 1,
				    10000))
			return 14;
	}
	if (tshm_seg_wait_released(held[0], 0) != -EOPNOTSUPP)
		return 15;
	for (i = 0; i < KEEP_SEGS; i++)
		tshm_seg_unref(held[i]);
	return 0;
}

/*
 * Module: a receiver keeps 2000 received segments under RLIMIT_NOFILE
 * 128 (the mapping is the holder; it kept one fd each and stopped at
 * about 120 with -EMFILE), re-sends some of them by their mappings, and
 * the producer's release wait sees the mapping-only holder.
 */
TEST_F_TIMEOUT(q, keep_2000_received_segments, 600)
{
	struct tshm_queue *in, *back;
	struct tshm_seg *seg, *first = NULL, *got[1];
	uint32_t id;
	unsigned n;
	size_t len;
	pid_t pid;
	int i;

	if (!is_kmod(self->ctx))
		SKIP(return, "the fallback passes an fd per segment");
	ASSERT_EQ(0, tshm_queue_create(self->ctx, 64, sizeof(id), &in));
	ASSERT_EQ(0, tshm_queue_create(self->ctx, KEEP_RESEND, sizeof(id),
				       &back));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0)
		_exit(keeper(in, back));
	for (i = 0; i < KEEP_SEGS; i++) {
		ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "keep", 0, &seg));
		fill_pattern(tshm_seg_data(seg), 4096, i);
		id = i;
		ASSERT_EQ(0, tshm_queue_send(in, &id, sizeof(id), &seg, 1,
					     10000));
		if (i == 0)
			first = seg;	/* watch its release */
		else
			tshm_seg_unref(seg);
	}
	for (i = 0; i < KEEP_RESEND; i++) {
		n = 1;
		ASSERT_EQ(0, tshm_queue_recv(back, &id, sizeof(id), &len, got,
					     &n, 20000));
		ASSERT_EQ(1, n);
		EXPECT_EQ(fill_sum(id), fnv1a(tshm_seg_data(got[0]), 4096));
		tshm_seg_unref(got[0]);
	}
	EXPECT_EQ(0, wait_ok(pid));
	EXPECT_EQ(0, tshm_seg_wait_released(first, 10000));
	tshm_seg_unref(first);
	tshm_queue_unref(back);
	tshm_queue_unref(in);
	EXPECT_EQ(0, count_proc_tshm());
}

TSHM_TEST_MAIN(child_main)
