// SPDX-License-Identifier: GPL-2.0
/*
 * Contexts, segments, release notification and handle passing, on
 * whichever backend the library picks.
 */
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "tshm-test.h"

FIXTURE(seg) {
	struct tshm_ctx *ctx;
	int fds_before;
};

FIXTURE_SETUP(seg)
{
	self->fds_before = count_fds();
	ASSERT_EQ(0, tshm_ctx_open(&self->ctx, 0));
}

FIXTURE_TEARDOWN(seg)
{
	tshm_ctx_close(self->ctx);
	EXPECT_EQ(self->fds_before, count_fds());
}

TEST(ctx_open_flags)
{
	struct tshm_ctx *ctx;
	int ret;

	EXPECT_EQ(-EINVAL, tshm_ctx_open(NULL, 0));
	EXPECT_EQ(-EINVAL, tshm_ctx_open(&ctx, 1U << 7));
	EXPECT_EQ(-EINVAL, tshm_ctx_open(&ctx, TSHM_CTX_MEMFD | TSHM_CTX_KMOD));

	ASSERT_EQ(0, tshm_ctx_open(&ctx, TSHM_CTX_MEMFD));
	EXPECT_STREQ("memfd", tshm_ctx_backend(ctx));
	tshm_ctx_close(ctx);

	ret = tshm_ctx_open(&ctx, TSHM_CTX_KMOD);
	if (access("/dev/tshm", F_OK) == 0) {
		ASSERT_EQ(0, ret);
		EXPECT_STREQ("kmod", tshm_ctx_backend(ctx));
		tshm_ctx_close(ctx);
	} else {
		EXPECT_EQ(-ENODEV, ret);
	}

	setenv("TSHM_BACKEND", "bogus", 1);
	EXPECT_EQ(-EINVAL, tshm_ctx_open(&ctx, 0));
	setenv("TSHM_BACKEND", "memfd", 1);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	EXPECT_STREQ("memfd", tshm_ctx_backend(ctx));
	tshm_ctx_close(ctx);
	tshm_ctx_close(NULL);
}

TEST_F(seg, ctx_fd)
{
	struct tshm_ctx *ctx2;
	int p[2];

	ASSERT_LE(0, tshm_ctx_fd(self->ctx));
	ASSERT_EQ(0, tshm_ctx_open_fd(tshm_ctx_fd(self->ctx), 0, &ctx2));
	EXPECT_STREQ(tshm_ctx_backend(self->ctx), tshm_ctx_backend(ctx2));
	EXPECT_NE(tshm_ctx_fd(self->ctx), tshm_ctx_fd(ctx2));
	tshm_ctx_close(ctx2);

	EXPECT_EQ(-EINVAL, tshm_ctx_open_fd(-1, 0, &ctx2));
	EXPECT_EQ(-EINVAL, tshm_ctx_open_fd(tshm_ctx_fd(self->ctx),
					    is_kmod(self->ctx) ? TSHM_CTX_MEMFD :
					    TSHM_CTX_KMOD, &ctx2));
	ASSERT_EQ(0, pipe(p));
	EXPECT_EQ(-EINVAL, tshm_ctx_open_fd(p[0], 0, &ctx2));
	close(p[0]);
	close(p[1]);
}

TEST_F(seg, create_errors)
{
	struct tshm_seg *seg;

	EXPECT_EQ(-EINVAL, tshm_seg_create(NULL, 4096, "x", 0, &seg));
	EXPECT_EQ(-EINVAL, tshm_seg_create(self->ctx, 0, "x", 0, &seg));
	EXPECT_EQ(-EINVAL, tshm_seg_create(self->ctx, 4096, "x", 1U << 9, &seg));
	EXPECT_EQ(-EINVAL, tshm_seg_create(self->ctx, 4096, "x", 0, NULL));
	EXPECT_GT(0, tshm_seg_create(self->ctx, (size_t)1 << 62, "x", 0, &seg));
	EXPECT_EQ(-EINVAL, tshm_seg_create(self->ctx, SIZE_MAX, "x", 0, &seg));
}

