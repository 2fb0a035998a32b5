// SPDX-License-Identifier: GPL-2.0
/*
 * hogwild: N workers train one linear model by lock-free SGD on a shared
 * parameter segment (Hogwild!, Niu et al. 2011; the example torch's
 * multiprocessing docs use).
 *
 *   hogwild [-m fork|spawn|forkserver] [-n WORKERS] [-s STEPS]
 *
 * The parent creates the parameter segment and hands it to every worker
 * through a queue (16 bytes on the module, an fd on the memfd fallback):
 * the workers map the very same pages and update them without locks.
 * tshm_spawn() gives each worker floor(CPUs / N) threads in
 * OMP_NUM_THREADS and friends, so a BLAS inside the workers would not
 * oversubscribe the machine.  Run it with -m spawn: each worker is a fresh
 * exec of this program that starts in hogwild_worker(), never in main().
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tshm-spawn.h>

#define DIM	16

struct params {
	double w[DIM];
	double b;
	unsigned long steps;	/* updates applied, all workers together */
};

struct job {
	int steps;
	double lr;
};

/* The model every worker's data comes from: y = w* . x + b* + noise. */
static double true_w(int i)
{
	return (i % 2 ? 1.0 : -1.0) * (1.0 + i / 4.0);
}

static double true_b = 0.5;

static double frand(unsigned long long *s)
{
	*s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
	return (double)(*s >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

static void sample(unsigned long long *s, double *x, double *y)
{
	double t = true_b;

	for (int i = 0; i < DIM; i++) {
		x[i] = frand(s);
		t += true_w(i) * x[i];
	}
	*y = t + 0.01 * frand(s);
}

static double loss(const struct params *p)
{
	unsigned long long s = 12345;
	double sum = 0;

	for (int k = 0; k < 1000; k++) {
		double x[DIM], y, e;

		sample(&s, x, &y);
		e = p->b - y;
		for (int i = 0; i < DIM; i++)
			e += p->w[i] * x[i];
		sum += e * e;
	}
	return sum / 1000;
}

static int hogwild_worker(int rank, int nprocs, void *arg)
{
	const struct job *job = arg;
	struct tshm_queue *q = tshm_worker_queue(0);
	struct tshm_seg *seg;
	unsigned nsegs = 1;
	unsigned long long s = 1000003ULL * (unsigned)(rank + 1);
	volatile struct params *p;
	size_t len;
	char dummy;
	int ret;

	ret = tshm_queue_recv(q, &dummy, 1, &len, &seg, &nsegs, 10000);
	if (ret < 0 || nsegs != 1)
		tshm_worker_fail("rank %d: no parameter segment: %s", rank,
				 tshm_strerror(ret));
	p = tshm_seg_data(seg);
	if (rank == 0)
		printf("worker 0 of %d: OMP_NUM_THREADS=%s\n", nprocs,
		       getenv("OMP_NUM_THREADS"));

	for (int step = 0; step < job->steps; step++) {
		double x[DIM], y, e;

		sample(&s, x, &y);
		/* Read, compute, write: no lock, races are the point. */
		e = p->b - y;
		for (int i = 0; i < DIM; i++)
			e += p->w[i] * x[i];
		for (int i = 0; i < DIM; i++)
			p->w[i] -= job->lr * e * x[i];
		p->b -= job->lr * e;
		__atomic_add_fetch(&((struct params *)p)->steps, 1,
				   __ATOMIC_RELAXED);
	}
	tshm_seg_unref(seg);
	return 0;
}
TSHM_ENTRY("hogwild", hogwild_worker)

int main(int argc, char **argv)
{
	enum tshm_start_method method = TSHM_START_SPAWN;
	struct tshm_forkserver *fs = NULL;
	struct job job = { .steps = 20000, .lr = 0.01 };
	struct tshm_spawn_attr *attr;
	struct tshm_procs *procs;
	struct tshm_failure f;
	struct tshm_queue *q;
	struct tshm_ctx *ctx;
	struct tshm_seg *seg;
	struct params *p;
	int n = 4, opt, ret;

	while ((opt = getopt(argc, argv, "m:n:s:")) != -1) {
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
		case 's':
			job.steps = atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: %s [-m fork|spawn|forkserver] "
				"[-n WORKERS] [-s STEPS]\n", argv[0]);
			return 2;
		}
	}
	/* A forkserver is made first, while the program is still clean. */
	if (method == TSHM_START_FORKSERVER &&
	    (ret = tshm_forkserver_create(&fs)) < 0)
		goto err;
	if ((ret = tshm_ctx_open(&ctx, 0)) < 0)
		goto err;
	if ((ret = tshm_seg_create(ctx, sizeof(*p), "hogwild-params", 0,
				   &seg)) < 0)
		goto err;
	p = tshm_seg_data(seg);
	memset(p, 0, sizeof(*p));
	printf("hogwild: %d workers (%s), %d steps each, loss before %.4f\n",
	       n, tshm_start_method_name(method), job.steps, loss(p));

	/* One message per worker, each carrying the parameter segment. */
	if ((ret = tshm_queue_create(ctx, (unsigned)n, 1, &q)) < 0)
		goto err;
	for (int i = 0; i < n; i++)
		if ((ret = tshm_queue_send(q, "p", 1, &seg, 1, -1)) < 0)
			goto err;

	if ((ret = tshm_spawn_attr_create(&attr)) < 0)
		goto err;
	tshm_spawn_attr_set_method(attr, method);
	tshm_spawn_attr_set_forkserver(attr, fs);
	tshm_spawn_attr_set_entry(attr, "hogwild");
	tshm_spawn_attr_set_arg(attr, &job, sizeof(job));
	tshm_spawn_attr_add_queue(attr, q);
	if ((ret = tshm_spawn_attr_set_nprocs(attr, n)) < 0)
		goto err;
	fflush(stdout);
	ret = tshm_spawn(ctx, attr, &procs);
	tshm_spawn_attr_destroy(attr);
	if (ret < 0)
		goto err;
	ret = tshm_procs_join(procs, -1, &f);
	tshm_procs_destroy(procs);
	if (ret < 0) {
		fprintf(stderr, "hogwild: %s\n", f.summary);
		return 1;
	}
	printf("hogwild: %lu updates, loss after %.6f, w[0] %.3f (true %.3f), "
	       "b %.3f (true %.3f)\n", p->steps, loss(p), p->w[0], true_w(0),
	       p->b, true_b);
	ret = loss(p) < 0.01 ? 0 : 1;
	tshm_queue_unref(q);
	tshm_seg_unref(seg);
	tshm_ctx_close(ctx);
	tshm_forkserver_destroy(fs);
	return ret;
err:
	fprintf(stderr, "hogwild: %s\n", tshm_strerror(ret));
	return 1;
}
