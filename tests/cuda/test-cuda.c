// SPDX-License-Identifier: GPL-2.0
/*
 * libtshm-cuda suite.  Every test that needs a GPU probes for one in a
 * forked child first (CUDA must not be initialized before fork) and prints
 * a kselftest SKIP with the reason when there is none.  Processes are
 * forked before any of them opens CUDA; the test process itself is the
 * producer where one is needed.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
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
/* white box: the description's layout, to forge bad ones (pack_bad_input) */
#include "../../cuda/cuda-private.h"

#include "kselftest_harness.h"
#include "../lib/tshm-test.h"	/* count_fds() */

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

/* ---- buffers in messages of the caller's own protocol ---- */

/*
 * A message of the tests' own protocol on a plain tshm queue: a head, the
 * description's length and bytes (at an odd offset: unpack must not need
 * alignment), the seed, a tail.
 */
#define OWN_HEAD	"own-msg"
#define OWN_TAIL	"own-end"
#define OWN_DESC_AT	12
#define OWN_MAX		(OWN_DESC_AT + TSHM_CUDA_DESC_SIZE + 16)

static int own_send(struct tshm_queue *q, struct tshm_cuda_buf *b,
		    uint64_t seed, int timeout_ms)
{
	struct tshm_seg *segs[TSHM_CUDA_PACK_SEGS];
	unsigned nsegs = TSHM_CUDA_PACK_SEGS;
	char msg[OWN_MAX];
	uint32_t dlen;
	size_t off;
	int n, fd;

	memcpy(msg, OWN_HEAD, 8);
	n = tshm_cuda_buf_pack(b, msg + OWN_DESC_AT, TSHM_CUDA_DESC_SIZE,
			       segs, &nsegs, &fd);
	if (n < 0)
		return n;
	if (n > TSHM_CUDA_DESC_SIZE || !nsegs ||
	    nsegs > TSHM_CUDA_PACK_SEGS)
		return -ERANGE;
	dlen = (uint32_t)n;
	memcpy(msg + 8, &dlen, 4);
	off = OWN_DESC_AT + dlen;
	memcpy(msg + off, &seed, 8);
	memcpy(msg + off + 8, OWN_TAIL, 8);
	return tshm_queue_send_fds(q, msg, off + 16, segs, nsegs, &fd,
				   fd >= 0 ? 1 : 0, timeout_ms);
}

/* What the receiving end of own_send() got; own_release() drops it. */
struct own_rx {
	char msg[OWN_MAX];
	size_t len;
	const void *desc;
	size_t dlen;
	uint64_t seed;
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS];
	unsigned nsegs;
	int fds[TSHM_QUEUE_MAX_FDS];
	unsigned nfds;
	int fd;
};

static void own_release(struct own_rx *rx)
{
	unsigned i;

	for (i = 0; i < rx->nsegs; i++)
		tshm_seg_unref(rx->segs[i]);
	for (i = 0; i < rx->nfds; i++)
		close(rx->fds[i]);
	rx->nsegs = rx->nfds = 0;
	rx->fd = -1;
}

static int own_recv(struct tshm_queue *q, struct own_rx *rx, int timeout_ms)
{
	uint32_t dlen;
	int ret;

	rx->nsegs = TSHM_QUEUE_MAX_SEGS;
	rx->nfds = TSHM_QUEUE_MAX_FDS;
	ret = tshm_queue_recv_fds(q, rx->msg, sizeof(rx->msg), &rx->len,
				  rx->segs, &rx->nsegs, rx->fds, &rx->nfds,
				  timeout_ms);
	if (ret)
		return ret;
	rx->fd = rx->nfds ? rx->fds[0] : -1;
	memcpy(&dlen, rx->msg + 8, 4);
	if (memcmp(rx->msg, OWN_HEAD, 8) || dlen > TSHM_CUDA_DESC_SIZE ||
	    rx->len != OWN_DESC_AT + dlen + 16 ||
	    memcmp(rx->msg + OWN_DESC_AT + dlen + 8, OWN_TAIL, 8)) {
		own_release(rx);
		return -EPROTO;
	}
	rx->desc = rx->msg + OWN_DESC_AT;
	rx->dlen = dlen;
	memcpy(&rx->seed, rx->msg + OWN_DESC_AT + dlen, 8);
	return 0;
}

/* What the pack tests share: a plain queue for own_send() and a page. */
struct own_env {
	struct tshm_ctx *ctx;
	struct tshm_queue *q;
	struct tshm_seg *seg;
	struct shared *sh;
};

static int own_env_open(struct own_env *e)
{
	int ret = tshm_ctx_open(&e->ctx, 0);

	if (ret < 0)
		return ret;
	ret = tshm_queue_create(e->ctx, 4, OWN_MAX, &e->q);
	if (ret < 0)
		goto close_ctx;
	e->sh = shared_create(e->ctx, &e->seg);
	if (!e->sh) {
		ret = -ENOMEM;
		tshm_queue_unref(e->q);
		goto close_ctx;
	}
	return 0;
close_ctx:
	tshm_ctx_close(e->ctx);
	return ret;
}

