// SPDX-License-Identifier: GPL-2.0
/*
 * lib-iceoryx-bench: libtshm's ping-pong against iceoryx's, in one run.
 *
 *   bench/run-iceoryx [-q]        starts RouDi, runs this, stops RouDi
 *   build/bench/lib-iceoryx-bench [-q]   with a RouDi already running
 *
 * One-way latency (half a round trip) of a 64-byte message and of a 1 MiB
 * payload between two processes.  iceoryx: publish/subscribe through its C
 * binding, a fresh chunk loaned for every message (a subscriber cannot
 * send a received chunk on), the receiver either busy-polling
 * iox_sub_take_chunk() ("spin") or sleeping in a WaitSet ("waitset", a
 * futex-backed semaphore).  tshm: the queue ping-pong of lib-bench, the
 * 1 MiB segment already held by both sides.  The ratio column is tshm over
 * iceoryx: below 1 means tshm is faster.  Built only where the iceoryx C
 * binding's headers are installed (Debian: libiceoryx-binding-c-dev).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <iceoryx_binding_c/publisher.h>
#include <iceoryx_binding_c/runtime.h>
#include <iceoryx_binding_c/subscriber.h>
#include <iceoryx_binding_c/types.h>
#include <iceoryx_binding_c/wait_set.h>

#include <tshm.h>

#include "bench-util.h"

#define MIB	(1U << 20)

static void die(const char *what)
{
	fprintf(stderr, "lib-iceoryx-bench: %s\n", what);
	exit(1);
}

static int reap(pid_t pid)
{
	int status;

	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- the floor ---- */

/* ---- iceoryx ---- */

struct iox_side {
	iox_pub_storage_t pub_storage;
	iox_sub_storage_t sub_storage;
	iox_ws_storage_t ws_storage;
	iox_pub_t pub;
	iox_sub_t sub;
	iox_ws_t ws;
};

static void iox_side_init(struct iox_side *s, const char *name,
			  const char *out, const char *in, bool waitset)
{
	iox_pub_options_t po;
	iox_sub_options_t so;

	iox_runtime_init(name);
	iox_pub_options_init(&po);
	po.historyCapacity = 0;
	po.subscriberTooSlowPolicy = ConsumerTooSlowPolicy_WAIT_FOR_CONSUMER;
	s->pub = iox_pub_init(&s->pub_storage, "tshm-bench", name, out, &po);
	iox_sub_options_init(&so);
	so.queueCapacity = 4;
	so.historyRequest = 0;
	so.queueFullPolicy = QueueFullPolicy_BLOCK_PRODUCER;
	s->sub = iox_sub_init(&s->sub_storage, "tshm-bench",
			      strcmp(name, "ping") ? "ping" : "pong", in, &so);
	s->ws = NULL;
	if (waitset) {
		s->ws = iox_ws_init(&s->ws_storage);
		if (iox_ws_attach_subscriber_state(s->ws, s->sub,
						   SubscriberState_HAS_DATA,
						   0, NULL) !=
		    WaitSetResult_SUCCESS)
			die("iox_ws_attach_subscriber_state failed");
	}
}

static void iox_side_fini(struct iox_side *s)
{
	if (s->ws)
		iox_ws_deinit(s->ws);
	iox_sub_deinit(s->sub);
	iox_pub_deinit(s->pub);
	iox_runtime_shutdown();
}

/* Both ends connected: our subscription live, our publisher subscribed. */
static void iox_wait_connected(struct iox_side *s)
{
	double until = now_us() + 10e6;

	while (iox_sub_get_subscription_state(s->sub) !=
	       SubscribeState_SUBSCRIBED || !iox_pub_has_subscribers(s->pub)) {
		if (now_us() > until)
			die("iceoryx: no peer after 10 s (is RouDi running?)");
		usleep(1000);
	}
}

static const void *iox_take(struct iox_side *s)
{
	iox_notification_info_t ev[2];
	const void *p;
	uint64_t missed;

	for (;;) {
		if (iox_sub_take_chunk(s->sub, &p) ==
		    ChunkReceiveResult_SUCCESS)
			return p;
		if (s->ws)
			iox_ws_wait(s->ws, ev, 2, &missed);
	}
}

static void iox_send(struct iox_side *s, uint32_t size, uint64_t seq)
{
	void *p;

	if (iox_pub_loan_chunk(s->pub, &p, size) != AllocationResult_SUCCESS)
		die("iox_pub_loan_chunk failed (RouDi's mempools too small?)");
	/* Like the tshm figures: a header is written, not the payload. */
	*(volatile uint64_t *)p = seq;
	iox_pub_publish_chunk(s->pub, p);
}

/*
 * Ping-pong of @size-byte payloads; the "ping" process measures.  -1 when
 * iceoryx failed (no RouDi, say).
 */
