// SPDX-License-Identifier: GPL-2.0
/*
 * tshm.ko: every ioctl's success and error paths, the segment fd (mmap
 * bounds, fstat, ftruncate, read-only holders, fdinfo, maps name).
 */
#include <limits.h>
#include <poll.h>
#include "kselftest_harness.h"
#include "tshm_test.h"

#define PG	4096UL

FIXTURE(seg) {
	int ctx;
};

FIXTURE_SETUP(seg)
{
	self->ctx = -1;
	TT_NEED_MODULE();
	self->ctx = tt_open();
	ASSERT_LE(0, self->ctx);
}

FIXTURE_TEARDOWN(seg)
{
	if (self->ctx >= 0)
		close(self->ctx);
}

TEST_F(seg, create_map_info)
{
	struct tshm_info info;
	struct stat st;
	uint64_t id = 0, id2 = 0;
	char *p;
	int fd, fd2;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, 3 * PG + 1, 0, "create", &id);
	ASSERT_LE(0, fd);
	ASSERT_NE(0, id);
	EXPECT_EQ(FD_CLOEXEC, fcntl(fd, F_GETFD));

	ASSERT_EQ(0, fstat(fd, &st));
	EXPECT_EQ(4 * PG, (uint64_t)st.st_size);
	EXPECT_TRUE(S_ISREG(st.st_mode));
	EXPECT_EQ(id, (uint64_t)st.st_ino);

	ASSERT_EQ(0, tt_info(fd, &info));
	EXPECT_EQ(id, info.id);
	EXPECT_EQ(4 * PG, info.size);
	EXPECT_EQ(0, info.flags);
	EXPECT_EQ(0, info.create_flags);
	EXPECT_EQ(1, info.holders);
	EXPECT_EQ(0, info.grants);
	EXPECT_EQ(0, info.resident);
	EXPECT_STREQ("create", info.name);

	p = mmap(NULL, 4 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	memset(p, 0x5a, 2 * PG);
	ASSERT_EQ(0, tt_info(fd, &info));
	EXPECT_EQ(2 * PG, info.resident);
	/* A second mapping through the same fd: still one holder. */
	char *q = mmap(NULL, PG, PROT_READ, MAP_SHARED, fd, PG);

	ASSERT_NE(MAP_FAILED, q);
	EXPECT_EQ(0x5a, q[0]);
	ASSERT_EQ(0, tt_info(fd, &info));
	EXPECT_EQ(1, info.holders);
	munmap(q, PG);
	munmap(p, 4 * PG);

	/* Ids are never reused; NOCLOEXEC is honoured. */
	fd2 = tt_create(self->ctx, PG, TSHM_CREATE_NOCLOEXEC, NULL, &id2);
	ASSERT_LE(0, fd2);
	EXPECT_LT(id, id2);
	EXPECT_EQ(0, fcntl(fd2, F_GETFD));
	close(fd2);
	close(fd);
}

TEST_F(seg, create_prefault)
{
	struct tshm_info info;
	int fd;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, 8 * PG, TSHM_CREATE_PREFAULT, "pf", NULL);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_info(fd, &info));
	EXPECT_EQ(8 * PG, info.resident);
	EXPECT_EQ(TSHM_CREATE_PREFAULT, info.create_flags);
	EXPECT_EQ(0, info.flags);
	close(fd);
}

