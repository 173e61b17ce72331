// GPU dequantisation kernels (dequant.h). One thread writes 8 (K-quants) or 1 (plain types,
// Q8_0) outputs; the formulas are gguf/quant.c's dequantize_row_* (docs/QWEN35.md §5.2).
// Load-time kernels, but launched as every other (ds_launch): each waits for its predecessor.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/quant_blocks.cuh"

// Q4_K: 32 threads per block; thread t: group g = t/8 (64 weights), 4 bytes of qs at l0 = 4*(t%8)
static __global__ void dequant_q4_K_kernel(const block_q4_K *__restrict__ x, float *__restrict__ y)
{
    ds_grid_dep();
    const int64_t ib = blockIdx.x;
    const int t = threadIdx.x, g = t / 8, l0 = 4 * (t % 8);
    const block_q4_K *b = x + ib;
    const float d = qb_half(b->d), dmin = qb_half(b->dmin);
    uint8_t sc, m;
    qb_scale_min_k4(2 * g, b->scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    qb_scale_min_k4(2 * g + 1, b->scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    const uint8_t *q = b->qs + 32 * g + l0;
    float *out = y + ib * QK_K + 64 * g + l0;
    for (int l = 0; l < 4; l++) {
        out[l] = d1 * (q[l] & 0xF) - m1;
        out[l + 32] = d2 * (q[l] >> 4) - m2;
    }
}

static __global__ void dequant_q5_K_kernel(const block_q5_K *__restrict__ x, float *__restrict__ y)
{
    ds_grid_dep();
    const int64_t ib = blockIdx.x;
    const int t = threadIdx.x, g = t / 8, l0 = 4 * (t % 8);
    const block_q5_K *b = x + ib;
    const float d = qb_half(b->d), dmin = qb_half(b->dmin);
    uint8_t sc, m;
    qb_scale_min_k4(2 * g, b->scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    qb_scale_min_k4(2 * g + 1, b->scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    const uint8_t u1 = 1 << (2 * g), u2 = 2 << (2 * g);
    const uint8_t *ql = b->qs + 32 * g + l0;
    const uint8_t *qh = b->qh + l0;
    float *out = y + ib * QK_K + 64 * g + l0;
    for (int l = 0; l < 4; l++) {
        out[l] = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        out[l + 32] = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
}

// Q6_K: 64 threads per block; thread t: half n = t/32, l = t%32 writes 4 outputs
static __global__ void dequant_q6_K_kernel(const block_q6_K *__restrict__ x, float *__restrict__ y)
{
    ds_grid_dep();
    const int64_t ib = blockIdx.x;
    const int t = threadIdx.x, n = t / 32, l = t % 32, is = l / 16;
    const block_q6_K *b = x + ib;
    const float d = qb_half(b->d);
    const uint8_t *ql = b->ql + 64 * n;
    const uint8_t *qh = b->qh + 32 * n;
    const int8_t *sc = b->scales + 8 * n;
    float *out = y + ib * QK_K + 128 * n;
    const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
    const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
    const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
    const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
    out[l] = d * sc[is + 0] * q1;
    out[l + 32] = d * sc[is + 2] * q2;
    out[l + 64] = d * sc[is + 4] * q3;
    out[l + 96] = d * sc[is + 6] * q4;
}

static __global__ void dequant_q8_0_kernel(const block_q8_0 *__restrict__ x, float *__restrict__ y,
                                           int64_t n)
{
    ds_grid_dep();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const block_q8_0 *b = x + i / QK8_0;
    y[i] = qb_half(b->d) * b->qs[i % QK8_0];
}

static __global__ void dequant_f16_kernel(const uint16_t *__restrict__ x, float *__restrict__ y,
                                          int64_t n)
{
    ds_grid_dep();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = qb_half(x[i]);
}

static __global__ void dequant_bf16_kernel(const uint16_t *__restrict__ x, float *__restrict__ y,
                                           int64_t n)
{
    ds_grid_dep();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = qb_bf16(x[i]);
}

static __global__ void dequant_f32_kernel(const float *__restrict__ x, float *__restrict__ y,
                                          int64_t n)
{
    ds_grid_dep();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

extern "C" void dequant_f32(uint32_t type, const void *d_src, float *d_dst, int64_t n,
                            const cuda_launch *l)
{
    DS_ASSERT(n >= 0);
    if (n == 0) return;
    const unsigned flat = ds_div_up(n, 256);
    switch (type) {
    case GGML_TYPE_Q4_K:
        DS_ASSERT(n % QK_K == 0);
        ds_launch(dequant_q4_K_kernel, (unsigned)(n / QK_K), 32, 0, l, (const block_q4_K *)d_src, d_dst);
        break;
    case GGML_TYPE_Q5_K:
        DS_ASSERT(n % QK_K == 0);
        ds_launch(dequant_q5_K_kernel, (unsigned)(n / QK_K), 32, 0, l, (const block_q5_K *)d_src, d_dst);
        break;
    case GGML_TYPE_Q6_K:
        DS_ASSERT(n % QK_K == 0);
        ds_launch(dequant_q6_K_kernel, (unsigned)(n / QK_K), 64, 0, l, (const block_q6_K *)d_src, d_dst);
        break;
    case GGML_TYPE_Q8_0:
        DS_ASSERT(n % QK8_0 == 0);
        ds_launch(dequant_q8_0_kernel, flat, 256, 0, l, (const block_q8_0 *)d_src, d_dst, n);
        break;
    case GGML_TYPE_F16:
        ds_launch(dequant_f16_kernel, flat, 256, 0, l, (const uint16_t *)d_src, d_dst, n);
        break;
    case GGML_TYPE_BF16:
        ds_launch(dequant_bf16_kernel, flat, 256, 0, l, (const uint16_t *)d_src, d_dst, n);
        break;
    case GGML_TYPE_F32:
        ds_launch(dequant_f32_kernel, flat, 256, 0, l, (const float *)d_src, d_dst, n);
        break;
    default:
        DS_ASSERT(!"dequant_f32: unsupported type");
    }
}