static void own_env_close(struct own_env *e)
{
	tshm_queue_unref(e->q);
	tshm_seg_unref(e->seg);
	tshm_ctx_close(e->ctx);
}

/*
 * Child: the next own_send() message, with @nsegs segments and @nfds fds,
 * unpacked on @ccu into *@r (exits on failure).
 */
static void child_own_unpack(struct tshm_cuda *ccu, struct tshm_queue *q,
			     struct own_rx *rx, unsigned nsegs, unsigned nfds,
			     struct tshm_cuda_buf **r)
{
	int ret = own_recv(q, rx, 20000);

	CK(!ret, "recv %d", ret);
	CK(rx->nsegs == nsegs && rx->nfds == nfds, "%u segments, %u fds",
	   rx->nsegs, rx->nfds);
	ret = tshm_cuda_buf_unpack(ccu, rx->desc, rx->dlen, rx->segs,
				   rx->nsegs, rx->fd, r);
	CK(!ret, "unpack %d", ret);
}

/* Open fds of this process. */
/*
 * A VMM buffer in a message of the test's own protocol on a plain queue:
 * the child unpacks it (twice: the second is a cache hit) and reads the
 * producer's data; the lease travels, so the producer's release wait
 * follows the child's buffers, and returns once it dropped them.
 */
TEST(pack_own_queue)
{
	struct tshm_cuda_buf *b;
	struct tshm_cuda *cu;
	struct own_env e;
	struct probe pr;
	uint64_t seed = 0x9ac40001;
	size_t size;
	pid_t pid;

	NEED_GPU(&pr, 1);
	size = (size_t)pr.gran * 2;
	ASSERT_EQ(0, own_env_open(&e));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		struct tshm_cuda_buf *r, *r2;
		struct tshm_cuda_stats st;
		uint64_t bad = ~0ULL;
		struct own_rx rx;
		int ret;

		child_own_unpack(ccu, e.q, &rx, 2, 1, &r);
		CK(tshm_cuda_buf_size(r) == size, "size");
		CK(tshm_cuda_buf_kind(r) == TSHM_CUDA_VMM, "kind");
		ret = dev_check(tshm_cuda_buf_ptr(r), size, rx.seed, &bad);
		CK(!ret, "check kernel: %s", dev_errstr(ret));
		CK(!bad, "%llu words differ", (unsigned long long)bad);
		/* the same description again: the import is in the cache */
		ret = tshm_cuda_buf_unpack(ccu, rx.desc, rx.dlen, rx.segs,
					   rx.nsegs, rx.fd, &r2);
		CK(!ret, "second unpack %d", ret);
		CK(r2 != r && tshm_cuda_buf_ptr(r2) == tshm_cuda_buf_ptr(r) &&
		   tshm_cuda_buf_id(r2) == tshm_cuda_buf_id(r), "same buffer");
		tshm_cuda_stats(ccu, &st);
		CK(st.imports == 1 && st.cache_hits == 1 && st.cached == 1,
		   "imports %llu hits %llu cached %llu",
		   (unsigned long long)st.imports,
		   (unsigned long long)st.cache_hits,
		   (unsigned long long)st.cached);
		/* the buffers hold their own references: ours go now */
		own_release(&rx);
		ret = dev_check(tshm_cuda_buf_ptr(r2), size, seed, &bad);
		CK(!ret && !bad, "check after release: %d, %llu bad", ret,
		   (unsigned long long)bad);
		tshm_cuda_buf_unref(r);
		atomic_store(&e.sh->v[V_C_GOT], 1);
		CK(!wait_v(e.sh, V_REQ, 1, 20000), "never asked to let go");
		tshm_cuda_buf_unref(r2);
		atomic_store(&e.sh->v[V_DONE], 1);
		CK(!wait_v(e.sh, V_STOP, 1, 20000), "never stopped");
		tshm_cuda_close(ccu);
		_exit(0);
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu)) TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, e.ctx, size, &b))
		TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, dev_fill(tshm_cuda_buf_ptr(b), size, seed));
	ASSERT_EQ(0, own_send(e.q, b, seed, 5000))
		TH_LOG("%s", tshm_cuda_last_error());
	/* one buffer made from the message is still held */
	ASSERT_EQ(0, wait_v(e.sh, V_C_GOT, 1, 20000));
	ASSERT_EQ(-EAGAIN, tshm_cuda_buf_wait_released(b, 0));
	atomic_store(&e.sh->v[V_REQ], 1);
	/* released while the child lives: nothing of it leaked there */
	ASSERT_EQ(0, wait_v(e.sh, V_DONE, 1, 20000));
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 10000));
	atomic_store(&e.sh->v[V_STOP], 1);
	ASSERT_EQ(0, exit_code(pid));
	tshm_cuda_buf_unref(b);
	tshm_cuda_close(cu);
	own_env_close(&e);
}