TEST_F(seg, create_errors)
{
	struct tshm_create c;
	char big[8192];

	TT_SETUP_SKIPPED();
#define CREATE_ERR(err, ...) do {					\
		memset(&c, 0, sizeof(c));				\
		c.argsz = sizeof(c);					\
		c.size = PG;						\
		__VA_ARGS__;						\
		EXPECT_EQ(-(err), tt_ioctl(self->ctx, TSHM_IOC_CREATE, &c)); \
	} while (0)

	CREATE_ERR(EINVAL, c.size = 0);
	CREATE_ERR(EOVERFLOW, c.size = UINT64_MAX);
	CREATE_ERR(EOVERFLOW, c.size = UINT64_MAX - PG);
	CREATE_ERR(EOVERFLOW, c.size = (uint64_t)LLONG_MAX);
	CREATE_ERR(EINVAL, c.flags = 1U << 20);
	CREATE_ERR(EINVAL, c.__pad = 1);
	CREATE_ERR(EINVAL, c.__reserved[1] = 1);
	CREATE_ERR(EINVAL, memset(c.name, 'a', sizeof(c.name)));
	CREATE_ERR(EINVAL, c.argsz = 4);
	CREATE_ERR(EINVAL, c.argsz = sizeof(c) - 8);
	EXPECT_EQ(-EFAULT, tt_ioctl(self->ctx, TSHM_IOC_CREATE, (void *)8));

	/* A newer caller's larger struct: zero tail accepted, else -E2BIG. */
	memset(big, 0, sizeof(big));
	memcpy(big, &(struct tshm_create){ .argsz = 256, .size = PG },
	       sizeof(struct tshm_create));
	EXPECT_EQ(0, tt_ioctl(self->ctx, TSHM_IOC_CREATE, big));
	close(((struct tshm_create *)big)->fd);
	big[200] = 1;
	EXPECT_EQ(-E2BIG, tt_ioctl(self->ctx, TSHM_IOC_CREATE, big));
	big[200] = 0;
	((struct tshm_create *)big)->argsz = sizeof(big);
	EXPECT_EQ(-E2BIG, tt_ioctl(self->ctx, TSHM_IOC_CREATE, big));
}

TEST_F(seg, wrong_file_ioctls)
{
	struct tshm_info info;
	int fd, pfd[2];

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, PG, 0, "w", NULL);
	ASSERT_LE(0, fd);
	/* Segment ioctls on a context and the other way round. */
	EXPECT_EQ(-ENOTTY, tt_info(self->ctx, &info));
	EXPECT_EQ(-ENOTTY, tt_grant(fd, fd, 1, NULL));
	EXPECT_EQ(-ENOTTY, tt_create(fd, PG, 0, NULL, NULL));
	EXPECT_EQ(-ENOTTY, tt_attach(fd, 1, 0, NULL));
	EXPECT_EQ(-ENOTTY, tt_drop(fd, 1, 1));
	EXPECT_EQ(-ENOTTY, tt_ioctl(fd, _IO(TSHM_IOC_MAGIC, 0x7f), NULL));
	EXPECT_EQ(-ENOTTY, tt_ioctl(self->ctx, _IO('T', 1), NULL));
	/* Foreign fds where a segment is expected. */
	ASSERT_EQ(0, pipe(pfd));
	EXPECT_EQ(-EINVAL, tt_grant(pfd[0], self->ctx, 1, NULL));
	EXPECT_EQ(-EINVAL, tt_grant(self->ctx, self->ctx, 1, NULL));
	EXPECT_EQ(-EBADF, tt_grant(-1, self->ctx, 1, NULL));
	EXPECT_EQ(-EBADF, tt_grant(999999, self->ctx, 1, NULL));
	/* Not a segment's mapping, nothing mapped at all. */
	void *anon = mmap(NULL, PG, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);

	ASSERT_NE(MAP_FAILED, anon);
	EXPECT_EQ(-EINVAL, tt_grant_addr(anon, self->ctx, 1, 0, NULL));
	munmap(anon, PG);
	EXPECT_EQ(-EFAULT, tt_grant_addr(anon, self->ctx, 1, 0, NULL));
	EXPECT_EQ(-EFAULT, tt_grant_addr(NULL, self->ctx, 1, 0, NULL));
	close(pfd[0]);
	close(pfd[1]);
	close(fd);
}

