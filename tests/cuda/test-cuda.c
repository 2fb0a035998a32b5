// SPDX-License-Identifier: GPL-2.0
/*
 * libtshm-cuda suite.  Every test that needs a GPU probes for one in a
 * forked child first (CUDA must not be initialized before fork) and prints
 * a kselftest SKIP with the reason when there is none.  Processes are
 * forked before any of them opens CUDA; the test process itself is the
 * producer where one is needed.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include <tshm.h>
#include <tshm-cuda.h>

#include "kselftest_harness.h"

/*
 * Device-side helpers: kernels (tk-kernels.cu) on a GPU; host loops over
 * the fake driver's host memory in test-cuda-fake (built from this file
 * with -DTSHM_CUDA_FAKE, run against tests/cuda/fake-cuda.c).
 */
#ifndef TSHM_CUDA_FAKE
#include "tk-kernels.h"
#define FAKE 0
#define dev_set_device	tk_set_device
#define dev_fill	tk_fill
#define dev_check	tk_check
#define dev_malloc	tk_malloc
#define dev_free	tk_free
#define dev_errstr	tk_errstr
#else
#include <dlfcn.h>
#include <limits.h>
#define FAKE 1

/* Point libtshm-cuda at the fake driver next to this binary. */
__attribute__((constructor)) static void use_fake_driver(void)
{
	char exe[PATH_MAX], *slash;
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 32);

	char tag[32];

	/* the fake's cuMemGetInfo counts this run's memory only */
	snprintf(tag, sizeof(tag), "%d", (int)getpid());
	setenv("TSHM_FAKE_VRAM_TAG", tag, 0);
	if (getenv("TSHM_CUDA_DRIVER") || n <= 0)
		return;
	exe[n] = 0;
	slash = strrchr(exe, '/');
	strcpy(slash ? slash + 1 : exe, "libfake-cuda.so");
	setenv("TSHM_CUDA_DRIVER", exe, 1);
}

static uint64_t host_word(uint64_t seed, uint64_t i)
{
	uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ULL;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static int dev_set_device(int ordinal)
{
	return 0;
}

static int dev_fill(void *p, size_t bytes, uint64_t seed)
{
	uint64_t *w = p;
	size_t i;

	for (i = 0; i < bytes / 8; i++)
		w[i] = host_word(seed, i);
	return 0;
}

static int dev_check(const void *p, size_t bytes, uint64_t seed,
		     uint64_t *bad)
{
	const uint64_t *w = p;
	size_t i;

	*bad = 0;
	for (i = 0; i < bytes / 8; i++)
		if (w[i] != host_word(seed, i))
			++*bad;
	return 0;
}

static void *fake_sym(const char *name)
{
	void *dl = dlopen(getenv("TSHM_CUDA_DRIVER"), RTLD_NOW | RTLD_LOCAL);

	return dl ? dlsym(dl, name) : NULL;
}

static int dev_malloc(void **p, size_t bytes)
{
	int (*fn)(void **, size_t) = (int (*)(void **, size_t))
		fake_sym("tshm_fake_malloc");

	return fn ? fn(p, bytes) : 2;
}

static int dev_free(void *p)
{
	int (*fn)(void *) = (int (*)(void *))fake_sym("tshm_fake_free");

	return fn ? fn(p) : 1;
}

static const char *dev_errstr(int err)
{
	return err ? "fake driver helper failed" : "no error";
}
#endif

/* ---- helpers ---- */

struct probe {
	int ret;
	int vmm;
	int64_t gran;
	char msg[400];
};

static void probe_gpu(struct probe *pr)
{
	int p[2];
	pid_t pid;

	memset(pr, 0, sizeof(*pr));
	if (pipe(p)) {
		pr->ret = -errno;
		snprintf(pr->msg, sizeof(pr->msg), "pipe: %s", strerror(errno));
		return;
	}
	pid = fork();
	if (pid == 0) {
		struct tshm_cuda *cu;
		struct probe r = { 0 };

		r.ret = tshm_cuda_open(0, &cu);
		if (r.ret) {
			snprintf(r.msg, sizeof(r.msg), "%s (%s)",
				 tshm_cuda_last_error(),
				 tshm_cuda_strerror(r.ret));
		} else {
			r.vmm = tshm_cuda_vmm_supported(cu);
			r.gran = r.vmm ? tshm_cuda_granularity(cu) : 0;
			tshm_cuda_close(cu);
		}
		if (write(p[1], &r, sizeof(r)) != sizeof(r))
			_exit(1);
		_exit(0);
	}
	close(p[1]);
	if (pid < 0 || read(p[0], pr, sizeof(*pr)) != sizeof(*pr)) {
		pr->ret = -EIO;
		snprintf(pr->msg, sizeof(pr->msg), "GPU probe process failed");
	}
	close(p[0]);
	if (pid > 0)
		waitpid(pid, NULL, 0);
}

/* SKIP (from a TEST body) unless a GPU, and VMM fd export if @vmm, works. */
#define NEED_GPU(pr, need_vmm) do {					\
		probe_gpu(pr);						\
		if ((pr)->ret)						\
			SKIP(return, "no usable GPU: %s", (pr)->msg);	\
		if ((need_vmm) && !(pr)->vmm)				\
			SKIP(return, "GPU cannot export VMM memory as "	\
			     "POSIX fds");				\
	} while (0)

/* A buffer big enough to see in cuMemGetInfo: 256 MiB (16 on the fake). */
static size_t big_size(const struct probe *pr)
{
	size_t want = FAKE ? 16UL << 20 : 256UL << 20;

	return (want + pr->gran - 1) / pr->gran * pr->gran;
}

