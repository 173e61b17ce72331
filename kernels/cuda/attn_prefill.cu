// Prefill attention (attn.h "Prefill runs"): the query rows of a prompt chunk in tiles, K and V
// read once per tile instead of once per row, on the tensor cores.
//
// Grid (n_kv, tiles, AP_SEGS): a CTA takes a tile of QT = 64 / G consecutive rows of a long run
// (tile blockIdx.y of all the long runs' tiles, in d_long's order) and the G query heads of KV
// head blockIdx.x that read it: 64 query vectors at most (v = row·G + head; the last rows of a
// tile, or vectors past QT·G, masked), and segment blockIdx.z of the positions up to the tile's
// last: AP_SEGS segments of equal length (a multiple of the super-chunk, attn.h, itself a multiple
// of KC), so a tile's prefix is read by up to AP_SEGS CTAs at once and each writes its own
// partial.
//
// Inside a CTA, 4 warps, each the 16 query vectors of its rows of the tile, on mma.sync
// m16n8k16 (F16 in, F32 accumulation) fed by ldmatrix, with the scores S = Q Kᵀ, the
// probabilities P and the output O (16 x d_h a warp) in registers: no shared-memory round trip
// of S, P or O and no barrier between the softmax and P·V. Per chunk of KC = 32 positions, one
// barrier-delimited load of K and V by cp.async (zeros past the segment: a masked probability 0
// times a NaN in a row not written yet would still be NaN); Q's two F16 halves and the chunk
// take ~101 KB of shared memory at d_h 256, so two CTAs share an SM and one's loads overlap the
// other's products. The softmax is online per vector in F32 (running max m, sum l); the max
// moves only when a chunk passes it by more than AP_LAZY (p stays <= e^AP_LAZY, far inside F16
// and F32), so O is rescaled in a few early chunks, not in every one. Q (scaled by 1/sqrt(d_h))
// and P are split into an F16 part and an F16 remainder, each multiplied, so their rounding
// stays near F32's (K and V are the F16 cache's own values). A segment's result goes out as the
// partial of its first super-chunk in attn_decode_rows' layout (o unnormalised, m, l; the
// segment's other super-chunks emptied), so attn_combine merges, divides and gates it as any
// row's.
//
// Measured against a tile of WMMA with S, P and O through shared memory (8 warps): 1.3-1.6x
// faster at an empty prefix, 3x at 31K positions, outputs within 1.2e-7.
#include <cuda_fp16.h>

#include "kernels/cuda/attn.h"
#include "kernels/cuda/attn_kv.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.cuh"

#define AP_QM 64 // query vectors of a tile
#define AP_KC 32 // positions of a chunk
#define AP_THREADS 128
#define AP_SEGS 16   // CTAs a tile's positions are split over
#define AP_LAZY 8.0f // how far a chunk's max may pass the reference max before it moves
static_assert(AP_KC == ATTN_CHUNK, "a super-chunk is whole chunks");
static_assert(ATTN_KV_BLOCK % AP_KC == 0, "a chunk lies in one KV block");

template <int D> struct ap_smem { // bytes; rows of D + 8 halves: 16 bytes apart mod 128, so the
                                  // 8 rows of an ldmatrix hit 8 different bank groups
    static constexpr int L = D + 8;
    static constexpr size_t QH = 0;
    static constexpr size_t QL = QH + (size_t)AP_QM * L * 2;
    static constexpr size_t K = QL + (size_t)AP_QM * L * 2;
    static constexpr size_t V = K + (size_t)AP_KC * L * 2;
    static constexpr size_t POS = V + (size_t)AP_KC * L * 2;
    static constexpr size_t BYTES = POS + AP_QM * 4;
};