TEST_F(seg, grant_attach_drop)
{
	struct tshm_info info;
	uint64_t id = 0, total = 0, size = 0;
	int fd, fd2;
	char *p, *q;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, 2 * PG, 0, "gad", &id);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 3, &total));
	EXPECT_EQ(3, total);
	ASSERT_EQ(0, tt_info(fd, &info));
	EXPECT_EQ(3, info.grants);
	uint64_t gen = info.generation;

	fd2 = tt_attach(self->ctx, id, 0, &size);
	ASSERT_LE(0, fd2);
	EXPECT_EQ(2 * PG, size);
	EXPECT_EQ(FD_CLOEXEC, fcntl(fd2, F_GETFD));
	ASSERT_EQ(0, tt_info(fd2, &info));
	EXPECT_EQ(2, info.holders);
	EXPECT_EQ(2, info.grants);
	EXPECT_LT(gen, info.generation);

	p = mmap(NULL, 2 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	q = mmap(NULL, 2 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
	ASSERT_NE(MAP_FAILED, p);
	ASSERT_NE(MAP_FAILED, q);
	strcpy(p + PG, "one way");
	EXPECT_STREQ("one way", q + PG);
	strcpy(q, "and back");
	EXPECT_STREQ("and back", p);

	/* DROP gives grants back without attaching. */
	EXPECT_EQ(-EINVAL, tt_drop(self->ctx, id, 3));
	EXPECT_EQ(0, tt_drop(self->ctx, id, 2));
	EXPECT_EQ(-ENOENT, tt_drop(self->ctx, id, 1));
	EXPECT_EQ(-ENOENT, tt_attach(self->ctx, id, 0, NULL));
	ASSERT_EQ(0, tt_info(fd, &info));
	EXPECT_EQ(0, info.grants);
	EXPECT_EQ(2, info.holders);
	munmap(p, 2 * PG);
	munmap(q, 2 * PG);
	close(fd2);
	close(fd);
}

TEST_F(seg, grant_errors)
{
	struct tshm_grant g;
	uint64_t id = 0;
	int fd, ro;
	char *p;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, PG, 0, "ge", &id);
	ASSERT_LE(0, fd);
	EXPECT_EQ(-EINVAL, tt_grant(fd, self->ctx, 0, NULL));
	memset(&g, 0, sizeof(g));
	g.argsz = sizeof(g);
	g.seg_fd = fd;
	g.count = 1;
	g.flags = 1U << 7;
	EXPECT_EQ(-EINVAL, tt_ioctl(self->ctx, TSHM_IOC_GRANT, &g));
	g.flags = 0;
	g.__reserved[0] = 1;
	EXPECT_EQ(-EINVAL, tt_ioctl(self->ctx, TSHM_IOC_GRANT, &g));
	g.__reserved[0] = 0;
	g.argsz = 8;
	EXPECT_EQ(-EINVAL, tt_ioctl(self->ctx, TSHM_IOC_GRANT, &g));
	g.argsz = sizeof(g);
	/* An address without BY_ADDR, an fd with it. */
	g.addr = 4096;
	EXPECT_EQ(-EINVAL, tt_ioctl(self->ctx, TSHM_IOC_GRANT, &g));
	g.addr = 0;
	p = mmap(NULL, PG, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	g.flags = TSHM_GRANT_BY_ADDR;
	g.addr = (uintptr_t)p;
	EXPECT_EQ(-EINVAL, tt_ioctl(self->ctx, TSHM_IOC_GRANT, &g));
	munmap(p, PG);

	/* Grants that overflow: the count is unsigned, its maximum checked. */
	EXPECT_EQ(-EOVERFLOW, tt_grant(fd, self->ctx, TSHM_GRANTS_MAX + 1U,
				       NULL));
	EXPECT_EQ(-EOVERFLOW, tt_grant(fd, self->ctx, UINT32_MAX, NULL));
	EXPECT_EQ(0, tt_grant(fd, self->ctx, TSHM_GRANTS_MAX, NULL));
	EXPECT_EQ(-EOVERFLOW, tt_grant(fd, self->ctx, 1, NULL));
	EXPECT_EQ(0, tt_drop(self->ctx, id, TSHM_GRANTS_MAX));

	/* A read-only holder hands out read-only grants only. */
	EXPECT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));
	ro = tt_attach(self->ctx, id, TSHM_ATTACH_RDONLY, NULL);
	ASSERT_LE(0, ro);
	EXPECT_EQ(-EACCES, tt_grant(ro, self->ctx, 1, NULL));
	EXPECT_EQ(0, tt_grant_flags(ro, self->ctx, 1, TSHM_GRANT_RDONLY,
				    NULL));
	EXPECT_EQ(0, tt_drop_flags(self->ctx, id, 1, TSHM_DROP_RDONLY));
	close(ro);
	close(fd);
}

/*
 * Issue 16, finding 7: a GRANT that fails writes nothing, and a GRANT
 * never writes its argument, so it cannot fail with EFAULT after the
 * grants were made: it works from a read-only page.
 */
TEST_F(seg, grant_writes_no_user_memory)
{
	struct tshm_grant *g;
	uint64_t id = 0;
	int fd;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, PG, 0, "g7", &id);
	ASSERT_LE(0, fd);
	g = mmap(NULL, PG, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, g);
	g->argsz = sizeof(*g);
	g->seg_fd = fd;
	g->count = 2;
	ASSERT_EQ(0, mprotect(g, PG, PROT_READ));
	EXPECT_EQ(2, ioctl(self->ctx, TSHM_IOC_GRANT, g));
	EXPECT_EQ(0, tt_drop(self->ctx, id, 2));
	munmap(g, PG);
	close(fd);
}

