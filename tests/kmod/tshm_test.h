/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers for the module's kselftests: thin ioctl wrappers returning the
 * fd or 0, or -errno; /proc/tshm and /proc/meminfo readers.
 */
#ifndef TSHM_TEST_H
#define TSHM_TEST_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/tshm.h>

#define TT_DEV		"/dev/tshm"
#define TT_MIB		(1024UL * 1024)
#define TT_NOBODY	65534

#define TT_NEED_MODULE()						\
	do {								\
		if (access(TT_DEV, R_OK | W_OK))		\
			SKIP(return, "no %s: tshm.ko not loaded",	\
			     TT_DEV);				\
	} while (0)

/*
 * kselftest_harness.h of 6.1 runs a TEST_F body even when its
 * FIXTURE_SETUP skipped: bodies start with this.
 */
#define TT_SETUP_SKIPPED()						\
	do {								\
		if (_metadata->skip)					\
			return;						\
	} while (0)

static inline int tt_open(void)
{
	int fd = open(TT_DEV, O_RDWR | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

static inline int tt_ioctl(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) ? -errno : 0;
}

static inline int tt_create(int ctx, uint64_t size, uint32_t flags,
			    const char *name, uint64_t *id)
{
	struct tshm_create c = { .argsz = sizeof(c), .flags = flags,
				 .size = size };
	int err;

	snprintf(c.name, sizeof(c.name), "%s", name ? name : "");
	err = tt_ioctl(ctx, TSHM_IOC_CREATE, &c);
	if (err)
		return err;
	if (id)
		*id = c.id;
	return c.fd;
}

/* ATTACH: the new fd, or -errno. */
static inline int tt_attach(int ctx, uint64_t id, uint32_t flags,
			    uint64_t *size)
{
	struct tshm_attach a = { .argsz = sizeof(a), .flags = flags, .id = id };
	int fd = ioctl(ctx, TSHM_IOC_ATTACH, &a);

	if (fd < 0)
		return -errno;
	if (size)
		*size = a.size;
	return fd;
}

static inline int tt_drop_flags(int ctx, uint64_t id, unsigned int count,
				uint32_t flags)
{
	struct tshm_drop d = { .argsz = sizeof(d), .flags = flags, .id = id,
			       .count = count };

	return tt_ioctl(ctx, TSHM_IOC_DROP, &d);
}

static inline int tt_drop(int ctx, uint64_t id, unsigned int count)
{
	return tt_drop_flags(ctx, id, count, 0);
}

/* GRANT of segment fd @seg to @ctx; 0 or -errno, *total the new total. */
static inline int tt_grant_flags(int seg, int ctx, unsigned int count,
				 uint32_t flags, uint64_t *total)
{
	struct tshm_grant g = { .argsz = sizeof(g), .flags = flags,
				.seg_fd = seg, .count = count };
	int ret = ioctl(ctx, TSHM_IOC_GRANT, &g);

	if (ret < 0)
		return -errno;
	if (total)
		*total = ret;
	return 0;
}

static inline int tt_grant(int seg, int ctx, unsigned int count,
			   uint64_t *total)
{
	return tt_grant_flags(seg, ctx, count, 0, total);
}

/* GRANT of the segment the caller maps at @addr, with no fd. */
static inline int tt_grant_addr(const void *addr, int ctx, unsigned int count,
				uint32_t flags, uint64_t *total)
{
	struct tshm_grant g = { .argsz = sizeof(g),
				.flags = flags | TSHM_GRANT_BY_ADDR,
				.seg_fd = -1, .count = count,
				.addr = (uintptr_t)addr };
	int ret = ioctl(ctx, TSHM_IOC_GRANT, &g);

	if (ret < 0)
		return -errno;
	if (total)
		*total = ret;
	return 0;
}

static inline int tt_info(int seg, struct tshm_info *info)
{
	memset(info, 0, sizeof(*info));
	info->argsz = sizeof(*info);
	return tt_ioctl(seg, TSHM_IOC_INFO, info);
}

/* One line of /proc/tshm. */
struct tt_line {
	uint64_t id, size, resident;
	unsigned int holders, grants, uid;
	int pid;
	long age;
	char flags[8], comm[64], name[128];
};

/*
 * Find segment @id in /proc/tshm.  Returns 1 and fills @l if listed, 0 if
 * not, -1 if /proc/tshm is unreadable or malformed.  With @id == 0, counts
 * the lines instead (and checks the totals line).
 */
static inline int tt_proc_scan(uint64_t id, struct tt_line *l)
{
	char buf[512];
	struct tt_line t;
	unsigned long n = 0, total = ~0UL;
	int found = 0;
	FILE *f;

	f = fopen("/proc/tshm", "re");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f) ||
	    strcmp(buf, "id size resident holders grants flags uid pid comm age name\n")) {
		fclose(f);
		return -1;
	}
	while (fgets(buf, sizeof(buf), f)) {
		if (!strncmp(buf, "total ", 6)) {
			total = strtoul(buf + 6, NULL, 10);
			break;
		}
		if (sscanf(buf, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %u %u %7s %u %d %63s %ld %127s",
			   &t.id, &t.size, &t.resident, &t.holders, &t.grants,
			   t.flags, &t.uid, &t.pid, t.comm, &t.age, t.name) != 11) {
			fclose(f);
			return -1;
		}
		n++;
		if (id && t.id == id) {
			if (l)
				*l = t;
			found = 1;
		}
	}
	fclose(f);
	if (total != n)
		return -1;
	return id ? found : (int)n;
}