static __device__ __forceinline__ void ldsm4(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
static __device__ __forceinline__ void ldsm4_t(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
// c += a·b: a 16x16 (row), b 16x8 (col), F16 in, F32 accumulation
static __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t h2u(__half2 h)
{
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}
// two probabilities as the F16 pair and the F16 pair of their remainders
static __device__ __forceinline__ void split2(float p0, float p1, uint32_t *hi, uint32_t *lo)
{
    const __half2 h = __floats2half2_rn(p0, p1);
    *hi = h2u(h);
    *lo = h2u(__floats2half2_rn(p0 - __low2float(h), p1 - __high2float(h)));
}

template <int D>
static __global__ void __launch_bounds__(AP_THREADS, 2)
    attn_prefill_kernel(const float *__restrict__ q, int64_t ld_q, const __half *__restrict__ kc,
                     const __half *__restrict__ vc, const int32_t *__restrict__ table,
                     int table_ld, const int32_t *__restrict__ slot,
                     const int32_t *__restrict__ pos, const int32_t *__restrict__ run, int R,
                     const int32_t *__restrict__ lng, int n_h, int n_kv, int n_split, int sp,
                     float *__restrict__ part)
{
    using SM = ap_smem<D>;
    constexpr int L = SM::L, NT = D / 8; // n-tiles of 8 over d_h
    extern __shared__ __align__(128) unsigned char smem[];
    __half *sQh = (__half *)(smem + SM::QH), *sQl = (__half *)(smem + SM::QL);
    __half *sK = (__half *)(smem + SM::K), *sV = (__half *)(smem + SM::V);
    int *sPos = (int *)(smem + SM::POS);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = blockIdx.x, G = n_h / n_kv, QT = AP_QM / G, QV = QT * G;
    const float scale = rsqrtf((float)D);
    ds_grid_dep();
    // this CTA's tile and segment
    int64_t row0 = 0, n_run = 0;
    const int64_t t0 = attn_tile_at(run, R, lng, blockIdx.y, QT, &row0, &n_run);
    if (t0 < 0 || n_run < 2) return;
    const int nt = (int)min((int64_t)QT, n_run - t0);
    const int p_max = pos[row0 + t0 + nt - 1];
    int seg_len, c_lo, c_hi;
    attn_segment(p_max, blockIdx.z, AP_SEGS, sp, &seg_len, &c_lo, &c_hi);
    if (c_lo > p_max) return;
    const int64_t sl = slot[row0];
    const __half *kh = kc + (int64_t)j * D, *vh = vc + (int64_t)j * D;
    for (int i = tid; i < AP_QM * D; i += AP_THREADS) {
        const int v = i / D, d = i % D, rr = v / G, g = v % G;
        float qv = 0.0f;
        if (v < QV && rr < nt) qv = q[(row0 + t0 + rr) * ld_q + (int64_t)(j * G + g) * D + d] * scale;
        const __half h = __float2half(qv);
        sQh[v * L + d] = h;
        sQl[v * L + d] = __float2half(qv - __half2float(h));
    }
    if (tid < AP_QM) sPos[tid] = tid < QV && tid / G < nt ? pos[row0 + t0 + tid / G] : -1;
    __syncthreads();
    // this thread's rows of the warp's 16: vA (mma rows g) and vB (g + 8); columns 2t, 2t + 1
    const int g = lane >> 2, t = lane & 3;
    const int vA = warp * 16 + g, vB = vA + 8, posA = sPos[vA], posB = sPos[vB];
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f; // l: this thread's columns
    // ldmatrix row addresses: A (Q) rows warp*16 + (lane%8) + 8*((lane/8)%2), column block
    // 8*(lane/16); B from K rows (lane%8) + 8*(lane/16), column block 8*((lane/8)%2); V
    // (transposed) rows (lane%8) + 8*((lane/8)%2), column block 8*(lane/16)
    const int qa_row = warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), qa_col = 8 * (lane >> 4);
    const int kb_row = (lane & 7) + 8 * (lane >> 4), kb_col = 8 * ((lane >> 3) & 1);
    const int vb_row = (lane & 7) + 8 * ((lane >> 3) & 1), vb_col = 8 * (lane >> 4);
    for (int c0 = c_lo; c0 <= c_hi; c0 += AP_KC) {
        { // K, V rows c0 .. c0 + 31 (zeros past the segment's last position)
            const int64_t b0 = c0 / ATTN_KV_BLOCK;
            const int64_t row_b = attn_kv_block(table, table_ld, sl, (int)b0) * ATTN_KV_BLOCK -
                                  b0 * ATTN_KV_BLOCK;
            constexpr int U = D / 8;
            for (int i = tid; i < AP_KC * U; i += AP_THREADS) {
                const int p = i / U, u = i % U;
                const bool ok = c0 + p <= c_hi;
                const int64_t off = ok ? (row_b + c0 + p) * n_kv * D + u * 8 : 0;
                cp_async16(sK + p * L + u * 8, kh + off, ok);
                cp_async16(sV + p * L + u * 8, vh + off, ok);
            }
            cp_async_commit();
            cp_async_wait_all();
        }
        __syncthreads();
        // S = Q Kᵀ: the warp's 16 rows x 32 positions, 4 n-tiles
        float s[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 4
        for (int k0 = 0; k0 < D; k0 += 16) {
            uint32_t ah[4], al[4], b[4];
            ldsm4(ah, sQh + qa_row * L + k0 + qa_col);
            ldsm4(al, sQl + qa_row * L + k0 + qa_col);
#pragma unroll
            for (int np = 0; np < 2; np++) {
                ldsm4(b, sK + (np * 16 + kb_row) * L + k0 + kb_col);
                mma16816(s[2 * np], ah, b[0], b[1]);
                mma16816(s[2 * np], al, b[0], b[1]);
                mma16816(s[2 * np + 1], ah, b[2], b[3]);
                mma16816(s[2 * np + 1], al, b[2], b[3]);
            }
        }
        // online softmax over the thread's 8 positions a row, the max across the row's 4 lanes
        float mxA = -INFINITY, mxB = -INFINITY;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int p = c0 + 8 * n + 2 * t + e;
                if (p > posA) s[n][e] = -INFINITY;
                if (p > posB) s[n][2 + e] = -INFINITY;
                mxA = fmaxf(mxA, s[n][e]);
                mxB = fmaxf(mxB, s[n][2 + e]);
            }
#pragma unroll
        for (int w = 1; w <= 2; w <<= 1) {
            mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, w));
            mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, w));
        }
        const float nA = mA == -INFINITY || mxA > mA + AP_LAZY ? mxA : mA;
        const float nB = mB == -INFINITY || mxB > mB + AP_LAZY ? mxB : mB;
        if (nA != mA && nA != -INFINITY) { // the reference max moved: rescale row A
            const float al = expf(mA - nA);
            lA *= al;
#pragma unroll
            for (int n = 0; n < NT; n++) o[n][0] *= al, o[n][1] *= al;
            mA = nA;
        }
        if (nB != mB && nB != -INFINITY) {
            const float al = expf(mB - nB);
            lB *= al;
#pragma unroll
            for (int n = 0; n < NT; n++) o[n][2] *= al, o[n][3] *= al;
            mB = nB;
        }
        // P, as A fragments of the two k-steps (positions 16ks .. 16ks + 15), F16 + remainder
        uint32_t ph[2][4], pl[2][4];
