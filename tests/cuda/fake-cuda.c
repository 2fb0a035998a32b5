// SPDX-License-Identifier: GPL-2.0
/*
 * A fake CUDA driver (libtshm-cuda loads it through TSHM_CUDA_DRIVER) so
 * the channel, lease, cache, pool and kill logic of libtshm-cuda runs on
 * machines without a GPU: test-cuda-fake.  "Device memory" is host memory:
 * a VMM allocation is a memfd, its exported handle a dup of it, a mapping
 * an mmap of it; a legacy IPC handle names the exporter's memfd as
 * /proc/PID/fd/N.  cuMemGetInfo counts what is still allocated the way the
 * kernel frees it: every fake-vram memfd some process holds by an fd or a
 * mapping (found in /proc), so a library that leaks an import, a handle or
 * an fd leaves the memory counted, killed processes' memory goes back with
 * them, and an fd in flight in a socket counts (its file is alive) only if
 * some process maps it or holds it.  Memfds are named after
 * $TSHM_FAKE_VRAM_TAG (the test sets it) so that concurrent test runs do
 * not see each other's.  Only the calls libtshm-cuda makes exist, with the
 * semantics it relies on.  It proves nothing about the real driver.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>

#define FAKE_GRAN	(2UL << 20)
#define FAKE_TOTAL	(80ULL << 30)

struct fake_alloc {
	uintptr_t base;
	size_t size;
	int fd;		/* -1: an opened IPC mapping */
};

static struct fake_alloc allocs[4096];

/* "fake-vram-TAG": what this run's memfds are called. */
static const char *vram_name(void)
{
	static char name[64];
	const char *tag = getenv("TSHM_FAKE_VRAM_TAG");

	snprintf(name, sizeof(name), "fake-vram-%s", tag ? tag : "");
	return name;
}

static int vram_create(size_t size)
{
	int fd = memfd_create(vram_name(), MFD_CLOEXEC);

	if (fd >= 0 && ftruncate(fd, (off_t)size)) {
		close(fd);
		fd = -1;
	}
	return fd;
}
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#define API __attribute__((visibility("default")))

int tshm_fake_malloc(void **p, size_t size);
int tshm_fake_retained(int d);
int tshm_fake_free(void *p);

static int add_alloc(uintptr_t base, size_t size, int fd)
{
	int i;

	pthread_mutex_lock(&lock);
	for (i = 0; i < 4096; i++)
		if (!allocs[i].base) {
			allocs[i] = (struct fake_alloc){ base, size, fd };
			break;
		}
	pthread_mutex_unlock(&lock);
	return i < 4096 ? 0 : -1;
}

static struct fake_alloc *find_alloc(uintptr_t p)
{
	int i;

	for (i = 0; i < 4096; i++)
		if (allocs[i].base && p >= allocs[i].base &&
		    p < allocs[i].base + allocs[i].size)
			return &allocs[i];
	return NULL;
}

API CUresult cuInit(unsigned int flags)
{
	return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *v)
{
	*v = 13000;
	return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult r, const char **s)
{
	static char buf[32];

	snprintf(buf, sizeof(buf), "FAKE_CUDA_ERROR_%d", (int)r);
	*s = buf;
	return CUDA_SUCCESS;
}

API CUresult cuGetErrorString(CUresult r, const char **s)
{
	*s = "fake driver error";
	return CUDA_SUCCESS;
}

/*
 * $TSHM_FAKE_DEVICES devices (1 unless set, at most FAKE_MAX_DEV), each
 * with its own UUID and primary context; tshm_fake_retained() tells a test
 * how many retains of a device's primary context are outstanding (a
 * receiver must make a context only on the device its buffer lives on).
 */
#define FAKE_MAX_DEV	8
static _Atomic int retained[FAKE_MAX_DEV];
static char primary[FAKE_MAX_DEV];

static int fake_devices(void)
{
	const char *s = getenv("TSHM_FAKE_DEVICES");
	int n = s ? atoi(s) : 1;

	return n < 1 ? 1 : n > FAKE_MAX_DEV ? FAKE_MAX_DEV : n;
}

static bool bad_device(CUdevice d)
{
	return d < 0 || d >= fake_devices();
}

API int tshm_fake_retained(int d)
{
	return bad_device(d) ? -1 : atomic_load(&retained[d]);
}

