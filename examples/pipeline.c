// SPDX-License-Identifier: GPL-2.0
/*
 * pipeline: one producer, N consumers, zero copies.
 *
 *   pipeline [-m fork|spawn|forkserver] [-n CONSUMERS] [-f FRAMES]
 *            [-s FRAME_BYTES]
 *
 * The producer takes a buffer from a pool, fills it (a "frame"), sends it on
 * a queue and forgets it.  A consumer spawned with tshm_spawn() receives
 * it (the same pages, not a copy), checks it, releases it and reports on a
 * second queue.  The buffer goes back to the pool by itself once the
 * consumer let go: the producer never tracks who holds what, and a consumer
 * that crashes does not leak it.  At the end the producer closes the queue;
 * consumers drain it and see end-of-queue.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tshm-spawn.h>

struct frame {
	uint32_t seq;
	uint32_t len;
	uint64_t sum;
};

struct result {
	uint32_t seq;
	int32_t rank;
	int32_t ok;
};

static uint64_t checksum(const void *p, size_t n)
{
	const uint64_t *w = p;
	uint64_t h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < n / 8; i++)
		h = (h ^ w[i]) * 0x100000001b3ULL;
	return h;
}

static void fill(void *p, size_t n, uint32_t seq)
{
	uint64_t *w = p, x = seq * 0x9e3779b97f4a7c15ULL + 1;

	for (size_t i = 0; i < n / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		w[i] = x;
	}
}

static int consumer(int rank, int nprocs, void *arg)
{
	struct tshm_queue *work = tshm_worker_queue(0);
	struct tshm_queue *results = tshm_worker_queue(1);

	for (;;) {
		struct tshm_seg *seg;
		unsigned nsegs = 1;
		struct frame fr;
		struct result r;
		size_t len;
		int ret;

		ret = tshm_queue_recv(work, &fr, sizeof(fr), &len, &seg, &nsegs,
				      -1);
		if (ret == -EPIPE)
			return 0;	/* closed and drained */
		if (ret < 0 || nsegs != 1)
			tshm_worker_fail("consumer %d: recv: %s", rank,
					 tshm_strerror(ret));
		r.seq = fr.seq;
		r.rank = rank;
		r.ok = checksum(tshm_seg_data(seg), fr.len) == fr.sum;
		/* Released: the buffer is the producer's again. */
		tshm_seg_unref(seg);
		ret = tshm_queue_send(results, &r, sizeof(r), NULL, 0, -1);
		if (ret < 0)
			tshm_worker_fail("consumer %d: send: %s", rank,
					 tshm_strerror(ret));
	}
}
TSHM_ENTRY("consumer", consumer)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int drain(struct tshm_queue *results, int timeout_ms, int *per_rank,
		 int nprocs, int *bad)
{
	struct result r;
	size_t len;
	int n = 0;

	while (tshm_queue_recv(results, &r, sizeof(r), &len, NULL, NULL,
			       n ? 0 : timeout_ms) == 0) {
		if (r.rank >= 0 && r.rank < nprocs)
			per_rank[r.rank]++;
		*bad += !r.ok;
		n++;
	}
	return n;
}

