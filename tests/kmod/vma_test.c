// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko: mappings the mm understands.  Whatever the core mm does to a
 * segment's VMAs on its own (remap_file_pages, merge, split, mremap,
 * fork) keeps the holder alive exactly as long as a mapping exists, and
 * pages a former holder pinned (vmsplice) stop being the segment's pages
 * once the producer punches them out.  Regression tests for issue 16.
 */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <linux/userfaultfd.h>
#include "kselftest_harness.h"
#include "tshm_test.h"

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE	0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE	0x02
#endif

FIXTURE(vma) {
	int ctx;
	long pg;
};

FIXTURE_SETUP(vma)
{
	self->ctx = -1;
	self->pg = sysconf(_SC_PAGESIZE);
	TT_NEED_MODULE();
	self->ctx = tt_open();
	ASSERT_LE(0, self->ctx);
}

FIXTURE_TEARDOWN(vma)
{
	if (self->ctx >= 0)
		close(self->ctx);
}

/*
 * Issue 16, finding 1: remap_file_pages() re-mmaps vma->vm_file.  Once
 * every page of the mapping went through it, the mapping alone must still
 * hold the segment: listed, one holder, the producer's poll not readable.
 */
TEST_F(vma, remap_file_pages_keeps_holder)
{
	const long pg = self->pg;
	struct pollfd pfd;
	struct tt_line l;
	uint64_t id = 0;
	int fd, keep;
	char *p;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, 2 * pg, 0, "rfp", &id);
	ASSERT_LE(0, fd);
	/* A second holder, as the producer's, to poll with. */
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));
	keep = tt_attach(self->ctx, id, 0, NULL);
	ASSERT_LE(0, keep);

	p = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	strcpy(p, "page0");
	strcpy(p + pg, "page1");
	/* Swap the two pages: every page of the mapping is re-mapped. */
	ASSERT_EQ(0, remap_file_pages(p, pg, 0, 1, 0));
	ASSERT_EQ(0, remap_file_pages(p + pg, pg, 0, 0, 0));
	EXPECT_STREQ("page1", p);
	EXPECT_STREQ("page0", p + pg);
	close(fd);

	/* Only the mapping holds the first holder now. */
	ASSERT_EQ(1, tt_proc_scan(id, &l));
	EXPECT_EQ(2, l.holders);
	pfd.fd = keep;
	pfd.events = POLLIN;
	EXPECT_EQ(0, poll(&pfd, 1, 0));

	ASSERT_EQ(0, munmap(p, 2 * pg));
	EXPECT_EQ(1, poll(&pfd, 1, 0));
	close(keep);
	EXPECT_EQ(0, tt_proc_has(id));
}

/*
 * Issue 16, finding 2: map 2 pages, remap_file_pages the first, close
 * the fd, mprotect both (the two VMAs merge), munmap, exit.  Nothing of
 * the segment may be left.
 */
TEST_F(vma, merge_after_remap_leaks_nothing)
{
	const long pg = self->pg;
	uint64_t id = 0;
	int st, pipefd[2];
	pid_t pid;

	TT_SETUP_SKIPPED();
	ASSERT_EQ(0, pipe(pipefd));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		int fd = tt_create(self->ctx, 2 * pg, 0, "merge", &id);
		char *p;

		if (fd < 0)
			_exit(1);
		p = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_SHARED,
			 fd, 0);
		if (p == MAP_FAILED)
			_exit(2);
		if (remap_file_pages(p, pg, 0, 0, 0))
			_exit(3);
		close(fd);
		if (mprotect(p, 2 * pg, PROT_READ))
			_exit(4);
		if (munmap(p, 2 * pg))
			_exit(5);
		if (write(pipefd[1], &id, sizeof(id)) != sizeof(id))
			_exit(6);
		_exit(0);
	}
	close(pipefd[1]);
	ASSERT_EQ(sizeof(id), read(pipefd[0], &id, sizeof(id)));
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	ASSERT_EQ(0, st);
	EXPECT_EQ(0, tt_proc_has(id));
	close(pipefd[0]);
}

/*
 * ->mmap refuses a mapping past the end of the segment, but the core
 * expands an adjacent VMA of the same file with contiguous offsets and
 * the same flags without asking ->mmap (both kernels).  Whichever the
 * kernel does, the page past the end is never the segment's: touching it
 * is SIGBUS, as past the end of any file, and nothing leaks.
 */
