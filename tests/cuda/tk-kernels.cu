// SPDX-License-Identifier: GPL-2.0
// Producer and consumer kernels for tests/cuda and bench/cuda-bench.
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "tk-kernels.h"

__host__ __device__ static inline uint64_t tk_word(uint64_t seed, uint64_t i)
{
	uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ULL;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

__global__ void tk_fill_kernel(uint64_t *w, size_t n, uint64_t seed)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	size_t step = (size_t)gridDim.x * blockDim.x;

	for (; i < n; i += step)
		w[i] = tk_word(seed, i);
}

__global__ void tk_check_kernel(const uint64_t *w, size_t n, uint64_t seed,
				unsigned long long *bad)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	size_t step = (size_t)gridDim.x * blockDim.x;
	unsigned long long mine = 0;

	for (; i < n; i += step)
		if (w[i] != tk_word(seed, i))
			mine++;
	if (mine)
		atomicAdd(bad, mine);
}

extern "C" int tk_set_device(int ordinal)
{
	return (int)cudaSetDevice(ordinal);
}

extern "C" int tk_fill(void *dptr, size_t bytes, uint64_t seed)
{
	tk_fill_kernel<<<1024, 256>>>((uint64_t *)dptr, bytes / 8, seed);
	cudaError_t e = cudaGetLastError();

	return (int)(e ? e : cudaDeviceSynchronize());
}

extern "C" int tk_check(const void *dptr, size_t bytes, uint64_t seed,
			uint64_t *bad)
{
	unsigned long long *d = NULL, h = 0;
	cudaError_t e = cudaMalloc(&d, sizeof(*d));

	if (e)
		return (int)e;
	cudaMemset(d, 0, sizeof(*d));
	tk_check_kernel<<<1024, 256>>>((const uint64_t *)dptr, bytes / 8,
					seed, d);
	e = cudaGetLastError();
	if (!e)
		e = cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost);
	cudaFree(d);
	*bad = h;
	return (int)e;
}

extern "C" int tk_malloc(void **dptr, size_t bytes)
{
	return (int)cudaMalloc(dptr, bytes);
}

extern "C" int tk_free(void *dptr)
{
	return (int)cudaFree(dptr);
}

extern "C" const char *tk_errstr(int err)
{
	return cudaGetErrorString((cudaError_t)err);
}

extern "C" int tk_ipc_get(void *dptr, void *handle)
{
	cudaIpcMemHandle_t h;
	cudaError_t e = cudaIpcGetMemHandle(&h, dptr);

	memcpy(handle, &h, sizeof(h));
	return (int)e;
}

extern "C" int tk_ipc_open(const void *handle, void **dptr)
{
	cudaIpcMemHandle_t h;

	memcpy(&h, handle, sizeof(h));
	return (int)cudaIpcOpenMemHandle(dptr, h,
					 cudaIpcMemLazyEnablePeerAccess);
}

extern "C" int tk_ipc_close(void *dptr)
{
	return (int)cudaIpcCloseMemHandle(dptr);
}
