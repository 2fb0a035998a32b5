// SPDX-License-Identifier: GPL-2.0
/*
 * tshm-fuzz: a type-aware fuzzer of tshm.ko, run inside the VM as root.
 *
 *   tshm-fuzz [--seed N] [--seconds S] [--procs N] [--kill-ms MS] [-v]
 *
 * Several worker processes issue random sequences of every ioctl of
 * <linux/tshm.h> (valid, boundary and garbage arguments), mmap, munmap,
 * mremap, madvise, mprotect, msync and page touches on segment fds, fork,
 * close, dup, poll and epoll, SCM_RIGHTS passing of context and segment
 * fds between workers, 16-byte (id) handles through a shared context, and
 * SIGKILLs: workers kill their forked children and themselves at points
 * their own random stream picks, and the parent kills random workers every
 * --kill-ms and starts new ones in their place.
 *
 * Every call's result is checked against what the ABI promises for the
 * arguments given (a valid call must succeed or fail only for lack of a
 * resource; a bad one must fail with its documented errno); page contents
 * are checked against a pattern every writer agrees on.  After the run,
 * with every worker gone, /proc/tshm must list no segment and Shmem in
 * /proc/meminfo must be back near its baseline.  Output is kselftest TAP.
 *
 * Replay: the seed is printed first.  Each worker's stream of operations
 * is a function of (seed, worker slot, incarnation), so --seed N replays
 * the same operations; how they interleave, and where the parent's timed
 * kills land, depends on scheduling (--kill-ms 0 --procs 1 replays
 * exactly).  See Documentation/dev-tools/hardening.rst.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <linux/tshm.h>

#ifndef MADV_COLD
#define MADV_COLD		20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT		21
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ	22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE	23
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP	4
#endif

#define PAGE		4096UL
#define MAX_PROCS	32
#define MAX_SEGS	40
#define MAX_MAPS	48
#define MAX_CTXS	6
#define MAX_GRANT_IDS	24
#define MAX_KIDS	3
#define IDPOOL		256
#define NVIOL		8

/* Every kind of operation and argument the fuzzer issues. */
#define KINDS(X)							\
	X(create_valid) X(create_prefault) X(create_huge)		\
	X(create_name_garbage) X(create_size_max) X(create_size0)	\
	X(create_size_overflow) X(create_size_huge_overflow)		\
	X(create_bad_flags) X(create_pad) X(create_reserved)		\
	X(create_name_unterminated) X(create_argsz_small)		\
	X(create_argsz_big_zero) X(create_argsz_big_nonzero)		\
	X(create_argsz_page) X(create_argsz_over_page)			\
	X(create_argsz_tail_fault) X(create_ptr_null)			\
	X(create_ptr_kernel) X(create_ptr_none) X(create_ptr_rdonly)	\
	X(create_on_seg) X(create_cmd_size_bits) X(create_cmd_dir_bits)	\
	X(create_garbage)						\
	X(attach_granted) X(attach_granted_rdonly) X(attach_shared)	\
	X(attach_nogrant_live) X(attach_freed) X(attach_never)		\
	X(attach_bad_flags) X(attach_count) X(attach_reserved)		\
	X(attach_argsz) X(attach_ptr_rdonly) X(attach_on_seg)		\
	X(attach_garbage)						\
	X(drop_valid) X(drop_all) X(drop_too_many) X(drop_count_zero)	\
	X(drop_count_negative) X(drop_count_int_min) X(drop_flags)	\
	X(drop_nogrant) X(drop_shared) X(drop_reserved) X(drop_argsz)	\
	X(grant_private) X(grant_shared) X(grant_foreign_ctx)		\
	X(grant_int_max) X(grant_overflow) X(grant_count_zero)		\
	X(grant_count_negative) X(grant_flags) X(grant_reserved)	\
	X(grant_ctx_closed) X(grant_ctx_negative) X(grant_ctx_is_seg)	\
	X(grant_ctx_pipe) X(grant_ctx_devnull) X(grant_ctx_epoll)	\
	X(grant_rdonly_holder) X(grant_ptr_rdonly) X(grant_argsz)	\
	X(grant_on_seg) X(grant_garbage) X(grant_by_addr)		\
	X(grant_by_addr_rdonly) X(grant_by_addr_bad) X(grant_rdonly)	\
	X(grant_addr_and_fd)						\
	X(info_valid) X(info_argsz) X(info_ptr_bad) X(info_on_ctx)	\
	X(info_garbage)							\
	X(ioctl_unknown_nr) X(ioctl_other_magic) X(ioctl_foreign_fd)	\
	X(mmap_rw) X(mmap_ro) X(mmap_offset) X(mmap_private)		\
	X(mmap_past_end) X(mmap_rdonly_write) X(mmap_huge_len)		\
	X(mmap_fixed_over) X(munmap_whole) X(munmap_part)		\
	X(mremap_shrink) X(mremap_grow) X(mremap_move)			\
	X(mremap_dontunmap) X(madvise) X(mprotect) X(msync)		\
	X(touch_write) X(touch_read)					\
	X(close_seg) X(close_seg_mapped) X(close_ctx) X(open_ctx)	\
	X(dup_seg) X(poll_seg) X(poll_ctx) X(epoll_add) X(epoll_wait)	\
	X(fd_ops_seg) X(fdinfo) X(proc_tshm)				\
	X(fork_child) X(kill_child) X(self_kill)			\
	X(scm_send_seg) X(scm_send_ctx) X(scm_send_id) X(scm_recv)	\
	X(attach_handle) X(remap_file_pages) X(mprotect_merge)		\
	X(vmsplice) X(mbind) X(mlock) X(madv_collapse) X(unprivileged)

#define X_ENUM(k) K_##k,
enum kind { KINDS(X_ENUM) NKINDS };
#define X_NAME(k) #k,
static const char *const kind_names[] = { KINDS(X_NAME) };

/* State shared by every process of the run (an anonymous shared map). */
struct shared {
	volatile int stop;
	uint64_t iters;
	uint64_t hits[NKINDS];
	uint64_t checks;
	uint64_t violations;
	uint64_t self_kills, kid_kills, forks, scm_fds, handles;
	uint64_t idpool[IDPOOL];
	uint32_t idpos;
	uint32_t nviol;
	char viol[NVIOL][240];
};

static struct shared *sh;
static uint64_t opt_seed;
static int opt_procs = 4, opt_seconds = 60, opt_kill_ms = 700, opt_verbose;

/* ---- one worker's (or forked child's) state ---------------------------- */

struct seg {
	int fd;
	uint64_t id, size;
	uint32_t flags;
	bool rdonly;
	bool exclusive;	/* only this holder, never granted or shared */
};

struct map {
	char *addr;
	size_t len;
	uint64_t off, segsize, id;
	bool writable;
	bool rdonly;	/* mapped through a read-only holder */
	bool dontfork;	/* not in a forked child */
};

struct ctx {
	int fd;
	bool shared;	/* others may hold it: grant counts are not ours */
	int n;
	struct { uint64_t id; uint32_t count; } g[MAX_GRANT_IDS];
};

struct worker {
	int slot;
	unsigned int gen;
	bool child;
	uint64_t rng;
	uint64_t iter;
	int inbox, *outbox;
	int epfd;
	char *arena;		/* 2 RW pages + 1 PROT_NONE page */
	char *ropage;
	struct seg segs[MAX_SEGS];
	int nsegs;
	struct map maps[MAX_MAPS];
	int nmaps;
	struct ctx ctxs[MAX_CTXS];
	int nctxs;
	uint64_t freed[16];
	int nfreed;
	pid_t kids[MAX_KIDS];
	int nkids;
	uint64_t kill_at;	/* iteration at which this process kills itself */
};

static struct worker W;
/* No transparent huge pages (PREEMPT_RT): CREATE_HUGE is EOPNOTSUPP. */
static bool no_thp;

/* ---- helpers ----------------------------------------------------------- */

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t rnd(void)
{
	return splitmix(&W.rng);
}

/* Uniform in [0, n). */
static uint64_t rn(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static void hit(enum kind k)
{
	__atomic_add_fetch(&sh->hits[k], 1, __ATOMIC_RELAXED);
}

static int xioctl(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) < 0 ? errno : 0;
}

/* For ioctls that return a value (GRANT: a count, ATTACH: an fd). */
static int xioctl_ret(int fd, unsigned long cmd, void *arg, int *ret)
{
	int r = ioctl(fd, cmd, arg);

	if (r < 0)
		return errno;
	*ret = r;
	return 0;
}

static const char *ename(int e)
{
	static char buf[32];

	if (!e)
		return "success";
	snprintf(buf, sizeof(buf), "%s", strerrorname_np(e) ?: "E?");
	return buf;
}

static void violation(enum kind k, const char *fmt, ...)
{
	char msg[200];
	va_list ap;
	uint32_t n;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	__atomic_add_fetch(&sh->violations, 1, __ATOMIC_RELAXED);
	n = __atomic_fetch_add(&sh->nviol, 1, __ATOMIC_RELAXED);
	if (n < NVIOL)
		snprintf(sh->viol[n], sizeof(sh->viol[n]),
			 "worker %d%s gen %u iter %" PRIu64 " %s: %s", W.slot,
			 W.child ? " (child)" : "", W.gen, W.iter,
			 kind_names[k], msg);
	if (n < 64)
		fprintf(stderr, "# VIOLATION worker %d%s gen %u iter %" PRIu64
			" %s: %s\n", W.slot, W.child ? " (child)" : "", W.gen,
			W.iter, kind_names[k], msg);
}

/* Errnos a valid call may still get: out of memory, fds, quota. */
static bool resource_errno(int e)
{
	return e == ENOMEM || e == EMFILE || e == ENFILE || e == ENOSPC ||
	       e == EDQUOT;
}

#define OK_RES	-2	/* in an expect list: resource errnos allowed */

/*
 * Check @got (0 or an errno) against the list @want (0 for success, errnos,
 * OK_RES, ended by -1).  Returns true if it was allowed.
 */
static bool expect_(enum kind k, int got, const int *want)
{
	char list[96] = "";
	int i;

	hit(k);
	__atomic_add_fetch(&sh->checks, 1, __ATOMIC_RELAXED);
	for (i = 0; want[i] != -1; i++) {
		if (want[i] == got || (want[i] == OK_RES && resource_errno(got)))
			return true;
	}
	for (i = 0; want[i] != -1; i++) {
		size_t l = strlen(list);

		snprintf(list + l, sizeof(list) - l, "%s%s", i ? "|" : "",
			 want[i] == OK_RES ? "ENOMEM.." : ename(want[i]));
	}
	violation(k, "got %s, expected %s", ename(got), list);
	return false;
}

#define expect(k, got, ...) expect_(K_##k, got, (const int[]){ __VA_ARGS__, -1 })

static void idpool_add(uint64_t id)
{
	uint32_t i = __atomic_fetch_add(&sh->idpos, 1, __ATOMIC_RELAXED);

	__atomic_store_n(&sh->idpool[i % IDPOOL], id, __ATOMIC_RELAXED);
}

static uint64_t idpool_pick(void)
{
	return __atomic_load_n(&sh->idpool[rn(IDPOOL)], __ATOMIC_RELAXED);
}

/* Pattern every writer of page @pg of segment @id writes. */
static uint64_t pattern(uint64_t id, uint64_t pg)
{
	return (id * 0x100000001b3ULL) ^ (pg + 1) ^ 0x5a5a000000000000ULL;
}

