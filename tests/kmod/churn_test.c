// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko: churn.  64 processes in a ring each create 1,000 segments,
 * grant each to the shared context and send its id to the next process,
 * which attaches, checks and drops it; some processes are SIGKILLed
 * midway.  Afterwards /proc/tshm is empty and Shmem is back where it was.
 * TSHM_CHURN_ROUNDS overrides the 1,000 (make check uses fewer on the
 * debug kernel, where KASAN and lockdep under emulation are ~50x slower).
 */
#include <signal.h>
#include "kselftest_harness.h"
#include "tshm_test.h"

#define WORKERS		64
#define ROUNDS		1000

static int rounds(void)
{
	const char *env = getenv("TSHM_CHURN_ROUNDS");
	int n = env ? atoi(env) : 0;

	return n > 0 ? n : ROUNDS;
}
#define SEGSZ		(16 * 1024)

static int worker(int ctx, int me, int in, int out)
{
	uint64_t id, got;
	int i, fd, afd;
	uint32_t *p;

	int n = rounds();

	signal(SIGPIPE, SIG_IGN);
	for (i = 0; i < n; i++) {
		fd = tt_create(ctx, SEGSZ, 0, "churn", &id);
		if (fd < 0)
			return 1;
		p = mmap(NULL, SEGSZ, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			return 2;
		p[0] = (uint32_t)id;
		munmap(p, SEGSZ);
		if (tt_grant(fd, ctx, 1, NULL))
			return 3;
		close(fd);
		/* A dead receiver: take the grant back, as a sender would. */
		if (out >= 0 && write(out, &id, sizeof(id)) != sizeof(id)) {
			if (tt_drop(ctx, id, 1))
				return 4;
			close(out);
			out = -1;
		}
		if (in < 0)
			continue;
		if (read(in, &got, sizeof(got)) != sizeof(got)) {
			close(in);	/* the sender died */
			in = -1;
			continue;
		}
		afd = tt_attach(ctx, got, 0, NULL);
		if (afd < 0)
			return 5;
		p = mmap(NULL, SEGSZ, PROT_READ, MAP_SHARED, afd, 0);
		if (p == MAP_FAILED || p[0] != (uint32_t)got)
			return 6;
		munmap(p, SEGSZ);
		close(afd);
	}
	(void)me;
	return 0;
}

FIXTURE(churn) {
	int dummy;
};

FIXTURE_SETUP(churn)
{
	TT_NEED_MODULE();
}

FIXTURE_TEARDOWN(churn)
{
}

TEST_F_TIMEOUT(churn, ring_with_kills, 900)
{
	int pipes[WORKERS][2], i, j, st, ctx, failed = 0, killed = 0;
	pid_t pids[WORKERS];
	long base_kb, end_kb;

	TT_SETUP_SKIPPED();
	base_kb = tt_shmem_kb();
	ASSERT_EQ(0, tt_proc_count());
	ctx = tt_open();
	ASSERT_LE(0, ctx);
	for (i = 0; i < WORKERS; i++)
		ASSERT_EQ(0, pipe(pipes[i]));
	for (i = 0; i < WORKERS; i++) {
		pids[i] = fork();
		ASSERT_LE(0, pids[i]);
		if (!pids[i]) {
			int in = pipes[i][0], out = pipes[(i + 1) % WORKERS][1];

			for (j = 0; j < WORKERS; j++) {
				if (pipes[j][0] != in)
					close(pipes[j][0]);
				if (pipes[j][1] != out)
					close(pipes[j][1]);
			}
			_exit(worker(ctx, i, in, out));
		}
	}
	for (i = 0; i < WORKERS; i++) {
		close(pipes[i][0]);
		close(pipes[i][1]);
	}
	/* Let them run a little, then kill every eighth one. */
	usleep(300 * 1000);
	for (i = 3; i < WORKERS; i += 8)
		kill(pids[i], SIGKILL);
	for (i = 0; i < WORKERS; i++) {
		ASSERT_EQ(pids[i], waitpid(pids[i], &st, 0));
		if (WIFSIGNALED(st))
			killed++;
		else if (WEXITSTATUS(st))
			failed++;
		if (WIFEXITED(st) && WEXITSTATUS(st))
			TH_LOG("worker %d exited %d", i, WEXITSTATUS(st));
	}
	TH_LOG("%d killed, %d failed, %d live segments before the context closes",
	       killed, failed, tt_proc_count());
	EXPECT_EQ(0, failed);
	close(ctx);
	EXPECT_EQ(0, tt_proc_count());
	end_kb = tt_shmem_kb();
	TH_LOG("Shmem %ld kB before, %ld kB after", base_kb, end_kb);
	EXPECT_GE(base_kb + 2048, end_kb);
}

TEST_HARNESS_MAIN
