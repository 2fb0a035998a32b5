// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * libtshm-cuda: GPU buffers shared through tshm queues.
 *
 * Design (Documentation/cuda/guide.rst has the long version):
 *
 *  - The driver API is loaded with dlopen("libcuda.so.1") at tshm_cuda_open()
 *    time, never linked: a program starts on a machine without the NVIDIA
 *    driver and gets -ENODEV, never a loader failure (and never the stub
 *    from $(CUDA_HOME)/lib64/stubs, which is not named libcuda.so.1).
 *  - A channel is a tshm queue (message bytes + lease segments) plus an
 *    AF_UNIX SOCK_SEQPACKET socketpair on which VMM buffers' exported fds
 *    travel with SCM_RIGHTS.  Two robust process-shared mutexes (producers,
 *    consumers) keep the socket and the queue in the same order; every fd
 *    datagram carries the sequence number of its queue message, so an
 *    orphan left by a process killed between the two is skipped.
 *  - Each buffer has a lease segment (sent with every message, held by a
 *    receiver while it uses the buffer: the producer's release wait) and,
 *    for VMM buffers, an anchor segment (held by receivers' caches; the
 *    producer marks it dead when it frees its copy, so caches drop the
 *    import and the memory goes back to the GPU).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "tshm-cuda.h"

/* ---- the driver, loaded at run time ---- */

#define CU_FN(name)	__typeof__(&name) name

struct cu_api {
	void *dl;
	CU_FN(cuInit);
	CU_FN(cuDriverGetVersion);
	CU_FN(cuGetErrorName);
	CU_FN(cuGetErrorString);
	CU_FN(cuDeviceGetCount);
	CU_FN(cuDeviceGet);
	CU_FN(cuDeviceGetUuid);
	CU_FN(cuDeviceGetAttribute);
	CU_FN(cuDevicePrimaryCtxRetain);
	CU_FN(cuDevicePrimaryCtxRelease);
	CU_FN(cuCtxSetCurrent);
	CU_FN(cuMemGetInfo);
	CU_FN(cuMemGetAllocationGranularity);
	CU_FN(cuMemCreate);
	CU_FN(cuMemRelease);
	CU_FN(cuMemAddressReserve);
	CU_FN(cuMemAddressFree);
	CU_FN(cuMemMap);
	CU_FN(cuMemUnmap);
	CU_FN(cuMemSetAccess);
	CU_FN(cuMemExportToShareableHandle);
	CU_FN(cuMemImportFromShareableHandle);
	CU_FN(cuMemGetAddressRange);
	CU_FN(cuIpcGetMemHandle);
	CU_FN(cuIpcOpenMemHandle);
	CU_FN(cuIpcCloseMemHandle);
};

static struct cu_api api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static int api_err;
static char api_msg[256];

static __thread char last_err[512];

#define STR_(x)	#x
#define STR(x)	STR_(x)	/* the ABI name cuda.h maps to, e.g. ..._v2 */

static __attribute__((format(printf, 1, 2))) void set_err(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_err, sizeof(last_err), fmt, ap);
	va_end(ap);
}

const char *tshm_cuda_last_error(void)
{
	return last_err[0] ? last_err : "no error";
}

static void api_load(void)
{
	const char *path = getenv("TSHM_CUDA_DRIVER");
	void *dl;

	if (!path || !*path)
		path = "libcuda.so.1";
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!dl) {
		api_err = -ENODEV;
		snprintf(api_msg, sizeof(api_msg),
			 "no CUDA driver: %s", dlerror());
		return;
	}
#define LOAD(name) do {							\
		*(void **)&api.name = dlsym(dl, STR(name));		\
		if (!api.name) {					\
			api_err = -ENOSYS;				\
			snprintf(api_msg, sizeof(api_msg),		\
				 "CUDA driver too old: no %s", STR(name)); \
			dlclose(dl);					\
			return;						\
		}							\
	} while (0)
	LOAD(cuInit);
	LOAD(cuDriverGetVersion);
	LOAD(cuGetErrorName);
	LOAD(cuGetErrorString);
	LOAD(cuDeviceGetCount);
	LOAD(cuDeviceGet);
	LOAD(cuDeviceGetUuid);
	LOAD(cuDeviceGetAttribute);
	LOAD(cuDevicePrimaryCtxRetain);
	LOAD(cuDevicePrimaryCtxRelease);
	LOAD(cuCtxSetCurrent);
	LOAD(cuMemGetInfo);
	LOAD(cuMemGetAllocationGranularity);
	LOAD(cuMemCreate);
	LOAD(cuMemRelease);
	LOAD(cuMemAddressReserve);
	LOAD(cuMemAddressFree);
	LOAD(cuMemMap);
	LOAD(cuMemUnmap);
	LOAD(cuMemSetAccess);
	LOAD(cuMemExportToShareableHandle);
	LOAD(cuMemImportFromShareableHandle);
	LOAD(cuMemGetAddressRange);
	LOAD(cuIpcGetMemHandle);
	LOAD(cuIpcOpenMemHandle);
	LOAD(cuIpcCloseMemHandle);
