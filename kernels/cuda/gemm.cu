// Batched GEMM on the tensor cores (gemm.h): dequantise a weight tile to F16 in shared memory,
// WMMA against the F16 activations, F32 accumulation in a fixed K order.
//
// CTA: 8 warps, 128 weight rows (16 a warp) x NT*16 batch rows, K in steps of GEMM_KT. The tile
// loads are chunks of 32 weights (one Q8_0 block, one K-quant sub-block): 128 rows x 4 chunks a
// step, 2 a thread. The accumulators go through shared memory (reusing the weight tile) so the
// stores of Y are coalesced along the weight rows.
#include <mma.h>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv_slices.cuh"
#include "kernels/cuda/quant_blocks.cuh"

using namespace nvcuda;

#define GEMM_M 128          // weight rows a CTA
#define GEMM_KT 128         // K a step
#define GEMM_LDS (GEMM_KT + 8) // shared row stride (halves): rows 16 banks apart
#define GEMM_THREADS 256
#define GEMM_MAX_NT 4       // 64 batch rows a CTA
#define GEMM_LDC (GEMM_MAX_NT * 16 + 4)

static_assert(GEMM_M * GEMM_LDC * 4 <= GEMM_M * GEMM_LDS * 2, "C tile must fit the W tile");

struct wview {
    const uint8_t *w;
    int64_t n_in, nblk; // nblk: blocks of the whole matrix (packed layouts' section offsets)
};

__device__ __forceinline__ void put32(__half *dst, const float *v)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2 h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) h[j] = __floats2half2_rn(v[8 * i + 2 * j], v[8 * i + 2 * j + 1]);
        *(uint4 *)(dst + 8 * i) = *(const uint4 *)h;
    }
}

// 32 weights of row r from element k (k % 32 == 0) into v
template <uint32_t T> __device__ __forceinline__ void chunk(const wview &m, int64_t r, int64_t k, float *v);

template <> __device__ __forceinline__ void chunk<GGML_TYPE_Q4_K>(const wview &m, int64_t r, int64_t k, float *v)
{
    const block_q4_K *b = (const block_q4_K *)m.w + r * (m.n_in / QK_K) + k / QK_K;
    const int j = (int)(k % QK_K) / 32;
    uint8_t sc, mn;
    qb_scale_min_k4(j, b->scales, &sc, &mn);
    const float d = qb_half(b->d) * sc, mm = qb_half(b->dmin) * mn;
    const uint4 *q4 = (const uint4 *)(b->qs + 32 * (j / 2));
    const int sh = 4 * (j & 1);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint4 u = q4[h];
        const uint32_t w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 16; i++) v[16 * h + i] = d * (float)((w4[i / 4] >> (8 * (i % 4) + sh)) & 0xF) - mm;
    }
}

template <> __device__ __forceinline__ void chunk<GGML_TYPE_Q5_K>(const wview &m, int64_t r, int64_t k, float *v)
{
    const block_q5_K *b = (const block_q5_K *)m.w + r * (m.n_in / QK_K) + k / QK_K;
    const int j = (int)(k % QK_K) / 32;
    uint8_t sc, mn;
    qb_scale_min_k4(j, b->scales, &sc, &mn);
    const float d = qb_half(b->d) * sc, mm = qb_half(b->dmin) * mn;
    const uint8_t *ql = b->qs + 32 * (j / 2);
    const int sh = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int q = ((ql[i] >> sh) & 0xF) + ((b->qh[i] >> j) & 1) * 16;
        v[i] = d * (float)q - mm;
    }
}