TEST_F(vma, past_end_merge_is_sigbus)
{
	const long pg = self->pg;
	uint64_t id = 0;
	char *r, *p, *q;
	int fd, st;
	pid_t pid;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, 4 * pg, 0, "pastend", &id);
	ASSERT_LE(0, fd);
	r = mmap(NULL, 2 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, r);
	/* The segment's last page, then the page after it right above. */
	p = mmap(r, pg, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 3 * pg);
	ASSERT_EQ(r, p);
	q = mmap(r + pg, pg, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 4 * pg);
	if (q == MAP_FAILED) {
		EXPECT_EQ(EINVAL, errno);
		TH_LOG("not merged: -EINVAL from ->mmap");
		munmap(r + pg, pg);
	} else {
		ASSERT_EQ(r + pg, q);
		TH_LOG("merged into the VMA before it without ->mmap");
		pid = fork();
		ASSERT_LE(0, pid);
		if (!pid) {
			*(volatile char *)p;
			*(volatile char *)q;
			_exit(0);
		}
		ASSERT_EQ(pid, waitpid(pid, &st, 0));
		ASSERT_TRUE(WIFSIGNALED(st));
		EXPECT_EQ(SIGBUS, WTERMSIG(st));
		EXPECT_EQ(0, munmap(q, pg));
	}
	close(fd);
	EXPECT_EQ(1, tt_proc_has(id));
	EXPECT_EQ(0, munmap(p, pg));
	EXPECT_EQ(0, tt_proc_has(id));
}

/* Merge, split, mremap and fork of one holder's VMAs: one holder. */
TEST_F(vma, merge_split_mremap_fork)
{
	const long pg = self->pg;
	struct tt_line l;
	uint64_t id = 0;
	char *p, *q, *r;
	int fd, st;
	pid_t pid;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, 4 * pg, 0, "msmf", &id);
	ASSERT_LE(0, fd);
	p = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	tt_fill(p, 4 * pg, 7);
	close(fd);
	/* Split in three, merge back, move the middle elsewhere. */
	ASSERT_EQ(0, mprotect(p + pg, pg, PROT_READ));
	ASSERT_EQ(0, mprotect(p + pg, pg, PROT_READ | PROT_WRITE));
	q = mremap(p + pg, 2 * pg, 2 * pg, MREMAP_MAYMOVE | MREMAP_FIXED,
		   p + 8 * pg);
	if (q == MAP_FAILED) {
		/* p + 8 pages may be taken: let the kernel choose. */
		r = mmap(NULL, 16 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
		ASSERT_NE(MAP_FAILED, r);
		q = mremap(p + pg, 2 * pg, 2 * pg,
			   MREMAP_MAYMOVE | MREMAP_FIXED, r + 8 * pg);
	}
	ASSERT_NE(MAP_FAILED, q);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		munmap(p, pg);
		munmap(p + 3 * pg, pg);
		q[0] = 42;
		pause();
		_exit(0);
	}
	munmap(p, pg);
	munmap(p + 3 * pg, pg);
	munmap(q, 2 * pg);
	/* The child's copy of the moved VMA still holds. */
	ASSERT_EQ(1, tt_proc_scan(id, &l));
	EXPECT_EQ(1, l.holders);
	kill(pid, SIGKILL);
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	EXPECT_EQ(0, tt_proc_has(id));
}

/*
 * Issue 16, finding 9: a consumer vmsplices a page of a buffer into a
 * pipe and lets go; the producer, told the buffer is released, punches
 * it before reusing it, so what it writes next never reaches the pipe.
 */
TEST_F(vma, punch_cuts_pages_a_former_holder_pinned)
{
	const long pg = self->pg;
	char buf[64] = "";
	int fd, st, pipefd[2];
	struct pollfd pfd;
	struct iovec iov;
	uint64_t id = 0;
	char *p;
	pid_t pid;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, pg, 0, "punch", &id);
	ASSERT_LE(0, fd);
	p = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	strcpy(p, "message for the consumer");
	ASSERT_EQ(0, pipe(pipefd));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		iov.iov_base = p;
		iov.iov_len = pg;
		if (vmsplice(pipefd[1], &iov, 1, 0) != pg)
			_exit(1);
		_exit(0);
	}
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	ASSERT_EQ(0, st);
	close(pipefd[1]);
	pfd.fd = fd;
	pfd.events = POLLIN;
	EXPECT_EQ(1, poll(&pfd, 1, 0));

	/* Recycle: punch, then reuse the buffer for someone else. */
	ASSERT_EQ(0, fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			       0, pg));
	EXPECT_EQ(0, p[0]);
	EXPECT_EQ(0, msync(p, pg, MS_SYNC));
	strcpy(p, "secret for another");
	ASSERT_EQ(sizeof(buf), read(pipefd[0], buf, sizeof(buf)));
	EXPECT_STREQ("message for the consumer", buf);
	close(pipefd[0]);
	munmap(p, pg);
	close(fd);
	EXPECT_EQ(0, tt_proc_has(id));
}

