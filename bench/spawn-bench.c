// SPDX-License-Identifier: GPL-2.0
/*
 * spawn-bench: how long tshm_spawn() takes to get N workers running a
 * trivial entry function ("ready": tshm_spawn() returned, every worker has
 * reached its entry) and to get them all back ("joined": tshm_procs_join()
 * returned 0), for N = 1, 4, 16, 64 and each start method.  A plain
 * fork()+waitpid() loop is the floor for comparison.
 *
 *   spawn-bench [-r REPS] [-n N[,N...]]
 *
 * Each figure is the median of REPS runs (default 7).  For scale:
 * torch.multiprocessing.spawn of a trivial function takes about 0.85 s for
 * one worker and 10 s for 16 on these machines.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tshm-spawn.h>

static int trivial(int rank, int nprocs, void *arg)
{
	return 0;
}
TSHM_ENTRY("trivial", trivial)

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* -1: the plain fork()+waitpid() floor. */
static int run_once(int method, int n, struct tshm_forkserver *fs,
		    double *ready, double *joined)
{
	struct tshm_spawn_attr *a;
	struct tshm_procs *procs;
	struct tshm_failure f;
	double t0 = now_us();
	int ret;

	if (method < 0) {
		for (int i = 0; i < n; i++) {
			pid_t pid = fork();

			if (pid == 0)
				_exit(0);
			if (pid < 0)
				return -errno;
		}
		*ready = now_us() - t0;
		for (int i = 0; i < n; i++)
			wait(NULL);
		*joined = now_us() - t0;
		return 0;
	}
	ret = tshm_spawn_attr_create(&a);
	if (ret)
		return ret;
	tshm_spawn_attr_set_method(a, method);
	tshm_spawn_attr_set_forkserver(a, fs);
	tshm_spawn_attr_set_entry(a, "trivial");
	tshm_spawn_attr_set_nprocs(a, n);
	t0 = now_us();
	ret = tshm_spawn(NULL, a, &procs);
	*ready = now_us() - t0;
	tshm_spawn_attr_destroy(a);
	if (ret)
		return ret;
	ret = tshm_procs_join(procs, -1, &f);
	*joined = now_us() - t0;
	if (ret)
		fprintf(stderr, "spawn-bench: %s\n", f.summary);
	tshm_procs_destroy(procs);
	return ret;
}

int main(int argc, char **argv)
{
	static const int methods[] = { -1, TSHM_START_FORK, TSHM_START_SPAWN,
				       TSHM_START_FORKSERVER };
	int sizes[16] = { 1, 4, 16, 64 }, nsizes = 4, reps = 7, opt;
	struct tshm_forkserver *fs;
	int ret;

	while ((opt = getopt(argc, argv, "r:n:")) != -1) {
		switch (opt) {
		case 'r':
			reps = atoi(optarg);
			if (reps < 1 || reps > 1000)
				reps = 7;
			break;
		case 'n': {
			char *save = NULL;

			nsizes = 0;
			for (char *t = strtok_r(optarg, ",", &save); t && nsizes < 16;
			     t = strtok_r(NULL, ",", &save))
				sizes[nsizes++] = atoi(t);
			break;
		}
		default:
			fprintf(stderr, "usage: %s [-r REPS] [-n N[,N...]]\n",
				argv[0]);
			return 2;
		}
	}
	/* Early, before anything else: that is the forkserver's point. */
	ret = tshm_forkserver_create(&fs);
	if (ret) {
		fprintf(stderr, "tshm_forkserver_create: %s\n",
			tshm_strerror(ret));
		return 1;
	}

	printf("# spawn-bench: median of %d runs, %ld online CPUs\n", reps,
	       sysconf(_SC_NPROCESSORS_ONLN));
	printf("%-12s %5s %12s %12s %14s %14s\n", "method", "N", "ready ms",
	       "joined ms", "ready us/wkr", "joined us/wkr");
	for (unsigned m = 0; m < sizeof(methods) / sizeof(methods[0]); m++) {
		const char *name = methods[m] < 0 ? "fork+waitpid" :
				   tshm_start_method_name(methods[m]);

		for (int s = 0; s < nsizes; s++) {
			double r[1000], j[1000], rm, jm;
			int n = sizes[s];

			if (n < 1 || n > TSHM_SPAWN_MAX_PROCS)
				continue;
			for (int i = 0; i < reps; i++) {
				ret = run_once(methods[m], n, fs, &r[i], &j[i]);
				if (ret) {
					fprintf(stderr, "%s N=%d: %s\n", name, n,
						tshm_strerror(ret));
					tshm_forkserver_destroy(fs);
					return 1;
				}
			}
			rm = median(r, reps);
			jm = median(j, reps);
			printf("%-12s %5d %12.3f %12.3f %14.1f %14.1f\n", name, n,
			       rm / 1e3, jm / 1e3, rm / n, jm / n);
			fflush(stdout);
		}
	}
	tshm_forkserver_destroy(fs);
	return 0;
}
