// Batched GEMM on the tensor cores (gemm.h): the public API, the K split and its reduction, the
// float weight types' kernel, X's F16 rows and the step's row helpers. The quantised types'
// kernel is gemm_q.cu.
//
// Float kernel: 8 warps, 128 weight rows (16 a warp) x NT*16 batch rows, K in steps of GEMM_KT;
// the tile loads are chunks of 32 weights, 128 rows x 4 chunks a step, 2 a thread, converted to
// F16 (+ remainders) in shared memory. The accumulators go through shared memory (reusing the
// weight tile) so the stores of Y are coalesced along the weight rows.
#include <mma.h>

#include "kernels/cuda/argmax_key.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_q.cuh"
#include "kernels/cuda/gemv_slices.cuh"
#include "kernels/cuda/quant_blocks.cuh"

using namespace nvcuda;

#define GEMM_LDS (GEMM_KT + 8) // shared row stride (halves): rows 16 banks apart
#define GEMM_THREADS 256
#define GEMM_MAX_NT 4       // 64 batch rows a CTA
#define GEMM_LDC (GEMM_MAX_NT * 16 + 4)

static_assert(GEMM_M * GEMM_LDC * 4 <= GEMM_M * GEMM_LDS * 2, "C tile must fit the W tile");

struct wview {
    const uint8_t *w;
    int64_t n_in, nblk; // nblk: blocks of the whole matrix (packed layouts' section offsets)
};

// 32 weights of row r from element k (k % 32 == 0) into v
template <uint32_t T> __device__ __forceinline__ void chunk(const wview &m, int64_t r, int64_t k, float *v);

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

// 32 values as F16 into hi, and (LO) the F16 rounding of what hi missed into lo: hi + lo carries
// ~22 bits, so F32 weights or activations lose nothing the F32 sum would keep
template <bool LO> __device__ __forceinline__ void put32(__half *hi, __half *lo, const float *v)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2 h[4], g[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float a = sat_half(v[8 * i + 2 * j]), b = sat_half(v[8 * i + 2 * j + 1]);
            h[j] = __floats2half2_rn(a, b);
            if (LO) g[j] = __floats2half2_rn(a - __low2float(h[j]), b - __high2float(h[j]));
        }
        *(uint4 *)(hi + 8 * i) = *(const uint4 *)h;
        if (LO) *(uint4 *)(lo + 8 * i) = *(const uint4 *)g;
    }
}

