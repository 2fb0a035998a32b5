// SPDX-License-Identifier: GPL-2.0
/*
 * tshmctl: who holds each segment, found the way lsof does.
 *
 *   /proc/PID/fd/N      -> "/tshm:<id>:<name> (deleted)"  a segment fd
 *                       -> "/dev/tshm"                    a context;
 *   /proc/PID/fdinfo/N     its "tshm-grant: <id> <writable> <read-only>
 *                          ..." lines
 *   /proc/PID/maps         "... /tshm:<id>:<name> (deleted)"  a mapping
 *
 * Processes we may not inspect (another user's, without root) are counted
 * in scan->denied, not guessed at.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tshmctl.h"

#define FD_PREFIX	"/tshm:"
#define MAP_PREFIX	"/tshm:"

struct idx {
	uint64_t id;
	struct seg *seg;
};

static int idx_cmp(const void *a, const void *b)
{
	const struct idx *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

static struct seg *find_seg(struct idx *ix, size_t n, uint64_t id)
{
	struct idx key = { .id = id }, *r;

	r = bsearch(&key, ix, n, sizeof(*ix), idx_cmp);
	return r ? r->seg : NULL;
}

/* The holder entry of @pid on @s, added if new. */
static struct holder *holder_of(struct seg *s, int pid, uint32_t uid,
				const char *comm)
{
	struct holder *h;

	if (s->nr_held && s->held[s->nr_held - 1].pid == pid)
		return &s->held[s->nr_held - 1];
	h = realloc(s->held, (s->nr_held + 1) * sizeof(*h));
	if (!h)
		return NULL;
	s->held = h;
	h = &h[s->nr_held++];
	memset(h, 0, sizeof(*h));
	h->pid = pid;
	h->uid = uid;
	h->ctx_fd = -1;
	snprintf(h->comm, sizeof(h->comm), "%s", comm);
	return h;
}

static void read_comm(int pid, char *buf, size_t len)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/comm", pid);
	snprintf(buf, len, "?");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n <= 0) {
		snprintf(buf, len, "?");
		return;
	}
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
}

static bool parse_id(const char *s, uint64_t *id)
{
	char *end;

	if (!isdigit((unsigned char)*s))
		return false;
	errno = 0;
	*id = strtoull(s, &end, 10);
	return !errno && *end == ':';
}

/* The grants a context fd owns, from its fdinfo. */
static void ctx_grants(int pid, int fd, struct idx *ix, size_t n, uint32_t uid,
		       const char *comm)
{
	char path[64], line[256];
	uint64_t id, count, ro;
	struct holder *h;
	struct seg *s;
	FILE *fp;

	snprintf(path, sizeof(path), "/proc/%d/fdinfo/%d", pid, fd);
	fp = fopen(path, "re");
	if (!fp)
		return;
	while (fgets(line, sizeof(line), fp)) {
		if (sscanf(line, "tshm-grant: %" SCNu64 " %" SCNu64 " %" SCNu64,
			   &id, &count, &ro) != 3)
			continue;
		count += ro;
		s = find_seg(ix, n, id);
		h = s ? holder_of(s, pid, uid, comm) : NULL;
		if (h) {
			h->grants += count;
			h->ctx_fd = fd;
		}
	}
	fclose(fp);
}