/* TSHM_CREATE_NOEXEC: no PROT_EXEC, not even by mprotect(). */
TEST_F(vma, noexec_segment)
{
	const long pg = self->pg;
	char *p;
	int fd;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, pg, TSHM_CREATE_NOEXEC, "noexec", NULL);
	ASSERT_LE(0, fd);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, pg, PROT_READ | PROT_EXEC,
				   MAP_SHARED, fd, 0));
	EXPECT_EQ(EPERM, errno);
	p = mmap(NULL, pg, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	EXPECT_EQ(-1, mprotect(p, pg, PROT_READ | PROT_EXEC));
	EXPECT_EQ(EACCES, errno);
	munmap(p, pg);
	close(fd);

	/* Without the flag, executable mappings are allowed. */
	fd = tt_create(self->ctx, pg, 0, "exec", NULL);
	ASSERT_LE(0, fd);
	p = mmap(NULL, pg, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0);
	EXPECT_NE(MAP_FAILED, p);
	munmap(p, pg);
	close(fd);
}

/* userfaultfd accepts a segment mapping: vma_is_shmem() holds. */
TEST_F(vma, userfaultfd_registers)
{
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { 0 };
	const long pg = self->pg;
	int fd, uffd;
	char *p;

	TT_SETUP_SKIPPED();
	uffd = syscall(__NR_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd < 0)
		SKIP(return, "no userfaultfd: %s", strerror(errno));
	ASSERT_EQ(0, ioctl(uffd, UFFDIO_API, &api));
	fd = tt_create(self->ctx, 2 * pg, 0, "uffd", NULL);
	ASSERT_LE(0, fd);
	p = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	reg.range.start = (unsigned long)p;
	reg.range.len = 2 * pg;
	reg.mode = UFFDIO_REGISTER_MODE_MISSING;
	EXPECT_EQ(0, ioctl(uffd, UFFDIO_REGISTER, &reg));
	close(uffd);
	munmap(p, 2 * pg);
	close(fd);
}

/*
 * No fd per held segment: under RLIMIT_NOFILE 128 a process keeps 2000
 * received segments mapped with their fds closed, passes one on by the
 * address of its mapping, and the producer's release poll still works.
 */
#define NSEG	2000
TEST_F(vma, mapped_without_fds_regranted_by_address)
{
	const long pg = self->pg;
	struct rlimit rl = { 128, 128 };
	int st, fd, keep, ready[2];
	struct pollfd pfd;
	uint64_t id = 0, gid = 0;
	pid_t pid;

	TT_SETUP_SKIPPED();
	ASSERT_EQ(0, pipe(ready));
	/* The producer keeps one segment's fd to poll on. */
	keep = tt_create(self->ctx, pg, 0, "kept", &gid);
	ASSERT_LE(0, keep);
	ASSERT_EQ(0, tt_grant(keep, self->ctx, 1, NULL));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		char *maps[NSEG], *kept;
		uint64_t ids[NSEG];
		int i;

		if (setrlimit(RLIMIT_NOFILE, &rl))
			_exit(1);
		for (i = 0; i < NSEG; i++) {
			fd = tt_create(self->ctx, pg, 0, "many", &ids[i]);
			if (fd < 0)
				_exit(2);
			maps[i] = mmap(NULL, pg, PROT_READ | PROT_WRITE,
				       MAP_SHARED, fd, 0);
			if (maps[i] == MAP_FAILED)
				_exit(3);
			close(fd);
			maps[i][0] = i & 0x7f;
		}
		fd = tt_attach(self->ctx, gid, 0, NULL);
		if (fd < 0)
			_exit(4);
		kept = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (kept == MAP_FAILED)
			_exit(5);
		close(fd);
		/* Pass on segment 1234 and the kept one, by address only. */
		if (tt_grant_addr(maps[1234] + 100, self->ctx, 1, 0, NULL) ||
		    tt_grant_addr(kept, self->ctx, 1, 0, NULL))
			_exit(6);
		if (write(ready[1], &ids[1234], sizeof(ids[1234])) != 8)
			_exit(7);
		pause();
		_exit(0);
	}
	ASSERT_EQ(sizeof(id), read(ready[0], &id, sizeof(id)));
	/* The grant by address made a real grant: attach it here. */
	fd = tt_attach(self->ctx, id, 0, NULL);
	ASSERT_LE(0, fd);
	char *p = mmap(NULL, pg, PROT_READ, MAP_SHARED, fd, 0);

	ASSERT_NE(MAP_FAILED, p);
	EXPECT_EQ(1234 & 0x7f, p[0]);
	munmap(p, pg);
	close(fd);
	EXPECT_EQ(0, tt_drop(self->ctx, gid, 1));

	/* The child maps the kept segment with no fd: not released yet. */
	pfd.fd = keep;
	pfd.events = POLLIN;
	EXPECT_EQ(0, poll(&pfd, 1, 0));
	kill(pid, SIGKILL);
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	EXPECT_EQ(1, poll(&pfd, 1, 10000));
	EXPECT_EQ(0, tt_proc_has(id));
	close(keep);
	close(ready[0]);
	close(ready[1]);
}

