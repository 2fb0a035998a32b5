// SPDX-License-Identifier: GPL-2.0
/*
 * lib-bench: libtshm against its baselines, one table, one run.
 *
 *   build/bench/lib-bench [-q]     (-q: fewer iterations, no 1 GiB)
 *
 * Latencies are one-way (half a ping-pong round trip) between two
 * processes.  Each tshm figure names the queue wait policy it used.
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tshm.h>

#include "bench-util.h"

static bool quick;
static struct tshm_ctx *ctx;

static void die(const char *what, int err)
{
	fprintf(stderr, "lib-bench: %s: %s\n", what, tshm_strerror(err));
	exit(1);
}

#define CHECK(call) do { int __r = (call); if (__r < 0) die(#call, __r); } while (0)

static void reap(pid_t pid)
{
	int status;

	waitpid(pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		die("child failed", -EIO);
}

/* ---- baselines ---- */

static int send_fd1(int sock, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 }, b = 0;
	struct iovec iov = { &b, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	return sendmsg(sock, &m, 0) == 1 ? 0 : -errno;
}

static int recv_fd1(int sock)
{
	char cbuf[CMSG_SPACE(sizeof(int))], b;
	struct iovec iov = { &b, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c;
	int fd;

	if (recvmsg(sock, &m, MSG_CMSG_CLOEXEC) != 1)
		return -1;
	c = CMSG_FIRSTHDR(&m);
	if (!c)
		return -1;
	memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

/* AF_UNIX SEQPACKET ping-pong passing one fd each way. */
static double scm_rights(int iters)
{
	int sv[2], fd, i;
	double t0, t;
	pid_t pid;

	socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv);
	fd = memfd_create("bench", MFD_CLOEXEC);
	pid = fork();
	if (pid == 0) {
		for (i = 0; i < iters; i++) {
			int got = recv_fd1(sv[1]);

			if (got < 0 || send_fd1(sv[1], got))
				_exit(1);
			close(got);
		}
		_exit(0);
	}
	t0 = now_us();
	for (i = 0; i < iters; i++) {
		int got;

		send_fd1(sv[0], fd);
		got = recv_fd1(sv[0]);
		close(got);
	}
	t = now_us() - t0;
	reap(pid);
	close(sv[0]);
	close(sv[1]);
	close(fd);
	return t / iters / 2;
}

/* Copy @size bytes through a pipe; the reader touches all of it. */
static double pipe_copy(size_t size, int iters)
{
	size_t chunk = 1 << 20, left;
	char *buf = malloc(chunk);
	int p[2], q[2], i;
	double t0, t;
	pid_t pid;
	char ack;

	memset(buf, 1, chunk);
	if (pipe(p) || pipe(q))
		die("pipe", -errno);
	fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
	pid = fork();
	if (pid == 0) {
		for (i = 0; i < iters; i++) {
			for (left = size; left;) {
				ssize_t n = read(p[0], buf, left < chunk ?
						 left : chunk);

				if (n <= 0)
					_exit(1);
				left -= n;
			}
			if (write(q[1], "k", 1) != 1)
				_exit(1);
		}
		_exit(0);
	}
	t0 = now_us();
	for (i = 0; i < iters; i++) {
		for (left = size; left;) {
			ssize_t n = write(p[1], buf, left < chunk ? left : chunk);

			if (n <= 0)
				die("write", -errno);
			left -= n;
		}
		if (read(q[0], &ack, 1) != 1)
			die("read", -errno);
	}
	t = now_us() - t0;
	reap(pid);
	close(p[0]);
	close(p[1]);
	close(q[0]);
	close(q[1]);
	free(buf);
	return t / iters;
}

/* ---- tshm ---- */

/*
 * Ping-pong over two queues.  @seg: carried each way (both sides keep it,
 * so after the first lap it is cached on both).
 */
static double tshm_pingpong(int iters, enum tshm_wait policy, size_t seg_size)
{
	struct tshm_queue *ab, *ba;
	struct tshm_seg *seg = NULL, *got;
	char msg[64] = { 0 };
	unsigned n;
	size_t len;
	double t0 = 0, t;
	pid_t pid;
	int i;

	CHECK(tshm_queue_create(ctx, 16, 64, &ab));
	CHECK(tshm_queue_create(ctx, 16, 64, &ba));
	tshm_queue_set_wait(ab, policy, 0);
	tshm_queue_set_wait(ba, policy, 0);
	if (seg_size)
		CHECK(tshm_seg_create(ctx, seg_size, "bench-cached", 0, &seg));
	pid = fork();
	if (pid == 0) {
		struct tshm_seg *keep = NULL;

		tshm_seg_unref(seg);	/* the child holds its own attach */
		for (i = 0; i < iters + 1; i++) {
			n = 1;
			if (tshm_queue_recv(ab, msg, sizeof(msg), &len, &got,
					    &n, -1))
				_exit(1);
			if (n && !keep)
				keep = tshm_seg_ref(got);
			if (tshm_queue_send(ba, msg, 64, &got, n, -1))
				_exit(1);
			if (n)
				tshm_seg_unref(got);
		}
		_exit(0);
	}
	/* One warm-up lap attaches the segment on both sides. */
	for (i = 0; i < iters + 1; i++) {
		if (i == 1)
			t0 = now_us();
		CHECK(tshm_queue_send(ab, msg, 64, &seg, seg ? 1 : 0, -1));
		n = 1;
		CHECK(tshm_queue_recv(ba, msg, sizeof(msg), &len, &got, &n, -1));
		if (n)
			tshm_seg_unref(got);
	}
	t = now_us() - t0;
	reap(pid);
	tshm_seg_unref(seg);
	tshm_queue_unref(ab);
	tshm_queue_unref(ba);
	return t / iters / 2;
}

/* Fresh segment: create, send, receiver maps it and reads a byte, acks. */
static double tshm_handoff(size_t size, int iters)
{
	struct tshm_queue *q, *ack;
	struct tshm_seg *seg, *got;
	double t0, t;
	unsigned n;
	size_t len;
	pid_t pid;
	char c;
	int i;

	CHECK(tshm_queue_create(ctx, 4, 8, &q));
	CHECK(tshm_queue_create(ctx, 4, 8, &ack));
	pid = fork();
	if (pid == 0) {
		for (i = 0; i < iters; i++) {
			n = 1;
			if (tshm_queue_recv(q, &c, 1, &len, &got, &n, -1) || !n)
				_exit(1);
			c = ((volatile char *)tshm_seg_data(got))[size - 1];
			tshm_seg_unref(got);
			if (tshm_queue_send(ack, &c, 1, NULL, 0, -1))
				_exit(1);
		}
		_exit(0);
	}
	t0 = now_us();
	for (i = 0; i < iters; i++) {
		CHECK(tshm_seg_create(ctx, size, "bench-fresh", 0, &seg));
		CHECK(tshm_queue_send(q, "x", 1, &seg, 1, -1));
		tshm_seg_unref(seg);
		CHECK(tshm_queue_recv(ack, &c, 1, &len, NULL, NULL, -1));
	}
	t = now_us() - t0;
	reap(pid);
	tshm_queue_unref(q);
	tshm_queue_unref(ack);
	return t / iters;
}

/* Messages per second, @np producers and @nc consumers, 64 bytes. */
static double tshm_rate(int np, int nc, long total, enum tshm_wait policy)
{
	struct tshm_queue *q;
	char msg[64] = { 0 };
	pid_t pid[8];
	double t0, t;
	size_t len;
	int i;

	CHECK(tshm_queue_create(ctx, 1024, 64, &q));
	tshm_queue_set_wait(q, policy, 0);
	for (i = 0; i < nc; i++) {
		pid[np + i] = fork();
		if (pid[np + i] == 0) {
			while (tshm_queue_recv(q, msg, 64, &len, NULL, NULL,
					       -1) == 0)
				;
			_exit(0);
		}
	}
	t0 = now_us();
	for (i = 0; i < np; i++) {
		pid[i] = fork();
		if (pid[i] == 0) {
			for (long k = 0; k < total / np; k++)
				if (tshm_queue_send(q, msg, 64, NULL, 0, -1))
					_exit(1);
			_exit(0);
		}
	}
	for (i = 0; i < np; i++)
		reap(pid[i]);
	while (tshm_queue_len(q))
		;
	t = now_us() - t0;
	tshm_queue_close(q);
	for (i = 0; i < nc; i++)
		reap(pid[np + i]);
	tshm_queue_unref(q);
	return total / (t / 1e6);
}

static void row(const char *what, double tshm, const char *unit,
		const char *base_name, double base, const char *policy)
{
	printf("| %-34s | %10.2f %-5s | %-22s | %10.2f | %7.2fx | %-8s |\n",
	       what, tshm, unit, base_name, base, base ? tshm / base : 0,
	       policy);
}

int main(int argc, char **argv)
{
	int lat = 20000, i;
	double floor, scm, v;
	static const struct { size_t size; int iters; } hs[] = {
		{ 4096, 2000 }, { 1 << 20, 500 }, { 64 << 20, 20 },
		{ 1UL << 30, 3 },
	};
	char name[64];

	quick = argc > 1 && !strcmp(argv[1], "-q");
	if (quick)
		lat = 2000;
	CHECK(tshm_ctx_open(&ctx, 0));
	printf("# libtshm bench, backend %s, %ld CPUs%s\n",
	       tshm_ctx_backend(ctx), sysconf(_SC_NPROCESSORS_ONLN),
	       quick ? ", quick" : "");
	printf("| %-34s | %16s | %-22s | %10s | %8s | %-8s |\n", "measure",
	       "tshm", "baseline", "baseline", "ratio", "policy");
	printf("|%.36s|%.18s|%.24s|%.12s|%.10s|%.10s|\n",
	       "------------------------------------", "------------------",
	       "------------------------", "------------", "----------",
	       "----------");
	fflush(stdout);

	floor = spin_floor(lat * 10);
	scm = scm_rights(lat);
	v = tshm_pingpong(lat * 5, TSHM_WAIT_SPIN, 0);
	row("64 B one-way latency", v, "us", "shm spin floor", floor, "spin");
	row("64 B one-way latency", v, "us", "SCM_RIGHTS seqpacket", scm,
	    "spin");
	v = tshm_pingpong(lat, TSHM_WAIT_ADAPTIVE, 0);
	row("64 B one-way latency", v, "us", "shm spin floor", floor,
	    "adaptive");
	v = tshm_pingpong(lat / 4, TSHM_WAIT_FUTEX, 0);
	row("64 B one-way latency", v, "us", "SCM_RIGHTS seqpacket", scm,
	    "futex");
	v = tshm_pingpong(lat, TSHM_WAIT_SPIN, 1 << 20);
	row("cached 1 MiB segment one-way", v, "us", "shm spin floor", floor,
	    "spin");
	row("cached 1 MiB segment one-way", v, "us", "SCM_RIGHTS seqpacket",
	    scm, "spin");
	fflush(stdout);

	for (i = 0; i < 4; i++) {
		size_t size = hs[i].size;
		int iters = quick ? (hs[i].iters + 9) / 10 : hs[i].iters;
		double h, p;

		if (quick && size > (64 << 20))
			continue;
		h = tshm_handoff(size, iters);
		p = pipe_copy(size, iters);
		if (size >= 1 << 20)
			snprintf(name, sizeof(name), "fresh %zu MiB handoff",
				 size >> 20);
		else
			snprintf(name, sizeof(name), "fresh %zu KiB handoff",
				 size >> 10);
		row(name, h, "us", "pipe copy", p, "adaptive");
		fflush(stdout);
	}
	v = tshm_rate(1, 1, quick ? 100000 : 1000000, TSHM_WAIT_ADAPTIVE);
	row("1+1 msgs/s (64 B)", v / 1e6, "M/s", "-", 0, "adaptive");
	v = tshm_rate(2, 2, quick ? 100000 : 1000000, TSHM_WAIT_ADAPTIVE);
	row("2+2 msgs/s (64 B)", v / 1e6, "M/s", "-", 0, "adaptive");
	tshm_ctx_close(ctx);
	return 0;
}
