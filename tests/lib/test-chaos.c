// SPDX-License-Identifier: GPL-2.0
/*
 * Chaos: producers and consumers SIGKILLed at random moments while they
 * send and receive segments for TSHM_CHAOS_SECONDS (default 30): at any
 * point, while asleep in a wait, or after being stopped (SIGSTOP) for a
 * while.  The survivors and the replacements must keep going, every call
 * of every survivor must come back within its timeout (also while another
 * participant is stopped), nothing may arrive twice or torn, and once
 * everyone is gone nothing may be left: no segment memfd open anywhere
 * (fallback), /proc/tshm empty and Shmem back (module).
 */
#include <stdatomic.h>
#include <sys/mman.h>
#include <time.h>

#include "tshm-test.h"

#define CH_PRODUCERS	3
#define CH_CONSUMERS	3
#define CH_WORKERS	(CH_PRODUCERS + CH_CONSUMERS)
#define CH_MAX_ID	(1U << 22)
#define CH_TIMEOUT_MS	200	/* every call's timeout */
/*
 * A survivor whose last call came back longer ago than this is stalled.
 * Far above CH_TIMEOUT_MS: emulated CPUs and sanitizers are slow, a
 * stalled survivor is stalled for as long as the stop lasts.
 */
#define CH_STALL_MS	3000
#define CH_STOP_MS	400	/* a stopped victim stays stopped this long */

struct chaos_msg {
	uint32_t id;
	uint32_t size;
	uint64_t sum;
	uint64_t self_sum;
};

struct chaos_shared {
	_Atomic uint32_t next_id;
	_Atomic uint32_t stop;
	_Atomic uint64_t delivered;
	_Atomic uint64_t dups;
	_Atomic uint64_t torn;
	_Atomic uint64_t errors;
	_Atomic int32_t last_error;
	_Atomic int64_t beat[CH_PRODUCERS + CH_CONSUMERS];	/* ms */
	uint64_t sums[CH_MAX_ID];
	_Atomic uint8_t seen[CH_MAX_ID];
};

static char seg_name[32];
static int my_role;

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A call came back. */
static void beat(struct chaos_shared *sh)
{
	atomic_store(&sh->beat[my_role], mono_ms());
}

static uint64_t cmsg_sum(const struct chaos_msg *m)
{
	return fnv1a(m, offsetof(struct chaos_msg, self_sum));
}

static void note_error(struct chaos_shared *sh, int ret)
{
	atomic_fetch_add(&sh->errors, 1);
	atomic_store(&sh->last_error, ret);
}

static void producer(struct tshm_ctx *ctx, struct tshm_queue *q,
		     struct chaos_shared *sh)
{
	struct tshm_seg *seg;
	struct chaos_msg m;
	int ret;

	while (!atomic_load(&sh->stop)) {
		m.id = atomic_fetch_add(&sh->next_id, 1);
		if (m.id >= CH_MAX_ID)
			_exit(0);
		m.size = 4096 * (1 + m.id % 4);
		if (tshm_seg_create(ctx, m.size, seg_name, 0, &seg))
			_exit(70);
		fill_pattern(tshm_seg_data(seg), m.size, m.id);
		m.sum = fnv1a(tshm_seg_data(seg), m.size);
		m.self_sum = cmsg_sum(&m);
		sh->sums[m.id] = m.sum;
		do {
			ret = tshm_queue_send(q, &m, sizeof(m), &seg, 1,
					      CH_TIMEOUT_MS);
			beat(sh);
		} while (ret == -ETIMEDOUT && !atomic_load(&sh->stop));
		if (ret && ret != -ETIMEDOUT && ret != -EPIPE)
			note_error(sh, ret);
		tshm_seg_unref(seg);
	}
	_exit(0);
}