/* ---- tables ------------------------------------------------------------ */

static struct seg *seg_add(int fd, uint64_t id, uint64_t size, uint32_t flags,
			   bool rdonly, bool exclusive)
{
	struct seg *s;

	if (W.nsegs == MAX_SEGS) {
		close(fd);
		return NULL;
	}
	s = &W.segs[W.nsegs++];
	*s = (struct seg){ .fd = fd, .id = id, .size = size, .flags = flags,
			   .rdonly = rdonly, .exclusive = exclusive };
	return s;
}

static struct seg *seg_pick(void)
{
	return W.nsegs ? &W.segs[rn(W.nsegs)] : NULL;
}

static void seg_remove(struct seg *s)
{
	*s = W.segs[--W.nsegs];
}

static struct ctx *ctx_add(int fd, bool shared)
{
	struct ctx *c;

	if (W.nctxs == MAX_CTXS) {
		close(fd);
		return NULL;
	}
	c = &W.ctxs[W.nctxs++];
	*c = (struct ctx){ .fd = fd, .shared = shared };
	return c;
}

static struct ctx *ctx_pick(void)
{
	return W.nctxs ? &W.ctxs[rn(W.nctxs)] : NULL;
}

static struct ctx *ctx_pick_private(void)
{
	int i, start = rn(MAX_CTXS);

	for (i = 0; i < W.nctxs; i++) {
		struct ctx *c = &W.ctxs[(start + i) % W.nctxs];

		if (!c->shared)
			return c;
	}
	return NULL;
}

static int grant_find(struct ctx *c, uint64_t id)
{
	int i;

	for (i = 0; i < c->n; i++)
		if (c->g[i].id == id)
			return i;
	return -1;
}

static void grant_sub(struct ctx *c, int i, uint32_t count)
{
	c->g[i].count -= count;
	if (!c->g[i].count)
		c->g[i] = c->g[--c->n];
}

/* Another holder or a grant may exist now: no exact checks on @id. */
static void seg_share(uint64_t id)
{
	int i;

	for (i = 0; i < W.nsegs; i++)
		if (W.segs[i].id == id)
			W.segs[i].exclusive = false;
}

static bool id_granted_anywhere(uint64_t id)
{
	int i;

	for (i = 0; i < W.nctxs; i++)
		if (grant_find(&W.ctxs[i], id) >= 0)
			return true;
	return false;
}

/* How many fds of this process are holders of @id. */
static int seg_fds_of(uint64_t id)
{
	int i, n = 0;

	for (i = 0; i < W.nsegs; i++)
		n += W.segs[i].id == id;
	return n;
}

static bool maps_of(uint64_t id)
{
	int i;

	for (i = 0; i < W.nmaps; i++)
		if (W.maps[i].id == id)
			return true;
	return false;
}

/* ---- argument buffers -------------------------------------------------- */

/* A struct at the start of the arena, the rest of the 2 pages zeroed. */
static void *arg_buf(size_t argsz_used)
{
	memset(W.arena, 0, argsz_used > 2 * PAGE ? 2 * PAGE : argsz_used + 64);
	return W.arena;
}

/* A struct whose last byte is the last byte before the guard page. */
static void *arg_tail(size_t len)
{
	char *p = W.arena + 2 * PAGE - len;

	memset(p, 0, len);
	return p;
}

/* Copy @arg into the read-only page (made RW for the copy). */
static void *arg_ro(const void *arg, size_t len)
{
	mprotect(W.ropage, PAGE, PROT_READ | PROT_WRITE);
	memcpy(W.ropage, arg, len);
	mprotect(W.ropage, PAGE, PROT_READ);
	return W.ropage;
}

static void *bad_ptr(enum kind *k, enum kind knull, enum kind kkern,
		     enum kind knone)
{
	switch (rn(3)) {
	case 0: *k = knull; return NULL;
	case 1: *k = kkern; return (void *)0xffff888000000000UL;
	default: *k = knone; return W.arena + 2 * PAGE;
	}
}

static void fill_name(char *name)
{
	int i, len = rn(TSHM_NAME_LEN);

	memset(name, 0, TSHM_NAME_LEN);
	for (i = 0; i < len; i++)
		name[i] = "abcxyz-_. 019\\\t\x7f\x80\xff"[rn(19)];
}

static uint64_t rand_size(void)
{
	switch (rn(8)) {
	case 0: return 1 + rn(PAGE);
	case 1: return PAGE * (1 + rn(4));
	case 2: return PAGE * (1 + rn(64)) - rn(2);
	case 3: return (1 + rn(4)) << 20;
	default: return 1 + rn(256 << 10);
	}
}

static uint64_t round_to(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* The size CREATE makes of @size with @flags. */
static uint64_t seg_size(uint64_t size, uint32_t flags)
{
	return round_to(size, flags & TSHM_CREATE_HUGE ? 2 << 20 : PAGE);
}

/* ---- CREATE ------------------------------------------------------------ */

static struct ctx *any_ctx(void)
{
	return ctx_pick();
}

static void op_create(void)
{
	struct ctx *c = any_ctx();
	struct tshm_create a = { .argsz = sizeof(a) }, *u;
	enum kind k = K_create_valid;
	int e, want_err = 0;
	bool valid = true;

	if (!c)
		return;
	a.size = rand_size();
	a.flags = rn(2) ? TSHM_CREATE_NOCLOEXEC : 0;
	snprintf(a.name, sizeof(a.name), "fz%d.%" PRIu64, W.slot, W.iter);

	switch (rn(24)) {
	case 0: case 1: case 2: case 3: case 4: case 5:
		break;
	case 6:
		k = K_create_prefault;
		a.flags |= TSHM_CREATE_PREFAULT;
		a.size = 1 + rn(1 << 20);
		break;
	case 7:
		k = K_create_huge;
		a.flags |= TSHM_CREATE_HUGE | (rn(4) ? 0 : TSHM_CREATE_PREFAULT);
		a.size = 1 + rn(4 << 20);
		/* No THP (PREEMPT_RT): no huge mount, huge is refused. */
		if (no_thp)
			want_err = EOPNOTSUPP;
		break;
	case 8:
		k = K_create_name_garbage;
		fill_name(a.name);
		break;
	case 9:
		/* The largest size that does not overflow rounding. */
		k = K_create_size_max;
		a.size = (rn(2) ? 1ULL << 40 : (uint64_t)LLONG_MAX - PAGE) -
			 rn(PAGE);
		break;
	case 10:
		k = K_create_size0; a.size = 0; want_err = EINVAL;
		break;
	case 11:
		k = K_create_size_overflow;
		a.size = (uint64_t[]){ ~0ULL, ~0ULL - PAGE, 1ULL << 63,
				       (uint64_t)LLONG_MAX,
				       (uint64_t)LLONG_MAX - PAGE + 1 }[rn(5)];
		want_err = EOVERFLOW;
		break;
	case 12:
		k = K_create_size_huge_overflow;
		a.flags |= TSHM_CREATE_HUGE;
		a.size = (uint64_t)LLONG_MAX - (1 << 20);
		want_err = no_thp ? EOPNOTSUPP : EOVERFLOW;
		break;
	case 13:
		k = K_create_bad_flags;
		a.flags |= 1U << (4 + rn(28));
		want_err = EINVAL;
		break;
	case 14:
		k = K_create_pad; a.__pad = 1 + rn(UINT32_MAX); want_err = EINVAL;
		break;
	case 15:
		k = K_create_reserved;
		a.__reserved[rn(2)] = 1ULL << rn(64);
		want_err = EINVAL;
		break;
	case 16:
		k = K_create_name_unterminated;
		memset(a.name, 'N', sizeof(a.name));
		want_err = EINVAL;
		break;
	case 17: {
		static const uint32_t small[] = { 0, 1, 4, 8, 16,
			sizeof(struct tshm_create) - 1 };
		k = K_create_argsz_small;
		a.argsz = small[rn(6)];
		want_err = EINVAL;
		break;
	}
	case 18: {
		/* Newer callers: a longer struct, zero or not past ours. */
		size_t sz = rn(4) ? sizeof(a) + 1 + rn(PAGE - sizeof(a)) : PAGE;
		bool nonzero = rn(2);

		u = arg_buf(sz);
		a.argsz = sz;
		memcpy(u, &a, sizeof(a));
		if (nonzero)
			((char *)u)[sizeof(a) + rn(sz - sizeof(a))] = 1 + rn(255);
		k = nonzero ? K_create_argsz_big_nonzero :
			      sz == PAGE ? K_create_argsz_page :
					   K_create_argsz_big_zero;
		e = xioctl(c->fd, TSHM_IOC_CREATE, u);
		if (nonzero) {
			expect_(k, e, (const int[]){ E2BIG, -1 });
		} else if (expect_(k, e, (const int[]){ 0, OK_RES, -1 }) && !e) {
			seg_add(u->fd, u->id, seg_size(a.size, a.flags), a.flags,
				false, true);
			idpool_add(u->id);
		}
		return;
	}
	case 19:
		k = K_create_argsz_over_page;
		a.argsz = rn(2) ? PAGE + 1 + rn(PAGE) : UINT32_MAX;
		want_err = E2BIG;
		break;
	case 20: {
		/* argsz runs into the guard page. */
		size_t have = sizeof(a) + rn(64);

		u = arg_tail(have);
		a.argsz = have + 1 + rn(PAGE - have);
		memcpy(u, &a, sizeof(a));
		e = xioctl(c->fd, TSHM_IOC_CREATE, u);
		expect(create_argsz_tail_fault, e, EFAULT);
		return;
	}
	case 21: {
		enum kind bk;
		void *p = bad_ptr(&bk, K_create_ptr_null, K_create_ptr_kernel,
				  K_create_ptr_none);

		e = xioctl(c->fd, TSHM_IOC_CREATE, p);
		expect_(bk, e, (const int[]){ EFAULT, -1 });
		return;
	}
	case 22:
		/* Copy-in works, writing fd and id back does not: no leak. */
		e = xioctl(c->fd, TSHM_IOC_CREATE, arg_ro(&a, sizeof(a)));
		expect(create_ptr_rdonly, e, EFAULT);
		return;
	case 23: {
		struct seg *s = seg_pick();
		unsigned long cmd;

		switch (rn(4)) {
		case 0:
			if (!s)
				return;
			e = xioctl(s->fd, TSHM_IOC_CREATE, &a);
			expect(create_on_seg, e, ENOTTY);
			return;
		case 1:
			/* Other size bits in cmd: argsz is what counts. */
			cmd = _IOC(_IOC_READ | _IOC_WRITE, TSHM_IOC_MAGIC, 0,
				   rn(1 << 14));
			e = xioctl(c->fd, cmd, &a);
			if (expect(create_cmd_size_bits, e, 0, OK_RES) && !e)
				seg_add(a.fd, a.id, seg_size(a.size, a.flags),
					a.flags, false, true);
			return;
		case 2:
			cmd = _IOC(rn(3), TSHM_IOC_MAGIC, 0, sizeof(a));
			e = xioctl(c->fd, cmd, &a);
			expect(create_cmd_dir_bits, e, ENOTTY);
			return;
		default: {
			/* Random bytes, a sane argsz now and then. */
			uint64_t *q = (uint64_t *)&a;
			size_t i;

			for (i = 0; i < sizeof(a) / 8; i++)
				q[i] = rn(3) ? rnd() : 0;
			if (rn(2))
				a.argsz = sizeof(a);
			e = xioctl(c->fd, TSHM_IOC_CREATE, &a);
			if (expect(create_garbage, e, 0, EINVAL, E2BIG,
				   EOVERFLOW, EOPNOTSUPP, EFBIG, OK_RES) && !e)
				seg_add(a.fd, a.id, seg_size(a.size, a.flags),
					a.flags, false, true);
			return;
		}
		}
	}
	}
	e = xioctl(c->fd, TSHM_IOC_CREATE, &a);
	if (want_err) {
		expect_(k, e, (const int[]){ want_err, -1 });
		if (!e)
			close(a.fd);
		return;
	}
	valid = expect_(k, e, (const int[]){ 0, OK_RES, -1 });
	if (!valid || e)
		return;
	if (a.fd < 0 || !a.id) {
		violation(k, "fd %d id %" PRIu64, a.fd, a.id);
		return;
	}
	if (seg_add(a.fd, a.id, seg_size(a.size, a.flags), a.flags, false, true))
		idpool_add(a.id);
}

/* ---- GRANT ------------------------------------------------------------- */

static struct map *map_pick(void);

static void grant_account(struct ctx *c, struct seg *s, int count)
{
	int i;

	seg_share(s->id);
	if (c->shared)
		return;
	i = grant_find(c, s->id);
	if (i < 0) {
		if (c->n == MAX_GRANT_IDS) {
			/* Model full: let the context become loose. */
			c->shared = true;
			return;
		}
		i = c->n++;
		c->g[i].id = s->id;
		c->g[i].count = 0;
	}
	c->g[i].count += count;
}

/* GRANT by the address of one of our mappings (no fd involved). */
static void grant_by_addr(struct ctx *c)
{
	struct tshm_grant g = { .argsz = sizeof(g), .flags = TSHM_GRANT_BY_ADDR,
				.seg_fd = -1, .count = 1 };
	struct map *m = map_pick();
	enum kind bk;
	int e, total = 0;

	switch (rn(4)) {
	default:
		if (!m)
			return;
		g.addr = (uintptr_t)m->addr + rn(m->len);
		if (m->rdonly && rn(4)) {
			e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
			expect(grant_by_addr_rdonly, e, EACCES);
			return;
		}
		if (m->rdonly || !rn(4)) {
			/* Read-only grants: given back at once when ours. */
			g.flags |= TSHM_GRANT_RDONLY;
			e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
			if (expect(grant_by_addr_rdonly, e, 0, EOVERFLOW,
				   OK_RES) && !e) {
				struct tshm_drop d = { .argsz = sizeof(d),
					.flags = TSHM_DROP_RDONLY, .id = m->id,
					.count = 1 };

				seg_share(m->id);
				e = xioctl(c->fd, TSHM_IOC_DROP, &d);
				if (!c->shared)
					expect(grant_rdonly, e, 0);
			}
			return;
		}
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		if (expect(grant_by_addr, e, 0, EOVERFLOW, OK_RES) && !e) {
			struct seg tmp = { .id = m->id };

			if (total < 1)
				violation(K_grant_by_addr, "total %d", total);
			grant_account(c, &tmp, 1);
		}
		return;
	case 1:
		/* Mapped, but not a segment: our arena. */
		g.addr = (uintptr_t)W.arena + rn(3 * PAGE);
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_by_addr_bad, e, EINVAL);
		return;
	case 2:
		g.addr = (uintptr_t)bad_ptr(&bk, 0, 0, 0);
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_by_addr_bad, e, EFAULT, EINVAL);
		return;
	case 3:
		/* An fd and BY_ADDR, or an address without it. */
		if (rn(2)) {
			g.seg_fd = m ? 0 : 3;
			g.addr = m ? (uintptr_t)m->addr : 0;
		} else {
			g.flags = 0;
			g.seg_fd = seg_pick() ? seg_pick()->fd : 0;
			g.addr = 1 + rn(1ULL << 40);
		}
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_addr_and_fd, e, EINVAL);
		return;
	}
}

