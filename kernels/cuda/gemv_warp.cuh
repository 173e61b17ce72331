// Internal to kernels/cuda, GEMV family (gemv.h): the warp kernel's body, shared by the single
// launch (gemv_warp.cu) and the two-matrix launch (gemv_pair.cu). One warp per output row (or
// wpr warps splitting a row), GEMV_WARPS warps per CTA, a grid that strides over rows (sized to
// fill the GPU once, so no tail wave); each lane owns a fixed 16-byte slice of a block and walks
// the row block by block. Integer dp4a against the Q8 x for quantised types, FP32 FMA for float
// types. Formulas: docs/QWEN35.md §5.2.
#ifndef DS_KERNELS_CUDA_GEMV_WARP_CUH
#define DS_KERNELS_CUDA_GEMV_WARP_CUH

#include <type_traits>

#include "kernels/cuda/argmax_key.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gdn_conv.cuh"
#include "kernels/cuda/gemv_plan.cuh"
#include "kernels/cuda/gemv_slices.cuh"

#define GEMV_WARPS 4

// the warp kernel's arguments besides the matrix, x and y
struct ep_args {
    int pf;                   // row groups prefetched into L2 ahead (0, 1, 2)
    int wpr;                  // warps per row (1, 2, 4): they split its blocks
    unsigned long long *best; // EP_ARGMAX
    const float *conv_w;      // EP_CONV: [n_conv][K]
    float *conv_state;        // EP_CONV: [n_conv][K-1]
    int64_t n_conv;
    int K;
};

// R rows of one matrix against x: acc[r] = partial (this lane's) dot of row rows[r]. The nl
// lanes of a row group (one warp, or the wpr warps that split a row) are numbered lr; lane lr
// takes slice lr % TPB of blocks lr / TPB + i * (nl / TPB). The x loads of a block are loaded
// once for the R rows. (Issuing the weight loads of several blocks before the first is used
// was slower at every shape but the Q6_K lm_head with R = 4 on the H200: the raw words held in
// registers cost occupancy. The loop the compiler schedules itself stays.)
template <typename TT, int R>
static __device__ __forceinline__ void rows_dot_q(const uint8_t *W, const int64_t *rows, int nb,
                                                  uint64_t nblk, const int8_t *xqs,
                                                  const float2 *xds, int lr, int nl, float *acc)
{
    const int bpi = nl / TT::TPB;
    const int c = lr % TT::TPB;
    // block indices in 32 bits (gemv_matrix_plan refuses a matrix of 2^32 blocks or more): one
    // register a row instead of two, which keeps the 40-register Q4_K build free of spills
    uint32_t base[R]; // the first block of each row
#pragma unroll
    for (int r = 0; r < R; r++) base[r] = (uint32_t)rows[r] * (uint32_t)nb;
#pragma unroll 4
    for (int b = lr / TT::TPB; b < nb; b += bpi) {
        const auto xv = load_x(TT(), b, c, xqs, xds);
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[r] += slice_dot(TT(), W, nblk, (uint64_t)(base[r] + (uint32_t)b), c, xv);
    }
}

struct f32_t {};
struct f16_t {};
struct bf16_t {};

static __device__ __forceinline__ float4 ldx4(const float *x, int64_t i) { return ldg<float4>(x + i); }

template <int R>
static __device__ __forceinline__ void rows_dot_f(f32_t, const uint8_t *W, const int64_t *rows,
                                                  int64_t n_in, const float *x, int lane,
                                                  float *acc)
{
#pragma unroll 4
    for (int64_t i = 4 * lane; i < n_in; i += 128) {
        const float4 v = ldx4(x, i);
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float4 a = ldg<float4>((const float *)W + rows[r] * n_in + i);
            acc[r] += a.x * v.x + a.y * v.y + a.z * v.z + a.w * v.w;
        }
    }
}

template <bool BF, int R>
static __device__ __forceinline__ void rows_dot_h(const uint8_t *W, const int64_t *rows,
                                                  int64_t n_in, const float *x, int lane,
                                                  float *acc)
{
#pragma unroll 2
    for (int64_t i = 8 * lane; i < n_in; i += 256) {
        const float4 v0 = ldx4(x, i), v1 = ldx4(x, i + 4);
        const float xs[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 a = ldg<uint4>((const uint16_t *)W + rows[r] * n_in + i);
            const uint32_t u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float lo, hi;
                if (BF) {
                    lo = __uint_as_float(u[k] << 16);
                    hi = __uint_as_float(u[k] & 0xffff0000u);
                } else {
                    const float2 f = __half22float2(*(const __half2 *)&u[k]);
                    lo = f.x;
                    hi = f.y;
                }
                acc[r] += lo * xs[2 * k] + hi * xs[2 * k + 1];
            }
        }
    }
}