TEST_F(seg, attach_drop_errors)
{
	struct tshm_attach a;
	struct tshm_drop d;
	uint64_t id = 0;
	int fd;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, PG, 0, "ae", &id);
	ASSERT_LE(0, fd);
	/* Never existed, exists but not granted: the same -ENOENT. */
	EXPECT_EQ(-ENOENT, tt_attach(self->ctx, UINT64_MAX, 0, NULL));
	EXPECT_EQ(-ENOENT, tt_attach(self->ctx, id, 0, NULL));
	EXPECT_EQ(-ENOENT, tt_drop(self->ctx, id, 1));
	EXPECT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));

	memset(&a, 0, sizeof(a));
	a.argsz = sizeof(a);
	a.id = id;
	a.flags = 1U << 9;
	EXPECT_EQ(-EINVAL, tt_ioctl(self->ctx, TSHM_IOC_ATTACH, &a));
	a.flags = 0;
	a.__reserved[1] = 1;
	EXPECT_EQ(-EINVAL, tt_ioctl(self->ctx, TSHM_IOC_ATTACH, &a));
	a.__reserved[1] = 0;
	EXPECT_EQ(-EFAULT, tt_ioctl(self->ctx, TSHM_IOC_ATTACH, (void *)16));

	EXPECT_EQ(-EINVAL, tt_drop(self->ctx, id, 0));
	memset(&d, 0, sizeof(d));
	d.argsz = sizeof(d);
	d.id = id;
	d.count = 1;
	d.flags = 1U << 5;
	EXPECT_EQ(-EINVAL, tt_ioctl(self->ctx, TSHM_IOC_DROP, &d));
	d.flags = 0;
	d.__pad = 1;
	EXPECT_EQ(-EINVAL, tt_ioctl(self->ctx, TSHM_IOC_DROP, &d));
	/* Only a writable grant is held: none of the read-only kind. */
	EXPECT_EQ(-EINVAL, tt_drop_flags(self->ctx, id, 1, TSHM_DROP_RDONLY));
	/* The failed calls consumed nothing. */
	EXPECT_EQ(0, tt_drop(self->ctx, id, 1));
	close(fd);
}

/* Read-only grants: chosen by the producer, attach read-only only. */
TEST_F(seg, read_only_grants)
{
	struct tshm_info info;
	uint64_t id = 0;
	int fd, ro, rw;
	char *p;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, PG, 0, "rog", &id);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_grant_flags(fd, self->ctx, 1, TSHM_GRANT_RDONLY,
				    NULL));
	/* Not as a writable holder, and that failure consumed nothing. */
	EXPECT_EQ(-EACCES, tt_attach(self->ctx, id, 0, NULL));
	EXPECT_EQ(-EINVAL, tt_drop(self->ctx, id, 1));
	ro = tt_attach(self->ctx, id, TSHM_ATTACH_RDONLY, NULL);
	ASSERT_LE(0, ro);
	EXPECT_EQ(O_RDONLY, fcntl(ro, F_GETFL) & O_ACCMODE);
	ASSERT_EQ(0, tt_info(ro, &info));
	EXPECT_EQ(TSHM_INFO_RDONLY, info.flags);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, PG, PROT_READ | PROT_WRITE,
				   MAP_SHARED, ro, 0));
	EXPECT_EQ(EACCES, errno);
	p = mmap(NULL, PG, PROT_READ, MAP_SHARED, ro, 0);
	ASSERT_NE(MAP_FAILED, p);
	EXPECT_EQ(-1, mprotect(p, PG, PROT_READ | PROT_WRITE));
	EXPECT_EQ(EACCES, errno);
	/* Nor by punching, nor by reopening through /proc. */
	EXPECT_EQ(-1, fallocate(ro, 3, 0, PG));
	EXPECT_EQ(EBADF, errno);
	/* Passed on by its mapping: read-only again. */
	close(ro);
	EXPECT_EQ(-EACCES, tt_grant_addr(p, self->ctx, 1, 0, NULL));
	EXPECT_EQ(0, tt_grant_addr(p, self->ctx, 1, TSHM_GRANT_RDONLY, NULL));
	munmap(p, PG);
	/* A writable grant may still be attached read-only. */
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));
	rw = tt_attach(self->ctx, id, 0, NULL);
	ASSERT_LE(0, rw);
	EXPECT_EQ(O_RDWR, fcntl(rw, F_GETFL) & O_ACCMODE);
	close(rw);
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));
	ASSERT_EQ(0, tt_drop_flags(self->ctx, id, 1, TSHM_DROP_RDONLY));
	ro = tt_attach(self->ctx, id, TSHM_ATTACH_RDONLY, NULL);
	ASSERT_LE(0, ro);
	EXPECT_EQ(-ENOENT, tt_attach(self->ctx, id, 0, NULL));
	close(ro);
	close(fd);
}