/*
 * The producer unrefs its buffer right after sending it in its own
 * message: the fd in the message keeps the memory, the child reads it
 * intact, and when the child lets go (buffer, segments, fd) the memory is
 * back (cuMemGetInfo in the child).
 */
TEST(pack_producer_unrefs)
{
	struct tshm_cuda_buf *b;
	struct tshm_cuda *cu;
	struct own_env e;
	struct probe pr;
	uint64_t seed = 0x9ac40002;
	size_t size;
	pid_t pid;

	NEED_GPU(&pr, 1);
	size = big_size(&pr);
	ASSERT_EQ(0, own_env_open(&e));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		size_t held, after, total;
		struct tshm_cuda_stats st;
		struct tshm_cuda_buf *r;
		uint64_t bad = ~0ULL;
		struct own_rx rx;
		int ret;

		CK(!wait_v(e.sh, V_FREED, 1, 20000), "producer never freed");
		child_own_unpack(ccu, e.q, &rx, 2, 1, &r);
		own_release(&rx);	/* at once: the buffer needs none of it */
		ret = dev_check(tshm_cuda_buf_ptr(r), size, rx.seed, &bad);
		CK(!ret && !bad, "check: %d, %llu bad", ret,
		   (unsigned long long)bad);
		CK(!tshm_cuda_mem_info(ccu, &held, &total), "mem info");
		tshm_cuda_buf_unref(r);
		tshm_cuda_stats(ccu, &st);
		CK(st.imports == 1 && st.cached == 0 && st.evictions == 1,
		   "imports %llu cached %llu evictions %llu",
		   (unsigned long long)st.imports,
		   (unsigned long long)st.cached,
		   (unsigned long long)st.evictions);
		CK(!tshm_cuda_mem_info(ccu, &after, &total), "mem info");
		printf("# free: %zu MiB held, %zu MiB after unref\n",
		       held >> 20, after >> 20);
		fflush(stdout);
		CK(after >= held + size * 3 / 4, "memory not back");
		tshm_cuda_close(ccu);
		_exit(0);
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu)) TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, e.ctx, size, &b))
		TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, dev_fill(tshm_cuda_buf_ptr(b), size, seed));
	ASSERT_EQ(0, own_send(e.q, b, seed, 5000));
	tshm_cuda_buf_unref(b);		/* the producer's copy is gone */
	atomic_store(&e.sh->v[V_FREED], 1);
	ASSERT_EQ(0, exit_code(pid));
	tshm_cuda_close(cu);
	own_env_close(&e);
}

/* Unpack that must fail: the error, *out NULL; a success is let go. */
static int unpack_err(struct tshm_cuda *cu, const void *d, size_t len,
		      struct tshm_seg *const *segs, unsigned nsegs, int fd)
{
	struct tshm_cuda_buf *r = (struct tshm_cuda_buf *)&r;
	int ret = tshm_cuda_buf_unpack(cu, d, len, segs, nsegs, fd, &r);

	if (!ret) {
		tshm_cuda_buf_unref(r);
		return 0;
	}
	return r ? -1000 : ret;
}

/* A copy of @rx's description to forge (the layout is cuda-private.h's). */
static struct tcu_wire desc_of(const struct own_rx *rx)
{
	struct tcu_wire w;

	memcpy(&w, rx->desc, sizeof(w));
	return w;
}

#define UNPACK_BAD(want, wp, segs, nsegs, fd, what) do {		\
		int __ret = unpack_err(ccu, (wp), sizeof(struct tcu_wire), \
				       (segs), (nsegs), (fd));		\
		CK(__ret == (want), "%s: %d, want %d", what, __ret, want); \
	} while (0)

/*
 * Flip every bit of @rx's description once (but the IPC handle's when
 * @skip_ipc: the fake driver would open what the flipped handle names):
 * each unpack gives 0 (a field no check can tell from the real one, the
 * buffer's id, say), -EBADMSG or -EXDEV, never crashes, never imports.
 */
static void flip_every_bit(struct tshm_cuda *ccu, const struct own_rx *rx,
			   bool skip_ipc, unsigned *ok, unsigned *bad)
{
	size_t i, ipc = offsetof(struct tcu_wire, ipc);
	struct tcu_wire w;
	unsigned bit;
	int ret;

	for (i = 0; i < sizeof(w); i++) {
		if (skip_ipc && i >= ipc && i < ipc + CU_IPC_HANDLE_SIZE)
			continue;
		for (bit = 0; bit < 8; bit++) {
			w = desc_of(rx);
			((uint8_t *)&w)[i] ^= (uint8_t)(1U << bit);
			ret = unpack_err(ccu, &w, sizeof(w), rx->segs,
					 rx->nsegs, rx->fd);
			CK(!ret || ret == -EBADMSG || ret == -EXDEV,
			   "byte %zu bit %u: %d", i, bit, ret);
			++*(ret ? bad : ok);
		}
	}
}

/*
 * Every kind of bad input is refused with -EBADMSG (-EXDEV for another
 * device) before anything is imported, nothing taken is kept (the child's
 * fds, imports and segment references, the latter seen by the producer's
 * release waits), and the fd passed is never closed; pack refuses a
 * received buffer and too little room.
 */