/* In child processes: report and exit non-zero. */
#define CK(cond, ...) do {						\
		if (!(cond)) {						\
			fprintf(stderr, "# %s:%d: child %d: ", __FILE__,	\
				__LINE__, getpid());			\
			fprintf(stderr, __VA_ARGS__);			\
			fprintf(stderr, " [%s]\n", tshm_cuda_last_error()); \
			_exit(1);					\
		}							\
	} while (0)

enum {
	V_C_READY, V_C_GOT, V_FREED, V_REQ, V_DONE, V_FREE, V_STOP,
	V_COUNT, V_IMPORTS, V_HITS, V_MAX = 16
};

struct shared {
	_Atomic uint64_t v[V_MAX];
};

static struct shared *shared_create(struct tshm_ctx *ctx, struct tshm_seg **seg)
{
	if (tshm_seg_create(ctx, 4096, "cuda-test", 0, seg))
		return NULL;
	return memset(tshm_seg_data(*seg), 0, 4096);
}

/* Wait until v[i] >= want; 0 or -ETIMEDOUT. */
static int wait_v(struct shared *sh, int i, uint64_t want, int timeout_ms)
{
	while (atomic_load(&sh->v[i]) < want) {
		if (timeout_ms-- <= 0)
			return -ETIMEDOUT;
		usleep(1000);
	}
	return 0;
}

static struct tshm_cuda *child_cuda(int ordinal)
{
	struct tshm_cuda *cu;
	int ret;

	/* never outlive a test that failed half-way */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	ret = tshm_cuda_open(ordinal, &cu);

	CK(!ret, "tshm_cuda_open(%d): %d", ordinal, ret);
	ret = dev_set_device(ordinal);
	CK(!ret, "cudaSetDevice: %s", dev_errstr(ret));
	return cu;
}

static int exit_code(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return WEXITSTATUS(st);
}

/* ---- no GPU needed ---- */

TEST(errno_mapping)
{
	ASSERT_EQ(0, tshm_cuda_errno(CUDA_SUCCESS));
	ASSERT_EQ(-EINVAL, tshm_cuda_errno(CUDA_ERROR_INVALID_VALUE));
	ASSERT_EQ(-ENOMEM, tshm_cuda_errno(CUDA_ERROR_OUT_OF_MEMORY));
	ASSERT_EQ(-ENODEV, tshm_cuda_errno(CUDA_ERROR_NO_DEVICE));
	ASSERT_EQ(-ENODEV, tshm_cuda_errno(CUDA_ERROR_STUB_LIBRARY));
	ASSERT_EQ(-ENODEV, tshm_cuda_errno(CUDA_ERROR_INVALID_DEVICE));
	ASSERT_EQ(-ENOSYS, tshm_cuda_errno(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER));
	ASSERT_EQ(-EOPNOTSUPP, tshm_cuda_errno(CUDA_ERROR_NOT_SUPPORTED));
	ASSERT_EQ(-EBADF, tshm_cuda_errno(CUDA_ERROR_INVALID_HANDLE));
	ASSERT_EQ(-EEXIST, tshm_cuda_errno(CUDA_ERROR_ALREADY_MAPPED));
	ASSERT_EQ(-EXDEV, tshm_cuda_errno(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED));
	ASSERT_EQ(-EPERM, tshm_cuda_errno(CUDA_ERROR_NOT_PERMITTED));
	ASSERT_EQ(-ETIMEDOUT, tshm_cuda_errno(CUDA_ERROR_TIMEOUT));
	ASSERT_EQ(-EFAULT, tshm_cuda_errno(CUDA_ERROR_ILLEGAL_ADDRESS));
	ASSERT_EQ(-EIO, tshm_cuda_errno(CUDA_ERROR_ECC_UNCORRECTABLE));
	ASSERT_EQ(-EIO, tshm_cuda_errno(CUDA_ERROR_UNKNOWN));
	ASSERT_NE(NULL, strstr(tshm_cuda_strerror(-EXDEV), "device"));
	ASSERT_NE(NULL, tshm_cuda_strerror(-EPIPE));
}

TEST(uuid_string)
{
	uint8_t u[16];
	char s[48];
	int i;

	for (i = 0; i < 16; i++)
		u[i] = (uint8_t)(i * 17);
	tshm_cuda_uuid_str(u, s, sizeof(s));
	ASSERT_STREQ("GPU-00112233-4455-6677-8899-aabbccddeeff", s);
}

/*
 * Without a GPU: open fails with -ENODEV (or -ENOSYS) and says why.  With
 * one: open, describe the device, close.
 */
TEST(open_reports_reason)
{
	struct tshm_cuda *cu = NULL;
	uint8_t u[16];
	char s[48];
	pid_t pid;

	/* in a child: the driver must not be initialized in this process */
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		int ret = tshm_cuda_open(0, &cu);

		if (ret) {
			CK(ret == -ENODEV || ret == -ENOSYS,
			   "unexpected %d", ret);
			CK(strlen(tshm_cuda_last_error()) > 5, "no message");
			CK(!cu, "out set on failure");
			printf("# no GPU: tshm_cuda_open: %d (%s): %s\n", ret,
			       tshm_cuda_strerror(ret),
			       tshm_cuda_last_error());
			fflush(stdout);
			_exit(0);
		}
		tshm_cuda_uuid(cu, u);
		tshm_cuda_uuid_str(u, s, sizeof(s));
		printf("# device %d %s vmm %d granularity %lld\n",
		       tshm_cuda_device(cu), s, tshm_cuda_vmm_supported(cu),
		       (long long)(tshm_cuda_vmm_supported(cu) ?
				   tshm_cuda_granularity(cu) : 0));
		CK(tshm_cuda_open(1000, &cu) == -ENODEV, "device 1000");
		tshm_cuda_close(cu);
		fflush(stdout);
		_exit(0);
	}
	ASSERT_EQ(0, exit_code(pid));
}