#pragma unroll
        for (int n = 0; n < 4; n++) {
            float pa[2], pb[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                pa[e] = s[n][e] == -INFINITY ? 0.0f : expf(s[n][e] - mA);
                pb[e] = s[n][2 + e] == -INFINITY ? 0.0f : expf(s[n][2 + e] - mB);
                lA += pa[e];
                lB += pb[e];
            }
            const int ks = n >> 1, hi = n & 1; // n-tile 2ks: a0 (row g), a1 (g+8); 2ks+1: a2, a3
            split2(pa[0], pa[1], &ph[ks][2 * hi], &pl[ks][2 * hi]);
            split2(pb[0], pb[1], &ph[ks][2 * hi + 1], &pl[ks][2 * hi + 1]);
        }
        // O += P V: 2 k-steps x D/8 n-tiles
#pragma unroll
        for (int ks = 0; ks < 2; ks++)
#pragma unroll
            for (int dp = 0; dp < NT / 2; dp++) {
                uint32_t b[4];
                ldsm4_t(b, sV + (ks * 16 + vb_row) * L + dp * 16 + vb_col);
                mma16816(o[2 * dp], ph[ks], b[0], b[1]);
                mma16816(o[2 * dp], pl[ks], b[0], b[1]);
                mma16816(o[2 * dp + 1], ph[ks], b[2], b[3]);
                mma16816(o[2 * dp + 1], pl[ks], b[2], b[3]);
            }
        __syncthreads(); // every warp is done with K and V
    }