TEST(pack_bad_input)
{
	struct tshm_seg *segs[TSHM_CUDA_PACK_SEGS], *anchor;
	struct tshm_cuda_buf *b, *b2, *lb;
	char desc[TSHM_CUDA_DESC_SIZE];
	struct tshm_cuda *cu;
	struct own_env e;
	struct probe pr;
	size_t lsize = 3UL << 20, ln = lsize - 8192;
	unsigned nsegs;
	void *d = NULL;
	pid_t pid;
	int fd;

	NEED_GPU(&pr, 1);
	ASSERT_EQ(0, own_env_open(&e));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		struct tshm_seg *mix[3];
		struct tshm_cuda_buf *r, *lr;
		struct own_rx rx[3];	/* b, b2 (VMM), lb (legacy) */
		struct tshm_cuda_stats st;
		unsigned ok = 0, nbad = 0, more, k;
		uint64_t bad;
		struct tcu_wire w;
		int ret, nfd;

		for (k = 0; k < 3; k++) {
			ret = own_recv(e.q, &rx[k], 20000);
			CK(!ret, "recv %u: %d", k, ret);
		}
		nfd = count_fds();
		CK(nfd > 0, "count fds");
		w = desc_of(&rx[0]);
		/* arguments */
		CK(tshm_cuda_buf_unpack(ccu, &w, sizeof(w), rx[0].segs, 2,
					rx[0].fd, NULL) == -EINVAL, "NULL out");
		CK(unpack_err(NULL, &w, sizeof(w), rx[0].segs, 2, rx[0].fd) ==
		   -EINVAL, "NULL device");
		mix[0] = rx[0].segs[0];
		mix[1] = NULL;
		CK(unpack_err(ccu, &w, sizeof(w), mix, 2, rx[0].fd) == -EINVAL,
		   "NULL segment");
		/* length */
		CK(unpack_err(ccu, rx[0].desc, rx[0].dlen - 1, rx[0].segs, 2,
			      rx[0].fd) == -EBADMSG, "truncated");
		CK(unpack_err(ccu, rx[0].desc, 0, rx[0].segs, 2, rx[0].fd) ==
		   -EBADMSG, "empty");
		CK(unpack_err(ccu, NULL, 0, rx[0].segs, 2, rx[0].fd) ==
		   -EBADMSG, "none");
		memcpy(desc, rx[0].desc, rx[0].dlen);
		CK(unpack_err(ccu, desc, rx[0].dlen + 1, rx[0].segs, 2,
			      rx[0].fd) == -EBADMSG, "one byte more");
		printf("# length: %s\n", tshm_cuda_last_error());
		/* fields */
		w = desc_of(&rx[0]);
		w.magic ^= 1;
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "magic");
		w = desc_of(&rx[0]);
		w.kind = 3;
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "kind 3");
		w = desc_of(&rx[0]);
		w.kind = TSHM_CUDA_LEGACY;	/* with VMM's segments and fd */
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "kind legacy");
		w = desc_of(&rx[0]);
		w.len = 8;			/* a channel message's head */
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "payload length");
		w = desc_of(&rx[0]);
		w.pad = 1;
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "reserved");
		w = desc_of(&rx[0]);
		w.off = 4096;			/* the buffer is the allocation */
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "offset past the allocation");
		printf("# offset: %s\n", tshm_cuda_last_error());
		w = desc_of(&rx[0]);
		w.off = UINT64_MAX - 4095;	/* off + size wraps */
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "offset wraps");
		w = desc_of(&rx[0]);
		w.size = w.alloc_size + 1;
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "size past the allocation");
		w = desc_of(&rx[0]);
		w.size = 0;
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "size 0");
		w = desc_of(&rx[0]);
		w.alloc_size += 4096;		/* no granularity multiple */
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "granularity");
		w = desc_of(&rx[0]);
		w.id = 0;
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "id 0");
		w = desc_of(&rx[0]);
		w.alloc_id ^= 1;		/* the anchor says otherwise */
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "allocation id");
		w = desc_of(&rx[0]);
		w.ipc[3] = 1;
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, rx[0].fd,
			   "IPC handle in a VMM description");
		w = desc_of(&rx[0]);
		w.uuid[15] ^= 0xff;
		UNPACK_BAD(-EXDEV, &w, rx[0].segs, 2, rx[0].fd,
			   "another device");
		/* segments and fd that do not go with it */
		w = desc_of(&rx[0]);
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 1, rx[0].fd,
			   "lease only");
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 0, rx[0].fd,
			   "no segments");
		mix[0] = rx[0].segs[0];
		mix[1] = rx[0].segs[1];
		mix[2] = rx[1].segs[0];
		UNPACK_BAD(-EBADMSG, &w, mix, 3, rx[0].fd,
			   "a segment more");
		w.nsegs = 3;
		UNPACK_BAD(-EBADMSG, &w, mix, 3, rx[0].fd,
			   "three segments named");
		w = desc_of(&rx[0]);
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, -1,
			   "VMM without its fd");
		printf("# no fd: %s\n", tshm_cuda_last_error());
		mix[0] = rx[0].segs[0];
		mix[1] = rx[1].segs[1];
		UNPACK_BAD(-EBADMSG, &w, mix, 2, rx[0].fd,
			   "anchor of another allocation");
		printf("# other anchor: %s\n", tshm_cuda_last_error());
		mix[0] = rx[0].segs[1];
		mix[1] = rx[0].segs[0];
		UNPACK_BAD(-EBADMSG, &w, mix, 2, rx[0].fd,
			   "segments swapped");
		w = desc_of(&rx[2]);
		UNPACK_BAD(-EBADMSG, &w, rx[2].segs, 1, rx[0].fd,
			   "legacy with an fd");
		UNPACK_BAD(-EBADMSG, &w, rx[0].segs, 2, -1,
			   "legacy with two segments");
		w.size = w.alloc_size - w.off + 1;
		UNPACK_BAD(-EBADMSG, &w, rx[2].segs, 1, -1,
			   "legacy past its allocation");
		/* nothing imported, taken or closed */
		tshm_cuda_stats(ccu, &st);
		CK(st.imports == 0 && st.cache_hits == 0 && st.cached == 0,
		   "imports %llu hits %llu cached %llu",
		   (unsigned long long)st.imports,
		   (unsigned long long)st.cache_hits,
		   (unsigned long long)st.cached);
		CK(count_fds() == nfd, "%d fds, were %d", count_fds(), nfd);
		CK(fcntl(rx[0].fd, F_GETFD) >= 0, "the fd was closed");
		/*
		 * Consistent, but more than the IPC mapping holds: refused
		 * where the driver tells the mapping's size (the fake does;
		 * a real one may not, then it is let pass).
		 */
		w = desc_of(&rx[2]);
		w.alloc_size += 2UL << 20;
		ret = unpack_err(ccu, &w, sizeof(w), rx[2].segs, 1, -1);
		CK(ret == -EBADMSG || (!FAKE && !ret), "legacy larger than "
		   "its mapping: %d", ret);
		printf("# legacy larger than its mapping: %s\n",
		       ret ? tshm_cuda_last_error() : "not told by the driver");
		more = !ret;

		/* the same messages, unspoilt, work */
		ret = tshm_cuda_buf_unpack(ccu, rx[0].desc, rx[0].dlen,
					   rx[0].segs, 2, rx[0].fd, &r);
		CK(!ret, "unpack %d", ret);
		ret = dev_check(tshm_cuda_buf_ptr(r), tshm_cuda_buf_size(r),
				rx[0].seed, &bad);
		CK(!ret && !bad, "check: %d, %llu bad", ret,
		   (unsigned long long)bad);
		ret = tshm_cuda_buf_unpack(ccu, rx[2].desc, rx[2].dlen,
					   rx[2].segs, 1, -1, &lr);
		CK(!ret, "legacy unpack %d", ret);
		ret = dev_check(tshm_cuda_buf_ptr(lr), ln, rx[2].seed, &bad);
		CK(!ret && !bad, "legacy check: %d, %llu bad", ret,
		   (unsigned long long)bad);
		/* a received buffer is not packed on */
		nsegs = TSHM_CUDA_PACK_SEGS;
		CK(tshm_cuda_buf_pack(r, desc, sizeof(desc), segs, &nsegs,
				      &fd) == -EOPNOTSUPP, "pack received");
		CK(tshm_cuda_buf_pack(lr, desc, sizeof(desc), segs, &nsegs,
				      &fd) == -EOPNOTSUPP, "pack legacy rcvd");
		/* single bit flips, with both imports cached and in use */
		flip_every_bit(ccu, &rx[0], false, &ok, &nbad);
		flip_every_bit(ccu, &rx[2], true, &ok, &nbad);
		printf("# bit flips: %u unpacked, %u refused\n", ok, nbad);
		fflush(stdout);
		tshm_cuda_stats(ccu, &st);
		CK(st.imports == 2 + more, "imports %llu",
		   (unsigned long long)st.imports);
		tshm_cuda_buf_unref(r);
		tshm_cuda_buf_unref(lr);
		if (FAKE)	/* a driver may keep fds of its own */
			CK(count_fds() == nfd, "%d fds, were %d", count_fds(),
			   nfd);
		for (k = 0; k < 3; k++)
			own_release(&rx[k]);
		/* the cache lets go of the anchors too */
		tshm_cuda_close(ccu);
		atomic_store(&e.sh->v[V_C_GOT], 1);
		CK(!wait_v(e.sh, V_STOP, 1, 20000), "never stopped");
		_exit(0);
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu)) TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, e.ctx, (size_t)pr.gran, &b));
	ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, e.ctx, (size_t)pr.gran, &b2));
	ASSERT_EQ(0, dev_malloc(&d, lsize));
	ASSERT_EQ(0, tshm_cuda_buf_wrap(cu, e.ctx, (char *)d + 4096, ln, &lb));
	ASSERT_EQ(0, dev_fill(tshm_cuda_buf_ptr(b), pr.gran, 31));
	ASSERT_EQ(0, dev_fill(tshm_cuda_buf_ptr(lb), ln, 33));
	/* pack: arguments and room */
	nsegs = TSHM_CUDA_PACK_SEGS;
	fd = -7;
	ASSERT_EQ(-EINVAL, tshm_cuda_buf_pack(NULL, desc, sizeof(desc), segs,
					      &nsegs, &fd));
	ASSERT_EQ(-EINVAL, tshm_cuda_buf_pack(b, desc, sizeof(desc), segs,
					      &nsegs, NULL));
	ASSERT_EQ(-ENOSPC, tshm_cuda_buf_pack(b, desc, sizeof(desc) - 1, segs,
					      &nsegs, &fd));
	TH_LOG("%s", tshm_cuda_last_error());
	nsegs = 1;
	ASSERT_EQ(-ENOSPC, tshm_cuda_buf_pack(b, desc, sizeof(desc), segs,
					      &nsegs, &fd));
	ASSERT_EQ(-ENOSPC, tshm_cuda_buf_pack(lb, desc, sizeof(desc), segs,
					      &nsegs, &fd));
	ASSERT_EQ(1, nsegs);		/* nothing written on failure */
	ASSERT_EQ(-7, fd);
	nsegs = TSHM_CUDA_PACK_SEGS;
	ASSERT_LT(0, tshm_cuda_buf_pack(b, desc, sizeof(desc), segs, &nsegs,
					&fd));
	ASSERT_EQ(2, nsegs);
	ASSERT_LE(0, fd);
	ASSERT_EQ(tshm_cuda_buf_lease(b), segs[0]);
	anchor = segs[1];
	nsegs = TSHM_CUDA_PACK_SEGS;
	ASSERT_LT(0, tshm_cuda_buf_pack(lb, desc, sizeof(desc), segs, &nsegs,
					&fd));
	ASSERT_EQ(1, nsegs);
	ASSERT_EQ(-1, fd);

	ASSERT_EQ(0, own_send(e.q, b, 31, 5000));
	ASSERT_EQ(0, own_send(e.q, b2, 32, 5000));
	ASSERT_EQ(0, own_send(e.q, lb, 33, 5000));
	ASSERT_EQ(0, wait_v(e.sh, V_C_GOT, 1, 20000));
	/* while the child lives: it keeps no lease and no anchor */
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 10000));
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b2, 10000));
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(lb, 10000));
	ASSERT_EQ(0, tshm_seg_wait_released(anchor, 10000));
	atomic_store(&e.sh->v[V_STOP], 1);
	ASSERT_EQ(0, exit_code(pid));
	tshm_cuda_buf_unref(b);
	tshm_cuda_buf_unref(b2);
	tshm_cuda_buf_unref(lb);
	ASSERT_EQ(0, dev_free(d));
	tshm_cuda_close(cu);
	own_env_close(&e);
}