/* ---- VMM path ---- */

/*
 * Producer kernel writes, producer sends and frees its copy at once; only
 * then does the consumer receive, and its kernel reads the right data.
 */
TEST(vmm_roundtrip)
{
	struct tshm_cuda_chan *ch;
	struct tshm_cuda_buf *b;
	struct tshm_cuda *cu;
	struct tshm_seg *seg;
	struct tshm_ctx *ctx;
	struct shared *sh;
	struct probe pr;
	uint64_t seed = 0x5eed0001;
	size_t size;
	pid_t pid;

	NEED_GPU(&pr, 1);
	size = (size_t)pr.gran * 4;
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_chan_create(ctx, 4, 64, &ch));
	ASSERT_NE(NULL, sh = shared_create(ctx, &seg));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		uint64_t s = 0, bad = ~0ULL;
		struct tshm_cuda_stats st;
		struct pollfd pfd;
		size_t len = 0;
		int ret;

		CK(!wait_v(sh, V_FREED, 1, 20000), "producer never freed");
		ret = tshm_cuda_recv(ch, ccu, &b, &s, sizeof(s), &len, 20000);
		CK(!ret, "recv %d", ret);
		CK(len == 8 && s == seed, "payload");
		CK(tshm_cuda_buf_size(b) == size, "size");
		CK(tshm_cuda_buf_kind(b) == TSHM_CUDA_VMM, "kind");
		ret = dev_check(tshm_cuda_buf_ptr(b), size, s, &bad);
		CK(!ret, "check kernel: %s", dev_errstr(ret));
		CK(!bad, "%llu words differ", (unsigned long long)bad);
		/* only the producer sends it and learns of its release */
		CK(tshm_cuda_send(ch, b, NULL, 0, 0) == -EOPNOTSUPP, "resend");
		CK(tshm_cuda_buf_wait_released(b, 0) == -EOPNOTSUPP, "wait");
		CK(tshm_cuda_buf_release_pollfds(b, &pfd, 1) == -EOPNOTSUPP,
		   "pollfds");
		tshm_cuda_buf_unref(b);
		/* the producer's copy is gone: the import goes now, not later */
		tshm_cuda_stats(ccu, &st);
		CK(st.imports == 1 && st.cached == 0 && st.evictions == 1,
		   "imports %llu cached %llu evictions %llu",
		   (unsigned long long)st.imports,
		   (unsigned long long)st.cached,
		   (unsigned long long)st.evictions);
		tshm_cuda_close(ccu);
		_exit(0);
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu)) TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, ctx, size, &b))
		TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, dev_fill(tshm_cuda_buf_ptr(b), size, seed));
	ASSERT_EQ(0, tshm_cuda_send(ch, b, &seed, sizeof(seed), 5000));
	tshm_cuda_buf_unref(b);		/* the producer's copy is gone */
	atomic_store(&sh->v[V_FREED], 1);
	ASSERT_EQ(0, exit_code(pid));
	tshm_cuda_close(cu);
	tshm_cuda_chan_destroy(ch);
	tshm_seg_unref(seg);
	tshm_ctx_close(ctx);
}

/*
 * The producer sends and exits, its context gone, before the consumer
 * receives: the fd in flight keeps the memory, the consumer reads the
 * data, and when it lets go the memory goes back (cuMemGetInfo in the
 * consumer, before and after).
 */
TEST(vmm_producer_exits)
{
	struct tshm_cuda_chan *ch;
	struct tshm_ctx *ctx;
	struct probe pr;
	size_t size;
	pid_t pid;

	NEED_GPU(&pr, 1);
	size = big_size(&pr);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_chan_create(ctx, 4, 64, &ch));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *cu = child_cuda(0);
		struct tshm_cuda_buf *b;
		uint64_t seed = 0xe417;
		int ret;

		ret = tshm_cuda_buf_alloc(cu, ctx, size, &b);
		CK(!ret, "alloc %d", ret);
		ret = dev_fill(tshm_cuda_buf_ptr(b), size, seed);
		CK(!ret, "fill %s", dev_errstr(ret));
		ret = tshm_cuda_send(ch, b, &seed, sizeof(seed), 5000);
		CK(!ret, "send %d", ret);
		tshm_cuda_buf_unref(b);
		tshm_cuda_close(cu);
		_exit(0);
	}
	ASSERT_EQ(0, exit_code(pid));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *cu = child_cuda(0);
		struct tshm_cuda_stats st;
		struct tshm_cuda_buf *b;
		size_t held, after, total;
		uint64_t s, bad;
		int ret;

		ret = tshm_cuda_recv(ch, cu, &b, &s, sizeof(s), NULL, 20000);
		CK(!ret, "recv %d", ret);
		ret = dev_check(tshm_cuda_buf_ptr(b), size, s, &bad);
		CK(!ret && !bad, "check: %d, %llu bad", ret,
		   (unsigned long long)bad);
		CK(!tshm_cuda_mem_info(cu, &held, &total), "mem info");
		tshm_cuda_buf_unref(b);
		tshm_cuda_stats(cu, &st);
		CK(st.cached == 0 && st.evictions == 1, "import kept");
		CK(!tshm_cuda_mem_info(cu, &after, &total), "mem info");
		printf("# free: %zu MiB held, %zu MiB after unref\n",
		       held >> 20, after >> 20);
		fflush(stdout);
		CK(after >= held + size * 3 / 4, "memory not back");
		tshm_cuda_close(cu);
		_exit(0);
	}
	ASSERT_EQ(0, exit_code(pid));
	tshm_cuda_chan_destroy(ch);
	tshm_ctx_close(ctx);
}