API CUresult cuDeviceGetCount(int *n)
{
	*n = fake_devices();
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	if (bad_device(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
	int i;

	if (bad_device(d))
		return CUDA_ERROR_INVALID_DEVICE;
	for (i = 0; i < 16; i++)
		u->bytes[i] = (char)(0xf0 + i);
	u->bytes[0] = (char)(0xf0 + d);
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
	if (bad_device(d))
		return CUDA_ERROR_INVALID_DEVICE;
	*v = 1;
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	if (bad_device(d))
		return CUDA_ERROR_INVALID_DEVICE;
	atomic_fetch_add(&retained[d], 1);
	*c = (CUcontext)&primary[d];
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	if (bad_device(d) || atomic_load(&retained[d]) <= 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	atomic_fetch_sub(&retained[d], 1);
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags,
					int *active)
{
	if (bad_device(d))
		return CUDA_ERROR_INVALID_DEVICE;
	*flags = 0;
	*active = atomic_load(&retained[d]) > 0;
	return CUDA_SUCCESS;
}

/*
 * The calling thread's context stack, as the driver keeps it: its top is
 * the current context (none when empty), so a library that changes it and
 * does not restore it is seen by the tests (context_left_as_found).
 */
#define FAKE_CTX_DEPTH	16
static __thread CUcontext ctx_stack[FAKE_CTX_DEPTH];
static __thread int ctx_depth;

/* The device whose primary context @c is, or -1. */
static int primary_of(CUcontext c)
{
	char *p = (char *)c;

	return p >= primary && p < primary + FAKE_MAX_DEV ?
		(int)(p - primary) : -1;
}

/* @c is a device's primary context that someone still retains. */
static bool primary_live(CUcontext c)
{
	int d = primary_of(c);

	return d >= 0 && atomic_load(&retained[d]) > 0;
}

API CUresult cuCtxSetCurrent(CUcontext c)
{
	if (!c) {
		if (ctx_depth)
			ctx_depth--;
	} else if (!ctx_depth) {
		ctx_stack[ctx_depth++] = c;
	} else {
		ctx_stack[ctx_depth - 1] = c;
	}
	return CUDA_SUCCESS;
}

API CUresult cuCtxPushCurrent_v2(CUcontext c)
{
	/* a primary context released by all is destroyed */
	if (!c || (primary_of(c) >= 0 && !primary_live(c)))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth == FAKE_CTX_DEPTH)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = c;
	return CUDA_SUCCESS;
}

API CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
	if (!ctx_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	ctx_depth--;
	if (c)
		*c = ctx_stack[ctx_depth];
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *c)
{
	*c = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
	return CUDA_SUCCESS;
}

/*
 * The calls that work in the current context need one: stricter than the
 * driver (which lets some VMM calls run without), so that a library call
 * that forgot to push its own fails here even on a thread where some
 * other context is current.
 */
static bool ctx_ok(void)
{
	return ctx_depth && primary_live(ctx_stack[ctx_depth - 1]);
}

struct vram_seen {
	unsigned long ino;
	uint64_t size;
};

static void seen_add(struct vram_seen *seen, unsigned *n, unsigned max,
		     unsigned long ino, uint64_t size)
{
	unsigned i;

	for (i = 0; i < *n; i++)
		if (seen[i].ino == ino) {
			if (size > seen[i].size)
				seen[i].size = size;
			return;
		}
	if (*n < max)
		seen[(*n)++] = (struct vram_seen){ ino, size };
}

/* This run's memfds that process @pid holds open or maps. */
static void scan_pid(const char *pid, const char *want,
		     struct vram_seen *seen, unsigned *n, unsigned max)
{
	char path[300], link[256], line[512];
	struct dirent *de;
	struct stat st;
	FILE *maps;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%s/fd", pid);
	d = opendir(path);
	while (d && (de = readdir(d))) {
		ssize_t k;

		snprintf(path, sizeof(path), "/proc/%s/fd/%s", pid, de->d_name);
		k = readlink(path, link, sizeof(link) - 1);
		if (k <= 0)
			continue;
		link[k] = 0;
		if (strstr(link, want) && !stat(path, &st))
			seen_add(seen, n, max, st.st_ino, st.st_size);
	}
	if (d)
		closedir(d);
	snprintf(path, sizeof(path), "/proc/%s/maps", pid);
	maps = fopen(path, "re");
	while (maps && fgets(line, sizeof(line), maps)) {
		unsigned long long start, end, off;
		unsigned long ino;

		if (!strstr(line, want) ||
		    sscanf(line, "%llx-%llx %*s %llx %*s %lu", &start, &end,
			   &off, &ino) != 4)
			continue;
		seen_add(seen, n, max, ino, off + (end - start));
	}
	if (maps)
		fclose(maps);
}

API CUresult cuMemGetInfo_v2(size_t *fr, size_t *total)
{
	static struct vram_seen seen[8192];
	char want[80];
	uint64_t used = 0;
	struct dirent *de;
	unsigned n = 0, i;
	DIR *proc;

	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	/* "/memfd:fake-vram-TAG (deleted)": the space keeps TAG whole */
	snprintf(want, sizeof(want), "memfd:%s ", vram_name());
	pthread_mutex_lock(&lock);
	proc = opendir("/proc");
	while (proc && (de = readdir(proc)))
		if (isdigit((unsigned char)de->d_name[0]))
			scan_pid(de->d_name, want, seen, &n, 8192);
	if (proc)
		closedir(proc);
	for (i = 0; i < n; i++)
		used += seen[i].size;
	pthread_mutex_unlock(&lock);
	*fr = used > FAKE_TOTAL ? 0 : FAKE_TOTAL - used;
	*total = FAKE_TOTAL;
	return CUDA_SUCCESS;
}

API CUresult cuMemGetAllocationGranularity(size_t *g,
		const CUmemAllocationProp *p, CUmemAllocationGranularity_flags f)
{
	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	*g = FAKE_GRAN;
	return CUDA_SUCCESS;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
			 const CUmemAllocationProp *p, unsigned long long f)
{
	int fd;

	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!size || size % FAKE_GRAN)
		return CUDA_ERROR_INVALID_VALUE;
	fd = vram_create(size);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*h = (CUmemGenericAllocationHandle)fd + 1;
	return CUDA_SUCCESS;
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	return close((int)h - 1) ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
				 CUdeviceptr addr, unsigned long long f)
{
	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS |
		       MAP_NORESERVE, -1, 0);

	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	return munmap((void *)(uintptr_t)p, size) ? CUDA_ERROR_INVALID_VALUE :
		CUDA_SUCCESS;
}