/*
 * A legacy buffer (cudaMalloc memory, a sub-range wrapped) in the test's
 * own message: no fd travels; a second unpack shares the open IPC mapping,
 * which closes with the last buffer; the producer frees its memory once
 * the release wait says the child let go.
 */
TEST(pack_legacy)
{
	struct tshm_cuda_buf *b;
	struct tshm_cuda *cu;
	struct own_env e;
	struct probe pr;
	uint64_t seed = 0x9ac40004;
	size_t size = 3UL << 20, n = size - 8192;
	void *d = NULL;
	pid_t pid;

	NEED_GPU(&pr, 0);
	ASSERT_EQ(0, own_env_open(&e));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu = child_cuda(0);
		struct tshm_cuda_buf *r, *r2;
		struct tshm_cuda_stats st;
		uint64_t bad = ~0ULL;
		struct own_rx rx;
		int ret;

		child_own_unpack(ccu, e.q, &rx, 1, 0, &r);
		CK(tshm_cuda_buf_kind(r) == TSHM_CUDA_LEGACY, "kind");
		CK(tshm_cuda_buf_size(r) == n, "size");
		ret = dev_check(tshm_cuda_buf_ptr(r), n, rx.seed, &bad);
		CK(!ret && !bad, "check: %d, %llu bad", ret,
		   (unsigned long long)bad);
		ret = tshm_cuda_buf_unpack(ccu, rx.desc, rx.dlen, rx.segs,
					   rx.nsegs, rx.fd, &r2);
		CK(!ret, "second unpack %d", ret);
		CK(tshm_cuda_buf_ptr(r2) == tshm_cuda_buf_ptr(r), "ptr");
		own_release(&rx);
		tshm_cuda_stats(ccu, &st);
		CK(st.imports == 1 && st.cache_hits == 1, "imports %llu "
		   "hits %llu", (unsigned long long)st.imports,
		   (unsigned long long)st.cache_hits);
		tshm_cuda_buf_unref(r);
		tshm_cuda_buf_unref(r2);
		/* the IPC mapping closes with its last user */
		tshm_cuda_stats(ccu, &st);
		CK(st.cached == 0, "cached %llu",
		   (unsigned long long)st.cached);
		atomic_store(&e.sh->v[V_C_GOT], 1);
		CK(!wait_v(e.sh, V_STOP, 1, 20000), "never stopped");
		tshm_cuda_close(ccu);
		_exit(0);
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu));
	ASSERT_EQ(0, dev_set_device(0));
	ASSERT_EQ(0, dev_malloc(&d, size));
	ASSERT_EQ(0, dev_fill((char *)d + 4096, n, seed));
	ASSERT_EQ(0, tshm_cuda_buf_wrap(cu, e.ctx, (char *)d + 4096, n, &b))
		TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, own_send(e.q, b, seed, 5000));
	ASSERT_EQ(0, wait_v(e.sh, V_C_GOT, 1, 20000));
	/* released while the child lives: the memory may go */
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 10000));
	tshm_cuda_buf_unref(b);
	ASSERT_EQ(0, dev_free(d));
	atomic_store(&e.sh->v[V_STOP], 1);
	ASSERT_EQ(0, exit_code(pid));
	tshm_cuda_close(cu);
	own_env_close(&e);
}