/*
 * The same buffer sent 20 times: the receiver imports it once and hits its
 * cache 19 times (no CUDA call), seeing the new contents each time.
 */
TEST(vmm_receiver_cache)
{
	struct tshm_cuda_chan *ch;
	struct tshm_cuda_buf *b;
	struct tshm_cuda *cu;
	struct tshm_ctx *ctx;
	struct probe pr;
	uint64_t i;
	pid_t pid;

	NEED_GPU(&pr, 1);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_chan_create(ctx, 4, 64, &ch));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		struct tshm_cuda_stats st;
		uint64_t s, bad, n = 0, id = 0;
		int ret;

		for (;;) {
			ret = tshm_cuda_recv(ch, ccu, &b, &s, sizeof(s), NULL,
					     20000);
			if (ret == -EPIPE)
				break;
			CK(!ret, "recv %d", ret);
			CK(!id || id == tshm_cuda_buf_id(b), "id changed");
			id = tshm_cuda_buf_id(b);
			ret = dev_check(tshm_cuda_buf_ptr(b),
				       tshm_cuda_buf_size(b), s, &bad);
			CK(!ret && !bad, "check: %d, %llu bad", ret,
			   (unsigned long long)bad);
			tshm_cuda_buf_unref(b);
			n++;
		}
		tshm_cuda_stats(ccu, &st);
		CK(n == 20, "got %llu", (unsigned long long)n);
		CK(st.imports == 1 && st.cache_hits == 19,
		   "imports %llu hits %llu", (unsigned long long)st.imports,
		   (unsigned long long)st.cache_hits);
		tshm_cuda_close(ccu);
		_exit(0);
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu));
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, ctx, (size_t)pr.gran, &b));
	for (i = 0; i < 20; i++) {
		uint64_t seed = 1000 + i;

		ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 20000));
		ASSERT_EQ(0, dev_fill(tshm_cuda_buf_ptr(b), pr.gran, seed));
		ASSERT_EQ(0, tshm_cuda_send(ch, b, &seed, sizeof(seed), 5000));
	}
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 20000));
	tshm_cuda_chan_close(ch);
	ASSERT_EQ(0, exit_code(pid));
	tshm_cuda_buf_unref(b);
	tshm_cuda_close(cu);
	tshm_cuda_chan_destroy(ch);
	tshm_ctx_close(ctx);
}

/*
 * A consumer holding a 256 MiB buffer is SIGKILLed: the producer's release
 * wait returns, and once the producer drops its copy cuMemGetInfo in a
 * third process shows the memory back.
 */
TEST(vmm_consumer_killed)
{
	struct tshm_cuda_chan *ch;
	struct tshm_cuda_buf *b;
	struct tshm_cuda *cu;
	struct tshm_seg *seg;
	struct tshm_ctx *ctx;
	struct shared *sh;
	struct probe pr;
	uint64_t seed = 77, base, held, after = 0;
	size_t size;
	pid_t cons, obs;
	int i;

	NEED_GPU(&pr, 1);
	size = big_size(&pr);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_chan_create(ctx, 4, 64, &ch));
	ASSERT_NE(NULL, sh = shared_create(ctx, &seg));
	cons = fork();
	ASSERT_GE(cons, 0);
	if (cons == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		uint64_t s, bad;
		int ret;

		atomic_store(&sh->v[V_C_READY], 1);
		ret = tshm_cuda_recv(ch, ccu, &b, &s, sizeof(s), NULL, 20000);
		CK(!ret, "recv %d", ret);
		ret = dev_check(tshm_cuda_buf_ptr(b), size, s, &bad);
		CK(!ret && !bad, "check");
		atomic_store(&sh->v[V_C_GOT], 1);
		for (;;)
			pause();
	}
	obs = fork();
	ASSERT_GE(obs, 0);
	if (obs == 0) {
		struct tshm_cuda *ocu = child_cuda(0);
		size_t fr, tot;

		while (!atomic_load(&sh->v[V_STOP])) {
			uint64_t req = atomic_load(&sh->v[V_REQ]);

			if (req != atomic_load(&sh->v[V_DONE])) {
				CK(!tshm_cuda_mem_info(ocu, &fr, &tot),
				   "mem info");
				atomic_store(&sh->v[V_FREE], fr);
				atomic_store(&sh->v[V_DONE], req);
			}
			usleep(1000);
		}
		tshm_cuda_close(ocu);
		_exit(0);
	}