static void op_grant(void)
{
	struct seg *s = seg_pick();
	struct ctx *c = ctx_pick();
	struct tshm_grant g = { .argsz = sizeof(g) }, *u;
	int e, pfd[2], total = 0;

	if (!c)
		return;
	if (!rn(5)) {
		grant_by_addr(c);
		return;
	}
	if (!s)
		return;
	g.seg_fd = s->fd;
	g.count = 1 + rn(3);

	if (s->rdonly) {
		if (rn(2)) {
			e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
			expect(grant_rdonly_holder, e, EACCES);
			return;
		}
		struct ctx *p = ctx_pick_private();
		struct tshm_drop d = { .argsz = sizeof(d),
				       .flags = TSHM_DROP_RDONLY, .id = s->id,
				       .count = g.count };

		if (!p)
			return;
		g.flags = TSHM_GRANT_RDONLY;
		e = xioctl_ret(p->fd, TSHM_IOC_GRANT, &g, &total);
		if (expect(grant_rdonly, e, 0, EOVERFLOW, OK_RES) && !e) {
			seg_share(s->id);
			e = xioctl(p->fd, TSHM_IOC_DROP, &d);
			expect(grant_rdonly, e, 0);
		}
		return;
	}
	switch (rn(26)) {
	default:
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		if (c->shared ? expect(grant_shared, e, 0, EOVERFLOW, OK_RES) :
				expect(grant_private, e, 0, EOVERFLOW, OK_RES)) {
			if (!e) {
				if (total < (int)g.count)
					violation(K_grant_private,
						  "grants %d < %u", total,
						  g.count);
				grant_account(c, s, g.count);
			}
		}
		return;
	case 10: {
		/* Up to TSHM_GRANTS_MAX grants: then one more overflows. */
		struct ctx *p = ctx_pick_private();

		bool alone = s->exclusive;

		if (!p)
			return;
		g.count = TSHM_GRANTS_MAX;
		e = xioctl_ret(p->fd, TSHM_IOC_GRANT, &g, &total);
		/* Without other grants, all fit; with any, they cannot. */
		if (alone ? !expect(grant_int_max, e, 0) :
			    !expect(grant_int_max, e, 0, EOVERFLOW))
			return;
		if (e)
			return;
		grant_account(p, s, TSHM_GRANTS_MAX);
		g.count = 1;
		e = xioctl_ret(p->fd, TSHM_IOC_GRANT, &g, &total);
		if (alone)
			expect(grant_overflow, e, EOVERFLOW);
		else if (expect(grant_overflow, e, EOVERFLOW, 0) && !e)
			grant_account(p, s, 1);
		return;
	}
	case 11:
		g.count = 0;
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_count_zero, e, EINVAL);
		return;
	case 12:
		/* Unsigned: above TSHM_GRANTS_MAX is an overflow. */
		g.count = TSHM_GRANTS_MAX + 1U + rn(TSHM_GRANTS_MAX);
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_count_negative, e, EOVERFLOW);
		return;
	case 13:
		g.flags = 1U << (2 + rn(30));
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_flags, e, EINVAL);
		return;
	case 14:
		g.__reserved[rn(2)] = 1 + rn(UINT32_MAX);
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_reserved, e, EINVAL);
		return;
	case 15:
		g.seg_fd = 900 + rn(100);	/* above anything we open */
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_ctx_closed, e, EBADF);
		return;
	case 16:
		g.seg_fd = rn(2) ? -1 : INT_MIN;
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_ctx_negative, e, EBADF);
		return;
	case 17:
		/* A context where the segment fd goes. */
		g.seg_fd = c->fd;
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_ctx_is_seg, e, EINVAL);
		return;
	case 18:
		if (pipe2(pfd, O_CLOEXEC))
			return;
		g.seg_fd = pfd[rn(2)];
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_ctx_pipe, e, EINVAL);
		close(pfd[0]);
		close(pfd[1]);
		return;
	case 19:
		g.seg_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_ctx_devnull, e, EINVAL);
		close(g.seg_fd);
		return;
	case 20:
		g.seg_fd = W.epfd;
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_ctx_epoll, e, EINVAL);
		return;
	case 21:
		/* GRANT only reads its argument: a read-only one works. */
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, arg_ro(&g, sizeof(g)),
			       &total);
		if (expect(grant_ptr_rdonly, e, 0, EOVERFLOW, OK_RES) && !e)
			grant_account(c, s, g.count);
		return;
	case 22: {
		size_t sz;

		switch (rn(3)) {
		case 0:
			g.argsz = rn(sizeof(g));
			e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
			expect(grant_argsz, e, EINVAL);
			return;
		case 1:
			g.argsz = PAGE + 1 + rn(1 << 20);
			e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
			expect(grant_argsz, e, E2BIG);
			return;
		default:
			sz = sizeof(g) + 8 * (1 + rn(8));
			u = arg_buf(sz);
			g.argsz = sz;
			memcpy(u, &g, sizeof(g));
			((char *)u)[sz - 1] = 7;
			e = xioctl_ret(c->fd, TSHM_IOC_GRANT, u, &total);
			expect(grant_argsz, e, E2BIG);
			return;
		}
	}
	case 23:
		e = xioctl_ret(s->fd, TSHM_IOC_GRANT, &g, &total);
		expect(grant_on_seg, e, ENOTTY);
		return;
	case 24: {
		/* A context this process got from another one. */
		struct ctx *f = NULL;
		int i;

		for (i = 0; i < W.nctxs && !f; i++)
			if (W.ctxs[i].shared && i)
				f = &W.ctxs[i];
		if (!f)
			return;
		e = xioctl_ret(f->fd, TSHM_IOC_GRANT, &g, &total);
		if (expect(grant_foreign_ctx, e, 0, EOVERFLOW, OK_RES) && !e)
			seg_share(s->id);
		return;
	}
	case 25: {
		uint64_t *q = (uint64_t *)&g;
		size_t i;

		for (i = 0; i < sizeof(g) / 8; i++)
			q[i] = rn(3) ? rnd() : 0;
		if (rn(2))
			g.argsz = sizeof(g);
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		/* A random seg_fd or address may name a segment we hold. */
		if (expect(grant_garbage, e, 0, EINVAL, E2BIG, EBADF, EFAULT,
			   EACCES, EOVERFLOW, OK_RES) && !e) {
			int j;

			for (j = 0; j < W.nsegs; j++)
				W.segs[j].exclusive = false;
			c->shared = true;
		}
		return;
	}
	}
}

/* ---- ATTACH / DROP ----------------------------------------------------- */

static void attach_got(struct tshm_attach *a, int fd, uint64_t id,
		       bool rdonly, enum kind k)
{
	struct tshm_info info = { .argsz = sizeof(info) };
	int e;

	if (fd < 0) {
		violation(k, "fd %d", fd);
		return;
	}
	e = xioctl(fd, TSHM_IOC_INFO, &info);
	if (e || info.id != id || info.size != a->size ||
	    !!(info.flags & TSHM_INFO_RDONLY) != rdonly || !info.holders ||
	    (fcntl(fd, F_GETFL) & O_ACCMODE) != (rdonly ? O_RDONLY : O_RDWR))
		violation(k, "INFO after ATTACH: %s id %" PRIu64 "/%" PRIu64
			  " size %" PRIu64 "/%" PRIu64 " flags %#x holders %u",
			  ename(e), (uint64_t)info.id, id, (uint64_t)info.size,
			  (uint64_t)a->size, info.flags, info.holders);
	seg_add(fd, id, a->size, info.create_flags, rdonly, false);
}