/* ---- contexts ---- */

/* What current_ctx() answers when it cannot ask the driver. */
static char no_answer;

/* A function of the driver libtshm-cuda loaded (after tshm_cuda_open()). */
static void *driver_sym(const char *name)
{
	const char *path = getenv("TSHM_CUDA_DRIVER");
	void *dl = dlopen(path && *path ? path : "libcuda.so.1",
			  RTLD_NOW | RTLD_NOLOAD);
	void *fn = dl ? dlsym(dl, name) : NULL;

	if (dl)
		dlclose(dl);	/* still loaded: libtshm-cuda holds it */
	return fn;
}

/* The calling thread's current context (cuCtxGetCurrent), NULL for none. */
static CUcontext current_ctx(void)
{
	CUresult (*get)(CUcontext *) = driver_sym("cuCtxGetCurrent");
	CUcontext c = (CUcontext)&no_answer;

	if (get && get(&c) != CUDA_SUCCESS)
		c = (CUcontext)&no_answer;
	return c;
}

/* In child processes: the thread's current context is still @want. */
#define CK_CTX(want, after) \
	CK(current_ctx() == (want), "current context changed by %s", after)

/*
 * libtshm-cuda runs its driver calls in the device's primary context and
 * leaves the calling thread's current context (the CUDA runtime's current
 * device, which torch relies on) as it found it: a thread with none keeps
 * none through open, alloc, mem_info, wrap, unpack (an import), the
 * cache's drop and close, and (on the fake driver, where any pointer
 * stands for another device's context) another context stays current.
 * The fake driver, like the real one, refuses the context-bound calls
 * (cuMemGetInfo, cuMemGetAddressRange, cuIpc*) with none current, so a
 * call the library forgot to bracket fails here too.
 */
