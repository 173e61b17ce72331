// Prefill attention (attn.h "Prefill runs"): the query rows of a prompt chunk in tiles, K and V
// read once per tile instead of once per row, on the tensor cores.
//
// Grid (n_kv, tiles, AP_SEGS): a CTA takes a tile of QT = 64 / G consecutive rows of a long run
// (tile blockIdx.y of all the long runs' tiles, in d_long's order) and the G query heads of KV
// head blockIdx.x that read it: 64 query vectors at most (v = row·G + head; the last rows of a
// tile, or vectors past QT·G, masked), and segment blockIdx.z of the positions up to the tile's
// last: AP_SEGS segments of equal length (a multiple of KC), so a tile's prefix is read by up to
// AP_SEGS CTAs at once and each writes its own partial. Over chunks of KC positions of the
// segment: S = Q Kᵀ (WMMA 16x16x16, F16 inputs, F32
// accumulation), the causal mask and an online softmax per vector in F32 (running max m, sum l),
// O = α O + P V (O in shared memory, F32). Q (scaled by 1/sqrt(d_h)) and P are split into an F16
// part and an F16 remainder, each multiplied, so their rounding stays near F32's (K and V are the
// F16 cache's own values). The next chunk's K and V load into registers while a chunk is
// multiplied; the running max moves only when a chunk passes it by more than AP_LAZY, so O is
// rescaled in a few early chunks, not in every one. A segment's result goes out as the partial
// of its first chunk in attn_decode_rows' layout (o unnormalised, m, l; the segment's other
// chunks emptied), so attn_combine merges, divides and gates it as any row's.
#include <cuda_fp16.h>
#include <mma.h>

#include "kernels/cuda/attn.h"
#include "kernels/cuda/attn_kv.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/q8.cuh"

using namespace nvcuda;

#define AP_QM 64      // query vectors of a tile (WMMA rows)
#define AP_KC 32      // positions of a chunk
#define AP_THREADS 256
#define AP_SEGS 16    // CTAs a tile's positions are split over
#define AP_LAZY 8.0f  // how far a chunk's max may pass the reference max before it moves
static_assert(ATTN_KV_BLOCK % AP_KC == 0, "a chunk lies in one KV block");
static_assert(AP_KC == ATTN_CHUNK, "a segment starts at a partial's chunk");

template <int D> struct ap_smem { // offsets in bytes
    static constexpr int LQ = D + 8, LKV = D + 8, LS = AP_KC + 4, LP = AP_KC + 8, LO = D + 4;
    static constexpr size_t QH = 0;
    static constexpr size_t QL = QH + (size_t)AP_QM * LQ * 2;
    static constexpr size_t K = QL + (size_t)AP_QM * LQ * 2;
    static constexpr size_t V = K + (size_t)AP_KC * LKV * 2;
    static constexpr size_t S = V + (size_t)AP_KC * LKV * 2;
    static constexpr size_t PH = S + (size_t)AP_QM * LS * 4;
    static constexpr size_t PL = PH + (size_t)AP_QM * LP * 2;
    static constexpr size_t O = PL + (size_t)AP_QM * LP * 2;
    static constexpr size_t M = O + (size_t)AP_QM * LO * 4; // m, l, α: [64] floats each
    static constexpr size_t POS = M + 3 * AP_QM * 4;        // [64] int: the vector's position
    static constexpr size_t FLAG = POS + AP_QM * 4;         // int: some α of the chunk != 1
    static constexpr size_t BYTES = FLAG + 16;
};

