// RMSNorm (norm.h): one CTA of 1024 threads per vector (grid: one CTA per row; norm_rms is the
// one row of norm_rms_rows); thread t holds elements t, t + 1024, ... so each warp holds 32
// consecutive elements per step, which is what the Q8 writer needs.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/q8.cuh"

#define NORM_THREADS 1024

// n <= NORM_THREADS * NORM_EPT (every hidden size up to 8192): x and w are read once into
// registers, all loads issued before the first use (one memory latency, not two passes).
#define NORM_EPT 8

static __global__ void __launch_bounds__(NORM_THREADS)
    norm_rms_kernel(const float *__restrict__ x, int64_t ld_x, const int32_t *__restrict__ src,
                    const float *__restrict__ w, int n, float eps, float *__restrict__ y,
                    int64_t ld_y, void *__restrict__ yq)
{
    ds_grid_dep();
    const int64_t row = blockIdx.x;
    x += (src ? src[row] : row) * ld_x;
    y = ds_row(y, row, ld_y);
    yq = ds_row_bytes(yq, row, ds_q8_bytes(n));
    __shared__ float scratch[32];
    float xv[NORM_EPT], wv[NORM_EPT];
#pragma unroll
    for (int e = 0; e < NORM_EPT; e++) {
        const int i = e * NORM_THREADS + threadIdx.x;
        xv[e] = i < n ? x[i] : 0.0f;
        wv[e] = w && i < n ? w[i] : 1.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < NORM_EPT; e++) ss += xv[e] * xv[e];
    ss = ds_block_sum(ss, scratch);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
    for (int e = 0; e < NORM_EPT; e++) {
        const int i0 = e * NORM_THREADS, i = i0 + threadIdx.x;
        if (i0 + (int)(threadIdx.x & ~31) >= n) break; // whole warps past the end leave together
        const float v = i < n ? xv[e] * r * wv[e] : 0.0f;
        if (y && i < n) y[i] = v;
        if (yq) ds_q8_store_warp(v, i0 + (threadIdx.x & ~31), n, yq);
    }
}

// any n: two passes over x
static __global__ void __launch_bounds__(NORM_THREADS)
    norm_rms_long_kernel(const float *__restrict__ x, int64_t ld_x,
                         const int32_t *__restrict__ src, const float *__restrict__ w, int n,
                         float eps, float *__restrict__ y, int64_t ld_y, void *__restrict__ yq)
{
    ds_grid_dep();
    const int64_t row = blockIdx.x;
    x += (src ? src[row] : row) * ld_x;
    y = ds_row(y, row, ld_y);
    yq = ds_row_bytes(yq, row, ds_q8_bytes(n));
    __shared__ float scratch[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) ss += x[i] * x[i];
    ss = ds_block_sum(ss, scratch);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i0 = 0; i0 < n; i0 += NORM_THREADS) {
        const int i = i0 + threadIdx.x;
        if (i0 + (threadIdx.x & ~31) >= n) break; // whole warps past the end leave together
        const float v = i < n ? x[i] * r * (w ? w[i] : 1.0f) : 0.0f;
        if (y && i < n) y[i] = v;
        if (yq) ds_q8_store_warp(v, i0 + (threadIdx.x & ~31), n, yq);
    }
}

extern "C" cuda_launch_dims norm_rms_rows_dims(int n, int B)
{
    (void)n;
    return (cuda_launch_dims){(unsigned)B, 1, 1, NORM_THREADS};
}

extern "C" void norm_rms_gather(const float *d_x, int64_t ld_x, const int32_t *d_src,
                                const float *d_w, int n, float eps, float *d_y, int64_t ld_y,
                                void *d_y_q8, int B, const cuda_launch *l)
{
    DS_ASSERT(n > 0 && (!d_y_q8 || n % 32 == 0) && B >= 1 && B <= 65535);
    const cuda_launch_dims d = norm_rms_rows_dims(n, B);
    if (n <= NORM_THREADS * NORM_EPT)
        ds_launch(norm_rms_kernel, ds_grid(d), d.block, 0, l, d_x, ld_x, d_src, d_w, n, eps, d_y,
                  ld_y, d_y_q8);
    else
        ds_launch(norm_rms_long_kernel, ds_grid(d), d.block, 0, l, d_x, ld_x, d_src, d_w, n, eps,
                  d_y, ld_y, d_y_q8);
}

extern "C" void norm_rms_rows(const float *d_x, int64_t ld_x, const float *d_w, int n, float eps,
                              float *d_y, int64_t ld_y, void *d_y_q8, int B, const cuda_launch *l)
{
    norm_rms_gather(d_x, ld_x, NULL, d_w, n, eps, d_y, ld_y, d_y_q8, B, l);
}

extern "C" void norm_rms(const float *d_x, const float *d_w, int n, float eps, float *d_y,
                         void *d_y_q8, const cuda_launch *l)
{
    norm_rms_rows(d_x, n, d_w, n, eps, d_y, n, d_y_q8, 1, l);
}