TEST_F(seg, create_map_ref)
{
	struct tshm_seg *seg, *seg2;
	unsigned char *p;
	int ret;

	ASSERT_EQ(0, tshm_seg_create(self->ctx, 10000, "basic", 0, &seg));
	EXPECT_GE(tshm_seg_size(seg), 10000);
	EXPECT_EQ(0, tshm_seg_size(seg) % getpagesize());
	EXPECT_NE(0, tshm_seg_id(seg));
	EXPECT_STREQ("basic", tshm_seg_name(seg));
	p = tshm_seg_data(seg);
	ASSERT_NE(NULL, p);
	EXPECT_EQ(0, p[0]);
	memset(p, 0xa5, tshm_seg_size(seg));
	EXPECT_EQ(0xa5, p[tshm_seg_size(seg) - 1]);
	EXPECT_EQ(seg, tshm_seg_ref(seg));
	tshm_seg_unref(seg);
	EXPECT_EQ(0xa5, p[9999]);

	ret = tshm_seg_create(self->ctx, 1, NULL, TSHM_SEG_PREFAULT |
			      TSHM_SEG_HUGE, &seg2);
	/*
	 * Without THP (PREEMPT_RT kernels) the module has no huge mount and
	 * refuses huge segments; memfd's huge is an madvise() hint.
	 */
	if (ret == -EOPNOTSUPP && access("/sys/kernel/mm/transparent_hugepage", F_OK)) {
		TH_LOG("no THP: huge segments refused with EOPNOTSUPP");
		ret = tshm_seg_create(self->ctx, 1, NULL, TSHM_SEG_PREFAULT, &seg2);
	}
	ASSERT_EQ(0, ret);
	EXPECT_NE(tshm_seg_id(seg), tshm_seg_id(seg2));
	EXPECT_STREQ("", tshm_seg_name(seg2));
	tshm_seg_unref(seg2);
	tshm_seg_unref(seg);
	tshm_seg_unref(NULL);
}

TEST_F(seg, shared_across_fork)
{
	struct tshm_seg *seg;
	volatile uint64_t *p;
	pid_t pid;

	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "fork", 0, &seg));
	p = tshm_seg_data(seg);
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		p[1] = 0x1234;
		_exit(p[0] == 7 ? 0 : 1);
	}
	p[0] = 7;
	(void)p[0];
	/* The child may run before the store: it then exits 1; retry once. */
	if (wait_ok(pid)) {
		pid = fork();
		if (pid == 0)
			_exit(p[0] == 7 ? 0 : 1);
		ASSERT_EQ(0, wait_ok(pid));
	}
	EXPECT_EQ(0x1234, p[1]);
	tshm_seg_unref(seg);
}

TEST(error_strings)
{
	EXPECT_STREQ("queue closed (and drained)", tshm_strerror(-EPIPE));
	EXPECT_STREQ(tshm_strerror(-EPIPE), tshm_strerror(EPIPE));
	EXPECT_STREQ("success", tshm_strerror(0));
	EXPECT_NE(NULL, tshm_strerror(-EIO));
	EXPECT_NE(NULL, tshm_strerror(-100000));
}

/*
 * The receiver gets the segment over a socket, checks it, acks, holds it
 * until told (or forever, to be killed), then exits.
 */
static int recv_child(struct tshm_ctx *ctx, int sock, uint64_t sum,
		      bool wait_kill)
{
	struct tshm_seg *seg, *again;
	char c = 0;

	if (tshm_seg_recv_fd(ctx, sock, &seg))
		return 10;
	if (fnv1a(tshm_seg_data(seg), tshm_seg_size(seg)) != sum)
		return 11;
	/* The same segment again: the cached object comes back. */
	if (tshm_seg_recv_fd(ctx, sock, &again) || again != seg)
		return 12;
	tshm_seg_unref(again);
	if (write(sock, "k", 1) != 1)
		return 13;
	if (wait_kill)
		pause();
	if (read(sock, &c, 1) != 1)
		return 14;
	tshm_seg_unref(seg);
	return 0;
}

static void release_case(struct __test_metadata *_metadata,
			 struct tshm_ctx *ctx, bool kill_it, bool use_poll)
{
	struct pollfd pfd[8];
	struct tshm_seg *seg;
	int sv[2], status, n, i;
	uint64_t sum;
	pid_t pid;
	char c;