API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off,
		      CUmemGenericAllocationHandle h, unsigned long long f)
{
	struct stat st;
	int fd = (int)h - 1;

	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (fstat(fd, &st) || (size_t)st.st_size < size + off)
		return CUDA_ERROR_INVALID_VALUE;
	if (mmap((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_FIXED, fd, (off_t)off) == MAP_FAILED)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE |
		 MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

API CUresult cuMemSetAccess(CUdeviceptr p, size_t size,
			    const CUmemAccessDesc *d, size_t n)
{
	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	return CUDA_SUCCESS;
}

API CUresult cuMemExportToShareableHandle(void *out,
		CUmemGenericAllocationHandle h, CUmemAllocationHandleType t,
		unsigned long long f)
{
	int fd;

	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	fd = dup((int)h - 1);
	if (fd < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h,
		void *handle, CUmemAllocationHandleType t)
{
	int fd = (int)(uintptr_t)handle, nfd;
	char path[64], link[64] = "";

	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (readlink(path, link, sizeof(link) - 1) < 0 ||
	    !strstr(link, "fake-vram"))
		return CUDA_ERROR_INVALID_VALUE;
	nfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (nfd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*h = (CUmemGenericAllocationHandle)nfd + 1;
	return CUDA_SUCCESS;
}

API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size,
				     CUdeviceptr p)
{
	struct fake_alloc *a;

	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	a = find_alloc((uintptr_t)p);
	if (a) {
		*base = a->base;
		*size = a->size;
	}
	pthread_mutex_unlock(&lock);
	return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

struct fake_ipc {
	uint32_t magic;
	int32_t pid;
	int32_t fd;
	uint32_t pad;
	uint64_t size;
};

API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	struct fake_ipc fi = { .magic = 0xfa4e1bc0 };
	struct fake_alloc *a;

	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	a = find_alloc((uintptr_t)p);
	if (a && a->base == p && a->fd >= 0) {
		fi.pid = getpid();
		fi.fd = a->fd;
		fi.size = a->size;
	}
	pthread_mutex_unlock(&lock);
	if (!fi.pid)
		return CUDA_ERROR_INVALID_VALUE;
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &fi, sizeof(fi));
	return CUDA_SUCCESS;
}

API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h,
				   unsigned int flags)
{
	struct fake_ipc fi;
	char path[64];
	void *m;
	int fd;

	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	memcpy(&fi, h.reserved, sizeof(fi));
	if (fi.magic != 0xfa4e1bc0)
		return CUDA_ERROR_INVALID_VALUE;
	if (fi.pid == getpid())
		return CUDA_ERROR_INVALID_CONTEXT;	/* as the real one */
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", fi.pid, fi.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	m = mmap(NULL, fi.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (add_alloc((uintptr_t)m, fi.size, -1)) {
		munmap(m, fi.size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

API CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	struct fake_alloc *a;

	if (!ctx_ok())
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	a = find_alloc((uintptr_t)p);
	if (a && a->fd < 0) {
		munmap((void *)a->base, a->size);
		memset(a, 0, sizeof(*a));
	} else {
		a = NULL;
	}
	pthread_mutex_unlock(&lock);
	return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* cudaMalloc/cudaFree stand-ins for the tests (not driver API). */
API int tshm_fake_malloc(void **p, size_t size)
{
	int fd = vram_create(size);
	void *m;

	if (fd < 0)
		return 2;
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED || add_alloc((uintptr_t)m, size, fd))
		return 2;
	*p = m;
	return 0;
}

API int tshm_fake_free(void *p)
{
	struct fake_alloc *a;

	pthread_mutex_lock(&lock);
	a = find_alloc((uintptr_t)p);
	if (a && a->fd >= 0 && a->base == (uintptr_t)p) {
		munmap(p, a->size);
		close(a->fd);
		memset(a, 0, sizeof(*a));
	} else {
		a = NULL;
	}
	pthread_mutex_unlock(&lock);
	return a ? 0 : 1;
}
