/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Device kernels for the CUDA suites (tk-kernels.cu, nvcc, CUDA runtime).
 * Each returns 0 or a cudaError_t value; tk_errstr() names it.
 * Pattern: word i of a buffer with seed s is tk_word(s, i).
 */
#ifndef _TK_KERNELS_H
#define _TK_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int tk_set_device(int ordinal);
int tk_fill(void *dptr, size_t bytes, uint64_t seed);
/* Words that differ from the pattern, counted on the device. */
int tk_check(const void *dptr, size_t bytes, uint64_t seed, uint64_t *bad);
int tk_malloc(void **dptr, size_t bytes);
int tk_free(void *dptr);
const char *tk_errstr(int err);
/* Raw cudaIpc*MemHandle, for the baseline in bench/cuda-bench. */
int tk_ipc_get(void *dptr, void *handle /* 64 bytes */);
int tk_ipc_open(const void *handle, void **dptr);
int tk_ipc_close(void *dptr);

#ifdef __cplusplus
}
#endif
#endif