#define ASK_FREE() ({							\
		uint64_t __r = atomic_fetch_add(&sh->v[V_REQ], 1) + 1;	\
		ASSERT_EQ(0, wait_v(sh, V_DONE, __r, 10000));		\
		atomic_load(&sh->v[V_FREE]);				\
	})
	ASSERT_EQ(0, tshm_cuda_open(0, &cu));
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(0, wait_v(sh, V_C_READY, 1, 20000));
	usleep(200000);		/* the consumer's context is settled */
	base = ASK_FREE();
	ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, ctx, size, &b))
		TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, dev_fill(tshm_cuda_buf_ptr(b), size, seed));
	ASSERT_EQ(0, tshm_cuda_send(ch, b, &seed, sizeof(seed), 5000));
	ASSERT_EQ(0, wait_v(sh, V_C_GOT, 1, 20000));
	held = ASK_FREE();
	TH_LOG("free: %llu MiB before, %llu MiB held",
	       (unsigned long long)(base >> 20),
	       (unsigned long long)(held >> 20));
	ASSERT_LE(held, base - size * 3 / 4);
	ASSERT_EQ(-EAGAIN, tshm_cuda_buf_wait_released(b, 0));
	kill(cons, SIGKILL);
	ASSERT_EQ(128 + SIGKILL, exit_code(cons));
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 10000));
	tshm_cuda_buf_unref(b);
	for (i = 0; i < 100; i++) {
		after = ASK_FREE();
		if (after >= base - size / 4)
			break;
		usleep(50000);
	}
	TH_LOG("free after kill + producer unref: %llu MiB",
	       (unsigned long long)(after >> 20));
	ASSERT_GE(after, base - size / 4);
	atomic_store(&sh->v[V_STOP], 1);
	ASSERT_EQ(0, exit_code(obs));
	tshm_cuda_close(cu);
	tshm_cuda_chan_destroy(ch);
	tshm_seg_unref(seg);
	tshm_ctx_close(ctx);
}

/* ---- legacy path ---- */

/* cudaMalloc memory, a sub-range wrapped: consumer kernel reads it. */
TEST(legacy_roundtrip)
{
	struct tshm_cuda_chan *ch;
	struct tshm_cuda_buf *b;
	struct tshm_cuda *cu;
	struct tshm_ctx *ctx;
	struct probe pr;
	uint64_t seed = 0x1e9ac7;
	size_t size = 3UL << 20, n = size - 8192;
	void *d = NULL;
	pid_t pid;

	NEED_GPU(&pr, 0);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_chan_create(ctx, 4, 64, &ch));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		uint64_t s, bad;
		int ret;

		ret = tshm_cuda_recv(ch, ccu, &b, &s, sizeof(s), NULL, 20000);
		CK(!ret, "recv %d", ret);
		CK(tshm_cuda_buf_kind(b) == TSHM_CUDA_LEGACY, "kind");
		CK(tshm_cuda_buf_size(b) == n, "size");
		ret = dev_check(tshm_cuda_buf_ptr(b), n, s, &bad);
		CK(!ret && !bad, "check: %d, %llu bad", ret,
		   (unsigned long long)bad);
		tshm_cuda_buf_unref(b);
		tshm_cuda_close(ccu);
		_exit(0);
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu));
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(0, dev_malloc(&d, size));
	ASSERT_EQ(0, dev_fill((char *)d + 4096, n, seed));
	ASSERT_EQ(0, tshm_cuda_buf_wrap(cu, ctx, (char *)d + 4096, n, &b))
		TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, tshm_cuda_send(ch, b, &seed, sizeof(seed), 5000));
	/* the memory is ours: free only once every receiver let go */
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 20000));
	tshm_cuda_buf_unref(b);
	ASSERT_EQ(0, dev_free(d));
	ASSERT_EQ(0, exit_code(pid));
	tshm_cuda_close(cu);
	tshm_cuda_chan_destroy(ch);
	tshm_ctx_close(ctx);
}

/* The consumer is SIGKILLed with the IPC mapping open: the wait returns. */
TEST(legacy_consumer_killed)
{
	struct tshm_cuda_chan *ch;
	struct tshm_cuda_buf *b;
	struct tshm_cuda *cu;
	struct tshm_seg *seg;
	struct tshm_ctx *ctx;
	struct shared *sh;
	struct probe pr;
	uint64_t seed = 5;
	size_t size = 2UL << 20;
	void *d = NULL;
	pid_t pid;

	NEED_GPU(&pr, 0);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_chan_create(ctx, 4, 64, &ch));
	ASSERT_NE(NULL, sh = shared_create(ctx, &seg));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		uint64_t s, bad;
		int ret;

		ret = tshm_cuda_recv(ch, ccu, &b, &s, sizeof(s), NULL, 20000);
		CK(!ret, "recv %d", ret);
		ret = dev_check(tshm_cuda_buf_ptr(b), size, s, &bad);
		CK(!ret && !bad, "check");
		atomic_store(&sh->v[V_C_GOT], 1);
		for (;;)
			pause();
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu));
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(0, dev_malloc(&d, size));
	ASSERT_EQ(0, dev_fill(d, size, seed));
	ASSERT_EQ(0, tshm_cuda_buf_wrap(cu, ctx, d, size, &b));
	ASSERT_EQ(0, tshm_cuda_send(ch, b, &seed, sizeof(seed), 5000));
	ASSERT_EQ(0, wait_v(sh, V_C_GOT, 1, 20000));
	ASSERT_EQ(-EAGAIN, tshm_cuda_buf_wait_released(b, 0));
	kill(pid, SIGKILL);
	ASSERT_EQ(128 + SIGKILL, exit_code(pid));
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 10000));
	tshm_cuda_buf_unref(b);
	ASSERT_EQ(0, dev_free(d));
	tshm_cuda_close(cu);
	tshm_cuda_chan_destroy(ch);
	tshm_seg_unref(seg);
	tshm_ctx_close(ctx);
}

/* ---- many buffers, 2 producers + 2 consumers, pools ---- */

#define MANY_PER_PRODUCER	64
#define MANY_POOL		4