#undef LOAD
	api.dl = dl;
}

/* ---- errors ---- */

int tshm_cuda_errno(int r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_INVALID_VALUE:
		return -EINVAL;
	case CUDA_ERROR_OUT_OF_MEMORY:
	case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
		return -ENOMEM;
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
	case CUDA_ERROR_STUB_LIBRARY:
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_DEVICE_UNAVAILABLE:
	case CUDA_ERROR_DEVICE_NOT_LICENSED:
	case CUDA_ERROR_SYSTEM_NOT_READY:
	case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
	case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
		return -ENODEV;
	case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
		return -ENOSYS;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_INVALID_HANDLE:
	case CUDA_ERROR_INVALID_CONTEXT:
	case CUDA_ERROR_CONTEXT_IS_DESTROYED:
		return -EBADF;
	case CUDA_ERROR_ALREADY_MAPPED:
		return -EEXIST;
	case CUDA_ERROR_ALREADY_ACQUIRED:
	case CUDA_ERROR_CONTEXT_ALREADY_IN_USE:
	case CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE:
		return -EBUSY;
	case CUDA_ERROR_NOT_MAPPED:
	case CUDA_ERROR_NOT_FOUND:
		return -ENOENT;
	case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
		return -EXDEV;
	case CUDA_ERROR_NOT_PERMITTED:
		return -EPERM;
	case CUDA_ERROR_NOT_READY:
		return -EAGAIN;
	case CUDA_ERROR_TIMEOUT:
	case CUDA_ERROR_LAUNCH_TIMEOUT:
		return -ETIMEDOUT;
	case CUDA_ERROR_ILLEGAL_ADDRESS:
	case CUDA_ERROR_MISALIGNED_ADDRESS:
		return -EFAULT;
	default:	/* ECC, launch failures, OS errors, unknown */
		return -EIO;
	}
}

const char *tshm_cuda_strerror(int err)
{
	switch (err < 0 ? -err : err) {
	case ENODEV:
		return "no usable CUDA driver or device";
	case ENOSYS:
		return "CUDA driver too old for this call";
	case EXDEV:
		return "GPU buffer is on another device than this process uses";
	case EBADMSG:
		return "not a tshm-cuda message, or its fd went missing";
	case EBADF:
		return "invalid CUDA handle or context";
	case EOPNOTSUPP:
		return "not supported by this device or driver";
	default:
		return tshm_strerror(err);
	}
}

static int cu_fail(const char *what, CUresult r)
{
	const char *name = NULL, *str = NULL;

	if (api.cuGetErrorName)
		api.cuGetErrorName(r, &name);
	if (api.cuGetErrorString)
		api.cuGetErrorString(r, &str);
	if (name)
		set_err("%s: %s (%s)", what, name, str ? str : "?");
	else	/* e.g. the stub library, which names nothing */
		set_err("%s: CUresult %d", what, (int)r);
	return tshm_cuda_errno(r);
}

#define CU_CALL(call) ({						\
		CUresult __r = api.call;				\
		__r == CUDA_SUCCESS ? 0 : cu_fail(#call, __r);		\
	})

/* ---- devices ---- */

struct cache_ent {
	struct cache_ent *next;
	uint64_t id;
	enum tshm_cuda_kind kind;
	CUdeviceptr base;	/* VMM: reserved range; legacy: IPC base */
	size_t size;
	struct tshm_seg *anchor;	/* VMM only */
	unsigned users;		/* receiver buffers using it now */
};

struct tshm_cuda {
	CUdevice dev;
	int ordinal;
	CUcontext ctx;
	CUuuid uuid;
	int vmm;
	size_t gran;
	pthread_mutex_t lock;
	struct cache_ent *cache;
	struct tshm_cuda_stats st;
};

struct anchor_data {
	uint32_t magic;
	_Atomic uint32_t dead;	/* set by the producer when it frees its copy */
	uint64_t id;
	int32_t pid;		/* the producer, for caches to notice its death */
	uint32_t pad;
};

#define ANCHOR_MAGIC	0x74637561U	/* "tcua" */

