/* Device buffers for the CUnit GPU tests: every failure is a test failure with the message
 * printed (a failed allocation ends the test). */
#ifndef DS_TESTS_GPU_GPU_DEV_H
#define DS_TESTS_GPU_GPU_DEV_H

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/status.h"
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

#endif