static uint64_t never_id(void)
{
	switch (rn(4)) {
	case 0: return 0;
	case 1: return ~0ULL - rn(16);
	case 2: return (1ULL << 62) + rnd() % (1ULL << 40);
	default: return 1ULL << 40 | rnd();
	}
}

static void op_attach(void)
{
	struct tshm_attach a = { .argsz = sizeof(a) };
	struct ctx *c = ctx_pick_private();
	struct seg *s;
	int e, i, fd = -1;

	switch (rn(14)) {
	case 0: case 1: case 2: case 3:
		/* A grant we made into a context only we hold. */
		if (!c || !c->n)
			return;
		i = rn(c->n);
		a.id = c->g[i].id;
		a.flags = rn(2) ? TSHM_ATTACH_NOCLOEXEC : 0;
		if (rn(3) == 0) {
			a.flags |= TSHM_ATTACH_RDONLY;
			e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
			if (expect(attach_granted_rdonly, e, 0, OK_RES) && !e) {
				grant_sub(c, i, 1);
				attach_got(&a, fd, a.id, true, K_attach_granted_rdonly);
			}
			return;
		}
		e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
		if (expect(attach_granted, e, 0, OK_RES) && !e) {
			grant_sub(c, i, 1);
			attach_got(&a, fd, a.id, false, K_attach_granted);
		}
		return;
	case 4: {
		/* Any id, any context shared with others: racy by nature. */
		struct ctx *x = ctx_pick();
		uint64_t id = idpool_pick();

		if (!x || !x->shared || !id)
			return;
		a.id = id;
		e = xioctl_ret(x->fd, TSHM_IOC_ATTACH, &a, &fd);
		if (expect(attach_shared, e, 0, ENOENT, OK_RES) && !e)
			attach_got(&a, fd, id, false, K_attach_shared);
		return;
	}
	case 5:
		/* A live segment of ours that this context has no grant of. */
		s = seg_pick();
		if (!c || !s || grant_find(c, s->id) >= 0)
			return;
		a.id = s->id;
		e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
		expect(attach_nogrant_live, e, ENOENT);
		return;
	case 6:
		if (!c || !W.nfreed)
			return;
		a.id = W.freed[rn(W.nfreed)];
		if (grant_find(c, a.id) >= 0)
			return;
		e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
		expect(attach_freed, e, ENOENT);
		return;
	case 7:
		if (!c)
			return;
		a.id = never_id();
		e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
		expect(attach_never, e, ENOENT);
		return;
	case 8:
		if (!c)
			return;
		a.id = c->n ? c->g[0].id : never_id();
		a.flags = 1U << (2 + rn(30));
		e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
		expect(attach_bad_flags, e, EINVAL);
		return;
	case 9: {
		/* Only a read-only grant: no writable holder from it. */
		struct tshm_grant g = { .argsz = sizeof(g),
					.flags = TSHM_GRANT_RDONLY, .count = 1 };
		int total;

		s = seg_pick();
		if (!c || !s || grant_find(c, s->id) >= 0)
			return;
		g.seg_fd = s->fd;
		e = xioctl_ret(c->fd, TSHM_IOC_GRANT, &g, &total);
		if (!expect(attach_count, e, 0, EOVERFLOW, OK_RES) || e)
			return;
		seg_share(s->id);
		a.id = s->id;
		e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
		expect(attach_count, e, EACCES);
		a.flags = TSHM_ATTACH_RDONLY;
		e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
		if (expect(attach_count, e, 0, OK_RES) && !e)
			attach_got(&a, fd, s->id, true, K_attach_count);
		else if (e) {
			struct tshm_drop d = { .argsz = sizeof(d),
				.flags = TSHM_DROP_RDONLY, .id = s->id,
				.count = 1 };

			xioctl(c->fd, TSHM_IOC_DROP, &d);
		}
		return;
	}
	case 10:
		if (!c)
			return;
		a.id = c->n ? c->g[0].id : never_id();
		a.__reserved[rn(2)] = 1ULL << rn(64);
		e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
		expect(attach_reserved, e, EINVAL);
		return;
	case 11: {
		if (!c)
			return;
		a.id = never_id();
		switch (rn(3)) {
		case 0:
			a.argsz = rn(sizeof(a));
			e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
			expect(attach_argsz, e, EINVAL);
			break;
		case 1:
			a.argsz = PAGE + 1 + rn(UINT32_MAX - PAGE - 1);
			e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
			expect(attach_argsz, e, E2BIG);
			break;
		default: {
			struct tshm_attach *u = arg_buf(sizeof(a) + 16);

			a.argsz = sizeof(a) + 16;
			memcpy(u, &a, sizeof(a));
			e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, u, &fd);
			expect(attach_argsz, e, ENOENT);
		}
		}
		return;
	}
	case 12:
		/* fd and size cannot be written back: the grant stays. */
		if (!c || !c->n)
			return;
		a.id = c->g[rn(c->n)].id;
		e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, arg_ro(&a, sizeof(a)), &fd);
		expect(attach_ptr_rdonly, e, EFAULT);
		return;
	default:
		s = seg_pick();
		if (rn(2) && s) {
			e = xioctl_ret(s->fd, TSHM_IOC_ATTACH, &a, &fd);
			expect(attach_on_seg, e, ENOTTY);
			return;
		}
		if (!c)
			return;
		{
			uint64_t *q = (uint64_t *)&a;
			size_t j;

			for (j = 0; j < sizeof(a) / 8; j++)
				q[j] = rn(3) ? rnd() : 0;
			if (rn(2))
				a.argsz = sizeof(a);
			a.flags &= rn(2) ? ~0U : TSHM_ATTACH_FLAGS;
			if (rn(2))
				a.id = c->n ? c->g[0].id : never_id();
			e = xioctl_ret(c->fd, TSHM_IOC_ATTACH, &a, &fd);
			if (expect(attach_garbage, e, 0, EINVAL, E2BIG, ENOENT,
				   OK_RES) && !e) {
				i = grant_find(c, a.id);
				if (i < 0) {
					violation(K_attach_garbage,
						  "attached %" PRIu64 " without a grant",
						  (uint64_t)a.id);
				} else {
					grant_sub(c, i, 1);
					attach_got(&a, fd, a.id, a.flags & TSHM_ATTACH_RDONLY,
						   K_attach_garbage);
				}
			}
		}
		return;
	}
}

static void op_drop(void)
{
	struct tshm_drop a = { .argsz = sizeof(a) };
	struct ctx *c = ctx_pick_private();
	int e, i;

	switch (rn(12)) {
	case 0: case 1: case 2:
		if (!c || !c->n)
			return;
		i = rn(c->n);
		a.id = c->g[i].id;
		if (rn(2)) {
			a.count = c->g[i].count;
			e = xioctl(c->fd, TSHM_IOC_DROP, &a);
			if (expect(drop_all, e, 0))
				grant_sub(c, i, a.count);
		} else {
			a.count = 1 + rn(c->g[i].count);
			e = xioctl(c->fd, TSHM_IOC_DROP, &a);
			if (expect(drop_valid, e, 0))
				grant_sub(c, i, a.count);
		}
		return;
	case 3:
		if (!c || !c->n)
			return;
		i = rn(c->n);
		a.id = c->g[i].id;
		a.count = c->g[i].count >= UINT32_MAX ? UINT32_MAX :
			  c->g[i].count + 1 + rn(UINT32_MAX - c->g[i].count);
		if (a.count <= c->g[i].count)
			return;
		e = xioctl(c->fd, TSHM_IOC_DROP, &a);
		expect(drop_too_many, e, EINVAL);
		return;
	case 4:
		if (!c)
			return;
		a.id = c->n ? c->g[0].id : never_id();
		e = xioctl(c->fd, TSHM_IOC_DROP, &a);
		expect(drop_count_zero, e, EINVAL);
		return;
	case 5:
		if (!c)
			return;
		a.id = c->n ? c->g[0].id : never_id();
		/* No read-only grant of it here (ours are all writable). */
		if (rn(2)) {
			a.count = 1;
			a.flags = TSHM_DROP_RDONLY;
			e = xioctl(c->fd, TSHM_IOC_DROP, &a);
			expect(drop_count_int_min, e, c->n ? EINVAL : ENOENT);
		} else {
			a.count = 1;
			a.__pad = 1 + rn(UINT32_MAX);
			e = xioctl(c->fd, TSHM_IOC_DROP, &a);
			expect(drop_count_negative, e, EINVAL);
		}
		return;
	case 6:
		if (!c)
			return;
		a.id = c->n ? c->g[0].id : never_id();
		a.count = 1;
		a.flags = 1U << (1 + rn(31));
		e = xioctl(c->fd, TSHM_IOC_DROP, &a);
		expect(drop_flags, e, EINVAL);
		return;
	case 7:
		if (!c)
			return;
		a.id = rn(2) ? never_id() : idpool_pick();
		a.count = 1 + rn(4);
		if (grant_find(c, a.id) >= 0)
			return;
		e = xioctl(c->fd, TSHM_IOC_DROP, &a);
		expect(drop_nogrant, e, ENOENT);
		return;
	case 8: {
		struct ctx *x = ctx_pick();

		if (!x || !x->shared)
			return;
		a.id = idpool_pick();
		a.count = 1 + rn(2);
		e = xioctl(x->fd, TSHM_IOC_DROP, &a);
		expect(drop_shared, e, 0, ENOENT, EINVAL);
		return;
	}
	case 9:
		if (!c)
			return;
		a.id = c->n ? c->g[0].id : never_id();
		a.count = 1;
		a.__reserved[rn(2)] = 1ULL << rn(64);
		e = xioctl(c->fd, TSHM_IOC_DROP, &a);
		expect(drop_reserved, e, EINVAL);
		return;
	default:
		if (!c)
			return;
		a.id = never_id();
		a.count = 1;
		a.argsz = rn(2) ? rn(sizeof(a)) : UINT32_MAX - rn(PAGE);
		e = xioctl(c->fd, TSHM_IOC_DROP, &a);
		expect(drop_argsz, e, a.argsz < sizeof(a) ? EINVAL : E2BIG);
		return;
	}
}

/* ---- INFO and odd ioctls ----------------------------------------------- */