int tshm_cuda_open(int ordinal, struct tshm_cuda **out)
{
	struct tshm_cuda *cu;
	int n = 0, v = 0, ret;

	*out = NULL;
	pthread_once(&api_once, api_load);
	if (api_err) {
		set_err("%s", api_msg);
		return api_err;
	}
	ret = CU_CALL(cuInit(0));
	if (ret)
		return ret;
	ret = CU_CALL(cuDeviceGetCount(&n));
	if (ret)
		return ret;
	if (ordinal < 0 || ordinal >= n) {
		set_err("no CUDA device %d (%d visible)", ordinal, n);
		return -ENODEV;
	}
	cu = calloc(1, sizeof(*cu));
	if (!cu)
		return -ENOMEM;
	pthread_mutex_init(&cu->lock, NULL);
	cu->ordinal = ordinal;
	ret = CU_CALL(cuDeviceGet(&cu->dev, ordinal));
	if (!ret)
		ret = CU_CALL(cuDeviceGetUuid(&cu->uuid, cu->dev));
	if (!ret)
		ret = CU_CALL(cuDevicePrimaryCtxRetain(&cu->ctx, cu->dev));
	if (ret) {
		free(cu);
		return ret;
	}
	ret = CU_CALL(cuCtxSetCurrent(cu->ctx));
	if (ret) {
		api.cuDevicePrimaryCtxRelease(cu->dev);
		free(cu);
		return ret;
	}
	if (api.cuDeviceGetAttribute(&v,
	    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
	    cu->dev) == CUDA_SUCCESS && v &&
	    api.cuDeviceGetAttribute(&v,
	    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
	    cu->dev) == CUDA_SUCCESS && v) {
		CUmemAllocationProp prop = { 0 };

		prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = cu->dev;
		prop.requestedHandleTypes =
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
		if (api.cuMemGetAllocationGranularity(&cu->gran, &prop,
		    CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
		    cu->gran)
			cu->vmm = 1;
	}
	*out = cu;
	return 0;
}

int tshm_cuda_make_current(struct tshm_cuda *cu)
{
	return CU_CALL(cuCtxSetCurrent(cu->ctx));
}

static void ent_drop(struct tshm_cuda *cu, struct cache_ent *e)
{
	api.cuCtxSetCurrent(cu->ctx);
	if (e->kind == TSHM_CUDA_VMM) {
		api.cuMemUnmap(e->base, e->size);
		api.cuMemAddressFree(e->base, e->size);
		if (e->anchor)
			tshm_seg_unref(e->anchor);
	} else {
		api.cuIpcCloseMemHandle(e->base);
	}
	free(e);
}

void tshm_cuda_close(struct tshm_cuda *cu)
{
	struct cache_ent *e, *n;

	if (!cu)
		return;
	api.cuCtxSetCurrent(cu->ctx);
	for (e = cu->cache; e; e = n) {
		n = e->next;
		ent_drop(cu, e);
	}
	api.cuDevicePrimaryCtxRelease(cu->dev);
	pthread_mutex_destroy(&cu->lock);
	free(cu);
}

int tshm_cuda_device(const struct tshm_cuda *cu)
{
	return (int)cu->dev;
}

void tshm_cuda_uuid(const struct tshm_cuda *cu, uint8_t uuid[16])
{
	memcpy(uuid, cu->uuid.bytes, 16);
}

void tshm_cuda_uuid_str(const uint8_t u[16], char *buf, size_t len)
{
	snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
		 "%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4],
		 u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
		 u[14], u[15]);
}

int tshm_cuda_check_uuid(struct tshm_cuda *cu, const uint8_t uuid[16])
{
	char a[48], b[48];

	if (!memcmp(uuid, cu->uuid.bytes, 16))
		return 0;
	tshm_cuda_uuid_str(uuid, a, sizeof(a));
	tshm_cuda_uuid_str((const uint8_t *)cu->uuid.bytes, b, sizeof(b));
	set_err("buffer is on %s, this process uses %s (device %d); "
		"check CUDA_VISIBLE_DEVICES", a, b, cu->ordinal);
	return -EXDEV;
}

int tshm_cuda_vmm_supported(struct tshm_cuda *cu)
{
	return cu->vmm;
}

int64_t tshm_cuda_granularity(struct tshm_cuda *cu)
{
	if (!cu->vmm) {
		set_err("device %d cannot export VMM memory as fds",
			cu->ordinal);
		return -EOPNOTSUPP;
	}
	return (int64_t)cu->gran;
}

int tshm_cuda_mem_info(struct tshm_cuda *cu, size_t *free_b, size_t *total_b)
{
	int ret = CU_CALL(cuCtxSetCurrent(cu->ctx));

	return ret ? ret : CU_CALL(cuMemGetInfo(free_b, total_b));
}

void tshm_cuda_stats(struct tshm_cuda *cu, struct tshm_cuda_stats *st)
{
	pthread_mutex_lock(&cu->lock);
	*st = cu->st;
	pthread_mutex_unlock(&cu->lock);
}

/*
 * The producer freed its copy, or died without doing so (checked only when
 * @check_pid: a kill(pid, 0) per entry; a reused pid keeps the entry).
 */
static int ent_dead(const struct cache_ent *e, int check_pid)
{
	struct anchor_data *ad;

	if (e->kind != TSHM_CUDA_VMM || !e->anchor)
		return 0;
	ad = tshm_seg_data(e->anchor);
	if (atomic_load(&ad->dead))
		return 1;
	return check_pid && ad->pid > 0 && kill(ad->pid, 0) < 0 &&
		errno == ESRCH;
}

/* Called with cu->lock held. */
static int cache_trim_locked(struct tshm_cuda *cu, int check_pid)
{
	struct cache_ent **pp = &cu->cache, *e;
	int n = 0;

	while ((e = *pp)) {
		if (!e->users && ent_dead(e, check_pid)) {
			*pp = e->next;
			ent_drop(cu, e);
			cu->st.evictions++;
			cu->st.cached--;
			n++;
			continue;
		}
		pp = &e->next;
	}
	return n;
}