	ASSERT_EQ(0, tshm_seg_create(ctx, 1 << 20, "release", 0, &seg));
	fill_pattern(tshm_seg_data(seg), tshm_seg_size(seg), 42);
	sum = fnv1a(tshm_seg_data(seg), tshm_seg_size(seg));
	/* Nobody else holds it yet. */
	EXPECT_EQ(0, tshm_seg_wait_released(seg, 0));
	EXPECT_EQ(0, tshm_seg_release_pollfds(seg, pfd, 8));

	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		close(sv[0]);
		tshm_seg_unref(seg);
		_exit(recv_child(ctx, sv[1], sum, kill_it));
	}
	close(sv[1]);
	ASSERT_EQ(0, tshm_seg_send_fd(seg, sv[0]));
	ASSERT_EQ(0, tshm_seg_send_fd(seg, sv[0]));
	ASSERT_EQ(1, read(sv[0], &c, 1));
	EXPECT_EQ(-EAGAIN, tshm_seg_wait_released(seg, 0));
	EXPECT_EQ(-ETIMEDOUT, tshm_seg_wait_released(seg, 50));
	if (use_poll) {
		/* the event-loop form: nothing is ready while it is held */
		ASSERT_LT(0, n = tshm_seg_release_pollfds(seg, pfd, 8));
		EXPECT_EQ(0, poll(pfd, n, 50));
	}
	if (kill_it) {
		kill(pid, SIGKILL);
	} else {
		ASSERT_EQ(1, write(sv[0], "x", 1));
	}
	if (use_poll) {
		for (i = 0; i < 100; i++) {
			n = tshm_seg_release_pollfds(seg, pfd, 8);
			ASSERT_LE(0, n);
			if (!n)
				break;
			ASSERT_LT(0, poll(pfd, n, 10000));
			if (!tshm_seg_wait_released(seg, 0))
				break;
		}
		ASSERT_GT(100, i);
		EXPECT_EQ(0, tshm_seg_release_pollfds(seg, pfd, 8));
	}
	EXPECT_EQ(0, tshm_seg_wait_released(seg, 10000));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	if (kill_it) {
		EXPECT_TRUE(WIFSIGNALED(status));
	} else {
		EXPECT_EQ(0, status);
	}
	close(sv[0]);
	tshm_seg_unref(seg);
}

TEST_F(seg, wait_released)
{
	release_case(_metadata, self->ctx, false, false);
}

TEST_F(seg, wait_released_receiver_killed)
{
	release_case(_metadata, self->ctx, true, false);
}

/* The same through tshm_seg_release_pollfds() and the caller's poll(). */
TEST_F(seg, release_pollfds)
{
	release_case(_metadata, self->ctx, false, true);
}

TEST_F(seg, release_pollfds_receiver_killed)
{
	release_case(_metadata, self->ctx, true, true);
}

TEST_F(seg, wait_released_errors)
{
	struct tshm_seg *seg;
	struct pollfd pfd;

	EXPECT_EQ(-EINVAL, tshm_seg_wait_released(NULL, 0));
	EXPECT_EQ(-EINVAL, tshm_seg_release_pollfds(NULL, &pfd, 1));
	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, NULL, 0, &seg));
	EXPECT_EQ(-EINVAL, tshm_seg_release_pollfds(seg, NULL, 1));
	EXPECT_EQ(-EINVAL, tshm_seg_release_pollfds(seg, &pfd, 0));
	tshm_seg_unref(seg);
}

TEST_F(seg, send_recv_fd_errors)
{
	struct tshm_seg *seg;
	int sv[2];

	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv));
	EXPECT_EQ(-EINVAL, tshm_seg_send_fd(NULL, sv[0]));
	EXPECT_EQ(-EINVAL, tshm_seg_recv_fd(self->ctx, -1, &seg));
	ASSERT_EQ(5, write(sv[0], "junk!", 5));
	EXPECT_EQ(-EBADMSG, tshm_seg_recv_fd(self->ctx, sv[1], &seg));
	close(sv[0]);
	EXPECT_EQ(-EPIPE, tshm_seg_recv_fd(self->ctx, sv[1], &seg));
	close(sv[1]);
}