TEST_F(seg, mmap_rules)
{
	uint64_t id = 0;
	char *p;
	int fd, ro;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, 4 * PG, 0, "mm", &id);
	ASSERT_LE(0, fd);
	/* Past the end: -EINVAL (vma_test's past_end_merge_is_sigbus: the
	 * core may merge without asking ->mmap). */
	EXPECT_EQ(MAP_FAILED, mmap(NULL, 5 * PG, PROT_READ, MAP_SHARED, fd, 0));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, PG, PROT_READ, MAP_SHARED, fd, 4 * PG));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, 2 * PG, PROT_READ, MAP_SHARED, fd,
				   3 * PG));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, PG, PROT_READ, MAP_SHARED, fd,
				   (off_t)1 << 60));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, PG, PROT_READ, MAP_PRIVATE, fd, 0));
	EXPECT_EQ(EINVAL, errno);
	p = mmap(NULL, PG, PROT_READ, MAP_SHARED, fd, 3 * PG);
	ASSERT_NE(MAP_FAILED, p);
	munmap(p, PG);

	/* The size is fixed (sealed): no truncate, no growing fallocate. */
	EXPECT_EQ(-1, ftruncate(fd, 8 * PG));
	EXPECT_EQ(EPERM, errno);
	EXPECT_EQ(-1, ftruncate(fd, 0));
	EXPECT_EQ(EPERM, errno);
	EXPECT_EQ(-1, fallocate(fd, 0, 0, 8 * PG));
	EXPECT_EQ(EPERM, errno);
	EXPECT_EQ(0, fallocate(fd, 0, 0, 4 * PG));
	char c, path[64];

	EXPECT_EQ(-1, read(fd, &c, 1));
	EXPECT_EQ(EINVAL, errno);
	EXPECT_EQ(-1, write(fd, &c, 1));
	EXPECT_EQ(EINVAL, errno);
	/* No way back in through /proc, read-only or not. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	EXPECT_EQ(-1, open(path, O_RDONLY));
	EXPECT_EQ(ENXIO, errno);

	/* Read-only holders: no PROT_WRITE, not even by mprotect. */
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 1, NULL));
	ro = tt_attach(self->ctx, id, TSHM_ATTACH_RDONLY, NULL);
	ASSERT_LE(0, ro);
	EXPECT_EQ(MAP_FAILED, mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED,
				   ro, 0));
	EXPECT_EQ(EACCES, errno);
	p = mmap(NULL, PG, PROT_READ, MAP_SHARED, ro, 0);
	ASSERT_NE(MAP_FAILED, p);
	EXPECT_EQ(-1, mprotect(p, PG, PROT_READ | PROT_WRITE));
	EXPECT_EQ(EACCES, errno);
	struct tshm_info info;

	ASSERT_EQ(0, tt_info(ro, &info));
	EXPECT_EQ(TSHM_INFO_RDONLY, info.flags);
	munmap(p, PG);
	close(ro);
	close(fd);
}