template <int R>
static __device__ __forceinline__ void rows_dot_f(f16_t, const uint8_t *W, const int64_t *rows,
                                                  int64_t n_in, const float *x, int lane,
                                                  float *acc)
{
    rows_dot_h<false, R>(W, rows, n_in, x, lane, acc);
}
template <int R>
static __device__ __forceinline__ void rows_dot_f(bf16_t, const uint8_t *W, const int64_t *rows,
                                                  int64_t n_in, const float *x, int lane,
                                                  float *acc)
{
    rows_dot_h<true, R>(W, rows, n_in, x, lane, acc);
}

template <typename TT> struct is_float_type { static constexpr bool v = false; };
template <> struct is_float_type<f32_t> { static constexpr bool v = true; };
template <> struct is_float_type<f16_t> { static constexpr bool v = true; };
template <> struct is_float_type<bf16_t> { static constexpr bool v = true; };

// nblk (blocks in the whole tensor) is only needed by the packed layouts; pass it through.
// (float types: one warp per row, lr = the lane)
template <typename TT, int R>
static __device__ __forceinline__ void rows_dot(const uint8_t *W, const int64_t *rows,
                                                int64_t n_in, uint64_t nblk, const float *x,
                                                const int8_t *xqs, const float2 *xds, int lr,
                                                int nl, float *acc)
{
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    if constexpr (is_float_type<TT>::v)
        rows_dot_f<R>(TT(), W, rows, n_in, x, lr, acc);
    else
        rows_dot_q<TT, R>(W, rows, (int)(n_in / TT::QK), nblk, xqs, xds, lr, nl, acc);
}

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// L2 prefetch of rows [r0, r0 + R) (consecutive) of a matrix in the GEMV layout: the lanes
// of a warp each touch one 128-byte line of every array the rows live in, so all of a row
// group's DRAM requests are in flight before the dot loop asks for the first block. The loop
// then reads from L2. Rows past n_out are not prefetched (prefetch never faults anyway).
static __device__ __forceinline__ void l2_prefetch_span(const uint8_t *p, uint64_t bytes, int lane)
{
    for (uint64_t off = (uint64_t)lane * 128; off < bytes; off += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

template <typename TT>
static __device__ __forceinline__ void prefetch_rows(const uint8_t *W, int64_t n_in,
                                                     int64_t n_out, uint64_t nblk, int64_t r0,
                                                     int R, int lane)
{
    if (r0 >= n_out) return;
    const int64_t nr = r0 + R <= n_out ? R : n_out - r0;
    if constexpr (is_float_type<TT>::v) {
        const uint64_t es = std::is_same<TT, f32_t>::value ? 4 : 2;
        l2_prefetch_span(W + (uint64_t)r0 * n_in * es, (uint64_t)nr * n_in * es, lane);
    } else {
        const uint64_t nb = (uint64_t)(n_in / TT::QK), b0 = (uint64_t)r0 * nb, n = (uint64_t)nr * nb;
        if constexpr (std::is_same<TT, q4k_t>::value) {
            l2_prefetch_span(W + b0 * 144, n * 144, lane);
        } else if constexpr (std::is_same<TT, q5k_t>::value) {
            l2_prefetch_span(W + b0 * 176, n * 176, lane);
        } else if constexpr (std::is_same<TT, q6k_t>::value) {
            l2_prefetch_span(W + b0 * 192, n * 192, lane);
            l2_prefetch_span(W + q6_sc_off(nblk) + b0 * 16, n * 16, lane);
        } else if constexpr (std::is_same<TT, q80_t>::value) {
            l2_prefetch_span(W + b0 * 32, n * 32, lane);
        }
    }
}

// Row `row`'s epilogue, given its dot a (and, for EP_SWIGLU, the up dot u): store, residual
// add, SwiGLU, the causal conv of the GDN in-projection, or store + running argmax.
// (EP_ADD: y_old is y[row] as loaded before the row's dot product; EP_CONV: cv, when not NULL,
// the row's 2K-1 conv inputs as loaded before it, gdn_conv_value's order.)
template <int EP>
static __device__ __forceinline__ void ep_row(const ep_args &ep, float *__restrict__ y,
                                              int64_t row, float a, float u, float y_old,
                                              const float *cv, unsigned long long *best)
{
    if constexpr (EP == EP_SWIGLU) a = a / (1.0f + __expf(-a)) * u;
    if constexpr (EP == EP_ADD) {
        y[row] = y_old + a;
    } else if constexpr (EP == EP_CONV) {
        float *st = ep.conv_state + row * (ep.K - 1);
        y[row] = row >= ep.n_conv ? a
                 : cv ? gdn_conv_channel_from(a, cv, cv + ep.K, st, ep.K)
                      : gdn_conv_channel(a, ep.conv_w + row * ep.K, st, ep.K);
    } else {
        y[row] = a;
    }
    if constexpr (EP == EP_ARGMAX) {
        const unsigned long long k = argmax_key(a, row);
        *best = k > *best ? k : *best;
    }
}

// The CTA's GEMV_WARPS warps form GEMV_WARPS / wpr row groups of wpr warps; group g of CTA k
// handles rows [R*(k*G + g), +R) (G groups per CTA), then strides by the grid. The wpr warps of
// a group split the row's blocks (short fat matrices: more warps in flight, fewer blocks each)
// and add their sums through shared memory in a fixed order. Rows past n_out (the last group)
// are computed on row n_out-1 and not stored. Every warp of a CTA runs the same iterations.
// The body takes its CTA index and count (cta, ncta) as arguments, so that one launch can run
// two matrices on two parts of its grid (gemv_pair_kernel).
template <typename TT, int EP, int R>
static __device__ __forceinline__ void
    gemv_body(const unsigned cta, const unsigned ncta, const uint8_t *__restrict__ W0,
              const uint8_t *__restrict__ W1, int64_t n_in, int64_t n_out,
              const float *__restrict__ x, const int8_t *__restrict__ xqs,
              const float2 *__restrict__ xds, float *__restrict__ y, ep_args ep)
{
    constexpr bool TWO = EP == EP_SWIGLU;
    __shared__ float s_part[GEMV_WARPS][2 * R];
    __shared__ float s_cv[GEMV_WARPS][EP == EP_CONV ? 32 : 1]; // EP_CONV: the rows' conv inputs
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wpr = ep.wpr, groups = GEMV_WARPS / wpr, grp = warp / wpr, wk = warp % wpr;
    const int lr = wk * 32 + lane, nl = wpr * 32;
    uint64_t nblk = 0;
    if constexpr (!is_float_type<TT>::v) nblk = (uint64_t)n_out * (uint64_t)(n_in / TT::QK);
    unsigned long long my_best = 0;
    const int64_t cta_rows = (int64_t)groups * R, rstride = (int64_t)ncta * cta_rows;
    // ep.pf row groups ahead in L2: the first group(s) now, then group i + pf while doing group
    // i. The weights do not depend on the preceding kernel, so the first prefetches go out
    // before ds_grid_dep(): under programmatic dependent launch they overlap its tail.
    const int64_t cfirst = (int64_t)cta * cta_rows, goff = (int64_t)grp * R;
    if constexpr (EP == EP_CONV) // the group's conv channels: lane l, row l % R of group l / R
        if (wk == 0)
            for (int l = lane;; l += 32) {
                const int64_t row = cfirst + goff + (l / R) * rstride + l % R;
                if (row >= ep.n_conv) break;
                gdn_conv_prefetch(ep.conv_w, ep.conv_state, row, ep.K);
            }
    if (wk == 0)
        for (int k = 0; k < ep.pf; k++) {
            prefetch_rows<TT>(W0, n_in, n_out, nblk, cfirst + goff + k * rstride, R, lane);
            if constexpr (TWO)
                prefetch_rows<TT>(W1, n_in, n_out, nblk, cfirst + goff + k * rstride, R, lane);
        }
    ds_grid_dep();
    for (int64_t c0 = cfirst; c0 < n_out; c0 += rstride) {
        const int64_t r0 = c0 + goff;
        if (ep.pf > 0 && wk == 0) {
            prefetch_rows<TT>(W0, n_in, n_out, nblk, r0 + ep.pf * rstride, R, lane);
            if constexpr (TWO) prefetch_rows<TT>(W1, n_in, n_out, nblk, r0 + ep.pf * rstride, R, lane);
        }
        int64_t rows[R];
#pragma unroll
        for (int r = 0; r < R; r++) rows[r] = r0 + r < n_out ? r0 + r : n_out - 1;
        // EP_ADD: the rows' y loaded now (after the wait: the preceding kernels may write it), so
        // that its latency overlaps the dot product instead of following it
        float y_old[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            y_old[r] = EP == EP_ADD && lane == 0 && wk == 0 ? y[rows[r]] : 0.0f;
        // EP_CONV: likewise the rows' conv inputs, lane l value l % (2K-1) of row l / (2K-1)
        // when the R rows' fit in a warp's lanes (else the epilogue reads them itself)
        const int nv = 2 * ep.K - 1;
        const bool cv_pre = EP == EP_CONV && R * nv <= 32;
        float cv = 0.0f;
        if (cv_pre && wk == 0 && lane < R * nv && r0 + lane / nv < ep.n_conv)
            cv = gdn_conv_value(ep.conv_w, ep.conv_state, r0 + lane / nv, ep.K, lane % nv);
        float a[R], u[R];
        rows_dot<TT, R>(W0, rows, n_in, nblk, x, xqs, xds, lr, nl, a);
        if constexpr (TWO) rows_dot<TT, R>(W1, rows, n_in, nblk, x, xqs, xds, lr, nl, u);
#pragma unroll
        for (int r = 0; r < R; r++) {
            a[r] = warp_sum(a[r]);
            if constexpr (TWO) u[r] = warp_sum(u[r]);
        }
        if (wpr > 1) { // the group's warps: partial sums through shared memory, added in order
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    s_part[warp][r] = a[r];
                    if constexpr (TWO) s_part[warp][R + r] = u[r];
                }
            __syncthreads();
            if (wk == 0)
#pragma unroll
                for (int r = 0; r < R; r++)
                    for (int k = 1; k < wpr; k++) {
                        a[r] += s_part[warp + k][r];
                        if constexpr (TWO) u[r] += s_part[warp + k][R + r];
                    }
            __syncthreads();
        }
        if (cv_pre && wk == 0) {
            s_cv[warp][lane] = cv;
            __syncwarp();
        }
        if (lane == 0 && wk == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r0 + r >= n_out) break;
                ep_row<EP>(ep, y, r0 + r, a[r], TWO ? u[r] : 0.0f, y_old[r],
                           cv_pre ? &s_cv[warp][r * nv] : nullptr, &my_best);
            }
        }
    }
    if constexpr (EP == EP_ARGMAX) {
        __shared__ unsigned long long sbest[GEMV_WARPS];
        if (lane == 0) sbest[warp] = my_best;
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long m = sbest[0];
            for (int w = 1; w < GEMV_WARPS; w++) m = sbest[w] > m ? sbest[w] : m;
            atomicMax(ep.best, m);
        }
    }
}

