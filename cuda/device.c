// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * One process's use of one device: the primary context (the one the CUDA
 * runtime uses too, so kernels launched by the caller see our mappings),
 * the device's UUID (what messages carry, since ordinals differ between
 * processes with different CUDA_VISIBLE_DEVICES) and whether VMM
 * allocations can be exported as POSIX fds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-private.h"

/* VMM with POSIX fd export, and its granularity: 0 when not supported. */
static size_t vmm_granularity(CUdevice dev)
{
	CUmemAllocationProp prop = { 0 };
	size_t gran = 0;
	int v = 0;

	if (tcu.cuDeviceGetAttribute(&v,
	    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
	    dev) != CUDA_SUCCESS || !v)
		return 0;
	if (tcu.cuDeviceGetAttribute(&v,
	    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
	    dev) != CUDA_SUCCESS || !v)
		return 0;
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	if (tcu.cuMemGetAllocationGranularity(&gran, &prop,
	    CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
		return 0;
	return gran;
}

/* The driver loaded and initialized; *@n: the devices this process sees. */
static int driver_devices(int *n)
{
	int ret = tcu_load();

	if (ret)
		return ret;
	ret = CU_CALL(cuInit(0));
	if (ret)
		return ret;
	return CU_CALL(cuDeviceGetCount(n));
}

/*
 * The UUIDs of the devices this process sees, read once: the set does not
 * change after cuInit() (which reads CUDA_VISIBLE_DEVICES), and a receiver
 * asks for every buffer it is sent (tshm_cuda_desc_device()), which then
 * costs no driver call.  A device whose UUID cannot be read is left out.
 */
static struct {
	pthread_once_t once;
	int err;		/* driver_devices()'s, with its message */
	char msg[256];
	int n;
	struct {
		CUuuid uuid;
		bool read;
	} *dev;
} visible = { .once = PTHREAD_ONCE_INIT };

static void read_visible(void)
{
	CUdevice dev;
	int i, n = 0;

	visible.err = driver_devices(&n);
	if (!visible.err && n > 0) {
		visible.dev = calloc((size_t)n, sizeof(*visible.dev));
		if (!visible.dev) {
			tcu_err("out of memory");
			visible.err = -ENOMEM;
		}
	}
	if (visible.err) {
		snprintf(visible.msg, sizeof(visible.msg), "%s",
			 tshm_cuda_last_error());
		return;
	}
	for (i = 0; i < n; i++)
		visible.dev[i].read =
			tcu.cuDeviceGet(&dev, i) == CUDA_SUCCESS &&
			tcu.cuDeviceGetUuid(&visible.dev[i].uuid, dev) ==
			CUDA_SUCCESS;
	visible.n = n;
}

int tcu_ordinal_of_uuid(const uint8_t uuid[16])
{
	char want[48];
	int i;

	pthread_once(&visible.once, read_visible);
	if (visible.err) {
		tcu_err("%s", visible.msg);
		return visible.err;
	}
	for (i = 0; i < visible.n; i++)
		if (visible.dev[i].read &&
		    !memcmp(visible.dev[i].uuid.bytes, uuid, 16))
			return i;
	tshm_cuda_uuid_str(uuid, want, sizeof(want));
	tcu_err("buffer is on %s, none of the %d device(s) this process sees; "
		"check CUDA_VISIBLE_DEVICES", want, visible.n);
	return -EXDEV;
}

int tshm_cuda_open(int ordinal, struct tshm_cuda **out)
{
	struct tshm_cuda *cu;
	int n = 0, ret;

	if (!out)
		return -EINVAL;
	*out = NULL;
	ret = driver_devices(&n);
	if (ret)
		return ret;
	if (ordinal < 0 || ordinal >= n) {
		tcu_err("no CUDA device %d (%d visible)", ordinal, n);
		return -ENODEV;
	}
	cu = calloc(1, sizeof(*cu));
	if (!cu)
		return -ENOMEM;
	pthread_mutex_init(&cu->lock, NULL);
	cu->ordinal = ordinal;
	ret = CU_CALL(cuDeviceGet(&cu->dev, ordinal));
	if (ret)
		goto err_free;
	ret = CU_CALL(cuDeviceGetUuid(&cu->uuid, cu->dev));
	if (ret)
		goto err_free;
	ret = CU_CALL(cuDevicePrimaryCtxRetain(&cu->ctx, cu->dev));
	if (ret)
		goto err_free;
	ret = tcu_ctx_push(cu);
	if (ret)
		goto err_release;
	cu->gran = vmm_granularity(cu->dev);
	tcu_ctx_pop();
	tcu_fork_register(&cu->fork, &cu->lock);
	*out = cu;
	return 0;

err_release:
	tcu.cuDevicePrimaryCtxRelease(cu->dev);
err_free:
	pthread_mutex_destroy(&cu->lock);
	free(cu);
	return ret;
}

int tshm_cuda_make_current(struct tshm_cuda *cu)
{
	return CU_CALL(cuCtxSetCurrent(cu->ctx));
}

int tcu_ctx_push(struct tshm_cuda *cu)
{
	return CU_CALL(cuCtxPushCurrent(cu->ctx));
}

void tcu_ctx_pop(void)
{
	CUcontext popped;

	tcu.cuCtxPopCurrent(&popped);
}

void tshm_cuda_close(struct tshm_cuda *cu)
{
	struct tcu_import *imp, *next;

	if (!cu)
		return;
	for (imp = cu->cache; imp; imp = next) {
		next = imp->next;
		tcu_import_drop(cu, imp);
	}
	tcu_fork_unregister(&cu->fork);
	tcu.cuDevicePrimaryCtxRelease(cu->dev);
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
	tcu_err("buffer is on %s, this process uses %s (device %d); "
		"check CUDA_VISIBLE_DEVICES", a, b, cu->ordinal);
	return -EXDEV;
}

int tshm_cuda_vmm_supported(struct tshm_cuda *cu)
{
	return cu->gran != 0;
}

int64_t tshm_cuda_granularity(struct tshm_cuda *cu)
{
	if (!cu->gran) {
		tcu_err("device %d cannot export VMM memory as fds",
			cu->ordinal);
		return -EOPNOTSUPP;
	}
	return (int64_t)cu->gran;
}

int tshm_cuda_mem_info(struct tshm_cuda *cu, size_t *free_b, size_t *total_b)
{
	int ret = tcu_ctx_push(cu);

	if (ret)
		return ret;
	ret = CU_CALL(cuMemGetInfo(free_b, total_b));
	tcu_ctx_pop();
	return ret;
}