static inline int tt_proc_has(uint64_t id)
{
	return tt_proc_scan(id, NULL);
}

static inline int tt_proc_count(void)
{
	return tt_proc_scan(0, NULL);
}

/* "Shmem:" of /proc/meminfo in KiB, per-cpu counters folded first. */
static inline long tt_shmem_kb(void)
{
	char buf[256];
	long kb = -1;
	FILE *f;
	int fd;

	fd = open("/proc/sys/vm/stat_refresh", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		/* Needs root; without it the value is just coarser. */
		(void)!write(fd, "1", 1);
		close(fd);
	}
	f = fopen("/proc/meminfo", "re");
	if (!f)
		return -1;
	while (fgets(buf, sizeof(buf), f))
		if (sscanf(buf, "Shmem: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* Sum of a field ("Swap:", "ShmemPmdMapped:"...) over a mapping in smaps. */
static inline long tt_smaps_kb(void *addr, const char *field)
{
	char buf[512], range[64];
	int in = 0, len = strlen(field);
	long kb = -1, v;
	FILE *f;

	snprintf(range, sizeof(range), "%lx-", (unsigned long)addr);
	f = fopen("/proc/self/smaps", "re");
	if (!f)
		return -1;
	while (fgets(buf, sizeof(buf), f)) {
		if (strchr(buf, '-') && strchr(buf, '-') < strchr(buf, ' ') &&
		    buf[0] != ' ') {
			if (in)
				break;
			in = !strncmp(buf, range, strlen(range));
			continue;
		}
		if (in && !strncmp(buf, field, len) &&
		    sscanf(buf + len, " %ld kB", &v) == 1)
			kb = v;
	}
	fclose(f);
	return kb;
}

/* Write a string to a sysfs/cgroup/proc file; 0 or -errno. */
static inline int tt_write_file(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC), err = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, s, strlen(s)) < 0)
		err = -errno;
	close(fd);
	return err;
}

static inline long long tt_read_ll(const char *path)
{
	char buf[64] = "";
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? strtoll(buf, NULL, 10) : -1;
}

static inline void tt_fill(void *p, size_t len, unsigned int seed)
{
	uint32_t *w = p;
	size_t i;

	for (i = 0; i < len / 4; i++)
		w[i] = seed ^ (uint32_t)(i * 2654435761u);
}

static inline int tt_check(const void *p, size_t len, unsigned int seed)
{
	const uint32_t *w = p;
	size_t i;

	for (i = 0; i < len / 4; i++)
		if (w[i] != (seed ^ (uint32_t)(i * 2654435761u)))
			return 0;
	return 1;
}

#endif /* TSHM_TEST_H */