struct stall {
	int ctx, efd, ret;
	uint64_t id;
	void *arg;
};

static void *attach_thread(void *p)
{
	struct stall *st = p;

	st->ret = ioctl(st->ctx, TSHM_IOC_ATTACH, st->arg);
	return NULL;
}

static void *drop_thread(void *p)
{
	struct stall *st = p;
	uint64_t one = 1;

	st->ret = tt_drop(st->ctx, st->id, 1);
	(void)!write(st->efd, &one, sizeof(one));
	return NULL;
}

/*
 * Issue 16, finding 6: a fault on ATTACH's argument stalls only the
 * caller.  The argument lies in a page write-protected by userfaultfd, so
 * ATTACH sleeps writing the size back; meanwhile a DROP on the same
 * context from another thread must complete.
 */
TEST_F(vma, attach_fault_stalls_only_its_caller)
{
	struct uffdio_api api = { .api = UFFD_API,
				  .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP };
	struct uffdio_register reg = { 0 };
	struct uffdio_writeprotect wp = { 0 };
	struct stall at = { 0 }, dr = { 0 };
	const long pg = self->pg;
	struct tshm_attach *a;
	struct uffd_msg msg;
	struct pollfd pfd;
	pthread_t ta, td;
	uint64_t id = 0;
	int fd, uffd;

	TT_SETUP_SKIPPED();
	uffd = syscall(__NR_userfaultfd, O_CLOEXEC);
	if (uffd < 0)
		SKIP(return, "no userfaultfd: %s", strerror(errno));
	if (ioctl(uffd, UFFDIO_API, &api) ||
	    !(api.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP))
		SKIP(return, "no userfaultfd write-protect");
	fd = tt_create(self->ctx, pg, 0, "stall", &id);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 2, NULL));

	a = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	ASSERT_NE(MAP_FAILED, a);
	memset(a, 0, sizeof(*a));
	a->argsz = sizeof(*a);
	a->id = id;
	reg.range.start = (uintptr_t)a;
	reg.range.len = pg;
	reg.mode = UFFDIO_REGISTER_MODE_WP;
	ASSERT_EQ(0, ioctl(uffd, UFFDIO_REGISTER, &reg));
	wp.range = reg.range;
	wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
	ASSERT_EQ(0, ioctl(uffd, UFFDIO_WRITEPROTECT, &wp));

	at.ctx = dr.ctx = self->ctx;
	at.arg = a;
	dr.id = id;
	dr.efd = eventfd(0, EFD_CLOEXEC);
	ASSERT_LE(0, dr.efd);
	ASSERT_EQ(0, pthread_create(&ta, NULL, attach_thread, &at));
	/* ATTACH is now asleep in the kernel, writing to the page. */
	pfd.fd = uffd;
	pfd.events = POLLIN;
	ASSERT_EQ(1, poll(&pfd, 1, 10000));
	ASSERT_EQ(sizeof(msg), read(uffd, &msg, sizeof(msg)));
	EXPECT_EQ(UFFD_EVENT_PAGEFAULT, msg.event);

	ASSERT_EQ(0, pthread_create(&td, NULL, drop_thread, &dr));
	pfd.fd = dr.efd;
	EXPECT_EQ(1, poll(&pfd, 1, 10000)) TH_LOG("DROP waited for ATTACH");

	/* Let ATTACH go, then both are done. */
	wp.mode = 0;
	ASSERT_EQ(0, ioctl(uffd, UFFDIO_WRITEPROTECT, &wp));
	pthread_join(ta, NULL);
	pthread_join(td, NULL);
	EXPECT_LT(0, at.ret);
	EXPECT_EQ(0, dr.ret);
	EXPECT_EQ(pg, a->size);
	if (at.ret > 0)
		close(at.ret);
	close(dr.efd);
	close(uffd);
	munmap(a, pg);
	close(fd);
}

TEST_HARNESS_MAIN