TEST(many_2x2_pools)
{
	struct tshm_cuda_chan *ch;
	struct tshm_seg *seg;
	struct tshm_ctx *ctx;
	struct shared *sh;
	struct probe pr;
	pid_t pids[4];
	int i;

	NEED_GPU(&pr, 1);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_chan_create(ctx, 8, 64, &ch));
	ASSERT_NE(NULL, sh = shared_create(ctx, &seg));
	for (i = 0; i < 4; i++) {
		pids[i] = fork();
		ASSERT_GE(pids[i], 0);
		if (pids[i])
			continue;
		if (i < 2) {	/* producer */
			struct tshm_cuda *cu = child_cuda(0);
			struct tshm_cuda_buf *b, *all[MANY_POOL];
			struct tshm_cuda_pool *pool;
			uint64_t k;
			int ret, j;

			ret = tshm_cuda_pool_create(cu, ctx, MANY_POOL,
						    (size_t)pr.gran, &pool);
			CK(!ret, "pool %d", ret);
			for (k = 0; k < MANY_PER_PRODUCER; k++) {
				uint64_t seed = ((uint64_t)(i + 1) << 32) | k;

				ret = tshm_cuda_pool_get(pool, 20000, &b);
				CK(!ret, "pool get %d", ret);
				ret = dev_fill(tshm_cuda_buf_ptr(b), pr.gran,
					      seed);
				CK(!ret, "fill %s", dev_errstr(ret));
				ret = tshm_cuda_send(ch, b, &seed, 8, 20000);
				CK(!ret, "send %d", ret);
				tshm_cuda_buf_unref(b);
			}
			/* every buffer comes back once released */
			for (j = 0; j < MANY_POOL; j++)
				CK(!tshm_cuda_pool_get(pool, 20000, &all[j]),
				   "buffer %d never came back", j);
			for (j = 0; j < MANY_POOL; j++)
				tshm_cuda_buf_unref(all[j]);
			tshm_cuda_pool_destroy(pool);
			tshm_cuda_close(cu);
			_exit(0);
		} else {	/* consumer */
			struct tshm_cuda *cu = child_cuda(0);
			struct tshm_cuda_stats st;
			struct tshm_cuda_buf *b;
			uint64_t s, bad;
			int ret;

			for (;;) {
				ret = tshm_cuda_recv(ch, cu, &b, &s, 8, NULL,
						     30000);
				if (ret == -EPIPE)
					break;
				CK(!ret, "recv %d", ret);
				ret = dev_check(tshm_cuda_buf_ptr(b),
					       tshm_cuda_buf_size(b), s, &bad);
				CK(!ret && !bad, "seed %#llx: %d, %llu bad",
				   (unsigned long long)s, ret,
				   (unsigned long long)bad);
				tshm_cuda_buf_unref(b);
				atomic_fetch_add(&sh->v[V_COUNT], 1);
			}
			tshm_cuda_stats(cu, &st);
			atomic_fetch_add(&sh->v[V_IMPORTS], st.imports);
			atomic_fetch_add(&sh->v[V_HITS], st.cache_hits);
			tshm_cuda_close(cu);
			_exit(0);
		}
	}
	ASSERT_EQ(0, exit_code(pids[0]));
	ASSERT_EQ(0, exit_code(pids[1]));
	tshm_cuda_chan_close(ch);
	ASSERT_EQ(0, exit_code(pids[2]));
	ASSERT_EQ(0, exit_code(pids[3]));
	TH_LOG("%llu buffers, %llu imports, %llu cache hits",
	       (unsigned long long)sh->v[V_COUNT],
	       (unsigned long long)sh->v[V_IMPORTS],
	       (unsigned long long)sh->v[V_HITS]);
	ASSERT_EQ(2 * MANY_PER_PRODUCER, sh->v[V_COUNT]);
	/* each consumer imports each producer's pool allocation once */
	ASSERT_LE(sh->v[V_IMPORTS], 2 * 2);
	ASSERT_EQ(sh->v[V_COUNT], sh->v[V_IMPORTS] + sh->v[V_HITS]);
	tshm_cuda_chan_destroy(ch);
	tshm_seg_unref(seg);
	tshm_ctx_close(ctx);
}

/* Poll the buffer's release fds until tshm_cuda_buf_wait_released() agrees. */
static int wait_released_by_poll(struct tshm_cuda_buf *b, int tries)
{
	struct pollfd pfd[8];
	int n;

	while (tries-- > 0) {
		n = tshm_cuda_buf_release_pollfds(b, pfd, 8);
		if (n <= 0)
			return n;
		if (poll(pfd, n, 10000) <= 0)
			return -ETIMEDOUT;
		if (!tshm_cuda_buf_wait_released(b, 0))
			return 0;
	}
	return -EAGAIN;
}

/*
 * A pool is one allocation cut into buffers of any size: a consumer that
 * receives two of them imports once.  A buffer comes back at once when
 * the producer's last local reference goes, and through its lease's
 * release fds when the consumer holding it is SIGKILLed.
 */
