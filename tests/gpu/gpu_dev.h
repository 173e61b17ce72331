/* Device buffers for the CUnit GPU tests: every failure is a test failure with the message
 * printed (a failed allocation ends the test). */
#ifndef DS_TESTS_GPU_GPU_DEV_H
#define DS_TESTS_GPU_GPU_DEV_H

#include <CUnit/Basic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cuda/cuda_device.h"

static inline void *dev(size_t bytes)
{
    status st;
    void *p = NULL;
    if (cuda_alloc(&p, bytes, "test buffer", &st)) printf("  %s\n", st.msg);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static inline void *dev_from(const void *h, size_t bytes)
{
    status st;
    void *p = dev(bytes);
    CU_ASSERT_EQUAL(cuda_upload(p, h, bytes, &st), STATUS_OK);
    return p;
}

/* Host memory for a test (the process stops when there is none). */
static inline void *gpu_xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    DS_ASSERT(p);
    return p;
}

/* A device buffer's bytes once the device is done with it, in a new host buffer. */
static inline void *gpu_host_of(const void *d, size_t bytes)
{
    status st;
    void *h = gpu_xmalloc(bytes);
    CU_ASSERT_EQUAL_FATAL(cuda_sync(NULL, "the kernels under test", &st), STATUS_OK);
    CU_ASSERT_EQUAL(cuda_download(h, d, bytes, &st), STATUS_OK);
    return h;
}

/* A DeltaNet state as the kernels store it (kernels/cuda/gdn.h "State storage") on the device:
 * bf16: x[0 .. n) first rounded in place to bf16 values (the twin then starts from what the
 * device holds), uploaded as bf16; else uploaded as F32. */
static inline void *gpu_state_dev(float *x, int64_t n, bool bf16)
{
    if (!bf16) return dev_from(x, (size_t)n * 4);
    uint16_t *h = gpu_xmalloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        h[i] = quant_f32_to_bf16(x[i]);
        x[i] = quant_bf16_to_f32(h[i]);
    }
    void *d = dev_from(h, (size_t)n * 2);
    free(h);
    return d;
}

/* n elements of a device state (gpu_state_dev's form) once the device is done, as floats (bf16
 * widened, exactly) in a new host buffer. */
static inline float *gpu_state_host(const void *d, int64_t n, bool bf16)
{
    if (!bf16) return gpu_host_of(d, (size_t)n * 4);
    uint16_t *h = gpu_host_of(d, (size_t)n * 2);
    float *x = gpu_xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = quant_bf16_to_f32(h[i]);
    free(h);
    return x;
}

#endif