static int scan_fds(int pid, struct idx *ix, size_t n, uint32_t uid,
		    const char *comm, struct holders_scan *scan)
{
	char path[64], link[PATH_MAX];
	struct dirent *de;
	struct holder *h;
	struct seg *s;
	uint64_t id;
	ssize_t len;
	DIR *d;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		if (!isdigit((unsigned char)de->d_name[0]))
			continue;
		fd = atoi(de->d_name);
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
		len = readlink(path, link, sizeof(link) - 1);
		if (len < 0)
			continue;
		link[len] = 0;
		if (!strcmp(link, "/dev/tshm")) {
			struct ctxuser *c;

			c = realloc(scan->ctx, (scan->nr_ctx + 1) * sizeof(*c));
			if (c) {
				scan->ctx = c;
				c = &c[scan->nr_ctx++];
				c->pid = pid;
				c->fd = fd;
				snprintf(c->comm, sizeof(c->comm), "%s", comm);
			}
			ctx_grants(pid, fd, ix, n, uid, comm);
			continue;
		}
		if (strncmp(link, FD_PREFIX, strlen(FD_PREFIX)) ||
		    !parse_id(link + strlen(FD_PREFIX), &id))
			continue;
		s = find_seg(ix, n, id);
		h = s ? holder_of(s, pid, uid, comm) : NULL;
		if (h && h->nr_fds < sizeof(h->fds) / sizeof(h->fds[0]))
			h->fds[h->nr_fds++] = fd;
	}
	closedir(d);
	return 0;
}

static void scan_maps(int pid, struct idx *ix, size_t n, uint32_t uid,
		      const char *comm)
{
	unsigned long start, end;
	char path[64], *line = NULL, *p;
	size_t cap = 0;
	struct holder *h;
	struct seg *s;
	uint64_t id;
	FILE *fp;
	int off;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	fp = fopen(path, "re");
	if (!fp)
		return;
	while (getline(&line, &cap, fp) > 0) {
		/* start-end perms offset dev inode path */
		if (sscanf(line, "%lx-%lx %*s %*x %*s %*u %n", &start, &end,
			   &off) != 2)
			continue;
		p = line + off;
		if (strncmp(p, MAP_PREFIX, strlen(MAP_PREFIX)) ||
		    !parse_id(p + strlen(MAP_PREFIX), &id))
			continue;
		s = find_seg(ix, n, id);
		h = s ? holder_of(s, pid, uid, comm) : NULL;
		if (h) {
			h->maps++;
			h->mapped += end - start;
		}
	}
	free(line);
	fclose(fp);
}

static void scan_pid(int pid, struct idx *ix, size_t n,
		     struct holders_scan *scan)
{
	char path[64], comm[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/%d", pid);
	if (stat(path, &st))
		return;		/* gone */
	read_comm(pid, comm, sizeof(comm));
	if (scan_fds(pid, ix, n, st.st_uid, comm, scan) == -EACCES) {
		scan->denied++;
		return;
	}
	scan_maps(pid, ix, n, st.st_uid, comm);
}

/**
 * holders_resolve() - fill each segment's held[] from /proc
 * @t: the segments
 * @only_pid: scan only this process (0: every process)
 * @scan: out: how many processes could not be read, and /dev/tshm users
 *
 * Return: 0 or -errno (/proc unreadable, out of memory).
 */
int holders_resolve(struct segtab *t, int only_pid, struct holders_scan *scan)
{
	struct dirent *de;
	struct idx *ix;
	size_t i;
	DIR *d;

	memset(scan, 0, sizeof(*scan));
	ix = calloc(t->n + 1, sizeof(*ix));
	if (!ix)
		return -ENOMEM;
	for (i = 0; i < t->n; i++) {
		ix[i].id = t->segs[i].id;
		ix[i].seg = &t->segs[i];
	}
	qsort(ix, t->n, sizeof(*ix), idx_cmp);

	if (only_pid) {
		scan_pid(only_pid, ix, t->n, scan);
		free(ix);
		return 0;
	}
	d = opendir("/proc");
	if (!d) {
		free(ix);
		return -errno;
	}
	while ((de = readdir(d))) {
		int pid = atoi(de->d_name);

		if (pid > 0 && pid != getpid())
			scan_pid(pid, ix, t->n, scan);
	}
	closedir(d);
	free(ix);
	return 0;
}

void holders_scan_free(struct holders_scan *scan)
{
	free(scan->ctx);
	memset(scan, 0, sizeof(*scan));
}

bool seg_held_by(const struct seg *s, int pid)
{
	unsigned int i;

	for (i = 0; i < s->nr_held; i++)
		if (s->held[i].pid == pid)
			return true;
	return false;
}
