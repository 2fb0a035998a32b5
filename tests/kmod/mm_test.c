// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko: segments are real shmem.  Huge-page segments are mapped with
 * PMDs; pages are charged to the faulting task's memory cgroup; a segment
 * mapped by two processes is swapped out by memcg reclaim (which finds
 * the mappings through the shmem inode's rmap) and read back intact.
 */
#include <signal.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/sysmacros.h>
#include "kselftest_harness.h"
#include "tshm_test.h"

#define CG	"/sys/fs/cgroup/tshm-mm-test"
#define ZRAM	"/dev/zram0"

static long meminfo_kb(const char *field)
{
	char buf[256];
	long kb = -1;
	size_t n = strlen(field);
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return -1;
	while (fgets(buf, sizeof(buf), f))
		if (!strncmp(buf, field, n) && buf[n] == ':') {
			kb = strtol(buf + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	return kb;
}

TEST(huge_pages_back_huge_segments)
{
	char mode[128] = "";
	struct tshm_info info;
	long pmd_kb, before;
	uint64_t size = 8 * TT_MIB;
	char *p;
	int ctx, fd, f;

	TT_NEED_MODULE();
	f = open("/sys/kernel/mm/transparent_hugepage/shmem_enabled", O_RDONLY);
	if (f >= 0) {
		(void)!read(f, mode, sizeof(mode) - 1);
		close(f);
	}
	if (strstr(mode, "[deny]"))
		SKIP(return, "shmem_enabled is deny");
	ctx = tt_open();
	ASSERT_LE(0, ctx);
	fd = tt_create(ctx, size, TSHM_CREATE_HUGE, "huge", NULL);
	if (fd == -EOPNOTSUPP)
		SKIP(return, "kernel without THP");
	ASSERT_LE(0, fd);
	before = meminfo_kb("ShmemHugePages");
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	/* shmem's get_unmapped_area aligned us for PMD mappings. */
	EXPECT_EQ(0, (unsigned long)p % (2 * TT_MIB));
	memset(p, 3, size);
	pmd_kb = tt_smaps_kb(p, "ShmemPmdMapped:");
	TH_LOG("ShmemPmdMapped %ld kB, ShmemHugePages %ld -> %ld kB", pmd_kb,
	       before, meminfo_kb("ShmemHugePages"));
	EXPECT_EQ((long)(size >> 10), pmd_kb);
	EXPECT_LE(before + (long)(size >> 10), meminfo_kb("ShmemHugePages"));
	ASSERT_EQ(0, tt_info(fd, &info));
	EXPECT_EQ(size, info.resident);
	munmap(p, size);
	close(fd);
	close(ctx);
}

/* A zram swap device, made by hand so that no mkswap is needed. */
static int zram_swap_on(uint64_t bytes)
{
	struct {
		char bootbits[1024];
		uint32_t version, last_page, nr_badpages;
	} *h;
	char page[4096], dev[32];
	unsigned int maj, min;
	int fd;

	if (access("/sys/block/zram0", F_OK) && system("modprobe zram 2>/dev/null"))
		return -1;
	tt_write_file("/sys/block/zram0/reset", "1");
	snprintf(dev, sizeof(dev), "%" PRIu64, bytes);
	if (tt_write_file("/sys/block/zram0/disksize", dev))
		return -1;
	if (access(ZRAM, F_OK)) {
		fd = open("/sys/block/zram0/dev", O_RDONLY);
		if (fd < 0 || read(fd, dev, sizeof(dev)) <= 0 ||
		    sscanf(dev, "%u:%u", &maj, &min) != 2)
			return -1;
		close(fd);
		if (mknod(ZRAM, S_IFBLK | 0600, makedev(maj, min)))
			return -1;
	}
	memset(page, 0, sizeof(page));
	h = (void *)page;
	h->version = 1;
	h->last_page = bytes / 4096 - 1;
	memcpy(page + 4096 - 10, "SWAPSPACE2", 10);
	fd = open(ZRAM, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, page, sizeof(page)) != sizeof(page))
		return -1;
	fsync(fd);
	close(fd);
	return swapon(ZRAM, 0);
}

static void zram_swap_off(void)
{
	swapoff(ZRAM);
	tt_write_file("/sys/block/zram0/reset", "1");
}

static int enter_cgroup(void)
{
	char pid[32];

	tt_write_file("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
	if (mkdir(CG, 0755) && errno != EEXIST)
		return -1;
	if (access(CG "/memory.reclaim", W_OK))
		return -1;
	snprintf(pid, sizeof(pid), "%d", getpid());
	return tt_write_file(CG "/cgroup.procs", pid);
}

/*
 * In the child, inside the cgroup: create, fill, share with a grandchild,
 * reclaim, check.  Exit codes tell the parent what went wrong.
 */
static int swap_child(void)
{
	const uint64_t size = 32 * TT_MIB;
	int ctx, fd, ready[2], go[2], st;
	long long charged;
	struct tt_line l = { 0 };
	uint64_t id = 0;
	long swap_kb;
	pid_t gc;
	char *p;

	if (enter_cgroup())
		return 10;
	ctx = tt_open();
	fd = ctx < 0 ? -1 : tt_create(ctx, size, 0, "swap", &id);
	if (fd < 0)
		return 11;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return 12;
	tt_fill(p, size, 0xabc);
	charged = tt_read_ll(CG "/memory.current");
	printf("# memory.current after fill: %lld\n", charged);
	if (charged < (long long)size)
		return 13;

	if (pipe(ready) || pipe(go))
		return 14;
	gc = fork();
	if (!gc) {
		/* The second process: its own mapping of the same pages. */
		char *q = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);

		if (q == MAP_FAILED || !tt_check(q, size, 0xabc))
			_exit(1);
		(void)!write(ready[1], "r", 1);
		(void)!read(go[0], &st, 1);
		_exit(tt_check(q, size, 0xabc) ? 0 : 2);
	}
	if (read(ready[0], &st, 1) != 1)
		return 15;

	/* Reclaim everything the cgroup has: the segment goes to swap. */
	tt_write_file(CG "/memory.reclaim", "256M");
	if (tt_proc_scan(id, &l) != 1)
		return 16;
	swap_kb = tt_smaps_kb(p, "Swap:");
	printf("# after reclaim: resident %" PRIu64 " of %" PRIu64 ", smaps Swap: %ld kB, memory.current %lld\n",
	       l.resident, size, swap_kb, tt_read_ll(CG "/memory.current"));
	if (l.resident > size / 2)
		return 17;
	if (swap_kb < (long)(size / 2048))
		return 18;

	/* Both processes read the pattern back. */
	(void)!write(go[1], "g", 1);
	if (waitpid(gc, &st, 0) != gc || !WIFEXITED(st) || WEXITSTATUS(st))
		return 19;
	if (!tt_check(p, size, 0xabc))
		return 20;
	munmap(p, size);
	close(fd);
	close(ctx);
	return tt_proc_has(id) ? 21 : 0;
}

TEST(swapped_out_by_memcg_reclaim_and_back)
{
	int st;
	pid_t pid;

	TT_NEED_MODULE();
	if (geteuid())
		SKIP(return, "needs root (swapon, cgroups)");
	if (zram_swap_on(128 * TT_MIB))
		SKIP(return, "no zram swap device (modprobe zram failed?)");
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		fflush(stdout);
		_exit(swap_child());
	}
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	rmdir(CG);
	zram_swap_off();
	ASSERT_TRUE(WIFEXITED(st));
	if (WEXITSTATUS(st) == 10)
		SKIP(return, "no cgroup2 memory controller with memory.reclaim");
	EXPECT_EQ(0, WEXITSTATUS(st));
}

TEST_HARNESS_MAIN