template <> __device__ __forceinline__ void chunk<GGML_TYPE_Q6_K>(const wview &m, int64_t r, int64_t k, float *v)
{
    const int64_t ib = r * (m.n_in / QK_K) + k / QK_K;
    const int c = (int)(k % QK_K) / 32, n = c / 4, qq = c % 4;
    const uint8_t *qlh = m.w + ib * 192;
    const uint8_t *ql = qlh + 64 * n + 32 * (qq & 1), *qh = qlh + 128 + 32 * n;
    const int8_t *sc = (const int8_t *)(m.w + q6_sc_off(m.nblk) + ib * 16) + 8 * n + 2 * qq;
    const float d = qb_half(*(const uint16_t *)(m.w + q6_d_off(m.nblk) + ib * 2));
    const int shl = 4 * (qq >> 1), shh = 2 * qq;
    const float d0 = d * sc[0], d1 = d * sc[1];
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int q = (int)(((ql[l] >> shl) & 0xF) | (((qh[l] >> shh) & 3) << 4)) - 32;
        v[l] = (l < 16 ? d0 : d1) * (float)q;
    }
}

template <> __device__ __forceinline__ void chunk<GGML_TYPE_Q8_0>(const wview &m, int64_t r, int64_t k, float *v)
{
    const int64_t ib = (r * m.n_in + k) / 32;
    const float d = qb_half(*(const uint16_t *)(m.w + q8_d_off(m.nblk) + ib * 2));
    const int4 *q = (const int4 *)(m.w + ib * 32);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int4 u = q[h];
        const int w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 16; i++) v[16 * h + i] = d * (float)(int8_t)(w4[i / 4] >> (8 * (i % 4)));
    }
}

template <> __device__ __forceinline__ void chunk<GGML_TYPE_F16>(const wview &m, int64_t r, int64_t k, float *v)
{
    const uint16_t *p = (const uint16_t *)m.w + r * m.n_in + k;
#pragma unroll
    for (int i = 0; i < 32; i++) v[i] = qb_half(p[i]);
}

template <> __device__ __forceinline__ void chunk<GGML_TYPE_BF16>(const wview &m, int64_t r, int64_t k, float *v)
{
    const uint16_t *p = (const uint16_t *)m.w + r * m.n_in + k;
#pragma unroll
    for (int i = 0; i < 32; i++) v[i] = qb_bf16(p[i]);
}

template <> __device__ __forceinline__ void chunk<GGML_TYPE_F32>(const wview &m, int64_t r, int64_t k, float *v)
{
    const float4 *p = (const float4 *)((const float *)m.w + r * m.n_in + k);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 t = p[i];
        v[4 * i] = t.x, v[4 * i + 1] = t.y, v[4 * i + 2] = t.z, v[4 * i + 3] = t.w;
    }
}

__device__ __forceinline__ float sat_half(float x) { return fminf(fmaxf(x, -65504.0f), 65504.0f); }