int tshm_cuda_cache_trim(struct tshm_cuda *cu)
{
	int n;

	pthread_mutex_lock(&cu->lock);
	api.cuCtxSetCurrent(cu->ctx);
	n = cache_trim_locked(cu, 1);
	pthread_mutex_unlock(&cu->lock);
	return n;
}

/* ---- buffers ---- */

struct tshm_cuda_buf {
	struct tshm_cuda *cu;
	enum tshm_cuda_kind kind;
	int producer;
	_Atomic int refs;
	uint64_t id;
	CUdeviceptr ptr;
	size_t size;
	struct tshm_seg *lease;
	struct tshm_seg *anchor;	/* producer, VMM */
	/* producer, VMM */
	CUmemGenericAllocationHandle h;
	int fd;
	/* producer, legacy */
	CUipcMemHandle ipc;
	uint64_t ipc_off;
	/* receiver */
	struct cache_ent *ent;
};

static uint64_t new_id(void)
{
	uint64_t id = 0;

	while (!id)
		if (getrandom(&id, sizeof(id), 0) != sizeof(id))
			id = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL)
				^ (uint64_t)(uintptr_t)&id;
	return id;
}

static int make_segs(struct tshm_ctx *ctx, struct tshm_cuda_buf *b, int anchor)
{
	int ret = tshm_seg_create(ctx, 4096, "cuda-lease", 0, &b->lease);

	if (ret) {
		set_err("lease segment: %s", tshm_strerror(ret));
		return ret;
	}
	if (anchor) {
		struct anchor_data *ad;

		ret = tshm_seg_create(ctx, 4096, "cuda-anchor", 0, &b->anchor);
		if (ret) {
			set_err("anchor segment: %s", tshm_strerror(ret));
			tshm_seg_unref(b->lease);
			b->lease = NULL;
			return ret;
		}
		ad = tshm_seg_data(b->anchor);
		ad->magic = ANCHOR_MAGIC;
		ad->id = b->id;
		ad->pid = getpid();
		atomic_store(&ad->dead, 0);
	}
	return 0;
}