static void op_info(void)
{
	struct tshm_info info = { .argsz = sizeof(info) }, *u;
	struct seg *s = seg_pick();
	struct ctx *c = ctx_pick();
	enum kind bk;
	int e;

	if (!s)
		return;
	switch (rn(8)) {
	default:
		e = xioctl(s->fd, TSHM_IOC_INFO, &info);
		if (!expect(info_valid, e, 0))
			return;
		if (info.id != s->id || info.size != s->size ||
		    info.flags != (s->rdonly ? TSHM_INFO_RDONLY : 0) ||
		    info.create_flags != s->flags ||
		    !info.holders || info.resident > info.size ||
		    info.name[TSHM_NAME_LEN - 1] ||
		    info.__pad || info.__reserved[0] || info.__reserved[2])
			violation(K_info_valid, "id %" PRIu64 "/%" PRIu64
				  " size %" PRIu64 "/%" PRIu64 " flags %#x/%#x%s"
				  " holders %u resident %" PRIu64,
				  (uint64_t)info.id, s->id, (uint64_t)info.size,
				  s->size, info.create_flags, s->flags,
				  s->rdonly ? " ro" : "", info.holders,
				  (uint64_t)info.resident);
		else if (s->exclusive && seg_fds_of(s->id) == 1 &&
			 (info.holders != 1 || info.grants))
			violation(K_info_valid, "exclusive segment %" PRIu64
				  " has holders %u grants %u", s->id,
				  info.holders, info.grants);
		return;
	case 4: {
		size_t sz = rn(2) ? rn(sizeof(info)) : sizeof(info) + 8 + rn(PAGE);

		u = arg_buf(sz);
		u->argsz = sz;
		e = xioctl(s->fd, TSHM_IOC_INFO, u);
		expect(info_argsz, e, sz < sizeof(info) ? EINVAL :
				      sz > PAGE ? E2BIG : 0);
		return;
	}
	case 5:
		e = xioctl(s->fd, TSHM_IOC_INFO,
			   rn(2) ? bad_ptr(&bk, 0, 0, 0) :
				   arg_ro(&info, sizeof(info)));
		expect(info_ptr_bad, e, EFAULT);
		return;
	case 6:
		if (!c)
			return;
		e = xioctl(c->fd, TSHM_IOC_INFO, &info);
		expect(info_on_ctx, e, ENOTTY);
		return;
	case 7: {
		uint64_t *q = (uint64_t *)&info;
		size_t i;

		for (i = 0; i < sizeof(info) / 8; i++)
			q[i] = rnd();
		if (rn(2))
			info.argsz = sizeof(info);
		e = xioctl(s->fd, TSHM_IOC_INFO, &info);
		expect(info_garbage, e, 0, EINVAL, E2BIG);
		return;
	}
	}
}

static void op_odd_ioctl(void)
{
	char buf[256] = { 0 };
	struct seg *s = seg_pick();
	struct ctx *c = ctx_pick();
	int fd, e, nr;

	*(uint32_t *)buf = 128;
	switch (rn(3)) {
	case 0:
		/* Numbers the module does not define. */
		do {
			nr = rn(256);
		} while (nr <= 3 || nr == 0x10);
		fd = rn(2) && s ? s->fd : c ? c->fd : -1;
		if (fd < 0)
			return;
		e = xioctl(fd, _IOC(rn(4), TSHM_IOC_MAGIC, nr, rn(256)), buf);
		expect(ioctl_unknown_nr, e, ENOTTY);
		return;
	case 1:
		fd = rn(2) && s ? s->fd : c ? c->fd : -1;
		if (fd < 0)
			return;
		e = xioctl(fd, _IOC(_IOC_READ | _IOC_WRITE, TSHM_IOC_MAGIC + 1,
				    rn(2) ? 0 : 0x10, 128), buf);
		expect(ioctl_other_magic, e, ENOTTY);
		return;
	default: {
		/* Our commands on fds that are not ours. */
		static const unsigned long cmds[] = { TSHM_IOC_CREATE,
			TSHM_IOC_ATTACH, TSHM_IOC_DROP, TSHM_IOC_GRANT,
			TSHM_IOC_INFO };
		int p[2];

		if (pipe2(p, O_CLOEXEC))
			return;
		e = xioctl(p[rn(2)], cmds[rn(5)], buf);
		close(p[0]);
		close(p[1]);
		expect(ioctl_foreign_fd, e, ENOTTY, EINVAL);
		return;
	}
	}
}

/* ---- mm ---------------------------------------------------------------- */

static void map_add(char *addr, size_t len, uint64_t off, struct seg *s,
		    bool writable)
{
	if (W.nmaps == MAX_MAPS) {
		munmap(addr, len);
		return;
	}
	W.maps[W.nmaps++] = (struct map){ .addr = addr, .len = len, .off = off,
		.segsize = s->size, .id = s->id, .writable = writable,
		.rdonly = s->rdonly };
}

static struct map *map_pick(void)
{
	return W.nmaps ? &W.maps[rn(W.nmaps)] : NULL;
}

static void map_remove(struct map *m)
{
	*m = W.maps[--W.nmaps];
}

static size_t map_len_for(struct seg *s, uint64_t *off)
{
	uint64_t pages = s->size / PAGE;
	uint64_t start = rn(2) ? 0 : rn(pages > 64 ? 64 : pages);
	uint64_t max = pages - start;

	if (max > 256)
		max = 256;
	*off = start * PAGE;
	return (1 + rn(max)) * PAGE;
}

/* A map of segment @id that mremap() grew past the segment's end. */
static bool grown_past_end(uint64_t id)
{
	int i;

	for (i = 0; i < W.nmaps; i++)
		if (W.maps[i].id == id &&
		    W.maps[i].off + W.maps[i].len > W.maps[i].segsize)
			return true;
	return false;
}

/*
 * Whether [p, p + len) at file offset @off continues one of our maps of
 * segment @id with contiguous offsets, on either side: the core then
 * expands that VMA instead of making a new one, and ->mmap is not asked.
 */
static bool continues_a_map(uint64_t id, const char *p, size_t len,
			    uint64_t off)
{
	int i;

	for (i = 0; i < W.nmaps; i++) {
		const struct map *m = &W.maps[i];

		if (m->id != id)
			continue;
		if (m->addr + m->len == p && m->off + m->len == off)
			return true;
		if (p + len == m->addr && off + len == m->off)
			return true;
	}
	return false;
}

static void op_mmap(void)
{
	struct seg *s = seg_pick();
	uint64_t off;
	size_t len;
	char *p;
	int e;

	if (!s)
		return;
	len = map_len_for(s, &off);
	switch (rn(10)) {
	default: {
		bool rw = !s->rdonly && rn(3);

		p = mmap(NULL, len, rw ? PROT_READ | PROT_WRITE : PROT_READ,
			 MAP_SHARED | (rn(4) ? 0 : MAP_POPULATE), s->fd, off);
		e = p == MAP_FAILED ? errno : 0;
		if ((off ? expect(mmap_offset, e, 0, OK_RES) :
		     rw ? expect(mmap_rw, e, 0, OK_RES) :
			  expect(mmap_ro, e, 0, OK_RES)) && !e)
			map_add(p, len, off, s, rw);
		return;
	}
	case 5:
		p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, s->fd, off);
		e = p == MAP_FAILED ? errno : 0;
		expect(mmap_private, e, EINVAL);
		if (!e)
			munmap(p, len);
		return;
	case 6:
		/* Past the end: by length, or by offset. */
		if (s->size > 1ULL << 40)
			return;
		if (rn(2)) {
			off = 0;
			len = s->size + PAGE * (1 + rn(16));
		} else {
			off = s->size + PAGE * rn(4);
			len = PAGE;
		}
		p = mmap(NULL, len, PROT_READ, MAP_SHARED, s->fd, off);
		e = p == MAP_FAILED ? errno : 0;
		/*
		 * The core merges a new mapping into an adjacent VMA of the
		 * same file with contiguous offsets without calling ->mmap:
		 * right after a map that ends at the end of the segment, or
		 * next to one this process grew past the end with mremap(),
		 * it may succeed (touching past the end is then SIGBUS).
		 */
		if (grown_past_end(s->id) ||
		    (!e && continues_a_map(s->id, p, len, off)))
			expect(mmap_past_end, e, EINVAL, 0);
		else
			expect(mmap_past_end, e, EINVAL);
		if (!e)
			munmap(p, len);
		return;
	case 7:
		if (!s->rdonly) {
			/* A writable holder: a fixed map over an old one. */
			struct map *m = map_pick();

			if (!m || m->len < len)
				return;
			p = mmap(m->addr, len, PROT_READ, MAP_SHARED | MAP_FIXED,
				 s->fd, off);
			e = p == MAP_FAILED ? errno : 0;
			if (!expect(mmap_fixed_over, e, 0, OK_RES) || e)
				return;
			/* The old map's tail survives, as a map of its own. */
			if (m->len > len) {
				struct map rest = *m;

				rest.addr += len;
				rest.len -= len;
				rest.off += len;
				map_remove(m);
				W.maps[W.nmaps++] = rest;
			} else {
				map_remove(m);
			}
			map_add(p, len, off, s, false);
			return;
		}
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, off);
		e = p == MAP_FAILED ? errno : 0;
		expect(mmap_rdonly_write, e, EACCES);
		if (!e)
			munmap(p, len);
		return;
	case 8:
		if (s->size > 1ULL << 40)
			return;
		p = mmap(NULL, (size_t)1 << (41 + rn(22)), PROT_READ, MAP_SHARED,
			 s->fd, 0);
		e = p == MAP_FAILED ? errno : 0;
		expect(mmap_huge_len, e, EINVAL, ENOMEM);
		return;
	case 9:
		/* MAP_SHARED_VALIDATE with an unknown flag, for good measure. */
		p = mmap(NULL, len, PROT_READ, MAP_SHARED_VALIDATE | 0x800000,
			 s->fd, off);
		e = p == MAP_FAILED ? errno : 0;
		expect(mmap_ro, e, EOPNOTSUPP);
		if (!e)
			map_add(p, len, off, s, false);
		return;
	}
}

static void op_munmap(void)
{
	struct map *m = map_pick();
	size_t cut;
	int e;

	if (!m)
		return;
	if (m->len == PAGE || rn(2)) {
		e = munmap(m->addr, m->len) ? errno : 0;
		expect(munmap_whole, e, 0);
		map_remove(m);
		return;
	}
	/* Cut a page run off the front or the back. */
	cut = PAGE * (1 + rn(m->len / PAGE - 1));
	if (rn(2)) {
		e = munmap(m->addr, cut) ? errno : 0;
		if (expect(munmap_part, e, 0)) {
			m->addr += cut;
			m->off += cut;
			m->len -= cut;
		}
	} else {
		e = munmap(m->addr + m->len - cut, cut) ? errno : 0;
		if (expect(munmap_part, e, 0))
			m->len -= cut;
	}
}

