// Batched GEMM of the quantised weight types (gemm.h): Q4_K, Q5_K, Q6_K and Q8_0 tiles
// dequantised to F16 in shared memory with half2 arithmetic, WMMA against the F16 rows of X,
// F32 accumulation in a fixed K order.
//
// CTA: 8 warps, 128 weight rows (16 a warp) x NT*16 batch rows, K in steps of GEMM_KT = 128,
// two shared-memory stages. While the tensor cores work on step s, each thread already holds
// the raw blocks of step s+1 in registers (global loads issued before the MMAs) and the X rows
// of step s+1 stream into the other stage with cp.async; the thread then dequantises its
// registers into that stage, and one barrier a step closes it. The first step's weights load
// before the grid dependency (they do not depend on earlier kernels), so under programmatic
// launch they overlap the previous kernel's tail.
//
// Thread (rr = tid % 128, c = tid / 128) dequantises 64 weights of row rr a step; c is uniform
// over a warp. Q4_K / Q5_K: sub-blocks 2c and 2c+1 of the step's four (the low and high nibbles
// of the same 32 bytes). Q6_K: chunks c and c+2 (low and high nibbles of the same ql bytes).
// Q8_0: blocks 2c and 2c+1. Nibbles become halves by the 0x6400 exponent trick: the bits
// (0x6400 | q) are the half 1024 + q exactly, 1024 is subtracted exactly, and one hfma2 applies
// the sub-block's scale (d·sc rounded to F16) and min. Rounding against the F32 CPU twin: the
// scale, the min and the product to F16 (2^-11 relative each), x to F16.
#include <mma.h>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm_q.cuh"
#include "kernels/cuda/gemv_slices.cuh"
#include "kernels/cuda/quant_blocks.cuh"

using namespace nvcuda;

#define GQ_LDS (GEMM_KT + 8) // shared row stride (halves): consecutive rows 4 banks apart
#define GQ_THREADS 256

struct qview {
    const uint8_t *w;
    int64_t n_in, nblk; // nblk: blocks of the whole matrix (packed layouts' section offsets)
};

__device__ __forceinline__ __half2 as_h2(uint32_t u)
{
    __half2 h;
    memcpy(&h, &u, 4);
    return h;
}
__device__ __forceinline__ uint32_t as_u32(__half2 h)
{
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}
// bytes 2p and 2p+1 of u into the low bytes of the two halves
__device__ __forceinline__ uint32_t spread(uint32_t u, int p) { return __byte_perm(u, 0, p ? 0x4342 : 0x4140); }
__device__ __forceinline__ __half2 magic(uint32_t q) { return as_h2(q | 0x64006400u); } // 1024 + q