template <int D>
static __global__ void __launch_bounds__(AP_THREADS)
    attn_prefill_kernel(const float *__restrict__ q, int64_t ld_q, const __half *__restrict__ kc,
                        const __half *__restrict__ vc, const int32_t *__restrict__ table,
                        int table_ld, const int32_t *__restrict__ slot,
                        const int32_t *__restrict__ pos,
                        const int32_t *__restrict__ run, int R, const int32_t *__restrict__ lng,
                        int n_h, int n_kv, int n_split, float *__restrict__ part)
{
    using SM = ap_smem<D>;
    constexpr int LQ = SM::LQ, LKV = SM::LKV, LS = SM::LS, LP = SM::LP, LO = SM::LO;
    extern __shared__ __align__(128) unsigned char smem[];
    __half *sQh = (__half *)(smem + SM::QH), *sQl = (__half *)(smem + SM::QL);
    __half *sK = (__half *)(smem + SM::K), *sV = (__half *)(smem + SM::V);
    float *sS = (float *)(smem + SM::S), *sO = (float *)(smem + SM::O);
    __half *sPh = (__half *)(smem + SM::PH), *sPl = (__half *)(smem + SM::PL);
    float *sM = (float *)(smem + SM::M), *sL = sM + AP_QM, *sAl = sL + AP_QM;
    int *sPos = (int *)(smem + SM::POS), *sFlag = (int *)(smem + SM::FLAG);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = blockIdx.x, G = n_h / n_kv, QT = AP_QM / G, QV = QT * G;
    const float scale = rsqrtf((float)D);
    ds_grid_dep();
    // this CTA's tile and segment
    int64_t row0 = 0, n_run = 0;
    const int64_t t0 = attn_tile_at(run, R, lng, blockIdx.y, QT, &row0, &n_run);
    if (t0 < 0 || n_run < 2) return; // past the tiles
    const int nt = (int)min((int64_t)QT, n_run - t0); // rows of this tile
    const int p_max = pos[row0 + t0 + nt - 1];       // positions rise along a run
    int seg_len, c_lo, c_hi;
    attn_segment(p_max, blockIdx.z, AP_SEGS, AP_KC, &seg_len, &c_lo, &c_hi);
    if (c_lo > p_max) return; // no positions: no row's partials reach this segment
    const int64_t sl = slot[row0];
    const __half *kh = kc + (int64_t)j * D, *vh = vc + (int64_t)j * D;
    // the tile's query vectors, hi and lo halves of q / sqrt(d_h); state m, l, O
    for (int i = tid; i < AP_QM * D; i += AP_THREADS) {
        const int v = i / D, d = i % D, rr = v / G, g = v % G;
        float qv = 0.0f;
        if (v < QV && rr < nt)
            qv = q[(row0 + t0 + rr) * ld_q + (int64_t)(j * G + g) * D + d] * scale;
        const __half h = __float2half(qv);
        sQh[v * LQ + d] = h;
        sQl[v * LQ + d] = __float2half(qv - __half2float(h));
        sO[v * LO + d] = 0.0f;
    }
    if (tid < AP_QM) {
        const int v = tid, rr = v / G;
        sPos[v] = v < QV && rr < nt ? pos[row0 + t0 + rr] : -1;
        sM[v] = -INFINITY;
        sL[v] = 0.0f;
    }
    __syncthreads();
    // K, V rows c0 .. c0 + KC of KV head j, 16 bytes a load, into registers a chunk ahead;
    // zeros past the segment (rows not written yet: a masked probability 0 times a NaN
    // there would still be NaN)
    constexpr int U = D / 8, NL = (AP_KC * U + AP_THREADS - 1) / AP_THREADS; // a thread's
    uint4 rk[NL], rv[NL];
    auto load_kv = [&](int c0) {
        const int64_t b0 = c0 / ATTN_KV_BLOCK; // the chunk lies in one block
        const int64_t row_b = attn_kv_block(table, table_ld, sl, (int)b0) * ATTN_KV_BLOCK -
                              b0 * ATTN_KV_BLOCK; // + position = the row in the pool
#pragma unroll
        for (int e = 0; e < NL; e++) {
            const int i = tid + e * AP_THREADS, p = i / U, u = i % U;
            rk[e] = rv[e] = make_uint4(0, 0, 0, 0);
            if (i < AP_KC * U && c0 + p <= c_hi) {
                rk[e] = ((const uint4 *)(kh + (row_b + c0 + p) * n_kv * D))[u];
                rv[e] = ((const uint4 *)(vh + (row_b + c0 + p) * n_kv * D))[u];
            }
        }
    };
    load_kv(c_lo);
    for (int c0 = c_lo; c0 <= c_hi; c0 += AP_KC) {
#pragma unroll
        for (int e = 0; e < NL; e++) {
            const int i = tid + e * AP_THREADS, p = i / U, u = i % U;
            if (i >= AP_KC * U) break;
            *(uint4 *)(sK + p * LKV + u * 8) = rk[e];
            *(uint4 *)(sV + p * LKV + u * 8) = rv[e];
        }
        if (tid == 0) *sFlag = 0;
        __syncthreads();
        if (c0 + AP_KC <= c_hi) load_kv(c0 + AP_KC); // in flight through this chunk's math
        { // S = Q Kᵀ: 4 x 2 tiles of 16 x 16, one a warp
            const int mi = warp >> 1, ni = warp & 1;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
#pragma unroll 4
            for (int k = 0; k < D; k += 16) {
                wmma::load_matrix_sync(b, sK + ni * 16 * LKV + k, LKV);
                wmma::load_matrix_sync(a, sQh + mi * 16 * LQ + k, LQ);
                wmma::mma_sync(acc, a, b, acc);
                wmma::load_matrix_sync(a, sQl + mi * 16 * LQ + k, LQ);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(sS + mi * 16 * LS + ni * 16, acc, LS, wmma::mem_row_major);
        }
        __syncthreads();
        // online softmax: warp w the vectors 8w .. 8w + 7, lane the chunk's position c0 +
        // lane. The reference max m moves only when the chunk's max passes it by more than
        // AP_LAZY (p stays <= e^AP_LAZY, far inside F16 and F32): O is rescaled in the
        // chunks where some vector's m moved, the few early ones
        for (int v = warp * 8; v < warp * 8 + 8; v++) {
            const bool valid = c0 + lane <= sPos[v];
            const float s = valid ? sS[v * LS + lane] : -INFINITY;
            const float m_old = sM[v], m_max = ds_warp_max(s);
            const float m_new = m_old == -INFINITY || m_max > m_old + AP_LAZY ? m_max : m_old;
            float p = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) {
                alpha = expf(m_old - m_new);
                p = valid ? expf(s - m_new) : 0.0f;
            }
            const float lsum = ds_warp_sum(p);
            const __half ph = __float2half(p);
            sPh[v * LP + lane] = ph;
            sPl[v * LP + lane] = __float2half(p - __half2float(ph));
            if (lane == 0) {
                sL[v] = sL[v] * alpha + lsum;
                sM[v] = m_new;
                sAl[v] = alpha;
                if (alpha != 1.0f) *sFlag = 1;
            }
        }
        __syncthreads();
        if (*sFlag) { // uniform: read after the barrier, reset before the next one
            for (int i = tid; i < AP_QM * D; i += AP_THREADS)
                sO[(i / D) * LO + i % D] *= sAl[i / D];
            __syncthreads();
        }
        // O += P V: 4 x D/16 tiles, warp w the tiles w, w + 8, ...
        for (int t = warp; t < 4 * (D / 16); t += AP_THREADS / 32) {
            const int mi = t / (D / 16), ni = t % (D / 16);
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, sO + mi * 16 * LO + ni * 16, LO, wmma::mem_row_major);
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
#pragma unroll
            for (int k = 0; k < AP_KC; k += 16) {
                wmma::load_matrix_sync(b, sV + k * LKV + ni * 16, LKV);
                wmma::load_matrix_sync(a, sPh + mi * 16 * LP + k, LP);
                wmma::mma_sync(acc, a, b, acc);
                wmma::load_matrix_sync(a, sPl + mi * 16 * LP + k, LP);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(sO + mi * 16 * LO + ni * 16, acc, LO, wmma::mem_row_major);
        }
        __syncthreads();
    }
    // out: each vector whose position reaches the segment, its (o, m, l) as the partial of
    // the segment's first chunk, the segment's other chunks below its position emptied
    // (l = 0), as attn_split leaves them
    const int64_t prow = partial_row_floats(n_h, n_split, D);
    const int s_lo = c_lo / ATTN_CHUNK, s_hi = s_lo + seg_len / ATTN_CHUNK;
    for (int i = tid; i < QV * D; i += AP_THREADS) {
        const int v = i / D, d = i % D, rr = v / G, g = v % G;
        if (rr >= nt || sPos[v] < c_lo) continue;
        float *base = part + (row0 + t0 + rr) * prow;
        const int64_t hs = (int64_t)(j * G + g) * n_split + s_lo;
        base[hs * D + d] = sO[v * LO + d];
    }
    for (int v = warp; v < QV; v += AP_THREADS / 32) {
        const int rr = v / G, g = v % G;
        if (rr >= nt || sPos[v] < c_lo) continue;
        float *pm = part + (row0 + t0 + rr) * prow + (int64_t)n_h * n_split * D;
        float *pl = pm + (int64_t)n_h * n_split;
        const int64_t hs = (int64_t)(j * G + g) * n_split;
        const int ns = min(n_split, (sPos[v] + 1 + ATTN_CHUNK - 1) / ATTN_CHUNK);
        for (int s = s_lo + lane; s < min(ns, s_hi); s += 32) {
            pm[hs + s] = s == s_lo ? sM[v] : -INFINITY;
            pl[hs + s] = s == s_lo ? sL[v] : 0.0f;
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
    const int n_split = (n_ctx + ATTN_CHUNK - 1) / ATTN_CHUNK;
    const size_t smem = attn_prefill_smem_bytes(d_h);
#define AP_LAUNCH(D)                                                                            \
    ds_launch(attn_prefill_kernel<D>, ds_grid(d), d.block, smem, l, d_q, ld_q,                   \
              (const __half *)d_k_cache, (const __half *)d_v_cache, d_table, table_ld, d_slot,  \
              d_pos, d_run, R, d_long, n_h, n_kv, n_split, d_partial)
    switch (d_h) {
    case 32: AP_LAUNCH(32); break;
    case 64: AP_LAUNCH(64); break;
    case 128: AP_LAUNCH(128); break;
    case 256: AP_LAUNCH(256); break;
    default: DS_ASSERT(!"attn_prefill_runs: d_h must be 32, 64, 128 or 256");
    }
#undef AP_LAUNCH
}
