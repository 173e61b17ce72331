/* cuBLAS through dlopen (blas.h). */
#include "kernels/cuda/blas.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublas_v2.h>

#include "common/dynlib.h"

struct blas {
    cublasHandle_t h;
};

static struct {
    pthread_once_t once;
    void *lib;
    __typeof__(&cublasCreate_v2) create;
    __typeof__(&cublasDestroy_v2) destroy;
    __typeof__(&cublasSetStream_v2) set_stream;
    __typeof__(&cublasSetWorkspace_v2) set_workspace;
    __typeof__(&cublasSetMathMode) set_math;
    __typeof__(&cublasGemmEx) gemm_ex;
    __typeof__(&cublasGetStatusString) status_string;
    __typeof__(&cublasGetProperty) property;
    char what[160];
} g_blas = {PTHREAD_ONCE_INIT};

static void load(void)
{
    const dynlib_sym syms[] = {
        {"cublasCreate_v2", (void **)&g_blas.create},
        {"cublasDestroy_v2", (void **)&g_blas.destroy},
        {"cublasSetStream_v2", (void **)&g_blas.set_stream},
        {"cublasSetWorkspace_v2", (void **)&g_blas.set_workspace},
        {"cublasSetMathMode", (void **)&g_blas.set_math},
        {"cublasGemmEx", (void **)&g_blas.gemm_ex},
        {"cublasGetStatusString", (void **)&g_blas.status_string},
        {"cublasGetProperty", (void **)&g_blas.property},
    };
    g_blas.lib = dynlib_open("libcublas.so.13", syms, (int)(sizeof syms / sizeof syms[0]),
                             g_blas.what, sizeof g_blas.what);
    if (!g_blas.lib) return;
    int major = 0, minor = 0, patch = 0;
    if (g_blas.property(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
        g_blas.property(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
        g_blas.property(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS) {
        snprintf(g_blas.what, sizeof g_blas.what, "libcublas.so.13 gives no version");
        dynlib_close(g_blas.lib);
        g_blas.lib = NULL;
        return;
    }
    snprintf(g_blas.what, sizeof g_blas.what, "cuBLAS %d.%d.%d (libcublas.so.13)", major, minor,
             patch);
}

const char *blas_describe(void)
{
    pthread_once(&g_blas.once, load);
    return g_blas.what;
}

int blas_open(void *d_workspace, size_t workspace_bytes, blas **out, status *st)
{
    *out = NULL;
    pthread_once(&g_blas.once, load);
    if (!g_blas.lib) return status_fail(st, STATUS_UNAVAILABLE, "dense GEMM: %s", g_blas.what);
    blas *b = calloc(1, sizeof *b);
    if (!b) return status_fail(st, STATUS_NOMEM, "dense GEMM: handle");
    cublasStatus_t r = g_blas.create(&b->h);
    if (r == CUBLAS_STATUS_SUCCESS) r = g_blas.set_math(b->h, CUBLAS_DEFAULT_MATH);
    if (r == CUBLAS_STATUS_SUCCESS && d_workspace)
        r = g_blas.set_workspace(b->h, d_workspace, workspace_bytes);
    if (r != CUBLAS_STATUS_SUCCESS) {
        if (b->h) g_blas.destroy(b->h);
        free(b);
        return status_fail(st, STATUS_DEVICE, "dense GEMM: cuBLAS handle: %s",
                           g_blas.status_string(r));
    }
    *out = b;
    return STATUS_OK;
}

void blas_close(blas *b)
{
    if (!b) return;
    g_blas.destroy(b->h);
    free(b);
}

int blas_gemm_f16(blas *b, int64_t n_out, int B, int64_t n_in, const uint16_t *d_w, int64_t ld_w,
                  const uint16_t *d_x, int64_t ld_x, float *d_y, int64_t ld_y, bool add,
                  cuda_stream s, status *st)
{
    if (n_out > INT_MAX || n_in > INT_MAX || ld_w > INT_MAX || ld_x > INT_MAX || ld_y > INT_MAX)
        return status_fail(st, STATUS_RANGE, "dense GEMM: %lld x %lld beyond cuBLAS's int sizes",
                           (long long)n_out, (long long)n_in);
    const float one = 1.0f, zero = 0.0f;
    /* column-major view: Y^T (n_out x B, ld_y) = W^T' (W row-major is n_in x n_out column-major,
     * transposed) times X^T (n_in x B column-major, ld_x) */
    cublasStatus_t r = g_blas.set_stream(b->h, (cudaStream_t)s);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = g_blas.gemm_ex(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, B, (int)n_in, &one, d_w,
                           CUDA_R_16F, (int)ld_w, d_x, CUDA_R_16F, (int)ld_x, add ? &one : &zero,
                           d_y, CUDA_R_32F, (int)ld_y, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (r != CUBLAS_STATUS_SUCCESS)
        return status_fail(st, STATUS_DEVICE, "dense GEMM %lld x %lld x %d: %s",
                           (long long)n_out, (long long)n_in, B, g_blas.status_string(r));
    return STATUS_OK;
}