#pragma unroll
    for (int w = 1; w <= 2; w <<= 1) {
        lA += __shfl_xor_sync(0xffffffffu, lA, w);
        lB += __shfl_xor_sync(0xffffffffu, lB, w);
    }
    // out: each vector whose position reaches the segment, its (o, m, l) as the partial of the
    // segment's first super-chunk, the segment's other super-chunks below its position emptied
    // (l = 0), as attn_split leaves them
    const int64_t prow = partial_row_floats(n_h, n_split, D);
    const int s_lo = c_lo / sp, s_hi = s_lo + seg_len / sp;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int v = half ? vB : vA, pv = half ? posB : posA;
        if (v >= QV || v / G >= nt || pv < c_lo) continue;
        const int rr = v / G, gq = v % G;
        float *base = part + (row0 + t0 + rr) * prow;
        const int64_t hs = (int64_t)(j * G + gq) * n_split;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            float *op = base + (hs + s_lo) * D + 8 * n + 2 * t;
            op[0] = o[n][2 * half];
            op[1] = o[n][2 * half + 1];
        }
        float *pm = base + (int64_t)n_h * n_split * D, *pl = pm + (int64_t)n_h * n_split;
        const int ns = min(n_split, (pv + 1 + sp - 1) / sp);
        for (int sidx = s_lo + t; sidx < min(ns, s_hi); sidx += 4) {
            pm[hs + sidx] = sidx == s_lo ? (half ? mB : mA) : -INFINITY;
            pl[hs + sidx] = sidx == s_lo ? (half ? lB : lA) : 0.0f;
        }
    }
}

extern "C" size_t attn_prefill_smem_bytes(int d_h)
{
    switch (d_h) {
    case 32: return ap_smem<32>::BYTES;
    case 64: return ap_smem<64>::BYTES;
    case 128: return ap_smem<128>::BYTES;
    case 256: return ap_smem<256>::BYTES;
    default: return 0;
    }
}

extern "C" int attn_prefill_init(status *st)
{
#define AP_INIT(D)                                                                              \
    CUDA_TRY(st, cudaFuncSetAttribute(attn_prefill_kernel<D>,                                   \
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,              \
                                      (int)ap_smem<D>::BYTES))
    AP_INIT(32);
    AP_INIT(64);
    AP_INIT(128);
    AP_INIT(256);
#undef AP_INIT
    return STATUS_OK;
}

// The long runs' tiles: sum of ceil(n / QT) <= B / QT + (the number of long runs) + 1.
extern "C" cuda_launch_dims attn_prefill_runs_dims(int n_h, int n_kv, int B, int long_rows)
{
    const int QT = AP_QM / (n_h / n_kv), lr = long_rows > 2 ? long_rows : 2;
    return (cuda_launch_dims){(unsigned)n_kv, (unsigned)((B + QT - 1) / QT + B / lr),
                              AP_SEGS, AP_THREADS};
}

extern "C" void attn_prefill_runs(const float *d_q, int64_t ld_q, const void *d_k_cache,
                                  const void *d_v_cache, const int32_t *d_slot,
                                  const int32_t *d_table, int table_ld, const int32_t *d_pos,
                                  const int32_t *d_run, const int32_t *d_long, int n_h, int n_kv,
                                  int d_h, int n_ctx, float *d_partial, int B, int R,
                                  int long_rows, const cuda_launch *l)
{
    DS_ASSERT(n_kv > 0 && n_h % n_kv == 0 && n_h / n_kv <= ATTN_MAX_GROUP);
    DS_ASSERT(B >= 1 && B <= 65535 && R >= 1 && R <= 65535 && n_ctx >= 1);
    DS_ASSERT((uintptr_t)d_k_cache % 16 == 0 && (uintptr_t)d_v_cache % 16 == 0);
    DS_ASSERT(d_table || table_ld * ATTN_KV_BLOCK >= n_ctx);
    DS_ASSERT(long_rows >= 2);
    const cuda_launch_dims d = attn_prefill_runs_dims(n_h, n_kv, B, long_rows);
    const int n_split = attn_n_split(n_ctx), sp = attn_split_positions(n_ctx);
    const size_t smem = attn_prefill_smem_bytes(d_h);
#define AP_LAUNCH(D)                                                                            \
    ds_launch(attn_prefill_kernel<D>, ds_grid(d), d.block, smem, l, d_q, ld_q,                   \
              (const __half *)d_k_cache, (const __half *)d_v_cache, d_table, table_ld, d_slot,  \
              d_pos, d_run, R, d_long, n_h, n_kv, n_split, sp, d_partial)
    switch (d_h) {
    case 32: AP_LAUNCH(32); break;
    case 64: AP_LAUNCH(64); break;
    case 128: AP_LAUNCH(128); break;
    case 256: AP_LAUNCH(256); break;
    default: DS_ASSERT(!"attn_prefill_runs: d_h must be 32, 64, 128 or 256");
    }
#undef AP_LAUNCH
}