// ---- host side: the warp kernel's shape (planning; gemv_warp.cu and gemv_pair.cu) ----

// The warp kernel's shape for a matrix when `full` CTAs fit: warps per row (split a row's blocks
// over 2 or 4 warps while the rows alone leave the GPU less than half full and each warp keeps
// a whole block step (32/TPB blocks) to do; forcing 1 was slower at large shapes), rows
// per CTA, and the CTAs that cover every row once.
template <typename TT, int R>
static void warp_shape(int64_t n_in, int64_t n_out, int64_t full, int *wpr_out,
                       int64_t *cta_rows, int64_t *need)
{
    int wpr = 1;
    if constexpr (!is_float_type<TT>::v) {
        const int64_t steps = (n_in / TT::QK + 32 / TT::TPB - 1) / (32 / TT::TPB);
        const int64_t row_warps = (n_out + R - 1) / R;
        while (wpr < GEMV_WARPS && row_warps * wpr * 2 <= full * GEMV_WARPS && steps >= wpr * 2)
            wpr *= 2;
    }
    *wpr_out = wpr;
    *cta_rows = (int64_t)(GEMV_WARPS / wpr) * R;
    *need = (n_out + *cta_rows - 1) / *cta_rows;
}

// L2 prefetch depth (the table's, 0..2), lowered until what one wave keeps in flight ahead
// fits GEMV_PREFETCH_CAP.
static inline int warp_pf(const gemv_matrix *w, int pf, uint64_t grid, int64_t cta_rows,
                          int arrays)
{
    pf = pf < 0 ? 0 : pf > 2 ? 2 : pf;
    const uint64_t row_bytes = gemv_packed_bytes(w->type, w->n_in, w->n_out) / (uint64_t)w->n_out;
    const uint64_t group = grid * (uint64_t)cta_rows * row_bytes * (uint64_t)arrays;
    while (pf > 0 && group * (uint64_t)(pf + 1) > GEMV_PREFETCH_CAP) pf--;
    return pf;
}

// the ggml type of a warp-kernel slice type (the tuning table's key)
template <typename TT> static constexpr uint32_t warp_ggml_type()
{
    if constexpr (std::is_same<TT, q4k_t>::value) return GGML_TYPE_Q4_K;
    else if constexpr (std::is_same<TT, q5k_t>::value) return GGML_TYPE_Q5_K;
    else if constexpr (std::is_same<TT, q6k_t>::value) return GGML_TYPE_Q6_K;
    else if constexpr (std::is_same<TT, q80_t>::value) return GGML_TYPE_Q8_0;
    else if constexpr (std::is_same<TT, f32_t>::value) return GGML_TYPE_F32;
    else if constexpr (std::is_same<TT, f16_t>::value) return GGML_TYPE_F16;
    else return GGML_TYPE_BF16;
}

#endif