static void consumer(struct tshm_queue *q, struct chaos_shared *sh)
{
	struct tshm_seg *seg;
	struct chaos_msg m;
	unsigned n;
	size_t len;
	int ret;

	for (;;) {
		n = 1;
		ret = tshm_queue_recv(q, &m, sizeof(m), &len, &seg, &n,
				      CH_TIMEOUT_MS);
		beat(sh);
		if (ret == -EPIPE)
			_exit(0);
		if (ret == -ETIMEDOUT)
			continue;
		if (ret) {
			note_error(sh, ret);
			continue;
		}
		if (len != sizeof(m) || n != 1 || m.self_sum != cmsg_sum(&m) ||
		    m.id >= CH_MAX_ID || tshm_seg_size(seg) < m.size ||
		    m.sum != sh->sums[m.id] ||
		    fnv1a(tshm_seg_data(seg), m.size) != m.sum)
			atomic_fetch_add(&sh->torn, 1);
		else if (atomic_fetch_add(&sh->seen[m.id], 1))
			atomic_fetch_add(&sh->dups, 1);
		else
			atomic_fetch_add(&sh->delivered, 1);
		tshm_seg_unref(seg);
	}
}

static pid_t spawn(int role, struct tshm_ctx *ctx, struct tshm_queue *q,
		   struct chaos_shared *sh)
{
	pid_t pid;

	atomic_store(&sh->beat[role], mono_ms());
	pid = fork();
	if (pid == 0) {
		my_role = role;
		if (role < CH_PRODUCERS)
			producer(ctx, q, sh);
		consumer(q, sh);
	}
	return pid;
}