static void op_mremap(void)
{
	struct map *m = map_pick();
	size_t nlen;
	char *p;
	int e;

	if (!m)
		return;
	switch (rn(4)) {
	case 0:
		if (m->len == PAGE)
			return;
		nlen = PAGE * (1 + rn(m->len / PAGE - 1));
		p = mremap(m->addr, m->len, nlen, 0);
		e = p == MAP_FAILED ? errno : 0;
		if (expect(mremap_shrink, e, 0))
			m->len = nlen;
		return;
	case 1:
		/* May reach past the end of the segment: never touched there. */
		nlen = m->len + PAGE * (1 + rn(16));
		p = mremap(m->addr, m->len, nlen, MREMAP_MAYMOVE);
		e = p == MAP_FAILED ? errno : 0;
		if (expect(mremap_grow, e, 0, EFAULT, OK_RES) && !e) {
			m->addr = p;
			m->len = nlen;
		}
		return;
	case 2:
		p = mmap(NULL, m->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
		if (p == MAP_FAILED)
			return;
		{
			char *q = mremap(m->addr, m->len, m->len,
					 MREMAP_MAYMOVE | MREMAP_FIXED, p);

			e = q == MAP_FAILED ? errno : 0;
			if (expect(mremap_move, e, 0, EFAULT, OK_RES) && !e)
				m->addr = q;
			else
				munmap(p, m->len);
		}
		return;
	default:
		/* 6.1 allows DONTUNMAP of shared mappings: both stay. */
		p = mremap(m->addr, m->len, m->len, MREMAP_MAYMOVE | MREMAP_DONTUNMAP);
		e = p == MAP_FAILED ? errno : 0;
		if (expect(mremap_dontunmap, e, 0, EINVAL, EFAULT, OK_RES) && !e &&
		    W.nmaps < MAX_MAPS) {
			struct map n = *m;

			n.addr = p;
			W.maps[W.nmaps++] = n;
		}
		return;
	}
}

static void op_madvise(void)
{
	static const int advs[] = { MADV_DONTNEED, MADV_REMOVE, MADV_WILLNEED,
		MADV_COLD, MADV_PAGEOUT, MADV_HUGEPAGE, MADV_NOHUGEPAGE,
		MADV_DONTFORK, MADV_DOFORK, MADV_WIPEONFORK, MADV_KEEPONFORK,
		MADV_POPULATE_READ, MADV_POPULATE_WRITE, MADV_SEQUENTIAL,
		MADV_RANDOM, MADV_NORMAL, MADV_FREE, MADV_MERGEABLE,
		MADV_DONTDUMP };
	struct map *m = map_pick();
	uint64_t in;
	size_t len;
	int adv, e;

	if (!m)
		return;
	in = m->segsize > m->off ? m->segsize - m->off : 0;
	if (in > m->len)
		in = m->len;
	if (!in)
		return;
	len = PAGE * (1 + rn(in / PAGE));
	adv = advs[rn(sizeof(advs) / sizeof(advs[0]))];
	if (adv == MADV_DONTFORK || adv == MADV_DOFORK)
		len = m->len;	/* whole entries, so a child knows its maps */
	/* Populate-write of a read-only map is a SIGSEGV-free EFAULT. */
	e = madvise(m->addr, len, adv) ? errno : 0;
	if (expect(madvise, e, 0, EINVAL, EACCES, EPERM, EFAULT, EAGAIN, EBUSY,
		   OK_RES) && (adv == MADV_DONTFORK || adv == MADV_DOFORK))
		m->dontfork = adv == MADV_DONTFORK || (e && m->dontfork);
}

static void op_mprotect(void)
{
	struct map *m = map_pick();
	int prot, e;

	if (!m)
		return;
	prot = (int[]){ PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE }[rn(3)];
	e = mprotect(m->addr, m->len, prot) ? errno : 0;
	if (!expect(mprotect, e, 0, EACCES, OK_RES))
		return;
	if (!e) {
		m->writable = prot & PROT_WRITE;
		/* PROT_NONE: make it readable again for the touch checks. */
		if (prot == PROT_NONE)
			mprotect(m->addr, m->len, PROT_READ);
	} else if (prot & PROT_WRITE) {
		m->writable = false;
	}
}

/* The part of a map that lies within its segment, in bytes. */
static uint64_t map_inside(const struct map *m)
{
	uint64_t in = m->segsize > m->off ? m->segsize - m->off : 0;

	return in > m->len ? m->len : in;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE		25
#endif

/*
 * What the core mm does to a segment's VMAs by itself: remap_file_pages
 * (same offsets, so the model's contents stay), mprotect splits that
 * merge back, vmsplice (pages pinned in a pipe), mbind, mlock,
 * MADV_PAGEOUT and MADV_COLLAPSE.  None may break holder accounting:
 * the end-of-run checks see to that.
 */
static void op_mm_more(void)
{
	struct map *m = map_pick();
	uint64_t in, pages, first, n;
	struct iovec iov;
	int e, pfd[2];
	ssize_t r;

	if (!m)
		return;
	in = map_inside(m);
	pages = in / PAGE;
	if (!pages)
		return;
	first = rn(pages);
	n = 1 + rn(pages - first);
	switch (rn(7)) {
	case 0:
		e = remap_file_pages(m->addr + first * PAGE, n * PAGE, 0,
				     m->off / PAGE + first, 0) ? errno : 0;
		/*
		 * Read-only holders map without VM_SHARED: refused; so is a
		 * range over VMAs whose flags differ (MADV_HUGEPAGE on part).
		 */
		if (m->rdonly)
			expect(remap_file_pages, e, EINVAL);
		else
			expect(remap_file_pages, e, 0, EINVAL, OK_RES);
		return;
	case 1:
		/* Split the map in three, then make it one again. */
		e = mprotect(m->addr + first * PAGE, n * PAGE, PROT_READ) ?
			errno : 0;
		if (expect(mprotect_merge, e, 0) && !e) {
			e = mprotect(m->addr + first * PAGE, n * PAGE,
				     m->writable ? PROT_READ | PROT_WRITE :
						   PROT_READ) ? errno : 0;
			expect(mprotect_merge, e, 0);
		}
		return;
	case 2:
		if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK))
			return;
		iov.iov_base = m->addr + first * PAGE;
		iov.iov_len = (n > 8 ? 8 : n) * PAGE;
		r = vmsplice(pfd[1], &iov, 1, 0);
		expect(vmsplice, r < 0 ? errno : 0, 0, EAGAIN, OK_RES);
		/* Sometimes the pipe outlives a fork or two: closed anyway. */
		close(pfd[0]);
		close(pfd[1]);
		return;
	case 3: {
		unsigned long node = 1;

		e = syscall(__NR_mbind, m->addr + first * PAGE, n * PAGE,
			    rn(2) ? 0 /* MPOL_DEFAULT */ : 2 /* MPOL_BIND */,
			    rn(2) ? &node : NULL, 8 * sizeof(node), 0) ?
			errno : 0;
		expect(mbind, e, 0, EINVAL, ENOSYS, EPERM, OK_RES);
		return;
	}
	case 4:
		e = mlock(m->addr + first * PAGE, n * PAGE) ? errno : 0;
		expect(mlock, e, 0, EPERM, EAGAIN, OK_RES);
		munlock(m->addr + first * PAGE, n * PAGE);
		return;
	case 5:
		e = madvise(m->addr + first * PAGE, n * PAGE, MADV_PAGEOUT) ?
			errno : 0;
		expect(madvise, e, 0, EINVAL, OK_RES);
		return;
	default:
		e = madvise(m->addr + first * PAGE, n * PAGE, MADV_COLLAPSE) ?
			errno : 0;
		expect(madv_collapse, e, 0, EINVAL, EAGAIN, EBUSY, EPERM,
		       OK_RES);
		return;
	}
}

static void op_msync(void)
{
	struct map *m = map_pick();
	int e;

	if (!m)
		return;
	e = msync(m->addr, m->len, rn(2) ? MS_SYNC : MS_ASYNC | MS_INVALIDATE) ?
		errno : 0;
	expect(msync, e, 0, EBUSY);
}

static void op_touch(void)
{
	struct map *m = map_pick();
	uint64_t in, pages, i, n, pg, *q, v;

	if (!m)
		return;
	in = m->segsize > m->off ? m->segsize - m->off : 0;
	if (in > m->len)
		in = m->len;
	pages = in / PAGE;
	if (!pages)
		return;
	n = 1 + rn(pages < 8 ? pages : 8);
	for (i = 0; i < n; i++) {
		pg = rn(pages);
		q = (uint64_t *)(m->addr + pg * PAGE) + rn(PAGE / 8);
		v = pattern(m->id, m->off / PAGE + pg);
		if (m->writable && rn(2)) {
			hit(K_touch_write);
			*q = v;
		} else {
			uint64_t got = *(volatile uint64_t *)q;

			hit(K_touch_read);
			if (got && got != v)
				violation(K_touch_read, "segment %" PRIu64 " page %"
					  PRIu64 ": %#" PRIx64 ", not 0 or %#" PRIx64,
					  m->id, m->off / PAGE + pg, got, v);
		}
	}
}

/* ---- fds ---------------------------------------------------------------- */

static void op_close(void)
{
	struct seg *s;
	struct ctx *c;
	int e;

	if (rn(8) == 0 && W.nctxs > 1) {
		/* Never the shared context 0: it is everyone's. */
		c = &W.ctxs[1 + rn(W.nctxs - 1)];
		e = close(c->fd) ? errno : 0;
		expect(close_ctx, e, 0);
		*c = W.ctxs[--W.nctxs];
		return;
	}
	s = seg_pick();
	if (!s)
		return;
	/* The last holder of a segment only we knew: it is gone now. */
	if (s->exclusive && seg_fds_of(s->id) == 1 && !maps_of(s->id) &&
	    !id_granted_anywhere(s->id) && W.nfreed < 16)
		W.freed[W.nfreed++] = s->id;
	e = close(s->fd) ? errno : 0;
	if (maps_of(s->id))
		expect(close_seg_mapped, e, 0);
	else
		expect(close_seg, e, 0);
	seg_remove(s);
}

static void op_open_ctx(void)
{
	int fd = open("/dev/tshm", O_RDWR | O_CLOEXEC);

	if (!expect(open_ctx, fd < 0 ? errno : 0, 0, OK_RES) || fd < 0)
		return;
	ctx_add(fd, false);
}

static void op_dup(void)
{
	struct seg *s = seg_pick();
	struct seg copy;
	int fd;

	if (!s)
		return;
	copy = *s;
	fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 0);
	if (!expect(dup_seg, fd < 0 ? errno : 0, 0, OK_RES) || fd < 0)
		return;
	/* Same open file description: still one holder. */
	seg_add(fd, copy.id, copy.size, copy.flags, copy.rdonly, copy.exclusive);
}

static void op_poll(void)
{
	struct seg *s = seg_pick();
	struct ctx *c = ctx_pick();
	struct epoll_event ev[8];
	struct pollfd p;
	int n, e;

	switch (rn(4)) {
	case 0:
		if (!s)
			return;
		p = (struct pollfd){ .fd = s->fd, .events = POLLIN };
		n = poll(&p, 1, 0);
		if (!expect(poll_seg, n < 0 ? errno : 0, 0))
			return;
		/* Exclusive: sole holder, so readable. */
		if (s->exclusive && seg_fds_of(s->id) == 1 &&
		    !id_granted_anywhere(s->id) && !(p.revents & POLLIN))
			violation(K_poll_seg, "sole holder of %" PRIu64
				  " not readable (revents %#x)", s->id, p.revents);
		return;
	case 1:
		if (!c)
			return;
		p = (struct pollfd){ .fd = c->fd, .events = POLLIN | POLLOUT };
		n = poll(&p, 1, 0);
		expect(poll_ctx, n < 0 ? errno : 0, 0);
		return;
	case 2:
		if (!s)
			return;
		ev[0] = (struct epoll_event){ .events = EPOLLIN | (rn(2) ? EPOLLET : 0),
					      .data.u64 = s->id };
		e = epoll_ctl(W.epfd, EPOLL_CTL_ADD, s->fd, ev) ? errno : 0;
		expect(epoll_add, e, 0, EEXIST, OK_RES);
		return;
	default:
		n = epoll_wait(W.epfd, ev, 8, 0);
		expect(epoll_wait, n < 0 ? errno : 0, 0);
		return;
	}
}