TEST(vmm_pool_recycles)
{
	struct tshm_cuda_buf *b[3], *x;
	struct tshm_cuda_pool *pool;
	struct tshm_cuda_chan *ch;
	struct tshm_cuda *cu;
	struct tshm_seg *seg;
	struct tshm_ctx *ctx;
	struct pollfd pfd[8];
	struct shared *sh;
	struct probe pr;
	size_t size;
	pid_t pid;
	int i, n;

	NEED_GPU(&pr, 1);
	size = (size_t)pr.gran / 2 + 4096 + 8;	/* no granularity multiple */
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_chan_create(ctx, 4, 64, &ch));
	ASSERT_NE(NULL, sh = shared_create(ctx, &seg));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		struct tshm_cuda_buf *r[2];
		struct tshm_cuda_stats st;
		uint64_t s, bad;
		int k, ret;

		for (k = 0; k < 2; k++) {
			ret = tshm_cuda_recv(ch, ccu, &r[k], &s, 8, NULL,
					     20000);
			CK(!ret, "recv %d", ret);
			CK(tshm_cuda_buf_size(r[k]) == size, "size");
			ret = dev_check(tshm_cuda_buf_ptr(r[k]), size, s, &bad);
			CK(!ret && !bad, "buffer %d: %d, %llu bad", k, ret,
			   (unsigned long long)bad);
		}
		CK(tshm_cuda_buf_ptr(r[0]) != tshm_cuda_buf_ptr(r[1]), "ptr");
		tshm_cuda_stats(ccu, &st);
		CK(st.imports == 1 && st.cache_hits == 1,
		   "imports %llu hits %llu", (unsigned long long)st.imports,
		   (unsigned long long)st.cache_hits);
		atomic_store(&sh->v[V_C_GOT], 1);
		for (;;)
			pause();
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu));
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(-EINVAL, tshm_cuda_pool_create(cu, ctx, 0, size, &pool));
	ASSERT_EQ(-EINVAL, tshm_cuda_pool_create(cu, ctx, 3, 0, &pool));
	ASSERT_EQ(0, tshm_cuda_pool_create(cu, ctx, 3, size, &pool))
		TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(3, tshm_cuda_pool_available(pool));
	for (i = 0; i < 3; i++) {
		ASSERT_EQ(0, tshm_cuda_pool_get(pool, 0, &b[i]));
		ASSERT_EQ(size, tshm_cuda_buf_size(b[i]));
		ASSERT_EQ(0, (uintptr_t)tshm_cuda_buf_ptr(b[i]) % 512);
		ASSERT_EQ(0, tshm_cuda_buf_wait_released(b[i], 0));
	}
	/* disjoint: each starts at least @size after the one before */
	for (i = 1; i < 3; i++)
		ASSERT_LE((char *)tshm_cuda_buf_ptr(b[i - 1]) + size,
			  (char *)tshm_cuda_buf_ptr(b[i]));
	ASSERT_EQ(0, tshm_cuda_pool_available(pool));
	ASSERT_EQ(-EAGAIN, tshm_cuda_pool_get(pool, 0, &x));
	ASSERT_EQ(-ETIMEDOUT, tshm_cuda_pool_get(pool, 50, &x));
	/* the last local reference goes: back at once */
	tshm_cuda_buf_unref(b[2]);
	ASSERT_EQ(1, tshm_cuda_pool_available(pool));
	ASSERT_EQ(0, tshm_cuda_pool_get(pool, 0, &x));
	ASSERT_EQ(b[2], x);

	for (i = 0; i < 2; i++) {
		uint64_t seed = 500 + i;

		ASSERT_EQ(0, dev_fill(tshm_cuda_buf_ptr(b[i]), size, seed));
		ASSERT_EQ(0, tshm_cuda_send(ch, b[i], &seed, 8, 5000));
	}
	ASSERT_EQ(0, wait_v(sh, V_C_GOT, 1, 20000));
	ASSERT_LT(0, n = tshm_cuda_buf_release_pollfds(b[0], pfd, 8));
	ASSERT_EQ(0, poll(pfd, n, 50));
	tshm_cuda_buf_unref(b[1]);	/* the consumer still holds it */
	ASSERT_EQ(-ETIMEDOUT, tshm_cuda_pool_get(pool, 50, &b[1]));
	kill(pid, SIGKILL);
	ASSERT_EQ(128 + SIGKILL, exit_code(pid));
	ASSERT_EQ(0, wait_released_by_poll(b[0], 100));
	tshm_cuda_buf_unref(b[0]);
	/* both come back; the third is still ours */
	ASSERT_EQ(0, tshm_cuda_pool_get(pool, 10000, &b[0]));
	ASSERT_EQ(0, tshm_cuda_pool_get(pool, 10000, &b[1]));
	ASSERT_NE(b[0], b[1]);
	ASSERT_NE(x, b[0]);
	ASSERT_NE(x, b[1]);
	ASSERT_EQ(-EAGAIN, tshm_cuda_pool_get(pool, 0, &b[2]));
	/* destroy with buffers out: they stay usable until unref'd */
	tshm_cuda_pool_destroy(pool);
	ASSERT_EQ(0, dev_fill(tshm_cuda_buf_ptr(x), size, 1));
	for (i = 0; i < 2; i++)
		tshm_cuda_buf_unref(b[i]);
	tshm_cuda_buf_unref(x);
	tshm_cuda_close(cu);
	tshm_cuda_chan_destroy(ch);
	tshm_seg_unref(seg);
	tshm_ctx_close(ctx);
}

/* ---- errors ---- */

/*
 * fork() while other threads hold the device handle's lock (its import
 * cache): libtshm-cuda's atfork handlers take it across fork(), so the
 * child can still use the handle's host-side state (it used to deadlock).
 * The child makes no CUDA call: CUDA itself is not usable after fork.
 */
struct cu_busy {
	struct tshm_cuda *cu;
	atomic_bool stop;
};

static void *cu_hammer(void *arg)
{
	struct cu_busy *b = arg;
	struct tshm_cuda_stats st;

	while (!atomic_load(&b->stop)) {
		tshm_cuda_stats(b->cu, &st);
		tshm_cuda_cache_trim(b->cu);
	}
	return NULL;
}