/* What tshm_seg_send_fd() writes on the fallback, forged. */
struct forged_wire {
	uint32_t magic;
	uint32_t backend;
	uint64_t gen;
};

static int forge_send(int sock, int seg_fd, int lease_fd)
{
	struct forged_wire w = { .magic = 0x47455354, .backend = 2, .gen = 1 };
	char cbuf[CMSG_SPACE(2 * sizeof(int))] = { 0 };
	struct iovec iov = { .iov_base = &w, .iov_len = sizeof(w) };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	int fds[2] = { seg_fd, lease_fd };

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(c), fds, sizeof(fds));
	return sendmsg(sock, &msg, 0) == sizeof(w) ? 0 : -errno;
}

/*
 * Received fds are checked, not trusted: an unsealed memfd (its sender
 * could shrink it and the receiver would take SIGBUS), a pipe where a
 * segment or a lease socket belongs: -EBADMSG, nothing kept open.  (The
 * module backend passes transfer contexts instead: checked by the module.)
 */
TEST_F(seg, recv_fd_checks_what_arrives)
{
	struct tshm_seg *got;
	int sv[2], lease[2], p[2], mfd, sealed, fds;

	if (is_kmod(self->ctx))
		SKIP(return, "fallback wire format");
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv));
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, lease));
	ASSERT_EQ(0, pipe(p));
	mfd = memfd_create("tshm:forged", MFD_ALLOW_SEALING);
	ASSERT_LE(0, mfd);
	ASSERT_EQ(0, ftruncate(mfd, 1 << 20));
	sealed = memfd_create("tshm:sealed", MFD_ALLOW_SEALING);
	ASSERT_LE(0, sealed);
	ASSERT_EQ(0, ftruncate(sealed, 1 << 20));
	ASSERT_EQ(0, fcntl(sealed, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK));
	fds = count_fds();

	ASSERT_EQ(0, forge_send(sv[0], mfd, lease[1]));
	EXPECT_EQ(-EBADMSG, tshm_seg_recv_fd(self->ctx, sv[1], &got));
	ASSERT_EQ(0, forge_send(sv[0], p[0], lease[1]));
	EXPECT_EQ(-EBADMSG, tshm_seg_recv_fd(self->ctx, sv[1], &got));
	ASSERT_EQ(0, forge_send(sv[0], sealed, p[0]));
	EXPECT_EQ(-EBADMSG, tshm_seg_recv_fd(self->ctx, sv[1], &got));
	EXPECT_EQ(fds, count_fds());
	/* Sealed, with a lease socket: that is a segment. */
	ASSERT_EQ(0, forge_send(sv[0], sealed, lease[1]));
	ASSERT_EQ(0, tshm_seg_recv_fd(self->ctx, sv[1], &got));
	EXPECT_EQ(1 << 20, tshm_seg_size(got));
	tshm_seg_unref(got);
	close(mfd);
	close(sealed);
	close(p[0]);
	close(p[1]);
	close(lease[0]);
	close(lease[1]);
	close(sv[0]);
	close(sv[1]);
}

static void *name_of(void *seg)
{
	return (void *)tshm_seg_name(seg);
}

/*
 * A received segment carries its name.  On the fallback it is read from
 * the memfd at the first tshm_seg_name() (a readlink() at every receive
 * cost 3 us): threads asking at once all get it, whole.
 */
TEST_F(seg, received_name)
{
	struct tshm_seg *seg, *got;
	struct tshm_ctx *ctx;
	int sv[2];
	pid_t pid;

	ASSERT_EQ(0, tshm_seg_create(self->ctx, 4096, "travels", 0, &seg));
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		close(sv[0]);
		tshm_seg_unref(seg);
		/* a context of its own: nothing cached from the parent */
		if (tshm_ctx_open_fd(tshm_ctx_fd(self->ctx), 0, &ctx) ||
		    tshm_seg_recv_fd(ctx, sv[1], &got))
			_exit(1);
		{
			pthread_t t[4];
			void *name;
			int bad = 0;

			for (int i = 0; i < 4; i++)
				if (pthread_create(&t[i], NULL, name_of, got))
					_exit(3);
			for (int i = 0; i < 4; i++) {
				pthread_join(t[i], &name);
				bad |= strcmp(name, "travels") != 0;
			}
			_exit(bad || strcmp(tshm_seg_name(got), "travels") ?
			      2 : 0);
		}
	}
	close(sv[1]);
	ASSERT_EQ(0, tshm_seg_send_fd(seg, sv[0]));
	EXPECT_EQ(0, wait_ok(pid));
	close(sv[0]);
	tshm_seg_unref(seg);
}