int main(int argc, char **argv)
{
	enum tshm_start_method method = TSHM_START_SPAWN;
	struct tshm_forkserver *fs = NULL;
	struct tshm_queue *work, *results;
	struct tshm_spawn_attr *attr;
	struct tshm_procs *procs;
	struct tshm_failure f;
	struct tshm_pool *pool;
	struct tshm_ctx *ctx;
	size_t size = 1 << 20;
	int n = 3, frames = 2000, opt, ret, got = 0, bad = 0;
	int per_rank[TSHM_SPAWN_MAX_PROCS] = { 0 };
	double t0;

	while ((opt = getopt(argc, argv, "m:n:f:s:")) != -1) {
		switch (opt) {
		case 'm':
			if (!strcmp(optarg, "fork"))
				method = TSHM_START_FORK;
			else if (!strcmp(optarg, "forkserver"))
				method = TSHM_START_FORKSERVER;
			else
				method = TSHM_START_SPAWN;
			break;
		case 'n':
			n = atoi(optarg);
			break;
		case 'f':
			frames = atoi(optarg);
			break;
		case 's':
			size = (size_t)atol(optarg) & ~7UL;
			break;
		default:
			fprintf(stderr, "usage: %s [-m fork|spawn|forkserver] "
				"[-n CONSUMERS] [-f FRAMES] [-s FRAME_BYTES]\n",
				argv[0]);
			return 2;
		}
	}
	if (n < 1 || n > TSHM_SPAWN_MAX_PROCS || frames < 1 ||
	    frames > 65536 || size < 8) {
		fprintf(stderr, "pipeline: bad arguments\n");
		return 2;
	}
	if (method == TSHM_START_FORKSERVER &&
	    (ret = tshm_forkserver_create(&fs)) < 0)
		goto err;
	if ((ret = tshm_ctx_open(&ctx, 0)) < 0)
		goto err;
	/* 8 buffers in flight at most: the producer waits for a release. */
	if ((ret = tshm_pool_create(ctx, 8, size, "frame", 0, &pool)) < 0 ||
	    (ret = tshm_queue_create(ctx, 8, sizeof(struct frame), &work)) < 0 ||
	    (ret = tshm_queue_create(ctx, (unsigned)frames,
				     sizeof(struct result), &results)) < 0)
		goto err;

	if ((ret = tshm_spawn_attr_create(&attr)) < 0)
		goto err;
	tshm_spawn_attr_set_method(attr, method);
	tshm_spawn_attr_set_forkserver(attr, fs);
	tshm_spawn_attr_set_entry(attr, "consumer");
	tshm_spawn_attr_set_nprocs(attr, n);
	tshm_spawn_attr_add_queue(attr, work);
	tshm_spawn_attr_add_queue(attr, results);
	ret = tshm_spawn(ctx, attr, &procs);
	tshm_spawn_attr_destroy(attr);
	if (ret < 0)
		goto err;
	printf("pipeline: %d consumers (%s), %d frames of %zu KiB, backend %s\n",
	       n, tshm_start_method_name(method), frames, size >> 10,
	       tshm_ctx_backend(ctx));

	t0 = now_s();
	for (int seq = 0; seq < frames; seq++) {
		struct tshm_seg *seg;
		struct frame fr = { .seq = (uint32_t)seq, .len = (uint32_t)size };

		/* Blocks while all 8 buffers are out with consumers. */
		ret = tshm_pool_get(pool, 10000, &seg);
		if (ret < 0)
			break;
		fill(tshm_seg_data(seg), size, fr.seq);
		fr.sum = checksum(tshm_seg_data(seg), size);
		ret = tshm_queue_send(work, &fr, sizeof(fr), &seg, 1, 10000);
		tshm_seg_unref(seg);
		if (ret < 0)
			break;
		got += drain(results, 0, per_rank, n, &bad);
	}
	tshm_queue_close(work);
	while (ret == 0 && got < frames) {
		int k = drain(results, 10000, per_rank, n, &bad);

		if (!k)
			break;
		got += k;
	}
	if (tshm_procs_join(procs, 10000, &f) < 0) {
		fprintf(stderr, "pipeline: %s\n", f.summary);
		ret = -ECANCELED;
	}
	tshm_procs_destroy(procs);
	printf("pipeline: %d/%d frames checked (%d bad) in %.3f s, %.0f MiB/s\n",
	       got, frames, bad, now_s() - t0,
	       (double)got * (double)size / (1 << 20) / (now_s() - t0));
	for (int i = 0; i < n; i++)
		printf("  consumer %d: %d frames\n", i, per_rank[i]);
	tshm_queue_unref(work);
	tshm_queue_unref(results);
	tshm_pool_destroy(pool);
	tshm_ctx_close(ctx);
	tshm_forkserver_destroy(fs);
	return ret < 0 || bad || got != frames;
err:
	fprintf(stderr, "pipeline: %s\n", tshm_strerror(ret));
	return 1;
}