int tshm_cuda_buf_alloc(struct tshm_cuda *cu, struct tshm_ctx *ctx,
			size_t size, struct tshm_cuda_buf **out)
{
	CUmemAllocationProp prop = { 0 };
	CUmemAccessDesc acc = { 0 };
	struct tshm_cuda_buf *b;
	int ret;

	*out = NULL;
	if (!cu->vmm) {
		set_err("device %d cannot export VMM memory as fds; use "
			"tshm_cuda_buf_wrap()", cu->ordinal);
		return -EOPNOTSUPP;
	}
	if (!size || size % cu->gran) {
		set_err("size %zu is not a positive multiple of the allocation "
			"granularity %zu (cuMemGetAllocationGranularity)",
			size, cu->gran);
		return -EINVAL;
	}
	ret = tshm_cuda_make_current(cu);
	if (ret)
		return ret;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->cu = cu;
	b->kind = TSHM_CUDA_VMM;
	b->producer = 1;
	b->refs = 1;
	b->id = new_id();
	b->size = size;
	b->fd = -1;

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = cu->dev;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	ret = CU_CALL(cuMemCreate(&b->h, size, &prop, 0));
	if (ret)
		goto err_free;
	ret = CU_CALL(cuMemAddressReserve(&b->ptr, size, cu->gran, 0, 0));
	if (ret)
		goto err_release;
	ret = CU_CALL(cuMemMap(b->ptr, size, 0, b->h, 0));
	if (ret)
		goto err_addr;
	acc.location = prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	ret = CU_CALL(cuMemSetAccess(b->ptr, size, &acc, 1));
	if (ret)
		goto err_unmap;
	ret = CU_CALL(cuMemExportToShareableHandle(&b->fd, b->h,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	if (ret)
		goto err_unmap;
	fcntl(b->fd, F_SETFD, FD_CLOEXEC);
	ret = make_segs(ctx, b, 1);
	if (ret)
		goto err_fd;
	*out = b;
	return 0;

err_fd:
	close(b->fd);
err_unmap:
	api.cuMemUnmap(b->ptr, size);
err_addr:
	api.cuMemAddressFree(b->ptr, size);
err_release:
	api.cuMemRelease(b->h);
err_free:
	free(b);
	return ret;
}

int tshm_cuda_buf_wrap(struct tshm_cuda *cu, struct tshm_ctx *ctx,
		       void *dptr, size_t size, struct tshm_cuda_buf **out)
{
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)dptr, base = 0;
	size_t bsize = 0;
	struct tshm_cuda_buf *b;
	int ret;

	*out = NULL;
	if (!size) {
		set_err("size 0");
		return -EINVAL;
	}
	ret = tshm_cuda_make_current(cu);
	if (ret)
		return ret;
	ret = CU_CALL(cuMemGetAddressRange(&base, &bsize, p));
	if (ret)
		return ret;
	if (size > bsize || p - base > bsize - size) {
		set_err("range %zu bytes at %#llx runs past its allocation "
			"(%zu bytes at %#llx)", size, (unsigned long long)p,
			bsize, (unsigned long long)base);
		return -EINVAL;
	}
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->cu = cu;
	b->kind = TSHM_CUDA_LEGACY;
	b->producer = 1;
	b->refs = 1;
	b->id = new_id();
	b->ptr = p;
	b->size = size;
	b->fd = -1;
	b->ipc_off = p - base;
	ret = CU_CALL(cuIpcGetMemHandle(&b->ipc, base));
	if (!ret)
		ret = make_segs(ctx, b, 0);
	if (ret) {
		free(b);
		return ret;
	}
	*out = b;
	return 0;
}

void *tshm_cuda_buf_ptr(const struct tshm_cuda_buf *b)
{
	return (void *)(uintptr_t)b->ptr;
}

size_t tshm_cuda_buf_size(const struct tshm_cuda_buf *b)
{
	return b->size;
}

uint64_t tshm_cuda_buf_id(const struct tshm_cuda_buf *b)
{
	return b->id;
}

enum tshm_cuda_kind tshm_cuda_buf_kind(const struct tshm_cuda_buf *b)
{
	return b->kind;
}

struct tshm_seg *tshm_cuda_buf_lease(struct tshm_cuda_buf *b)
{
	return b->lease;
}

int tshm_cuda_buf_wait_released(struct tshm_cuda_buf *b, int timeout_ms)
{
	if (!b->producer)
		return -EOPNOTSUPP;
	return tshm_seg_wait_released(b->lease, timeout_ms);
}

static struct tshm_cuda_buf *buf_ref(struct tshm_cuda_buf *b)
{
	atomic_fetch_add(&b->refs, 1);
	return b;
}

static void buf_free(struct tshm_cuda_buf *b)
{
	struct tshm_cuda *cu = b->cu;

	if (b->producer) {
		if (b->kind == TSHM_CUDA_VMM) {
			api.cuCtxSetCurrent(cu->ctx);
			api.cuMemUnmap(b->ptr, b->size);
			api.cuMemAddressFree(b->ptr, b->size);
			api.cuMemRelease(b->h);
			close(b->fd);
			atomic_store(&((struct anchor_data *)
				       tshm_seg_data(b->anchor))->dead, 1);
			tshm_seg_unref(b->anchor);
		}
	} else if (b->ent) {
		pthread_mutex_lock(&cu->lock);
		if (!--b->ent->users && b->kind == TSHM_CUDA_LEGACY) {
			/* an open IPC mapping is what the lease covers */
			struct cache_ent **pp = &cu->cache;

			while (*pp != b->ent)
				pp = &(*pp)->next;
			*pp = b->ent->next;
			api.cuCtxSetCurrent(cu->ctx);
			ent_drop(cu, b->ent);
			cu->st.cached--;
		}
		pthread_mutex_unlock(&cu->lock);
	}
	if (b->lease)
		tshm_seg_unref(b->lease);
	free(b);
}

void tshm_cuda_buf_unref(struct tshm_cuda_buf *b)
{
	if (b && atomic_fetch_sub(&b->refs, 1) == 1)
		buf_free(b);
}

/* ---- channels ---- */

struct chan_shared {
	uint32_t magic;
	uint32_t pad;
	pthread_mutex_t send_lock;
	pthread_mutex_t recv_lock;
	uint64_t next_seq;
};

#define CHAN_MAGIC	0x74636368U
#define WIRE_MAGIC	0x74637731U

struct wire {
	uint32_t magic;
	uint8_t kind;
	uint8_t nsegs;
	uint16_t pad;
	uint64_t id;
	uint64_t size;
	uint64_t seq;
	uint64_t ipc_off;
	uint8_t uuid[16];
	uint8_t ipc[CU_IPC_HANDLE_SIZE];
	uint32_t len;
	uint32_t pad2;
};

struct fd_msg {
	uint64_t seq;
	uint64_t id;
};

struct tshm_cuda_chan {
	struct tshm_queue *q;
	struct tshm_seg *shm;
	struct chan_shared *sh;
	int sock[2];		/* [0] producers write, [1] consumers read */
	size_t max_msg;
};

int tshm_cuda_chan_create(struct tshm_ctx *ctx, unsigned capacity,
			  size_t max_msg, struct tshm_cuda_chan **out)
{
	struct tshm_cuda_chan *ch;
	pthread_mutexattr_t ma;
	int ret, sz = 4 << 20;

	*out = NULL;
	if (max_msg > (1U << 20))
		return -EINVAL;
	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	ch->max_msg = max_msg;
	ret = tshm_queue_create(ctx, capacity, sizeof(struct wire) + max_msg,
				&ch->q);
	if (ret)
		goto err;
	ret = tshm_seg_create(ctx, 4096, "cuda-chan", 0, &ch->shm);
	if (ret)
		goto err_q;
	ch->sh = tshm_seg_data(ch->shm);
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&ch->sh->send_lock, &ma);
	pthread_mutex_init(&ch->sh->recv_lock, &ma);
	pthread_mutexattr_destroy(&ma);
	ch->sh->next_seq = 1;
	ch->sh->magic = CHAN_MAGIC;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ch->sock)) {
		ret = -errno;
		goto err_shm;
	}
	setsockopt(ch->sock[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(ch->sock[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	*out = ch;
	return 0;

err_shm:
	tshm_seg_unref(ch->shm);
err_q:
	tshm_queue_unref(ch->q);
err:
	free(ch);
	return ret;
}

int tshm_cuda_chan_close(struct tshm_cuda_chan *ch)
{
	return tshm_queue_close(ch->q);
}

struct tshm_queue *tshm_cuda_chan_queue(struct tshm_cuda_chan *ch)
{
	return ch->q;
}

void tshm_cuda_chan_destroy(struct tshm_cuda_chan *ch)
{
	if (!ch)
		return;
	close(ch->sock[0]);
	close(ch->sock[1]);
	tshm_seg_unref(ch->shm);
	tshm_queue_unref(ch->q);
	free(ch);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left before @deadline (-1: forever), 0 once passed. */
static int left_ms(int64_t deadline)
{
	int64_t l;

	if (deadline < 0)
		return -1;
	l = deadline - now_ms();
	return l < 0 ? 0 : (int)(l > 0x7fffffff ? 0x7fffffff : l);
}

static int64_t deadline_of(int timeout_ms)
{
	return timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
}

static int lock_robust(pthread_mutex_t *m, int timeout_ms)
{
	struct timespec ts;
	int r;

	if (timeout_ms < 0) {
		r = pthread_mutex_lock(m);
	} else if (timeout_ms == 0) {
		r = pthread_mutex_trylock(m);
	} else {
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += timeout_ms / 1000;
		ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		r = pthread_mutex_timedlock(m, &ts);
	}
	if (r == EOWNERDEAD) {
		/* the holder died; the sequence numbers heal the state */
		pthread_mutex_consistent(m);
		r = 0;
	}
	if (r == EBUSY)
		return -EAGAIN;
	return -r;
}

static int send_fd(int sock, const struct fd_msg *m, int fd, int64_t deadline)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { (void *)m, sizeof(*m) };
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
	};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	struct pollfd pfd = { .fd = sock, .events = POLLOUT };

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	for (;;) {
		if (sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0)
			return 0;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN) {
			set_err("sending the buffer's fd: %s", strerror(errno));
			return -errno;
		}
		if (!left_ms(deadline))
			return deadline < 0 ? -EAGAIN : -ETIMEDOUT;
		poll(&pfd, 1, left_ms(deadline));
	}
}

/*
 * Take the fd datagram of message @seq from the consumers' end: skip (and
 * close) orphans with lower numbers, left by a process killed between the
 * socket and the queue.  Called under recv_lock.
 */
static int take_fd(int sock, uint64_t seq, uint64_t id, int *fdp)
{
	struct pollfd pfd = { .fd = sock, .events = POLLIN };

	for (;;) {
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct fd_msg m;
		struct iovec iov = { &m, sizeof(m) };
		struct msghdr mh = {
			.msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = cbuf, .msg_controllen = sizeof(cbuf),
		};
		struct cmsghdr *c;
		ssize_t n;
		int fd = -1;

		n = recv(sock, &m, sizeof(m), MSG_PEEK | MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			/* sent before the queue message: should be there */
			if (poll(&pfd, 1, 5000) > 0)
				continue;
			set_err("fd of message %llu never arrived",
				(unsigned long long)seq);
			return -EBADMSG;
		}
		if (n != sizeof(m) || m.seq > seq) {
			set_err("fd of message %llu is missing",
				(unsigned long long)seq);
			return -EBADMSG;
		}
		n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0)
			continue;
		for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_level == SOL_SOCKET &&
			    c->cmsg_type == SCM_RIGHTS)
				memcpy(&fd, CMSG_DATA(c), sizeof(int));
		if (m.seq < seq || m.id != id || fd < 0) {
			if (fd >= 0)
				close(fd);
			if (m.seq < seq)
				continue;	/* an orphan */
			set_err("fd of message %llu does not match",
				(unsigned long long)seq);
			return -EBADMSG;
		}
		*fdp = fd;
		return 0;
	}
}