__device__ __forceinline__ void store64(__half *dst, const uint32_t *v) // 32 halves
{
#pragma unroll
    for (int i = 0; i < 4; i++) ((uint4 *)dst)[i] = make_uint4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

// byte i (0..11) of a K-quant block's scales, held in words y, z, w of its 16-byte header
__device__ __forceinline__ uint32_t sbyte(const uint4 &hdr, int i)
{
    const uint32_t w = i < 4 ? hdr.y : i < 8 ? hdr.z : hdr.w;
    return (w >> (8 * (i & 3))) & 0xFF;
}
// qb_scale_min_k4 on the registers: the 6-bit scale times d and min times dmin of sub-block j
__device__ __forceinline__ void kq_scale(const uint4 &hdr, int j, __half2 *s, __half2 *mn)
{
    uint32_t sc, m;
    if (j < 4) {
        sc = sbyte(hdr, j) & 63, m = sbyte(hdr, j + 4) & 63;
    } else {
        sc = (sbyte(hdr, j + 4) & 0xF) | ((sbyte(hdr, j - 4) >> 6) << 4);
        m = (sbyte(hdr, j + 4) >> 4) | ((sbyte(hdr, j) >> 6) << 4);
    }
    *s = __float2half2_rn(qb_half((uint16_t)hdr.x) * (float)sc);
    *mn = __float2half2_rn(-qb_half((uint16_t)(hdr.x >> 16)) * (float)m);
}

// ---- per type: the raw bytes a thread holds for one step, and their dequantisation ----

template <uint32_t T> struct qraw;

template <> struct qraw<GGML_TYPE_Q4_K> {
    uint4 hdr, q[2];
};
__device__ __forceinline__ void qload(const qview &m, int64_t r, int64_t k0, int c, qraw<GGML_TYPE_Q4_K> &o)
{
    const uint8_t *b = m.w + (r * (m.n_in / QK_K) + k0 / QK_K) * 144;
    const int h = (int)(k0 / GEMM_KT) & 1;
    o.hdr = ldg<uint4>(b);
    o.q[0] = ldg<uint4>(b + 16 + 32 * (2 * h + c));
    o.q[1] = ldg<uint4>(b + 32 + 32 * (2 * h + c));
}
__device__ __forceinline__ void qput(const qraw<GGML_TYPE_Q4_K> &o, int64_t k0, int c, __half *row)
{
    const int j = 4 * ((int)(k0 / GEMM_KT) & 1) + 2 * c;
    __half2 s0, m0, s1, m1;
    kq_scale(o.hdr, j, &s0, &m0);
    kq_scale(o.hdr, j + 1, &s1, &m1);
    const __half2 k1024 = __float2half2_rn(1024.0f);
    const uint32_t w[8] = {o.q[0].x, o.q[0].y, o.q[0].z, o.q[0].w, o.q[1].x, o.q[1].y, o.q[1].z, o.q[1].w};
    uint32_t lo[16], hi[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const uint32_t t = spread(w[i / 2], i & 1);
        lo[i] = as_u32(__hfma2(__hsub2(magic(t & 0x000F000Fu), k1024), s0, m0));
        hi[i] = as_u32(__hfma2(__hsub2(magic((t >> 4) & 0x000F000Fu), k1024), s1, m1));
    }
    store64(row + 64 * c, lo);
    store64(row + 64 * c + 32, hi);
}

template <> struct qraw<GGML_TYPE_Q5_K> {
    uint4 hdr, qh[2], q[2];
};
__device__ __forceinline__ void qload(const qview &m, int64_t r, int64_t k0, int c, qraw<GGML_TYPE_Q5_K> &o)
{
    const uint8_t *b = m.w + (r * (m.n_in / QK_K) + k0 / QK_K) * 176;
    const int h = (int)(k0 / GEMM_KT) & 1;
    o.hdr = ldg<uint4>(b);
    o.qh[0] = ldg<uint4>(b + 16);
    o.qh[1] = ldg<uint4>(b + 32);
    o.q[0] = ldg<uint4>(b + 48 + 32 * (2 * h + c));
    o.q[1] = ldg<uint4>(b + 64 + 32 * (2 * h + c));
}
__device__ __forceinline__ void qput(const qraw<GGML_TYPE_Q5_K> &o, int64_t k0, int c, __half *row)
{
    const int j = 4 * ((int)(k0 / GEMM_KT) & 1) + 2 * c;
    __half2 s0, m0, s1, m1;
    kq_scale(o.hdr, j, &s0, &m0);
    kq_scale(o.hdr, j + 1, &s1, &m1);
    const __half2 k1024 = __float2half2_rn(1024.0f);
    const uint32_t w[8] = {o.q[0].x, o.q[0].y, o.q[0].z, o.q[0].w, o.q[1].x, o.q[1].y, o.q[1].z, o.q[1].w};
    const uint32_t wh[8] = {o.qh[0].x, o.qh[0].y, o.qh[0].z, o.qh[0].w, o.qh[1].x, o.qh[1].y, o.qh[1].z, o.qh[1].w};
    uint32_t lo[16], hi[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const uint32_t t = spread(w[i / 2], i & 1), u = spread(wh[i / 2], i & 1);
        const uint32_t a = (t & 0x000F000Fu) | (((u >> j) & 0x00010001u) << 4);
        const uint32_t b = ((t >> 4) & 0x000F000Fu) | (((u >> (j + 1)) & 0x00010001u) << 4);
        lo[i] = as_u32(__hfma2(__hsub2(magic(a), k1024), s0, m0));
        hi[i] = as_u32(__hfma2(__hsub2(magic(b), k1024), s1, m1));
    }
    store64(row + 64 * c, lo);
    store64(row + 64 * c + 32, hi);
}

template <> struct qraw<GGML_TYPE_Q6_K> {
    uint4 ql[2], qh[2];
    uint2 sc;
    uint32_t d;
};
__device__ __forceinline__ void qload(const qview &m, int64_t r, int64_t k0, int c, qraw<GGML_TYPE_Q6_K> &o)
{
    const int64_t ib = r * (m.n_in / QK_K) + k0 / QK_K;
    const int n = (int)(k0 / GEMM_KT) & 1;
    const uint8_t *qlh = m.w + ib * 192;
    o.ql[0] = ldg<uint4>(qlh + 64 * n + 32 * c);
    o.ql[1] = ldg<uint4>(qlh + 64 * n + 32 * c + 16);
    o.qh[0] = ldg<uint4>(qlh + 128 + 32 * n);
    o.qh[1] = ldg<uint4>(qlh + 128 + 32 * n + 16);
    o.sc = ldg<uint2>(m.w + q6_sc_off(m.nblk) + ib * 16 + 8 * n);
    o.d = ldg<uint16_t>(m.w + q6_d_off(m.nblk) + ib * 2);
}
__device__ __forceinline__ __half2 q6_scale(const qraw<GGML_TYPE_Q6_K> &o, int i) // scale byte i of 8
{
    const uint32_t w = i < 4 ? o.sc.x : o.sc.y;
    return __float2half2_rn(qb_half((uint16_t)o.d) * (float)(int8_t)(w >> (8 * (i & 3))));
}
__device__ __forceinline__ void qput(const qraw<GGML_TYPE_Q6_K> &o, int64_t k0, int c, __half *row)
{
    (void)k0;
    // chunk c: low nibbles, qh bits 2c; chunk c+2: high nibbles, qh bits 2c+4; 16 elements a scale
    const __half2 sa[2] = {q6_scale(o, 2 * c), q6_scale(o, 2 * c + 1)};
    const __half2 sb[2] = {q6_scale(o, 2 * c + 4), q6_scale(o, 2 * c + 5)};
    const __half2 k1056 = __float2half2_rn(1056.0f);
    const uint32_t w[8] = {o.ql[0].x, o.ql[0].y, o.ql[0].z, o.ql[0].w, o.ql[1].x, o.ql[1].y, o.ql[1].z, o.ql[1].w};
    const uint32_t wh[8] = {o.qh[0].x, o.qh[0].y, o.qh[0].z, o.qh[0].w, o.qh[1].x, o.qh[1].y, o.qh[1].z, o.qh[1].w};
    uint32_t va[16], vb[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const uint32_t t = spread(w[i / 2], i & 1), u = spread(wh[i / 2], i & 1);
        const uint32_t a = (t & 0x000F000Fu) | (((u >> (2 * c)) & 0x00030003u) << 4);
        const uint32_t b = ((t >> 4) & 0x000F000Fu) | (((u >> (2 * c + 4)) & 0x00030003u) << 4);
        va[i] = as_u32(__hmul2(__hsub2(magic(a), k1056), sa[i / 8]));
        vb[i] = as_u32(__hmul2(__hsub2(magic(b), k1056), sb[i / 8]));
    }
    store64(row + 32 * c, va);
    store64(row + 32 * (c + 2), vb);
}

template <> struct qraw<GGML_TYPE_Q8_0> {
    uint4 q[4];
    uint32_t d[2];
};
__device__ __forceinline__ void qload(const qview &m, int64_t r, int64_t k0, int c, qraw<GGML_TYPE_Q8_0> &o)
{
    const int64_t ib = (r * m.n_in + k0) / 32 + 2 * c;
    const uint8_t *q = m.w + ib * 32;
#pragma unroll
    for (int i = 0; i < 4; i++) o.q[i] = ldg<uint4>(q + 16 * i);
    o.d[0] = ldg<uint16_t>(m.w + q8_d_off(m.nblk) + ib * 2);
    o.d[1] = ldg<uint16_t>(m.w + q8_d_off(m.nblk) + ib * 2 + 2);
}
__device__ __forceinline__ void qput(const qraw<GGML_TYPE_Q8_0> &o, int64_t k0, int c, __half *row)
{
    (void)k0;
    const __half2 k1152 = __float2half2_rn(1152.0f);
#pragma unroll
    for (int blk = 0; blk < 2; blk++) {
        const __half2 d = __half2half2(__ushort_as_half((uint16_t)o.d[blk]));
        const uint32_t w[8] = {o.q[2 * blk].x, o.q[2 * blk].y, o.q[2 * blk].z, o.q[2 * blk].w,
                               o.q[2 * blk + 1].x, o.q[2 * blk + 1].y, o.q[2 * blk + 1].z, o.q[2 * blk + 1].w};
        uint32_t v[16];
#pragma unroll
        for (int i = 0; i < 16; i++) { // int8 b: (b ^ 0x80) is b + 128, so the half is 1152 + b
            const uint32_t t = spread(w[i / 2], i & 1) ^ 0x00800080u;
            v[i] = as_u32(__hmul2(__hsub2(magic(t), k1152), d));
        }
        store64(row + 64 * c + 32 * blk, v);
    }
}

// the raw blocks of row r for the step at k0, zero (so the tile is zero) past the matrix; the
// K-quants' rows end on a step (n_in % 256 == 0)
template <uint32_t T>
__device__ __forceinline__ void qload_or_zero(const qview &m, int64_t r, bool row_ok, int64_t k0,
                                              int64_t k_end, int c, qraw<T> &o)
{
    (void)k_end;
    if (row_ok) qload(m, r, k0, c, o);
    else memset(&o, 0, sizeof o);
}
// Q8_0 rows may end inside a step (n_in % 128 != 0): a block past the end gets scale 0
__device__ __forceinline__ void qload_or_zero(const qview &m, int64_t r, bool row_ok, int64_t k0,
                                              int64_t k_end, int c, qraw<GGML_TYPE_Q8_0> &o)
{
    if (row_ok && k0 + 64 * c < k_end) {
        qload(m, r, k0, c, o);
        if (k0 + 64 * c + 32 >= k_end) o.d[1] = 0;
    } else {
        memset(&o, 0, sizeof o);
    }
}

// the X rows b0.. of the step at k0 into Xs (zero past B and past k_end), 16 bytes a copy
template <int N>
__device__ __forceinline__ void x_async(const __half *xh, int64_t n_in, int b0, int B, int64_t k0,
                                        int64_t k_end, __half *Xs, int tid)
{
#pragma unroll
    for (int e = tid; e < N * (GEMM_KT / 8); e += GQ_THREADS) {
        const int i = e / (GEMM_KT / 8), kk = 8 * (e % (GEMM_KT / 8));
        const bool ok = b0 + i < B && k0 + kk < k_end;
        cp_async16(Xs + i * GQ_LDS + kk, ok ? xh + (int64_t)(b0 + i) * n_in + k0 + kk : xh, ok);
    }
}

template <int NT> constexpr int gq_min_blocks() { return NT <= 4 ? 2 : 1; }

template <uint32_t T, int NT>
static __global__ void __launch_bounds__(GQ_THREADS, gq_min_blocks<NT>())
    gemm_q_kernel(qview m, int64_t n_out, const __half *__restrict__ xh, float *__restrict__ y,
                  int64_t ld_y, int add, int B, float *__restrict__ part, int k_steps_per_split)
{
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int N = NT * 16, LDC = N + 4;
    static_assert(GEMM_M * LDC * 4 <= 2 * GEMM_M * GQ_LDS * 2, "C tile must fit the W stages");
    __half *Ws = (__half *)smem;          // [2][GEMM_M][GQ_LDS]
    __half *Xs = Ws + 2 * GEMM_M * GQ_LDS; // [2][N][GQ_LDS]
    float *Cs = (float *)smem;            // [GEMM_M][LDC], after the K loop
    const int tid = threadIdx.x, warp = tid >> 5, rr = tid % GEMM_M, c = tid / GEMM_M;
    const int64_t r0 = (int64_t)blockIdx.x * GEMM_M, r = r0 + rr;
    const bool row_ok = r < n_out;
    const int b0 = blockIdx.y * N;
    const int64_t k_begin = (int64_t)blockIdx.z * k_steps_per_split * GEMM_KT;
    const int64_t k_end = min(m.n_in, k_begin + (int64_t)k_steps_per_split * GEMM_KT);

    qraw<T> q;
    qload_or_zero(m, r, row_ok, k_begin, k_end, c, q); // the weights precede no kernel
    ds_grid_dep();
    x_async<N>(xh, m.n_in, b0, B, k_begin, k_end, Xs, tid);
    cp_async_commit();
    qput(q, k_begin, c, Ws + rr * GQ_LDS);
    cp_async_wait_all();
    __syncthreads();

    // warps: WM along the weight rows x WN along the batch rows; a warp's tile is FM x FN
    // fragments of 16x16 (A loaded FN times less often than one warp a 16-row strip would)
    constexpr int WM = NT >= 4 ? 4 : 8, WN = 8 / WM, FM = GEMM_M / 16 / WM, FN = NT / WN;
    const int wm = warp % WM, wn = warp / WM;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    int s = 0;
    for (int64_t k0 = k_begin; k0 < k_end; k0 += GEMM_KT, s ^= 1) {
        const int64_t kn = k0 + GEMM_KT;
        const bool more = kn < k_end;
        __half *Wn = Ws + (s ^ 1) * GEMM_M * GQ_LDS, *Xn = Xs + (s ^ 1) * N * GQ_LDS;
        if (more) {
            qload_or_zero(m, r, row_ok, kn, k_end, c, q);
            x_async<N>(xh, m.n_in, b0, B, kn, k_end, Xn, tid);
            cp_async_commit();
        }
        const __half *Wc = Ws + (s * GEMM_M + wm * FM * 16) * GQ_LDS;
        const __half *Xc = Xs + (s * N + wn * FN * 16) * GQ_LDS;
#pragma unroll
        for (int kk = 0; kk < GEMM_KT; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> bf[FN];
#pragma unroll
            for (int i = 0; i < FM; i++) wmma::load_matrix_sync(a[i], Wc + i * 16 * GQ_LDS + kk, GQ_LDS);
#pragma unroll
            for (int j = 0; j < FN; j++) wmma::load_matrix_sync(bf[j], Xc + j * 16 * GQ_LDS + kk, GQ_LDS);
#pragma unroll
            for (int i = 0; i < FM; i++)
#pragma unroll
                for (int j = 0; j < FN; j++) wmma::mma_sync(acc[i][j], a[i], bf[j], acc[i][j]);
        }
        if (more) {
            qput(q, kn, c, Wn + rr * GQ_LDS);
            cp_async_wait_all();
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++)
            wmma::store_matrix_sync(Cs + (wm * FM + i) * 16 * LDC + (wn * FN + j) * 16, acc[i][j], LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < GEMM_M * N; e += GQ_THREADS) {
        const int i = e / GEMM_M, rw = e % GEMM_M;
        const int64_t ro = r0 + rw;
        if (b0 + i >= B || ro >= n_out) continue;
        const float v = Cs[rw * LDC + i];
        if (gridDim.z > 1) { // split K: this split's partial, summed by gemm.cu's reduction
            part[((int64_t)blockIdx.z * B + b0 + i) * n_out + ro] = v;
            continue;
        }
        float *out = y + (int64_t)(b0 + i) * ld_y + ro;
        *out = add ? *out + v : v;
    }
}

// The dense path's weights (gemm.h): the matrix as F16 rows, by the same loads and half2
// dequantisation as a gemm_q_kernel step (into a shared tile as there, each thread 64 halves of
// its row), then out to global memory a row's 256 bytes by 16 lanes at a time (writes straight
// from the threads, 32 rows apart a warp, ran at a third of the bandwidth). CTA: 128 rows x one
// 128-wide K step. The scratch it writes was read by the last dense GEMM: written only after the
// grid dependency.
template <uint32_t T>
static __global__ void __launch_bounds__(GQ_THREADS)
    gemm_q_half_kernel(qview m, int64_t n_out, __half *__restrict__ w16, int64_t ld)
{
    __shared__ __align__(16) __half tile[GEMM_M * GQ_LDS];
    const int tid = threadIdx.x, rr = tid % GEMM_M, c = tid / GEMM_M;
    const int64_t r0 = (int64_t)blockIdx.x * GEMM_M, k0 = (int64_t)blockIdx.y * GEMM_KT;
    qraw<T> q;
    qload_or_zero(m, r0 + rr, r0 + rr < n_out, k0, m.n_in, c, q);
    qput(q, k0, c, tile + rr * GQ_LDS);
    __syncthreads();
    ds_grid_dep();
    constexpr int U = GEMM_KT / 8; // uint4 a row
    for (int i = tid; i < GEMM_M * U; i += GQ_THREADS) {
        const int row = i / U, u = i % U;
        if (r0 + row < n_out)
            *(uint4 *)(w16 + (r0 + row) * ld + k0 + 8 * u) = *(const uint4 *)(tile + row * GQ_LDS + 8 * u);
    }
}

template <uint32_t T>
static void half_t(const gemv_matrix *w, uint16_t *w16, int64_t ld, const cuda_launch *l)
{
    const int64_t bs = T == GGML_TYPE_Q8_0 ? 32 : QK_K;
    const qview m = {(const uint8_t *)w->d_w, w->n_in, w->n_in * w->n_out / bs};
    const dim3 grid(ds_div_up(w->n_out, GEMM_M), ds_div_up(w->n_in, GEMM_KT));
    ds_launch(gemm_q_half_kernel<T>, grid, GQ_THREADS, 0, l, m, w->n_out, (__half *)w16, ld);
}

void gemm_q_half_launch(const gemv_matrix *w, uint16_t *w16, int64_t ld, const cuda_launch *l)
{
    switch (w->type) {
    case GGML_TYPE_Q4_K: half_t<GGML_TYPE_Q4_K>(w, w16, ld, l); break;
    case GGML_TYPE_Q5_K: half_t<GGML_TYPE_Q5_K>(w, w16, ld, l); break;
    case GGML_TYPE_Q6_K: half_t<GGML_TYPE_Q6_K>(w, w16, ld, l); break;
    case GGML_TYPE_Q8_0: half_t<GGML_TYPE_Q8_0>(w, w16, ld, l); break;
    default: DS_ASSERT(!"gemm_q_half_launch: not a quantised type");
    }
}

template <int NT> static size_t gq_smem() { return (size_t)(2 * GEMM_M + 2 * NT * 16) * GQ_LDS * 2; }

template <uint32_t T, int NT>
static void launch_nt(const gemv_matrix *w, const uint16_t *xh, float *y, int64_t ld_y, int add,
                      int B, float *part, int kps, int splits, const cuda_launch *l)
{
    const int64_t bs = T == GGML_TYPE_Q8_0 ? 32 : QK_K;
    const qview m = {(const uint8_t *)w->d_w, w->n_in, w->n_in * w->n_out / bs};
    const dim3 grid(ds_div_up(w->n_out, GEMM_M), ds_div_up(B, NT * 16), splits);
    ds_launch(gemm_q_kernel<T, NT>, grid, GQ_THREADS, gq_smem<NT>(), l, m, w->n_out,
              (const __half *)xh, y, ld_y, add, B, part, kps);
}

// the batch tile: 16 / 32 / 64 rows (two CTAs an SM), 128 from 65 rows on (one CTA an SM,
// the weights dequantised half as often)
template <uint32_t T>
static void launch_t(const gemv_matrix *w, const uint16_t *xh, float *y, int64_t ld_y, int add,
                     int B, float *part, int kps, int splits, const cuda_launch *l)
{
    if (B <= 16) launch_nt<T, 1>(w, xh, y, ld_y, add, B, part, kps, splits, l);
    else if (B <= 32) launch_nt<T, 2>(w, xh, y, ld_y, add, B, part, kps, splits, l);
    else if (B <= 64) launch_nt<T, 4>(w, xh, y, ld_y, add, B, part, kps, splits, l);
    else launch_nt<T, 8>(w, xh, y, ld_y, add, B, part, kps, splits, l);
}

void gemm_q_launch(const gemv_matrix *w, const uint16_t *xh, float *y, int64_t ld_y, int add,
                   int B, float *part, int kps, int splits, const cuda_launch *l)
{
    switch (w->type) {
    case GGML_TYPE_Q4_K: launch_t<GGML_TYPE_Q4_K>(w, xh, y, ld_y, add, B, part, kps, splits, l); break;
    case GGML_TYPE_Q5_K: launch_t<GGML_TYPE_Q5_K>(w, xh, y, ld_y, add, B, part, kps, splits, l); break;
    case GGML_TYPE_Q6_K: launch_t<GGML_TYPE_Q6_K>(w, xh, y, ld_y, add, B, part, kps, splits, l); break;
    case GGML_TYPE_Q8_0: launch_t<GGML_TYPE_Q8_0>(w, xh, y, ld_y, add, B, part, kps, splits, l); break;
    default: DS_ASSERT(!"gemm_q_launch: not a quantised type");
    }
}

template <uint32_t T, int NT> static cudaError_t init_nt()
{
    return cudaFuncSetAttribute(gemm_q_kernel<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)gq_smem<NT>());
}
template <uint32_t T> static cudaError_t init_t()
{
    cudaError_t e = init_nt<T, 1>();
    if (e == cudaSuccess) e = init_nt<T, 2>();
    if (e == cudaSuccess) e = init_nt<T, 4>();
    if (e == cudaSuccess) e = init_nt<T, 8>();
    return e;
}

cudaError_t gemm_q_init()
{
    cudaError_t e = init_t<GGML_TYPE_Q4_K>();
    if (e == cudaSuccess) e = init_t<GGML_TYPE_Q5_K>();
    if (e == cudaSuccess) e = init_t<GGML_TYPE_Q6_K>();
    if (e == cudaSuccess) e = init_t<GGML_TYPE_Q8_0>();
    return e;
}