// LOX / LOW: the activations / weights also as an F16 remainder tile (F16/BF16 weights: x;
// F32 weights: both); the products hi·hi + hi·lo + lo·hi accumulate in that order.
template <uint32_t T, int NT, bool LOX, bool LOW>
static __global__ void __launch_bounds__(GEMM_THREADS)
    gemm_kernel(wview m, int64_t n_out, const float *__restrict__ x, int64_t ld_x,
                float *__restrict__ y, int64_t ld_y, int add, int B, float *__restrict__ part,
                int k_steps_per_split)
{
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int N = NT * 16;
    __half *Ws = (__half *)smem;                        // [GEMM_M][GEMM_LDS]
    __half *Wl = Ws + GEMM_M * GEMM_LDS;                // LOW: [GEMM_M][GEMM_LDS]
    __half *Xs = Wl + (LOW ? GEMM_M * GEMM_LDS : 0);    // [N][GEMM_LDS]
    __half *Xl = Xs + N * GEMM_LDS;                     // LOX: [N][GEMM_LDS]
    float *Cs = (float *)smem;                          // [GEMM_M][GEMM_LDC], after the K loop
    const int tid = threadIdx.x, warp = tid >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * GEMM_M;
    const int b0 = blockIdx.y * N;
    const int64_t k_begin = (int64_t)blockIdx.z * k_steps_per_split * GEMM_KT;
    const int64_t k_end = min(m.n_in, k_begin + (int64_t)k_steps_per_split * GEMM_KT);
    ds_grid_dep();

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) wmma::fill_fragment(acc[j], 0.0f);

    for (int64_t k0 = k_begin; k0 < k_end; k0 += GEMM_KT) {
        // X tile: N rows x GEMM_KT, 4 floats a thread a pass
        for (int e = tid; e < N * GEMM_KT / 4; e += GEMM_THREADS) {
            const int i = e / (GEMM_KT / 4), kk = 4 * (e % (GEMM_KT / 4));
            float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
            if (b0 + i < B && k0 + kk < k_end) t = *(const float4 *)(x + (int64_t)(b0 + i) * ld_x + k0 + kk);
            const float v[4] = {sat_half(t.x), sat_half(t.y), sat_half(t.z), sat_half(t.w)};
            __half2 *d = (__half2 *)(Xs + i * GEMM_LDS + kk);
            d[0] = __floats2half2_rn(v[0], v[1]);
            d[1] = __floats2half2_rn(v[2], v[3]);
            if (LOX) {
                __half2 *dl = (__half2 *)(Xl + i * GEMM_LDS + kk);
                dl[0] = __floats2half2_rn(v[0] - __low2float(d[0]), v[1] - __high2float(d[0]));
                dl[1] = __floats2half2_rn(v[2] - __low2float(d[1]), v[3] - __high2float(d[1]));
            }
        }
        // W tile: 128 rows x 4 chunks of 32
#pragma unroll
        for (int p = 0; p < GEMM_M * (GEMM_KT / 32) / GEMM_THREADS; p++) {
            const int t = tid + p * GEMM_THREADS, rr = t / (GEMM_KT / 32), c = t % (GEMM_KT / 32);
            const int64_t r = r0 + rr, k = k0 + 32 * c;
            float v[32];
            if (r < n_out && k < k_end) {
                chunk<T>(m, r, k, v);
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++) v[i] = 0.0f;
            }
            put32<LOW>(Ws + rr * GEMM_LDS + 32 * c, Wl + rr * GEMM_LDS + 32 * c, v);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_KT; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a, al;
            wmma::load_matrix_sync(a, Ws + warp * 16 * GEMM_LDS + kk, GEMM_LDS);
            if (LOW) wmma::load_matrix_sync(al, Wl + warp * 16 * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> bf;
                wmma::load_matrix_sync(bf, Xs + j * 16 * GEMM_LDS + kk, GEMM_LDS);
                wmma::mma_sync(acc[j], a, bf, acc[j]);
                if (LOW) wmma::mma_sync(acc[j], al, bf, acc[j]);
                if (LOX) {
                    wmma::load_matrix_sync(bf, Xl + j * 16 * GEMM_LDS + kk, GEMM_LDS);
                    wmma::mma_sync(acc[j], a, bf, acc[j]);
                }
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
        const float c = Cs[rr * GEMM_LDC + i];
        if (gridDim.z > 1) { // split K: this split's partial, summed by gemv_reduce_splits
            part[((int64_t)blockIdx.z * B + b0 + i) * n_out + r] = c;
            continue;
        }
        float *out = y + (int64_t)(b0 + i) * ld_y + r;
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

// K steps a split: the weight tiles alone give the GPU at least two CTAs an SM, split K until
// they do (a function of the matrix and the GPU, never of B)
static int steps_per_split(const gemv_matrix *w)
{
    const int64_t tiles = ds_div_up(w->n_out, GEMM_M), steps = ds_div_up(w->n_in, GEMM_KT);
    const int sm = w->plan.sm_count > 0 ? w->plan.sm_count : 132;
    int64_t splits = ds_div_up(2 * sm, tiles);
    if (splits > steps) splits = steps;
    if (splits < 1) splits = 1;
    return (int)ds_div_up(steps, splits);
}

static int n_splits(const gemv_matrix *w)
{
    return (int)ds_div_up(ds_div_up(w->n_in, GEMM_KT), steps_per_split(w));
}

extern "C" int64_t gemm_work_floats(const gemv_matrix *w, int B)
{
    const int s = n_splits(w);
    return s > 1 ? (int64_t)s * B * w->n_out : 0;
}

template <uint32_t T, int NT, bool LOX, bool LOW> static size_t gemm_smem()
{
    return (size_t)(GEMM_M * (LOW ? 2 : 1) + NT * 16 * (LOX ? 2 : 1)) * GEMM_LDS * 2;
}

template <uint32_t T, int NT, bool LOX, bool LOW>
static void launch_nt(const gemv_matrix *w, const float *x, int64_t ld_x, float *y, int64_t ld_y,
                      int add, int B, float *work, int kps, int splits, const cuda_launch *l)
{
    const size_t smem = gemm_smem<T, NT, LOX, LOW>();
    const wview m = {(const uint8_t *)w->d_w, w->n_in, w->n_in * w->n_out / gemm_block(T)};
    const dim3 grid(ds_div_up(w->n_out, GEMM_M), ds_div_up(B, NT * 16), splits);
    ds_launch(gemm_kernel<T, NT, LOX, LOW>, grid, GEMM_THREADS, smem, l, m, w->n_out, x, ld_x, y,
              ld_y, add, B, work, kps);
}

template <uint32_t T, bool LOX, bool LOW>
static void launch_t(const gemv_matrix *w, const float *x, int64_t ld_x, float *y, int64_t ld_y,
                     int add, int B, float *work, int kps, int splits, const cuda_launch *l)
{
    if (B <= 16) launch_nt<T, 1, LOX, LOW>(w, x, ld_x, y, ld_y, add, B, work, kps, splits, l);
    else if (B <= 32) launch_nt<T, 2, LOX, LOW>(w, x, ld_x, y, ld_y, add, B, work, kps, splits, l);
    else launch_nt<T, 4, LOX, LOW>(w, x, ld_x, y, ld_y, add, B, work, kps, splits, l);
}

template <uint32_t T, bool LOX, bool LOW> static cudaError_t init_t()
{
    cudaError_t e = cudaFuncSetAttribute(gemm_kernel<T, 1, LOX, LOW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)gemm_smem<T, 1, LOX, LOW>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_kernel<T, 2, LOX, LOW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)gemm_smem<T, 2, LOX, LOW>());
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_kernel<T, 4, LOX, LOW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)gemm_smem<T, 4, LOX, LOW>());
    return e;
}