template <uint32_t T, int NT>
static __global__ void __launch_bounds__(GEMM_THREADS)
    gemm_kernel(wview m, int64_t n_out, const float *__restrict__ x, int64_t ld_x,
                float *__restrict__ y, int64_t ld_y, int add, int B)
{
    extern __shared__ __align__(128) uint8_t smem[];
    __half *Ws = (__half *)smem;                   // [GEMM_M][GEMM_LDS]
    __half *Xs = Ws + GEMM_M * GEMM_LDS;           // [NT*16][GEMM_LDS]
    float *Cs = (float *)smem;                     // [GEMM_M][GEMM_LDC], after the K loop
    constexpr int N = NT * 16;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * GEMM_M;
    const int b0 = blockIdx.y * N;
    ds_grid_dep();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) wmma::fill_fragment(acc[j], 0.0f);

    for (int64_t k0 = 0; k0 < m.n_in; k0 += GEMM_KT) {
        // X tile: N rows x GEMM_KT, 4 floats a thread a pass
        for (int e = tid; e < N * GEMM_KT / 4; e += GEMM_THREADS) {
            const int i = e / (GEMM_KT / 4), kk = 4 * (e % (GEMM_KT / 4));
            float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
            if (b0 + i < B && k0 + kk < m.n_in) t = *(const float4 *)(x + (int64_t)(b0 + i) * ld_x + k0 + kk);
            __half2 *d = (__half2 *)(Xs + i * GEMM_LDS + kk);
            d[0] = __floats2half2_rn(sat_half(t.x), sat_half(t.y));
            d[1] = __floats2half2_rn(sat_half(t.z), sat_half(t.w));
        }
        // W tile: 128 rows x 4 chunks of 32
#pragma unroll
        for (int p = 0; p < GEMM_M * (GEMM_KT / 32) / GEMM_THREADS; p++) {
            const int t = tid + p * GEMM_THREADS, rr = t / (GEMM_KT / 32), c = t % (GEMM_KT / 32);
            const int64_t r = r0 + rr, k = k0 + 32 * c;
            float v[32];
            if (r < n_out && k < m.n_in) {
                chunk<T>(m, r, k, v);
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++) v[i] = 0.0f;
            }
            put32(Ws + rr * GEMM_LDS + 32 * c, v);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_KT; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
            wmma::load_matrix_sync(a, Ws + warp * 16 * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> bf;
                wmma::load_matrix_sync(bf, Xs + j * 16 * GEMM_LDS + kk, GEMM_LDS);
                wmma::mma_sync(acc[j], a, bf, acc[j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
        wmma::store_matrix_sync(Cs + warp * 16 * GEMM_LDC + j * 16, acc[j], GEMM_LDC, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < GEMM_M * N; e += GEMM_THREADS) {
        const int i = e / GEMM_M, rr = e % GEMM_M;
        const int64_t r = r0 + rr;
        if (b0 + i >= B || r >= n_out) continue;
        float *out = y + (int64_t)(b0 + i) * ld_y + r;
        const float c = Cs[rr * GEMM_LDC + i];
        *out = add ? *out + c : c;
    }
}

static int64_t gemm_block(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: return 256;
    case GGML_TYPE_Q8_0: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_F32: return 32;
    default: return 0;
    }
}

extern "C" bool gemm_supported(uint32_t type, int64_t n_in)
{
    const int64_t bs = gemm_block(type);
    return bs > 0 && n_in > 0 && n_in % bs == 0;
}

template <uint32_t T, int NT> static size_t gemm_smem() { return (size_t)(GEMM_M + NT * 16) * GEMM_LDS * 2; }

template <uint32_t T, int NT>
static void launch_nt(const gemv_matrix *w, const float *x, int64_t ld_x, float *y, int64_t ld_y,
                      int add, int B, const cuda_launch *l)
{
    const size_t smem = gemm_smem<T, NT>();
    const wview m = {(const uint8_t *)w->d_w, w->n_in, w->n_in * w->n_out / gemm_block(T)};
    const dim3 grid(ds_div_up(w->n_out, GEMM_M), ds_div_up(B, NT * 16));
    ds_launch(gemm_kernel<T, NT>, grid, GEMM_THREADS, smem, l, m, w->n_out, x, ld_x, y, ld_y, add, B);
}

template <uint32_t T>
static void launch_t(const gemv_matrix *w, const float *x, int64_t ld_x, float *y, int64_t ld_y,
                     int add, int B, const cuda_launch *l)
{
    if (B <= 16) launch_nt<T, 1>(w, x, ld_x, y, ld_y, add, B, l);
    else if (B <= 32) launch_nt<T, 2>(w, x, ld_x, y, ld_y, add, B, l);
    else launch_nt<T, 4>(w, x, ld_x, y, ld_y, add, B, l);
}

template <uint32_t T> static cudaError_t init_t()
{
    cudaError_t e = cudaFuncSetAttribute(gemm_kernel<T, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gemm_smem<T, 1>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_kernel<T, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gemm_smem<T, 2>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_kernel<T, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gemm_smem<T, 4>());
    return e;
}

extern "C" int gemm_init(status *st)
{
    CUDA_TRY(st, init_t<GGML_TYPE_Q4_K>());
    CUDA_TRY(st, init_t<GGML_TYPE_Q5_K>());
    CUDA_TRY(st, init_t<GGML_TYPE_Q6_K>());
    CUDA_TRY(st, init_t<GGML_TYPE_Q8_0>());
    CUDA_TRY(st, init_t<GGML_TYPE_F16>());
    CUDA_TRY(st, init_t<GGML_TYPE_BF16>());
    CUDA_TRY(st, init_t<GGML_TYPE_F32>());
    return STATUS_OK;
}

extern "C" void gemm_rows(const gemv_matrix *w, const float *d_x, int64_t ld_x, float *d_y,
                          int64_t ld_y, gemv_epilogue ep, int B, const cuda_launch *l)
{
    DS_ASSERT(gemm_supported(w->type, w->n_in) && B >= 1 && B <= GEMM_MAX_ROWS);
    DS_ASSERT(ld_x % 4 == 0 && ld_x >= w->n_in && ld_y >= w->n_out);
    const int add = ep == GEMV_ADD;
    switch (w->type) {
    case GGML_TYPE_Q4_K: launch_t<GGML_TYPE_Q4_K>(w, d_x, ld_x, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_Q5_K: launch_t<GGML_TYPE_Q5_K>(w, d_x, ld_x, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_Q6_K: launch_t<GGML_TYPE_Q6_K>(w, d_x, ld_x, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_Q8_0: launch_t<GGML_TYPE_Q8_0>(w, d_x, ld_x, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_F16: launch_t<GGML_TYPE_F16>(w, d_x, ld_x, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_BF16: launch_t<GGML_TYPE_BF16>(w, d_x, ld_x, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_F32: launch_t<GGML_TYPE_F32>(w, d_x, ld_x, d_y, ld_y, add, B, l); break;
    default: DS_ASSERT(!"gemm_rows: unsupported type");
    }
}

// ---- the batched step's row-wise helpers ----

static __global__ void swiglu_rows_kernel(const float *__restrict__ gu, int64_t ld_gu, int F,
                                          float *__restrict__ out, int64_t ld_out)
{
    ds_grid_dep();
    const int i = blockIdx.y;
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= F) return;
    const float g = gu[(int64_t)i * ld_gu + r], u = gu[(int64_t)i * ld_gu + F + r];
    out[(int64_t)i * ld_out + r] = g / (1.0f + expf(-g)) * u;
}

extern "C" void gemm_swiglu_rows(const float *d_gu, int64_t ld_gu, int F, float *d_out,
                                 int64_t ld_out, int B, const cuda_launch *l)
{
    DS_ASSERT(F > 0 && B >= 1 && B < 65536 && ld_gu >= 2 * (int64_t)F && ld_out >= F);
    ds_launch(swiglu_rows_kernel, dim3(ds_div_up(F, 256), B), 256, 0, l, d_gu, ld_gu, F, d_out, ld_out);
}

static __device__ __forceinline__ unsigned long long row_key(float v, int64_t c)
{
    const uint32_t u = __float_as_uint(v);
    const uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)k << 32) | (uint32_t)~(uint32_t)c;
}

static __global__ void __launch_bounds__(1024)
    argmax_rows_kernel(const float *__restrict__ logits, int64_t ld, int64_t n,
                       unsigned long long *__restrict__ best)
{
    __shared__ unsigned long long part[32];
    ds_grid_dep();
    const float *x = logits + (int64_t)blockIdx.x * ld;
    unsigned long long m = 0;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
        const float v = x[c];
        if (v == v) m = max(m, row_key(v, c)); // NaN never wins
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = part[threadIdx.x];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (threadIdx.x == 0) best[blockIdx.x] = m;
    }
}

extern "C" void gemm_argmax_rows(const float *d_logits, int64_t ld, int64_t n,
                                 unsigned long long *d_best, int B, const cuda_launch *l)
{
    DS_ASSERT(n > 0 && ld >= n && B >= 1);
    ds_launch(argmax_rows_kernel, B, 1024, 0, l, d_logits, ld, n, d_best);
}