static void op_fd_misc(void)
{
	struct seg *s = seg_pick();
	struct ctx *c = ctx_pick();
	char buf[4096] = { 0 }, path[64];
	int fd, e;
	ssize_t r;

	switch (rn(4)) {
	case 0:
		if (!s)
			return;
		/* No read/write/truncate/reopen; fallocate is shmem's. */
		switch (rn(5)) {
		case 0:
			r = read(s->fd, buf, 16);
			expect(fd_ops_seg, r < 0 ? errno : 0, EINVAL, EBADF);
			return;
		case 1:
			r = write(s->fd, buf, 16);
			expect(fd_ops_seg, r < 0 ? errno : 0, EINVAL, EBADF);
			return;
		case 2:
			e = ftruncate(s->fd, rn(2) ? 0 : s->size * 2) ? errno : 0;
			expect(fd_ops_seg, e, EPERM, EINVAL);
			return;
		case 3:
			snprintf(path, sizeof(path), "/proc/self/fd/%d", s->fd);
			fd = open(path, rn(2) ? O_RDONLY : O_RDWR);
			e = fd < 0 ? errno : 0;
			if (fd >= 0)
				close(fd);
			expect(fd_ops_seg, e, ENXIO);
			return;
		default:
			/* Allocate, or punch (reads then see zeroes). */
			e = fallocate(s->fd, rn(2) ? 0 : FALLOC_FL_PUNCH_HOLE |
				      FALLOC_FL_KEEP_SIZE, 0, PAGE) ? errno : 0;
			if (s->rdonly)
				expect(fd_ops_seg, e, EBADF);
			else
				expect(fd_ops_seg, e, 0, OK_RES);
			return;
		}
	case 1:
	case 2:
		fd = rn(2) && s ? s->fd : c ? c->fd : -1;
		if (fd < 0)
			return;
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		e = fd < 0 ? errno : 0;
		if (fd >= 0) {
			while ((r = read(fd, buf, sizeof(buf))) > 0)
				;
			e = r < 0 ? errno : 0;
			close(fd);
		}
		expect(fdinfo, e, 0);
		return;
	default:
		fd = open("/proc/tshm", O_RDONLY | O_CLOEXEC);
		e = fd < 0 ? errno : 0;
		if (fd >= 0) {
			/* Odd-sized reads walk seq_file's restart path. */
			while ((r = read(fd, buf, 1 + rn(sizeof(buf)))) > 0)
				;
			e = r < 0 ? errno : 0;
			close(fd);
		}
		expect(proc_tshm, e, 0);
		return;
	}
}

/* ---- SCM_RIGHTS and handles ------------------------------------------- */

#define MSG_FD_SEG	1
#define MSG_FD_CTX	2
#define MSG_ID		3

struct msg {
	uint8_t type, nfds;
	uint64_t id;
};