TEST_F(seg, send_recv_fd_other_backend)
{
	struct tshm_ctx *other;
	struct tshm_seg *seg, *got;
	int sv[2];

	if (!is_kmod(self->ctx))
		SKIP(return, "needs the module for a second backend");
	ASSERT_EQ(0, tshm_ctx_open(&other, TSHM_CTX_MEMFD));
	ASSERT_EQ(0, tshm_seg_create(other, 4096, "x", 0, &seg));
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv));
	ASSERT_EQ(0, tshm_seg_send_fd(seg, sv[0]));
	EXPECT_EQ(-EXDEV, tshm_seg_recv_fd(self->ctx, sv[1], &got));
	close(sv[0]);
	close(sv[1]);
	tshm_seg_unref(seg);
	tshm_ctx_close(other);
}

TEST_F(seg, handles)
{
	struct tshm_handle h, bad;
	struct tshm_seg *seg, *got;
	pid_t pid;

	ASSERT_EQ(0, tshm_seg_create(self->ctx, 8192, "handle", 0, &seg));
	fill_pattern(tshm_seg_data(seg), 8192, 7);
	EXPECT_EQ(-EINVAL, tshm_seg_export(NULL, &h));
	EXPECT_EQ(-EINVAL, tshm_seg_import(self->ctx, NULL, &got));
	if (!is_kmod(self->ctx)) {
		EXPECT_EQ(-EOPNOTSUPP, tshm_seg_export(seg, &h));
		h = (struct tshm_handle){ .id = 1, .grants = 1 };
		EXPECT_EQ(-EOPNOTSUPP, tshm_seg_import(self->ctx, &h, &got));
		tshm_seg_unref(seg);
		return;
	}
	ASSERT_EQ(0, tshm_seg_export(seg, &h));
	EXPECT_EQ(tshm_seg_id(seg), h.id);
	EXPECT_EQ(1, h.grants);
	bad = h;
	bad.grants = 2;
	EXPECT_EQ(-EINVAL, tshm_seg_import(self->ctx, &bad, &got));
	bad = h;
	bad.flags = 1;
	EXPECT_EQ(-EINVAL, tshm_seg_import(self->ctx, &bad, &got));

	/* A child sharing the context consumes the grant. */
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		struct tshm_ctx *cctx;

		if (tshm_ctx_open_fd(tshm_ctx_fd(self->ctx), 0, &cctx))
			_exit(1);
		if (tshm_seg_import(cctx, &h, &got))
			_exit(2);
		if (fnv1a(tshm_seg_data(got), 8192) !=
		    fnv1a(tshm_seg_data(seg), 8192))
			_exit(3);
		tshm_seg_unref(got);
		_exit(0);
	}
	EXPECT_EQ(0, wait_ok(pid));
	EXPECT_EQ(0, tshm_seg_wait_released(seg, 5000));

	/* Importing what we hold: cached, the grant is given back later. */
	ASSERT_EQ(0, tshm_seg_export(seg, &h));
	ASSERT_EQ(0, tshm_seg_import(self->ctx, &h, &got));
	EXPECT_EQ(seg, got);
	tshm_seg_unref(got);
	/* Waiting for release gives the pending grant back first. */
	EXPECT_EQ(0, tshm_seg_wait_released(seg, 5000));

	/* An id nobody granted. */
	bad = h;
	bad.id = ~0ULL;
	EXPECT_GT(0, tshm_seg_import(self->ctx, &bad, &got));
	tshm_seg_unref(seg);
}

TSHM_TEST_MAIN(NULL)