TEST(context_left_as_found)
{
	struct tshm_cuda_buf *b, *lb;
	static char other_device;
	size_t fr = 0, total = 0;
	struct tshm_cuda *cu;
	struct own_env e;
	struct probe pr;
	CUcontext before;
	void *d = NULL;
	pid_t pid;

	NEED_GPU(&pr, 1);
	ASSERT_EQ(0, own_env_open(&e));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tshm_cuda *ccu;
		struct tshm_cuda_buf *r;
		struct own_rx rx;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		CK(!tshm_cuda_open(0, &ccu), "open");
		CK_CTX(NULL, "tshm_cuda_open");
		child_own_unpack(ccu, e.q, &rx, 2, 1, &r);
		CK_CTX(NULL, "tshm_cuda_buf_unpack");
		own_release(&rx);
		tshm_cuda_buf_unref(r);
		tshm_cuda_cache_trim(ccu);
		tshm_cuda_close(ccu);	/* drops the cached import */
		CK_CTX(NULL, "tshm_cuda_close");
		_exit(0);
	}
	ASSERT_EQ(0, tshm_cuda_open(0, &cu)) TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_NE((CUcontext)&no_answer, current_ctx());
	EXPECT_EQ(NULL, current_ctx()) TH_LOG("after tshm_cuda_open");
	ASSERT_EQ(0, tshm_cuda_mem_info(cu, &fr, &total))
		TH_LOG("%s", tshm_cuda_last_error());
	EXPECT_EQ(NULL, current_ctx()) TH_LOG("after tshm_cuda_mem_info");
	ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, e.ctx, (size_t)pr.gran, &b))
		TH_LOG("%s", tshm_cuda_last_error());
	EXPECT_EQ(NULL, current_ctx()) TH_LOG("after tshm_cuda_buf_alloc");
	ASSERT_EQ(0, own_send(e.q, b, 1, 5000));
	ASSERT_EQ(0, exit_code(pid));
	ASSERT_EQ(0, tshm_cuda_buf_wait_released(b, 10000));
	tshm_cuda_buf_unref(b);		/* frees the allocation */
	EXPECT_EQ(NULL, current_ctx()) TH_LOG("after the allocation's free");

	/* cudaMalloc makes the runtime's context current on a GPU */
	ASSERT_EQ(0, dev_malloc(&d, 1UL << 20));
	before = current_ctx();
	ASSERT_EQ(0, tshm_cuda_buf_wrap(cu, e.ctx, d, 4096, &lb))
		TH_LOG("%s", tshm_cuda_last_error());
	EXPECT_EQ(before, current_ctx()) TH_LOG("after tshm_cuda_buf_wrap");
	tshm_cuda_buf_unref(lb);
	ASSERT_EQ(0, dev_free(d));

	if (FAKE) {
		CUresult (*push)(CUcontext) = driver_sym("cuCtxPushCurrent_v2");

		ASSERT_NE(NULL, push);
		ASSERT_EQ(CUDA_SUCCESS, push((CUcontext)&other_device));
		ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, e.ctx, (size_t)pr.gran,
						 &b));
		ASSERT_EQ(0, tshm_cuda_mem_info(cu, &fr, &total));
		tshm_cuda_buf_unref(b);
		EXPECT_EQ((CUcontext)&other_device, current_ctx());
	}
	before = current_ctx();
	tshm_cuda_close(cu);
	EXPECT_EQ(before, current_ctx()) TH_LOG("after tshm_cuda_close");
	own_env_close(&e);
}

