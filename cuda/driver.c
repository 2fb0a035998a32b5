// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * The CUDA driver, loaded at run time, and what its errors become.
 *
 * The driver API is dlopen("libcuda.so.1")ed by the first
 * tshm_cuda_open() or tshm_cuda_desc_device(), never linked: a program
 * starts on a machine without the NVIDIA driver and gets -ENODEV, never
 * a loader failure (and never the stub from
 * $(CUDA_HOME)/lib64/stubs, which is not named libcuda.so.1).
 * TSHM_CUDA_DRIVER names another library (the tests' fake driver).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda-private.h"

struct tcu_api tcu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_err;
static char load_msg[256];

static __thread char last_err[512];

#define STR_(x)	#x
#define STR(x)	STR_(x)	/* the ABI name cuda.h maps to, e.g. ..._v2 */

void tcu_err(const char *fmt, ...)
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

static void load(void)
{
	const char *path = getenv("TSHM_CUDA_DRIVER");
	void *dl;

	if (!path || !*path)
		path = "libcuda.so.1";
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!dl) {
		load_err = -ENODEV;
		snprintf(load_msg, sizeof(load_msg), "no CUDA driver: %s",
			 dlerror());
		return;
	}
#define LOAD(name) do {							\
		*(void **)&tcu.name = dlsym(dl, STR(name));		\
		if (!tcu.name) {					\
			load_err = -ENOSYS;				\
			snprintf(load_msg, sizeof(load_msg),		\
				 "CUDA driver too old: no %s", STR(name)); \
			memset(&tcu, 0, sizeof(tcu));			\
			dlclose(dl);					\
			return;						\
		}							\
	} while (0)
	LOAD(cuInit);
	LOAD(cuGetErrorName);
	LOAD(cuGetErrorString);
	LOAD(cuDeviceGetCount);
	LOAD(cuDeviceGet);
	LOAD(cuDeviceGetUuid);
	LOAD(cuDeviceGetAttribute);
	LOAD(cuDevicePrimaryCtxRetain);
	LOAD(cuDevicePrimaryCtxRelease);
	LOAD(cuCtxSetCurrent);
	LOAD(cuCtxPushCurrent);
	LOAD(cuCtxPopCurrent);
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
	tcu.dl = dl;
}

int tcu_load(void)
{
	pthread_once(&load_once, load);
	if (load_err)
		tcu_err("%s", load_msg);
	return load_err;
}

/* The table is in Documentation/cuda/guide.rst ("Errors"): keep both. */
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

int tcu_fail(const char *call, CUresult r)
{
	const char *name = NULL, *str = NULL;
	int fn_len = (int)strcspn(call, "(");	/* "cuFoo", not its args */

	if (tcu.cuGetErrorName)
		tcu.cuGetErrorName(r, &name);
	if (tcu.cuGetErrorString)
		tcu.cuGetErrorString(r, &str);
	if (name)
		tcu_err("%.*s: %s (%s)", fn_len, call, name, str ? str : "?");
	else	/* e.g. the stub library, which names nothing */
		tcu_err("%.*s: CUresult %d", fn_len, call, (int)r);
	return tshm_cuda_errno(r);
}