TEST(fork_while_threads_in_library)
{
	struct cu_busy b = { 0 };
	struct tshm_cuda_stats st;
	struct probe pr;
	pthread_t t[2];
	int i, status, failed = 0;
	pid_t pid;

	NEED_GPU(&pr, false);
	ASSERT_EQ(0, tshm_cuda_open(0, &b.cu));
	for (i = 0; i < 2; i++)
		ASSERT_EQ(0, pthread_create(&t[i], NULL, cu_hammer, &b));
	for (i = 0; i < 300 && !failed; i++) {
		pid = fork();
		ASSERT_LE(0, pid);
		if (pid == 0) {
			alarm(10);	/* a deadlock shows as SIGALRM */
			tshm_cuda_stats(b.cu, &st);
			_exit(0);
		}
		ASSERT_EQ(pid, waitpid(pid, &status, 0));
		if (!WIFEXITED(status) || WEXITSTATUS(status)) {
			TH_LOG("fork %d: child status %#x", i, status);
			failed = 1;
		}
	}
	atomic_store(&b.stop, true);
	for (i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	EXPECT_EQ(0, failed);
	tshm_cuda_close(b.cu);
}

TEST(errors)
{
	struct tshm_cuda_chan *ch;
	struct tshm_cuda_buf *b = NULL;
	struct tshm_cuda *cu, *none;
	struct tshm_ctx *ctx;
	struct probe pr;
	uint64_t host = 0, seed = 9;
	uint8_t u[16];
	char junk[40] = "not a tshm-cuda message";
	void *d = NULL;
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS];
	unsigned nsegs = TSHM_QUEUE_MAX_SEGS, k;
	char raw[512];
	size_t len;
	pid_t pid;
	int ret, code;

	NEED_GPU(&pr, 0);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_chan_create(ctx, 4, 64, &ch));
	/* a consumer on device 1, where there is one */
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu;

		if (tshm_cuda_open(1, &ccu))
			_exit(77);
		ret = tshm_cuda_recv(ch, ccu, &b, &seed, 8, NULL, 20000);
		CK(ret == -EXDEV, "recv on device 1: %d", ret);
		CK(strstr(tshm_cuda_last_error(), "GPU-"), "message");
		printf("# %s\n", tshm_cuda_last_error());
		fflush(stdout);
		_exit(0);
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu));
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(-ENODEV, tshm_cuda_open(4096, &none));
	TH_LOG("%s", tshm_cuda_last_error());
	if (pr.vmm) {
		ASSERT_EQ(-EINVAL, tshm_cuda_buf_alloc(cu, ctx,
				   (size_t)pr.gran + 1, &b));
		TH_LOG("%s", tshm_cuda_last_error());
		ASSERT_NE(NULL, strstr(tshm_cuda_last_error(), "granularity"));
		ASSERT_EQ(-EINVAL, tshm_cuda_buf_alloc(cu, ctx, 0, &b));
		if (pr.gran > 1)
			ASSERT_EQ(-EINVAL, tshm_cuda_buf_alloc(cu, ctx,
					   (size_t)pr.gran / 2, &b));
	}
	/* a host address is no device allocation */
	ret = tshm_cuda_buf_wrap(cu, ctx, &host, sizeof(host), &b);
	TH_LOG("wrap(host pointer): %d %s", ret, tshm_cuda_last_error());
	ASSERT_LT(ret, 0);
	ASSERT_EQ(0, dev_malloc(&d, 1 << 20));
	/* far past it: cudaMalloc may round the allocation up */
	ASSERT_EQ(-EINVAL, tshm_cuda_buf_wrap(cu, ctx, d, 64 << 20, &b));
	ASSERT_EQ(-EINVAL, tshm_cuda_buf_wrap(cu, ctx, d, 0, &b));
	/* another device's UUID */
	tshm_cuda_uuid(cu, u);
	ASSERT_EQ(0, tshm_cuda_check_uuid(cu, u));
	u[15] ^= 0xff;
	ASSERT_EQ(-EXDEV, tshm_cuda_check_uuid(cu, u));
	ASSERT_NE(NULL, strstr(tshm_cuda_last_error(), "GPU-"));
	/* the real thing when there are two devices */
	ASSERT_EQ(0, tshm_cuda_buf_wrap(cu, ctx, d, 1 << 20, &b));
	ASSERT_EQ(0, tshm_cuda_send(ch, b, &seed, 8, 5000));
	code = exit_code(pid);
	if (code == 77) {
		/* drain raw: a process cannot open its own IPC handle */
		TH_LOG("one GPU: wrong device checked with a forged UUID only");
		ASSERT_EQ(0, tshm_queue_recv(tshm_cuda_chan_queue(ch), raw,
					     sizeof(raw), &len, segs, &nsegs,
					     1000));
		for (k = 0; k < nsegs; k++)
			tshm_seg_unref(segs[k]);
	} else {
		ASSERT_EQ(0, code);
	}
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 10000));
	tshm_cuda_buf_unref(b);
	/* a message tshm-cuda did not send */
	ASSERT_EQ(0, tshm_queue_send(tshm_cuda_chan_queue(ch), junk,
				     sizeof(junk), NULL, 0, 1000));
	ASSERT_EQ(-EBADMSG, tshm_cuda_recv(ch, cu, &b, &seed, 8, NULL, 1000));
	ASSERT_NE(NULL, strstr(tshm_cuda_last_error(), "not a tshm-cuda"));
	ASSERT_EQ(-EAGAIN, tshm_cuda_recv(ch, cu, &b, &seed, 8, NULL, 0));
	ASSERT_EQ(0, dev_free(d));
	tshm_cuda_close(cu);
	tshm_cuda_chan_destroy(ch);
	tshm_ctx_close(ctx);
}

TEST_HARNESS_MAIN
