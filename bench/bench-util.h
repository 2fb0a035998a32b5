/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers the libtshm benchmarks share: a monotonic clock, a shared
 * anonymous mapping, and the floor every latency is compared with (two
 * processes ping-ponging through one shared word, nothing else).
 */
#ifndef TSHM_BENCH_UTIL_H
#define TSHM_BENCH_UTIL_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* MAP_SHARED | MAP_ANONYMOUS, so forked children see it; exits on failure. */
static inline void *shared_anon(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("bench: mmap");
		exit(1);
	}
	return p;
}

/* One-way latency in us of a raw shared-memory spin ping-pong. */
static inline double spin_floor(int iters)
{
	_Atomic uint64_t *w = shared_anon(4096);
	double t0, t;
	int i, status;
	pid_t pid;

	pid = fork();
	if (pid < 0) {
		perror("bench: fork");
		exit(1);
	}
	if (pid == 0) {
		for (i = 0; i < iters; i++) {
			while (atomic_load_explicit(w, memory_order_acquire) !=
			       (uint64_t)2 * i + 1)
				;
			atomic_store_explicit(w, 2 * i + 2,
					      memory_order_release);
		}
		_exit(0);
	}
	t0 = now_us();
	for (i = 0; i < iters; i++) {
		atomic_store_explicit(w, 2 * i + 1, memory_order_release);
		while (atomic_load_explicit(w, memory_order_acquire) !=
		       (uint64_t)2 * i + 2)
			;
	}
	t = now_us() - t0;
	waitpid(pid, &status, 0);
	munmap((void *)w, 4096);
	return t / iters / 2;
}

#endif /* TSHM_BENCH_UTIL_H */