/* Segment memfds named @seg_name open in any process we can see. */
static int memfds_anywhere(void)
{
	char path[600], link[256], want[64];
	struct dirent *p, *f;
	DIR *proc, *fds;
	int n = 0;

	snprintf(want, sizeof(want), "/memfd:tshm:%s ", seg_name);
	proc = opendir("/proc");
	if (!proc)
		return -1;
	while ((p = readdir(proc))) {
		if (p->d_name[0] < '0' || p->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/fd", p->d_name);
		fds = opendir(path);
		if (!fds)
			continue;
		while ((f = readdir(fds))) {
			ssize_t len;

			snprintf(path, sizeof(path), "/proc/%s/fd/%s",
				 p->d_name, f->d_name);
			len = readlink(path, link, sizeof(link) - 1);
			if (len <= 0)
				continue;
			link[len] = '\0';
			if (!strncmp(link, want, strlen(want)))
				n++;
		}
		closedir(fds);
	}
	closedir(proc);
	return n;
}

static long shmem_kb(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	long kb = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Shmem: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* 'S': asleep (in a futex or poll wait: workers sleep nowhere else). */
static char proc_state(pid_t pid)
{
	char path[64], buf[256], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return '?';
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : '?';
}

/* Survivors (all but @skip) whose last call is older than CH_STALL_MS. */
static unsigned stalled(struct chaos_shared *sh, int skip)
{
	int64_t now = mono_ms();
	unsigned i, n = 0;

	for (i = 0; i < CH_WORKERS; i++)
		if ((int)i != skip && now - atomic_load(&sh->beat[i]) >
		    CH_STALL_MS)
			n++;
	return n;
}

enum { KILL_ANYWHERE, KILL_ASLEEP, KILL_STOPPED, KILL_MODES };

/* A worker asleep, looking from @i on for up to 200 ms; else @i. */
static unsigned asleep_worker(const pid_t *pid, unsigned i)
{
	unsigned t, j;

	for (t = 0; t < 100; t++) {
		for (j = 0; j < CH_WORKERS; j++)
			if (proc_state(pid[(i + j) % CH_WORKERS]) == 'S')
				return (i + j) % CH_WORKERS;
		usleep(2000);
	}
	return i;
}

FIXTURE(chaos) {
	int unused;
};

FIXTURE_SETUP(chaos) { }
FIXTURE_TEARDOWN(chaos) { }

TEST_F_TIMEOUT(chaos, sigkill_during_send_recv, 3600)
{
	const char *env = getenv("TSHM_CHAOS_SECONDS");
	int seconds = env ? atoi(env) : 30;
	struct chaos_shared *sh;
	struct tshm_queue *q;
	struct tshm_ctx *ctx;
	pid_t pid[CH_WORKERS];
	unsigned kills = 0, i, asleep = 0, stopped = 0, stalls = 0;
	unsigned progress_while_stopped = 0;
	uint64_t before;
	long shmem0;
	int64_t end;
	bool kmod;

	snprintf(seg_name, sizeof(seg_name), "chaos-%d", getpid());
	shmem0 = shmem_kb();
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, sh);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	kmod = is_kmod(ctx);
	ASSERT_EQ(0, tshm_queue_create(ctx, 32, sizeof(struct chaos_msg), &q));
	for (i = 0; i < CH_WORKERS; i++) {
		pid[i] = spawn(i, ctx, q, sh);
		ASSERT_LE(0, pid[i]);
	}

	srand(getpid());
	end = mono_ms() + seconds * 1000LL;
	while (mono_ms() < end) {
		int mode = rand() % KILL_MODES;
		uint64_t got;

		usleep(5000 + rand() % 40000);
		i = rand() % CH_WORKERS;
		stalls += stalled(sh, -1);
		if (mode == KILL_ASLEEP) {
			/*
			 * Whoever is asleep first, starting at the one drawn:
			 * waiting for that one alone, a slow kernel (KASAN
			 * under emulation) sometimes saw none asleep in a run.
			 */
			i = asleep_worker(pid, i);
			asleep += proc_state(pid[i]) == 'S';
		} else if (mode == KILL_STOPPED) {
			/* The others go on while it is stopped, and after. */
			kill(pid[i], SIGSTOP);
			got = atomic_load(&sh->delivered);
			usleep(CH_STOP_MS * 1000);
			stalls += stalled(sh, i);
			progress_while_stopped += atomic_load(&sh->delivered) >
						  got;
			stopped++;
		}
		kill(pid[i], SIGKILL);
		waitpid(pid[i], NULL, 0);
		kills++;
		pid[i] = spawn(i, ctx, q, sh);
		ASSERT_LE(0, pid[i]);
	}

	/* The killing is over: everyone left must still make progress. */
	before = atomic_load(&sh->delivered);
	usleep(500000);
	EXPECT_LT(before, atomic_load(&sh->delivered));

	atomic_store(&sh->stop, 1);
	for (i = 0; i < CH_PRODUCERS; i++)
		EXPECT_EQ(0, wait_ok(pid[i]));
	ASSERT_EQ(0, tshm_queue_close(q));
	for (i = CH_PRODUCERS; i < CH_WORKERS; i++)
		EXPECT_EQ(0, wait_ok(pid[i]));

	TH_LOG("%s: %d s, %u kills, %llu delivered, %llu dups, %llu torn, %llu errors (last %d)",
	       tshm_ctx_backend(ctx), seconds, kills,
	       (unsigned long long)sh->delivered, (unsigned long long)sh->dups,
	       (unsigned long long)sh->torn, (unsigned long long)sh->errors,
	       sh->last_error);
	TH_LOG("%u killed asleep, %u stopped then killed (others delivered "
	       "meanwhile %u times), %u stalled survivors", asleep, stopped,
	       progress_while_stopped, stalls);
	EXPECT_LT(0, kills);
	EXPECT_LT(0, asleep);
	EXPECT_LT(0, stopped);
	EXPECT_EQ(0, stalls);
	/* A stopped participant costs the others at most its own slot. */
	EXPECT_LT(stopped / 2, progress_while_stopped);
	EXPECT_LT(0, atomic_load(&sh->delivered));
	EXPECT_EQ(0, atomic_load(&sh->dups));
	EXPECT_EQ(0, atomic_load(&sh->torn));
	EXPECT_EQ(0, atomic_load(&sh->errors));

	/*
	 * Everyone is gone: with the queue, the last in-flight state goes.
	 * The bookkeeping mapping is shmem too (MAP_SHARED|MAP_ANONYMOUS):
	 * drop it before comparing Shmem with the baseline.
	 */
	munmap(sh, sizeof(*sh));
	tshm_queue_unref(q);
	tshm_ctx_close(ctx);
	EXPECT_EQ(0, memfds_anywhere());
	if (kmod) {
		EXPECT_EQ(0, count_proc_tshm());
		/* Freed pages may take a moment to leave the counter. */
		for (i = 0; i < 50 && shmem_kb() > shmem0 + 1024; i++)
			usleep(100000);
		TH_LOG("Shmem %ld kB before, %ld kB after", shmem0, shmem_kb());
		EXPECT_GE(shmem0 + 1024, shmem_kb());
	}
}

TSHM_TEST_MAIN(NULL)