int tshm_cuda_send(struct tshm_cuda_chan *ch, struct tshm_cuda_buf *b,
		   const void *msg, size_t len, int timeout_ms)
{
	int64_t deadline = deadline_of(timeout_ms);
	struct tshm_seg *segs[2];
	struct wire *w;
	unsigned nsegs = 0;
	int ret;

	if (len > ch->max_msg)
		return -EMSGSIZE;
	if (!b->producer) {
		set_err("a received GPU buffer cannot be sent on; send the "
			"producer's buffer");
		return -EOPNOTSUPP;
	}
	w = calloc(1, sizeof(*w) + len);
	if (!w)
		return -ENOMEM;
	w->magic = WIRE_MAGIC;
	w->kind = (uint8_t)b->kind;
	w->id = b->id;
	w->size = b->size;
	w->ipc_off = b->ipc_off;
	memcpy(w->uuid, b->cu->uuid.bytes, 16);
	if (b->kind == TSHM_CUDA_LEGACY)
		memcpy(w->ipc, b->ipc.reserved, CU_IPC_HANDLE_SIZE);
	w->len = (uint32_t)len;
	if (len)
		memcpy(w + 1, msg, len);
	segs[nsegs++] = b->lease;
	if (b->anchor)
		segs[nsegs++] = b->anchor;
	w->nsegs = (uint8_t)nsegs;

	if (b->kind == TSHM_CUDA_VMM) {
		struct fd_msg fm;

		ret = lock_robust(&ch->sh->send_lock, left_ms(deadline));
		if (ret)
			goto out;
		w->seq = fm.seq = ch->sh->next_seq++;
		fm.id = b->id;
		ret = send_fd(ch->sock[0], &fm, b->fd, deadline);
		if (!ret)
			ret = tshm_queue_send(ch->q, w, sizeof(*w) + len, segs,
					      nsegs, left_ms(deadline));
		pthread_mutex_unlock(&ch->sh->send_lock);
	} else {
		ret = tshm_queue_send(ch->q, w, sizeof(*w) + len, segs, nsegs,
				      timeout_ms);
	}
out:
	free(w);
	return ret;
}