/* In a child that made none: is a primary context active on ordinal 0? */
static int primary_active(void)
{
	CUresult (*get_dev)(CUdevice *, int) = driver_sym("cuDeviceGet");
	CUresult (*state)(CUdevice, unsigned int *, int *) =
		driver_sym("cuDevicePrimaryCtxGetState");
	unsigned int flags;
	CUdevice dev;
	int active = -1;

	if (!get_dev || !state || get_dev(&dev, 0) != CUDA_SUCCESS ||
	    state(dev, &flags, &active) != CUDA_SUCCESS)
		return -1;
	return active;
}

/*
 * tshm_cuda_desc_device() names the device a description's buffer lives
 * on by its UUID and makes no context anywhere: a child that opened
 * nothing asks, and no primary context is active after.  A forged UUID is
 * -EXDEV with the reason; a short or foreign description -EBADMSG.
 */
TEST(desc_device_opens_nothing)
{
	struct tshm_seg *segs[TSHM_CUDA_PACK_SEGS];
	unsigned nsegs = TSHM_CUDA_PACK_SEGS;
	struct tshm_cuda_buf *b;
	struct tshm_cuda *cu;
	struct tshm_ctx *ctx;
	struct probe pr;
	char desc[TSHM_CUDA_DESC_SIZE];
	int p[2], n, fd;
	pid_t pid;

	NEED_GPU(&pr, 1);
	ASSERT_EQ(0, pipe(p));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		struct tcu_wire w;
		int ret;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(p[1]);
		n = (int)read(p[0], desc, sizeof(desc));
		CK(n == (int)sizeof(w), "read %d", n);
		ret = tshm_cuda_desc_device(desc, n);
		CK(ret == 0, "desc_device %d", ret);
		CK(primary_active() == 0, "a primary context is active: %d",
		   primary_active());
		memcpy(&w, desc, sizeof(w));
		w.uuid[0] ^= 0xff;
		ret = tshm_cuda_desc_device(&w, sizeof(w));
		CK(ret == -EXDEV, "forged UUID %d", ret);
		CK(strstr(tshm_cuda_last_error(), "CUDA_VISIBLE_DEVICES"),
		   "no reason");
		printf("# %s\n", tshm_cuda_last_error());
		fflush(stdout);
		CK(tshm_cuda_desc_device(desc, n - 1) == -EBADMSG, "short");
		memcpy(&w, desc, sizeof(w));
		w.magic ^= 1;
		CK(tshm_cuda_desc_device(&w, sizeof(w)) == -EBADMSG, "magic");
		CK(tshm_cuda_desc_device(NULL, 1) == -EINVAL, "NULL");
		CK(primary_active() == 0, "a primary context is active");
		_exit(0);
	}
	close(p[0]);
	ASSERT_EQ(0, tshm_ctx_open(&ctx, 0));
	ASSERT_EQ(0, tshm_cuda_open(0, &cu)) TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, tshm_cuda_buf_alloc(cu, ctx, (size_t)pr.gran, &b))
		TH_LOG("%s", tshm_cuda_last_error());
	n = tshm_cuda_buf_pack(b, desc, sizeof(desc), segs, &nsegs, &fd);
	ASSERT_LT(0, n) TH_LOG("%s", tshm_cuda_last_error());
	ASSERT_EQ(0, tshm_cuda_desc_device(desc, n));
	ASSERT_EQ(n, write(p[1], desc, n));
	close(p[1]);
	ASSERT_EQ(0, exit_code(pid));
	tshm_cuda_buf_unref(b);
	tshm_cuda_close(cu);
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