TEST_F(seg, mremap_split_madvise)
{
	struct tshm_info info;
	uint32_t *w;
	uint64_t id = 0;
	char *p, *q;
	int fd;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, 8 * PG, 0, "mr", &id);
	ASSERT_LE(0, fd);
	p = mmap(NULL, 8 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	tt_fill(p, 8 * PG, 7);
	/* Split by munmap and mprotect, moved by mremap: one holder still. */
	ASSERT_EQ(0, munmap(p + 2 * PG, PG));
	ASSERT_EQ(0, mprotect(p + 4 * PG, PG, PROT_READ));
	q = mremap(p + 5 * PG, 3 * PG, 3 * PG, MREMAP_MAYMOVE | MREMAP_FIXED,
		   p + 64 * PG);
	ASSERT_NE(MAP_FAILED, q);
	w = (uint32_t *)q;
	EXPECT_EQ(7u ^ (uint32_t)((5 * PG / 4) * 2654435761u), w[0]);
	ASSERT_EQ(0, tt_info(fd, &info));
	EXPECT_EQ(1, info.holders);
	/* Growing in place past the segment is refused by mremap itself or
	 * would fault past EOF; shrinking works. */
	ASSERT_EQ(q, mremap(q, 3 * PG, 2 * PG, 0));

	/* MADV_DONTNEED drops our PTEs only; MADV_REMOVE punches the file. */
	w = (uint32_t *)p;
	EXPECT_EQ(0, madvise(p, PG, MADV_DONTNEED));
	EXPECT_EQ(7u, w[0]);
	EXPECT_EQ(0, madvise(p + PG, PG, MADV_REMOVE));
	EXPECT_EQ(0u, w[PG / 4]);

	close(fd);
	ASSERT_EQ(0, munmap(p, 2 * PG));
	ASSERT_EQ(0, munmap(p + 3 * PG, 2 * PG));
	/* Only the moved VMA keeps the holder, and so the segment. */
	EXPECT_EQ(1, tt_proc_has(id));
	ASSERT_EQ(0, munmap(q, 2 * PG));
	EXPECT_EQ(0, tt_proc_has(id));
}

TEST_F(seg, fdinfo_and_maps)
{
	char path[64], buf[4096], want[96];
	uint64_t id = 0;
	ssize_t n;
	void *p;
	int fd, f;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, PG, 0, "fdinfo name", &id);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_grant(fd, self->ctx, 2, NULL));

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = open(path, O_RDONLY);
	ASSERT_LE(0, f);
	n = read(f, buf, sizeof(buf) - 1);
	close(f);
	ASSERT_LT(0, n);
	buf[n] = 0;
	snprintf(want, sizeof(want), "tshm-id:\t%" PRIu64 "\n", id);
	EXPECT_NE(NULL, strstr(buf, want)) TH_LOG("%s", buf);
	EXPECT_NE(NULL, strstr(buf, "tshm-size:\t4096\n"));
	EXPECT_NE(NULL, strstr(buf, "tshm-holders:\t1\n"));
	EXPECT_NE(NULL, strstr(buf, "tshm-grants:\t2\n"));
	EXPECT_NE(NULL, strstr(buf, "tshm-name:\tfdinfo\\040name\n"));

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", self->ctx);
	f = open(path, O_RDONLY);
	ASSERT_LE(0, f);
	n = read(f, buf, sizeof(buf) - 1);
	close(f);
	ASSERT_LT(0, n);
	buf[n] = 0;
	snprintf(want, sizeof(want), "tshm-grant:\t%" PRIu64 " 2 0 4096 1 fdinfo\\040name\n", id);
	EXPECT_NE(NULL, strstr(buf, want)) TH_LOG("%s", buf);

	/* The fd's link and the mapping's path both name the segment. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, buf, sizeof(buf) - 1);
	ASSERT_LT(0, n);
	buf[n] = 0;
	snprintf(want, sizeof(want), "tshm:%" PRIu64 ":fdinfo name", id);
	EXPECT_NE(NULL, strstr(buf, want)) TH_LOG("%s", buf);

	p = mmap(NULL, PG, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, p);
	f = open("/proc/self/maps", O_RDONLY);
	ASSERT_LE(0, f);
	n = read(f, buf, sizeof(buf) - 1);
	close(f);
	ASSERT_LT(0, n);
	buf[n] = 0;
	snprintf(want, sizeof(want), "/tshm:%" PRIu64 ":fdinfo name", id);
	EXPECT_NE(NULL, strstr(buf, want)) TH_LOG("%s", buf);
	munmap(p, PG);
	close(fd);
}

TEST_F(seg, huge_rounding)
{
	struct tshm_info info;
	int fd;

	TT_SETUP_SKIPPED();
	fd = tt_create(self->ctx, 1, TSHM_CREATE_HUGE, "h", NULL);
	if (fd == -EOPNOTSUPP)
		SKIP(return, "no huge page mount (no THP)");
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, tt_info(fd, &info));
	EXPECT_EQ(2 * TT_MIB, info.size);
	EXPECT_EQ(TSHM_CREATE_HUGE, info.create_flags);
	close(fd);
}

TEST_HARNESS_MAIN