static int import_vmm(struct tshm_cuda *cu, const struct wire *w, int fd,
		      struct tshm_seg *anchor, struct cache_ent **out)
{
	CUmemGenericAllocationHandle h;
	CUmemAccessDesc acc = { 0 };
	struct cache_ent *e;
	int ret;

	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->id = w->id;
	e->kind = TSHM_CUDA_VMM;
	e->size = w->size;
	ret = CU_CALL(cuCtxSetCurrent(cu->ctx));
	if (ret)
		goto err;
	ret = CU_CALL(cuMemImportFromShareableHandle(&h,
			(void *)(uintptr_t)fd,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	if (ret)
		goto err;
	ret = CU_CALL(cuMemAddressReserve(&e->base, e->size, cu->gran, 0, 0));
	if (ret)
		goto err_h;
	ret = CU_CALL(cuMemMap(e->base, e->size, 0, h, 0));
	if (ret)
		goto err_addr;
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = cu->dev;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	ret = CU_CALL(cuMemSetAccess(e->base, e->size, &acc, 1));
	if (ret)
		goto err_unmap;
	api.cuMemRelease(h);	/* the mapping keeps the memory */
	e->anchor = tshm_seg_ref(anchor);
	*out = e;
	return 0;

err_unmap:
	api.cuMemUnmap(e->base, e->size);
err_addr:
	api.cuMemAddressFree(e->base, e->size);
err_h:
	api.cuMemRelease(h);
err:
	free(e);
	return ret;
}

static int open_legacy(struct tshm_cuda *cu, const struct wire *w,
		       struct cache_ent **out)
{
	CUipcMemHandle ih;
	struct cache_ent *e;
	int ret;

	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->id = w->id;
	e->kind = TSHM_CUDA_LEGACY;
	e->size = w->size;
	memcpy(ih.reserved, w->ipc, CU_IPC_HANDLE_SIZE);
	ret = CU_CALL(cuCtxSetCurrent(cu->ctx));
	if (!ret)
		ret = CU_CALL(cuIpcOpenMemHandle(&e->base, ih,
				CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	if (ret) {
		free(e);
		return ret;
	}
	*out = e;
	return 0;
}

int tshm_cuda_recv(struct tshm_cuda_chan *ch, struct tshm_cuda *cu,
		   struct tshm_cuda_buf **out, void *msg, size_t cap,
		   size_t *lenp, int timeout_ms)
{
	int64_t deadline = deadline_of(timeout_ms);
	size_t wlen = sizeof(struct wire) + ch->max_msg, got = 0;
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS];
	unsigned nsegs = TSHM_QUEUE_MAX_SEGS, i;
	struct tshm_cuda_buf *b = NULL;
	struct cache_ent *e;
	struct wire *w;
	int ret, fd = -1;

	*out = NULL;
	w = malloc(wlen);
	if (!w)
		return -ENOMEM;
	ret = lock_robust(&ch->sh->recv_lock, timeout_ms);
	if (ret)
		goto out_free;
	ret = tshm_queue_recv(ch->q, w, wlen, &got, segs, &nsegs,
			      left_ms(deadline));
	if (ret) {
		pthread_mutex_unlock(&ch->sh->recv_lock);
		goto out_free;
	}
	if (got < sizeof(*w) || w->magic != WIRE_MAGIC ||
	    got != sizeof(*w) + w->len || w->nsegs != nsegs ||
	    (w->kind != TSHM_CUDA_VMM && w->kind != TSHM_CUDA_LEGACY) ||
	    nsegs != (w->kind == TSHM_CUDA_VMM ? 2U : 1U)) {
		pthread_mutex_unlock(&ch->sh->recv_lock);
		set_err("not a tshm-cuda message (%zu bytes, %u segments)",
			got, nsegs);
		ret = -EBADMSG;
		goto out_segs;
	}
	if (w->kind == TSHM_CUDA_VMM)
		ret = take_fd(ch->sock[1], w->seq, w->id, &fd);
	pthread_mutex_unlock(&ch->sh->recv_lock);
	if (ret)
		goto out_segs;
	if (w->len > cap) {
		set_err("payload of %u bytes, room for %zu", w->len, cap);
		ret = -EMSGSIZE;
		if (lenp)
			*lenp = w->len;
		goto out_segs;
	}
	ret = tshm_cuda_check_uuid(cu, w->uuid);
	if (ret)
		goto out_segs;
	b = calloc(1, sizeof(*b));
	if (!b) {
		ret = -ENOMEM;
		goto out_segs;
	}

	pthread_mutex_lock(&cu->lock);
	if (cu->st.cached)
		cache_trim_locked(cu, 0);	/* no system call */
	for (e = cu->cache; e; e = e->next)
		if (e->id == w->id && e->kind == w->kind)
			break;
	if (!e && cu->st.cached)
		cache_trim_locked(cu, 1);	/* importing anyway: check pids */
	if (e) {
		if (e->size != w->size) {
			pthread_mutex_unlock(&cu->lock);
			set_err("buffer %#llx changed size",
				(unsigned long long)w->id);
			ret = -EBADMSG;
			goto out_segs;
		}
		cu->st.cache_hits++;
	} else {
		ret = w->kind == TSHM_CUDA_VMM ?
			import_vmm(cu, w, fd, segs[1], &e) :
			open_legacy(cu, w, &e);
		if (ret) {
			pthread_mutex_unlock(&cu->lock);
			goto out_segs;
		}
		e->next = cu->cache;
		cu->cache = e;
		cu->st.imports++;
		cu->st.cached++;
	}
	e->users++;
	pthread_mutex_unlock(&cu->lock);

	b->cu = cu;
	b->kind = w->kind;
	b->refs = 1;
	b->id = w->id;
	b->size = w->size;
	b->fd = -1;
	b->ent = e;
	b->ptr = e->base + (w->kind == TSHM_CUDA_LEGACY ? w->ipc_off : 0);
	b->lease = segs[0];
	segs[0] = NULL;
	if (w->len)
		memcpy(msg, w + 1, w->len);
	if (lenp)
		*lenp = w->len;
	*out = b;
	b = NULL;
	ret = 0;

out_segs:
	free(b);
	if (fd >= 0)
		close(fd);
	for (i = 0; i < nsegs; i++)
		if (segs[i])
			tshm_seg_unref(segs[i]);
out_free:
	free(w);
	return ret;
}

/* ---- pools ---- */

struct tshm_cuda_pool {
	unsigned count;
	pthread_mutex_t lock;
	struct tshm_cuda_buf *bufs[];
};

int tshm_cuda_pool_create(struct tshm_cuda *cu, struct tshm_ctx *ctx,
			  unsigned count, size_t size,
			  struct tshm_cuda_pool **out)
{
	struct tshm_cuda_pool *p;
	unsigned i;
	int ret;

	*out = NULL;
	if (!count || count > 65536)
		return -EINVAL;
	p = calloc(1, sizeof(*p) + count * sizeof(p->bufs[0]));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	for (i = 0; i < count; i++) {
		ret = tshm_cuda_buf_alloc(cu, ctx, size, &p->bufs[i]);
		if (ret) {
			p->count = i;
			tshm_cuda_pool_destroy(p);
			return ret;
		}
	}
	p->count = count;
	*out = p;
	return 0;
}

/*
 * A buffer is free when only the pool holds it here and every receiver has
 * released its lease.  Waiting polls the leases with a short backoff (the
 * library offers no wait on several segments at once).
 */
int tshm_cuda_pool_get(struct tshm_cuda_pool *p, int timeout_ms,
		       struct tshm_cuda_buf **out)
{
	int64_t deadline = deadline_of(timeout_ms);
	unsigned i, nap = 50;

	*out = NULL;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		for (i = 0; i < p->count; i++) {
			struct tshm_cuda_buf *b = p->bufs[i];

			if (atomic_load(&b->refs) == 1 &&
			    tshm_seg_wait_released(b->lease, 0) == 0) {
				*out = buf_ref(b);
				pthread_mutex_unlock(&p->lock);
				return 0;
			}
		}
		pthread_mutex_unlock(&p->lock);
		if (!left_ms(deadline))
			return timeout_ms == 0 ? -EAGAIN : -ETIMEDOUT;
		usleep(nap);
		if (nap < 2000)
			nap *= 2;
	}
}

void tshm_cuda_pool_destroy(struct tshm_cuda_pool *p)
{
	unsigned i;

	if (!p)
		return;
	for (i = 0; i < p->count; i++)
		tshm_cuda_buf_unref(p->bufs[i]);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