static void op_scm_send(void)
{
	int target = rn(opt_procs);
	char cbuf[CMSG_SPACE(3 * sizeof(int))];
	struct msg m = { 0 };
	struct iovec iov = { &m, sizeof(m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;
	int fds[3], i, n = 0, e;
	struct seg *s;

	switch (rn(3)) {
	case 0:
		/* A segment fd (or up to three). */
		m.type = MSG_FD_SEG;
		n = 1 + rn(3);
		for (i = 0; i < n; i++) {
			s = seg_pick();
			if (!s)
				return;
			seg_share(s->id);
			fds[i] = s->fd;
		}
		hit(K_scm_send_seg);
		break;
	case 1:
		/* A context; this process's model of it is no longer exact. */
		if (!W.nctxs)
			return;
		m.type = MSG_FD_CTX;
		n = 1;
		i = rn(W.nctxs);
		W.ctxs[i].shared = true;
		W.ctxs[i].n = 0;
		fds[0] = W.ctxs[i].fd;
		hit(K_scm_send_ctx);
		break;
	default: {
		/* A 16-byte handle: grant on the shared context, send the id. */
		struct tshm_grant g = { .argsz = sizeof(g), .count = 1 };

		s = seg_pick();
		if (!s || s->rdonly)
			return;
		g.seg_fd = s->fd;
		e = xioctl(W.ctxs[0].fd, TSHM_IOC_GRANT, &g);
		if (!expect(scm_send_id, e, 0, EOVERFLOW, OK_RES) || e)
			return;
		seg_share(s->id);
		m.type = MSG_ID;
		m.id = s->id;
		if (send(W.outbox[target], &m, sizeof(m), MSG_DONTWAIT) == sizeof(m))
			__atomic_add_fetch(&sh->handles, 1, __ATOMIC_RELAXED);
		/* Not sent: the grant stays in the shared context till the end. */
		return;
	}
	}
	m.nfds = n;
	mh.msg_control = cbuf;
	mh.msg_controllen = CMSG_SPACE(n * sizeof(int));
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(n * sizeof(int));
	memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
	e = sendmsg(W.outbox[target], &mh, MSG_DONTWAIT) < 0 ? errno : 0;
	if (!e)
		__atomic_add_fetch(&sh->scm_fds, n, __ATOMIC_RELAXED);
}

static void op_scm_recv(void)
{
	char cbuf[CMSG_SPACE(3 * sizeof(int))];
	struct msg m;
	struct iovec iov = { &m, sizeof(m) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	int fds[3], n = 0, i, e;
	ssize_t r;

	r = recvmsg(W.inbox, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (r < 0) {
		expect(scm_recv, errno, EAGAIN);
		return;
	}
	hit(K_scm_recv);
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		memcpy(fds, CMSG_DATA(cm), n * sizeof(int));
	}
	if (r != sizeof(m)) {
		for (i = 0; i < n; i++)
			close(fds[i]);
		return;
	}
	if (m.type == MSG_ID) {
		struct tshm_attach a = { .argsz = sizeof(a), .id = m.id };
		int fd = -1;

		/*
		 * Someone else on the shared context may have used it first
		 * (ENOENT), or used the writable grant while another worker's
		 * read-only grant of the same segment sat there for a moment
		 * (grant, then drop at once): EACCES, the ABI's answer to a
		 * writable attach where only read-only grants are left.
		 */
		e = xioctl_ret(W.ctxs[0].fd, TSHM_IOC_ATTACH, &a, &fd);
		if (expect(attach_handle, e, 0, ENOENT, EACCES, OK_RES) && !e)
			attach_got(&a, fd, m.id, false, K_attach_handle);
		return;
	}
	for (i = 0; i < n; i++) {
		if (m.type == MSG_FD_CTX) {
			ctx_add(fds[i], true);
		} else {
			struct tshm_info info = { .argsz = sizeof(info) };

			e = xioctl(fds[i], TSHM_IOC_INFO, &info);
			if (!expect(info_valid, e, 0) || e) {
				close(fds[i]);
				continue;
			}
			seg_add(fds[i], info.id, info.size, info.create_flags,
				info.flags & TSHM_INFO_RDONLY, false);
		}
	}
}

/* ---- processes --------------------------------------------------------- */

static void run_ops(uint64_t max);

static void op_fork(void)
{
	pid_t pid;
	int i;

	if (W.child || W.nkids == MAX_KIDS)
		return;
	/* Whatever the child does to our segments, we no longer know. */
	for (i = 0; i < W.nsegs; i++)
		W.segs[i].exclusive = false;
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		W.child = true;
		W.rng ^= 0xc0ffee ^ W.iter;
		for (i = W.nmaps - 1; i >= 0; i--)
			if (W.maps[i].dontfork)
				W.maps[i] = W.maps[--W.nmaps];
		W.nkids = 0;
		/* Contexts whose grant counts the parent models: not ours. */
		for (i = W.nctxs - 1; i > 0; i--) {
			if (!W.ctxs[i].shared) {
				close(W.ctxs[i].fd);
				W.ctxs[i] = W.ctxs[--W.nctxs];
			}
		}
		W.kill_at = rn(4) ? 0 : W.iter + rn(50);
		run_ops(W.iter + 20 + rn(200));
		_exit(0);
	}
	hit(K_fork_child);
	__atomic_add_fetch(&sh->forks, 1, __ATOMIC_RELAXED);
	W.kids[W.nkids++] = pid;
}

static void reap_kids(bool kill_some)
{
	int i, st;

	for (i = 0; i < W.nkids; i++) {
		if (kill_some && rn(3) == 0) {
			kill(W.kids[i], SIGKILL);
			hit(K_kill_child);
			__atomic_add_fetch(&sh->kid_kills, 1, __ATOMIC_RELAXED);
		}
		if (waitpid(W.kids[i], &st, kill_some ? WNOHANG : 0) == W.kids[i]) {
			if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL)
				violation(K_fork_child, "child died of signal %d",
					  WTERMSIG(st));
			else if (WIFEXITED(st) && WEXITSTATUS(st))
				violation(K_fork_child, "child exit %d",
					  WEXITSTATUS(st));
			W.kids[i--] = W.kids[--W.nkids];
		}
	}
}

static void one_op(void)
{
	unsigned int r = rn(1000);

	if (W.kill_at && W.iter >= W.kill_at) {
		hit(K_self_kill);
		__atomic_add_fetch(&sh->self_kills, 1, __ATOMIC_RELAXED);
		kill(getpid(), SIGKILL);
	}
	if (r < 150)
		op_create();
	else if (r < 250)
		op_grant();
	else if (r < 350)
		op_attach();
	else if (r < 410)
		op_drop();
	else if (r < 470)
		op_info();
	else if (r < 490)
		op_odd_ioctl();
	else if (r < 580)
		op_mmap();
	else if (r < 630)
		op_munmap();
	else if (r < 660)
		op_mremap();
	else if (r < 690)
		op_madvise();
	else if (r < 710)
		op_mprotect();
	else if (r < 720)
		op_msync();
	else if (r < 750)
		op_mm_more();
	else if (r < 800)
		op_touch();
	else if (r < 860)
		op_close();
	else if (r < 870)
		op_open_ctx();
	else if (r < 880)
		op_dup();
	else if (r < 910)
		op_poll();
	else if (r < 930)
		op_fd_misc();
	else if (r < 955)
		op_scm_send();
	else if (r < 985)
		op_scm_recv();
	else if (r < 995)
		op_fork();
	else
		reap_kids(true);
}

static void run_ops(uint64_t max)
{
	while (!sh->stop && (!max || W.iter < max)) {
		one_op();
		W.iter++;
		__atomic_add_fetch(&sh->iters, 1, __ATOMIC_RELAXED);
		/* Keep tables from filling for good. */
		if (W.nsegs > MAX_SEGS - 4)
			op_close();
		if (W.nmaps > MAX_MAPS - 4)
			op_munmap();
	}
}

static void worker_main(int slot, unsigned int gen, int shared_ctx,
			int *inbox, int *outbox)
{
	int i;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	memset(&W, 0, sizeof(W));
	W.slot = slot;
	W.gen = gen;
	W.rng = opt_seed ^ ((uint64_t)slot << 48) ^ ((uint64_t)gen << 32);
	splitmix(&W.rng);
	W.inbox = inbox[slot];
	W.outbox = outbox;
	for (i = 0; i < opt_procs; i++)
		if (i != slot)
			close(inbox[i]);
	W.arena = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	W.ropage = mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	W.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (W.arena == MAP_FAILED || W.ropage == MAP_FAILED || W.epfd < 0)
		_exit(3);
	mprotect(W.arena + 2 * PAGE, PAGE, PROT_NONE);
	/* Context 0 is the one every worker shares. */
	ctx_add(dup(shared_ctx), true);
	close(shared_ctx);
	/* One incarnation in three dies by its own hand somewhere. */
	W.kill_at = rn(3) ? 0 : 50 + rn(5000);
	/*
	 * Half the incarnations of odd workers run as nobody: the per-user
	 * limits, RLIMIT_MEMLOCK and /proc/tshm's filter then apply.
	 */
	if (slot % 2 && rn(2) && !geteuid()) {
		if (setgroups(0, NULL) || setresgid(65534, 65534, 65534) ||
		    setresuid(65534, 65534, 65534))
			_exit(3);
		/* A change of credentials clears the parent-death signal. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		hit(K_unprivileged);
	}
	run_ops(0);
	reap_kids(false);
	_exit(0);
}

/* ---- the parent -------------------------------------------------------- */

static long meminfo_kb(const char *field)
{
	char buf[256];
	size_t fl = strlen(field);
	long kb = -1;
	FILE *f;
	int fd;

	fd = open("/proc/sys/vm/stat_refresh", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, "1", 1);
		close(fd);
	}
	f = fopen("/proc/meminfo", "re");
	if (!f)
		return -1;
	while (fgets(buf, sizeof(buf), f))
		if (!strncmp(buf, field, fl) && buf[fl] == ':') {
			kb = strtol(buf + fl + 1, NULL, 10);
			break;
		}
	fclose(f);
	return kb;
}

/* Segments /proc/tshm lists (its totals line), -1 if unreadable. */
static long proc_segments(void)
{
	char buf[512];
	long n = -1;
	FILE *f = fopen("/proc/tshm", "re");

	if (!f)
		return -1;
	while (fgets(buf, sizeof(buf), f))
		if (!strncmp(buf, "total ", 6))
			n = strtol(buf + 6, NULL, 10);
	fclose(f);
	return n;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(const char *argv0)
{
	fprintf(stderr,
		"usage: %s [--seed N] [--seconds S] [--procs N] [--kill-ms MS] [-v]\n"
		"  --seed N      replay a run (default: from the clock)\n"
		"  --seconds S   how long to fuzz (default 60)\n"
		"  --procs N     worker processes (default 4, at most %d)\n"
		"  --kill-ms MS  SIGKILL a random worker every MS ms on average\n"
		"                (default 700; 0: only the workers' own kills)\n"
		"  --list-kinds  print every operation kind and exit\n"
		"  -v            list the kinds not exercised\n",
		argv0, MAX_PROCS);
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "seed", required_argument, NULL, 's' },
		{ "seconds", required_argument, NULL, 't' },
		{ "procs", required_argument, NULL, 'p' },
		{ "kill-ms", required_argument, NULL, 'k' },
		{ "list-kinds", no_argument, NULL, 'l' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	int inbox[MAX_PROCS], outbox[MAX_PROCS], sp[2], ctx, i, o, st;
	pid_t pids[MAX_PROCS];
	unsigned int gens[MAX_PROCS] = { 0 };
	bool seeded = false, crashed = false;
	long base_shmem, end_shmem = -1, base_segs, end_segs = -1;
	uint64_t prng, kills = 0, respawns = 0, kinds = 0;
	double t0, t1, next_kill, elapsed;
	char crash_msg[128] = "";
	unsigned int u;

	while ((o = getopt_long(argc, argv, "v", opts, NULL)) != -1) {
		switch (o) {
		case 's': opt_seed = strtoull(optarg, NULL, 0); seeded = true; break;
		case 't': opt_seconds = atoi(optarg); break;
		case 'p': opt_procs = atoi(optarg); break;
		case 'k': opt_kill_ms = atoi(optarg); break;
		case 'v': opt_verbose = 1; break;
		case 'l':
			for (u = 0; u < NKINDS; u++)
				printf("%s\n", kind_names[u]);
			return 0;
		default: usage(argv[0]);
		}
	}
	if (optind != argc || opt_procs < 1 || opt_procs > MAX_PROCS ||
	    opt_seconds < 0 || opt_kill_ms < 0)
		usage(argv[0]);
	if (!seeded) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		opt_seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
			   (uint64_t)getpid() << 40;
	}
	printf("# tshm-fuzz: seed %" PRIu64 " (replay: --seed %" PRIu64 " --procs %d"
	       " --seconds %d --kill-ms %d)\n", opt_seed, opt_seed, opt_procs,
	       opt_seconds, opt_kill_ms);
	printf("TAP version 13\n1..5\n");
	fflush(stdout);

	ctx = open("/dev/tshm", O_RDWR | O_CLOEXEC);
	if (ctx < 0) {
		printf("ok 1 fuzz # SKIP no %s: tshm.ko not loaded\n", "/dev/tshm");
		for (i = 2; i <= 5; i++)
			printf("ok %d fuzz # SKIP\n", i);
		printf("# Totals: pass:0 fail:0 xfail:0 xpass:0 skip:5 error:0\n");
		return 4;
	}
	no_thp = access("/sys/kernel/mm/transparent_hugepage", F_OK) != 0;
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	for (i = 0; i < opt_procs; i++) {
		if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sp)) {
			perror("socketpair");
			return 1;
		}
		inbox[i] = sp[0];
		outbox[i] = sp[1];
	}
	signal(SIGPIPE, SIG_IGN);
	base_segs = proc_segments();
	base_shmem = meminfo_kb("Shmem");
	printf("# baseline: %ld segments in /proc/tshm, Shmem %ld kB\n",
	       base_segs, base_shmem);
	fflush(stdout);

	prng = opt_seed ^ 0x9a4e47ULL;
	t0 = now();
	next_kill = t0 + (opt_kill_ms ? (splitmix(&prng) % (2 * opt_kill_ms)) / 1e3 : 1e9);
	for (i = 0; i < opt_procs; i++) {
		pids[i] = fork();
		if (pids[i] == 0)
			worker_main(i, 0, ctx, inbox, outbox);
	}
	for (;;) {
		double t = now();
		pid_t pid;

		if (t - t0 >= opt_seconds)
			break;
		if (t >= next_kill) {
			i = splitmix(&prng) % opt_procs;
			if (pids[i] > 0 && !kill(pids[i], SIGKILL))
				kills++;
			next_kill = t + (splitmix(&prng) % (2 * opt_kill_ms + 1)) / 1e3;
		}
		/* Reap, judge and replace workers that died. */
		while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
			for (i = 0; i < opt_procs && pids[i] != pid; i++)
				;
			if (i == opt_procs)
				continue;
			if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL) {
				crashed = true;
				snprintf(crash_msg, sizeof(crash_msg),
					 "worker %d gen %u died of signal %d (%s)",
					 i, gens[i], WTERMSIG(st), strsignal(WTERMSIG(st)));
				printf("# %s\n", crash_msg);
			} else if (WIFEXITED(st) && WEXITSTATUS(st)) {
				crashed = true;
				snprintf(crash_msg, sizeof(crash_msg),
					 "worker %d gen %u exited %d", i, gens[i],
					 WEXITSTATUS(st));
				printf("# %s\n", crash_msg);
			}
			respawns++;
			pids[i] = fork();
			if (pids[i] == 0)
				worker_main(i, ++gens[i], ctx, inbox, outbox);
			if (pids[i] > 0)
				++gens[i];
		}
		usleep(20000);
	}
	sh->stop = 1;
	t1 = now();
	/* Let them finish their op and reap their children, then kill. */
	for (i = 0; i < 100; i++) {
		int alive = 0, j;

		for (j = 0; j < opt_procs; j++) {
			if (pids[j] <= 0)
				continue;
			if (waitpid(pids[j], &st, WNOHANG) == pids[j]) {
				if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL) {
					crashed = true;
					snprintf(crash_msg, sizeof(crash_msg),
						 "worker %d died of signal %d", j,
						 WTERMSIG(st));
				}
				pids[j] = 0;
			} else {
				alive++;
			}
		}
		if (!alive)
			break;
		usleep(50000);
	}
	for (i = 0; i < opt_procs; i++) {
		if (pids[i] > 0) {
			kill(pids[i], SIGKILL);
			waitpid(pids[i], &st, 0);
		}
	}
	/* Orphaned grandchildren die with their parent (PDEATHSIG). */
	while (waitpid(-1, &st, WNOHANG) > 0)
		;
	/* Drop what is in flight and what the shared context holds. */
	for (i = 0; i < opt_procs; i++) {
		close(inbox[i]);
		close(outbox[i]);
	}
	close(ctx);
	for (i = 0; i < 100; i++) {
		end_segs = proc_segments();
		end_shmem = meminfo_kb("Shmem");
		if (end_segs == (base_segs > 0 ? base_segs : 0) &&
		    end_shmem - base_shmem < 2048)
			break;
		usleep(100000);
	}

	elapsed = t1 - t0;
	for (u = 0; u < NKINDS; u++)
		kinds += sh->hits[u] != 0;

	if (!sh->violations)
		printf("ok 1 fuzz: every result as the ABI says (%" PRIu64 " checks)\n",
		       sh->checks);
	else
		printf("not ok 1 fuzz: %" PRIu64 " unexpected results of %" PRIu64
		       " checks\n", sh->violations, sh->checks);
	for (u = 0; u < sh->nviol && u < NVIOL; u++)
		printf("# %s\n", sh->viol[u]);
	printf("%s 2 fuzz: no worker crashed%s%s\n", crashed ? "not ok" : "ok",
	       crashed ? ": " : "", crash_msg);
	printf("%s 3 fuzz: /proc/tshm lists no segment afterwards (%ld)\n",
	       end_segs == (base_segs > 0 ? base_segs : 0) ? "ok" : "not ok",
	       end_segs);
	printf("%s 4 fuzz: Shmem back to baseline (%+ld kB)\n",
	       end_shmem >= 0 && end_shmem - base_shmem < 2048 ? "ok" : "not ok",
	       end_shmem - base_shmem);
	printf("%s 5 fuzz: iterations ran (%" PRIu64 ")\n",
	       sh->iters ? "ok" : "not ok", sh->iters);
	if (opt_verbose) {
		for (u = 0; u < NKINDS; u++)
			printf("# kind %-28s %" PRIu64 "\n", kind_names[u], sh->hits[u]);
	} else {
		printf("# kinds not exercised:");
		for (u = 0; u < NKINDS; u++)
			if (!sh->hits[u])
				printf(" %s", kind_names[u]);
		printf("\n");
	}
	{
		int fails = !!sh->violations + crashed +
			(end_segs != (base_segs > 0 ? base_segs : 0)) +
			!(end_shmem >= 0 && end_shmem - base_shmem < 2048) +
			!sh->iters;

		printf("# tshm-fuzz: seed %" PRIu64 " procs %d: %" PRIu64
		       " iterations in %.1fs (%.0f/min), %" PRIu64 "/%d kinds, "
		       "%" PRIu64 " checks, kills: %" PRIu64 " by parent + %"
		       PRIu64 " self + %" PRIu64 " children, %" PRIu64 " forks, %"
		       PRIu64 " fds and %" PRIu64 " handles passed\n",
		       opt_seed, opt_procs, sh->iters, elapsed,
		       elapsed > 0 ? sh->iters * 60.0 / elapsed : 0.0, kinds,
		       NKINDS, sh->checks, kills, sh->self_kills, sh->kid_kills,
		       sh->forks, sh->scm_fds, sh->handles);
		(void)respawns;
		printf("# Totals: pass:%d fail:%d xfail:0 xpass:0 skip:0 error:0\n",
		       5 - fails, fails);
		return fails ? 1 : 0;
	}
}