extern "C" int gemm_init(status *st)
{
    CUDA_TRY(st, gemm_q_init());
    CUDA_TRY(st, (init_t<GGML_TYPE_F16, true, false>()));
    CUDA_TRY(st, (init_t<GGML_TYPE_BF16, true, false>()));
    CUDA_TRY(st, (init_t<GGML_TYPE_F32, true, true>()));
    return STATUS_OK;
}

extern "C" bool gemm_reads_half(uint32_t type)
{
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K ||
           type == GGML_TYPE_Q8_0;
}

extern "C" void gemm_rows(const gemv_matrix *w, const float *d_x, int64_t ld_x,
                          const uint16_t *d_xh, float *d_y, int64_t ld_y, gemv_epilogue ep, int B,
                          float *d_work, const cuda_launch *l)
{
    DS_ASSERT(gemm_supported(w->type, w->n_in) && B >= 1 && B <= GEMM_MAX_ROWS);
    DS_ASSERT(ld_y >= w->n_out && (d_xh || !gemm_reads_half(w->type)));
    DS_ASSERT(gemm_reads_half(w->type) || (d_x && ld_x % 4 == 0 && ld_x >= w->n_in));
    DS_ASSERT(d_work || gemm_work_floats(w, B) == 0);
    const int add = ep == GEMV_ADD;
    const int kps = steps_per_split(w), splits = n_splits(w);
    switch (w->type) {
    case GGML_TYPE_F16: launch_t<GGML_TYPE_F16, true, false>(w, d_x, ld_x, d_y, ld_y, add, B, d_work, kps, splits, l); break;
    case GGML_TYPE_BF16: launch_t<GGML_TYPE_BF16, true, false>(w, d_x, ld_x, d_y, ld_y, add, B, d_work, kps, splits, l); break;
    case GGML_TYPE_F32: launch_t<GGML_TYPE_F32, true, true>(w, d_x, ld_x, d_y, ld_y, add, B, d_work, kps, splits, l); break;
    default: gemm_q_launch(w, d_xh, d_y, ld_y, add, B, d_work, kps, splits, l);
    }
    if (splits > 1) gemv_reduce_splits(d_work, splits, B, w->n_out, d_y, ld_y, ep, l);
}

static __global__ void x_half_kernel(const float *__restrict__ x, int64_t ld_x, int64_t n,
                                     __half *__restrict__ xh)
{
    ds_grid_dep();
    const int i = blockIdx.y;
    const int64_t k = 4 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (k >= n) return;
    const float4 t = *(const float4 *)(x + (int64_t)i * ld_x + k);
    __half2 h[2] = {__floats2half2_rn(sat_half(t.x), sat_half(t.y)),
                    __floats2half2_rn(sat_half(t.z), sat_half(t.w))};
    *(uint2 *)(xh + (int64_t)i * n + k) = *(const uint2 *)h;
}

extern "C" int64_t gemm_dense_ld(const gemv_matrix *w)
{
    return (int64_t)ds_div_up(w->n_in, GEMM_KT) * GEMM_KT;
}

extern "C" void gemm_dequant_half(const gemv_matrix *w, uint16_t *d_w16, const cuda_launch *l)
{
    DS_ASSERT(gemm_reads_half(w->type));
    gemm_q_half_launch(w, d_w16, gemm_dense_ld(w), l);
}

extern "C" void gemm_x_half(const float *d_x, int64_t ld_x, int64_t n, uint16_t *d_xh, int B,
                            const cuda_launch *l)
{
    DS_ASSERT(n > 0 && n % 4 == 0 && ld_x % 4 == 0 && ld_x >= n && B >= 1 && B < 65536);
    ds_launch(x_half_kernel, dim3(ds_div_up(n / 4, 256), B), 256, 0, l, d_x, ld_x, n, (__half *)d_xh);
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
        if (v == v) m = max(m, argmax_key(v, c)); // NaN never wins
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