static double iox_pingpong(int iters, uint32_t size, bool waitset)
{
	double *result = shared_anon(4096), t;
	struct iox_side s;
	pid_t pong, ping;
	int i;

	*result = -1;
	pong = fork();
	if (pong == 0) {
		alarm(120);	/* a lost peer must not hang the run */
		iox_side_init(&s, "pong", "pong", "ping", waitset);
		iox_wait_connected(&s);
		for (i = 0; i < iters + 1; i++) {
			const void *p = iox_take(&s);
			uint64_t seq = *(const volatile uint64_t *)p;

			iox_sub_release_chunk(s.sub, p);
			iox_send(&s, size, seq);
		}
		iox_side_fini(&s);
		_exit(0);
	}
	ping = fork();
	if (ping == 0) {
		double t0 = 0;

		alarm(120);
		iox_side_init(&s, "ping", "ping", "pong", waitset);
		iox_wait_connected(&s);
		for (i = 0; i < iters + 1; i++) {
			const void *p;

			if (i == 1)
				t0 = now_us();	/* after one warm-up lap */
			iox_send(&s, size, i);
			p = iox_take(&s);
			if (*(const volatile uint64_t *)p != (uint64_t)i)
				_exit(2);
			iox_sub_release_chunk(s.sub, p);
		}
		*result = (now_us() - t0) / iters / 2;
		iox_side_fini(&s);
		_exit(0);
	}
	if (reap(ping) || reap(pong))
		*result = -1;
	t = *result;
	munmap(result, 4096);
	return t;
}

/* ---- tshm (as in lib-bench) ---- */

static double tshm_pingpong(struct tshm_ctx *ctx, int iters,
			    enum tshm_wait policy, size_t seg_size)
{
	struct tshm_queue *ab, *ba;
	struct tshm_seg *seg = NULL, *got;
	char msg[64] = { 0 };
	double t0 = 0, t;
	unsigned n;
	size_t len;
	pid_t pid;
	int i;

	if (tshm_queue_create(ctx, 16, 64, &ab) ||
	    tshm_queue_create(ctx, 16, 64, &ba))
		die("tshm_queue_create failed");
	tshm_queue_set_wait(ab, policy, 0);
	tshm_queue_set_wait(ba, policy, 0);
	if (seg_size && tshm_seg_create(ctx, seg_size, "bench-cached", 0, &seg))
		die("tshm_seg_create failed");
	pid = fork();
	if (pid == 0) {
		struct tshm_seg *keep = NULL;

		tshm_seg_unref(seg);
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
	for (i = 0; i < iters + 1; i++) {
		if (i == 1)
			t0 = now_us();
		if (tshm_queue_send(ab, msg, 64, &seg, seg ? 1 : 0, -1))
			die("tshm_queue_send failed");
		n = 1;
		if (tshm_queue_recv(ba, msg, sizeof(msg), &len, &got, &n, -1))
			die("tshm_queue_recv failed");
		if (n)
			tshm_seg_unref(got);
	}
	t = now_us() - t0;
	if (reap(pid))
		die("tshm child failed");
	tshm_seg_unref(seg);
	tshm_queue_unref(ab);
	tshm_queue_unref(ba);
	return t / iters / 2;
}

static void row(const char *what, double tshm, const char *base_name,
		double base, const char *policy)
{
	printf("| %-34s | %10.2f %-5s | %-22s | %10.2f | %7.2fx | %-8s |\n",
	       what, tshm, "us", base_name, base, base > 0 ? tshm / base : 0,
	       policy);
}

int main(int argc, char **argv)
{
	bool quick = argc > 1 && !strcmp(argv[1], "-q");
	int lat = quick ? 2000 : 20000;
	double floor, t64, t1m, i64s, i1ms, i64w, i1mw, f64, f1m;
	struct tshm_ctx *ctx;

	if (tshm_ctx_open(&ctx, 0))
		die("tshm_ctx_open failed");
	printf("# libtshm vs iceoryx, tshm backend %s, %ld CPUs%s\n",
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
	i64s = iox_pingpong(lat, 64, false);
	i1ms = iox_pingpong(lat, MIB, false);
	i64w = iox_pingpong(lat / 4, 64, true);
	i1mw = iox_pingpong(lat / 4, MIB, true);
	if (i64s < 0 || i1ms < 0 || i64w < 0 || i1mw < 0)
		die("iceoryx ping-pong failed (is RouDi running, with 1 MiB chunks?)");
	t64 = tshm_pingpong(ctx, lat, TSHM_WAIT_SPIN, 0);
	t1m = tshm_pingpong(ctx, lat, TSHM_WAIT_SPIN, MIB);
	f64 = tshm_pingpong(ctx, lat / 4, TSHM_WAIT_FUTEX, 0);
	f1m = tshm_pingpong(ctx, lat / 4, TSHM_WAIT_FUTEX, MIB);

	row("64 B one-way latency", t64, "shm spin floor", floor, "spin");
	row("64 B one-way latency", t64, "iceoryx (spin)", i64s, "spin");
	row("64 B one-way latency", f64, "iceoryx (waitset)", i64w, "futex");
	row("1 MiB one-way (tshm: cached seg)", t1m, "shm spin floor", floor,
	    "spin");
	row("1 MiB one-way (tshm: cached seg)", t1m, "iceoryx (spin)", i1ms,
	    "spin");
	row("1 MiB one-way (tshm: cached seg)", f1m, "iceoryx (waitset)", i1mw,
	    "futex");
	tshm_ctx_close(ctx);
	return 0;
}
