// The chunked gated delta rule of prefill runs (gdn.h "Chunked runs"): the WY / UT form of
// ref_gdn_chunked (kernels/cpu/gdn.c, docs/QWEN35.md §3) over chunks of GDN_CHUNK tokens, in two
// launches, the products on the tensor cores.
//
// 1. Per chunk (every long run's chunks, in d_long's order) and value head, all at once: what
//    does not depend on the state. q, k L2-normed (q also by 1/sqrt(d_k)), the gates β and the
//    cumulative log decays γ, M = β_i k_i·k_j e^{γi−γj} (strictly lower), A = q_i·k_j e^{γi−γj}
//    (lower with the diagonal), T = (I + M)⁻¹ (by 16 x 16 blocks: the diagonal ones by forward
//    substitution, then T_IJ = −T_II Σ_K M_IK T_KJ), U = T βV and W = T diag(β e^γ) K; out to
//    the scratch with Qg_i = e^{γi} q_i, Ke_i = e^{γlast−γi} k_i and e^{γlast}. A CTA a (chunk,
//    head); nothing of it is computed twice.
// 2. Per run, value head and 32 state columns: the chunks in order, the columns S_c in shared
//    memory from the run's first chunk to its last: Ũ = U − W·S_c, O = Qg·S_c + A·Ũ (the rows'
//    outputs), S_c ← e^{γlast} S_c + Keᵀ·Ũ. Only this part is sequential, and it is three small
//    products a chunk; the next chunk's Qg and W load (cp.async) while the last two run. A bf16
//    state (gdn.h "State storage") is converted on the way in and out, and S_c rounded to bf16
//    after every chunk, as if stored between chunks.
// The products (M, A, U, W; every product of launch 2) on mma.sync m16n8k8 TF32 with F32
// accumulation, each F32 operand split into a TF32 part and a TF32 remainder and the three
// products that matter summed (hi·hi + hi·lo + lo·hi: near F32's rounding, the dropped lo·lo
// term is 2⁻²² of the product); the rest (norms, gates, the decays, the 16 x 16 blocks of T) in
// F32 on the CUDA cores. Rows past a chunk's last are zeros throughout.
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/gdn_state.cuh"
#include "kernels/cuda/q8.cuh"

#define GDN_CHUNK 64
#define GDN_CHUNK_COLS 32    // value columns of a launch-2 CTA
#define GDN_CHUNK_THREADS 256
#define GDN_CHUNK_RUN_CTAS 8 // runs in flight per head and column group (launch 2)
#define GDN_CHUNK_MAX_DV 128
#define GDN_NW (GDN_CHUNK_THREADS / 32)

// one (chunk, head)'s scratch, floats: Qg, W, Ke [64][d_k] each, U [64][d_v], A [64][64],
// e^{γlast} (padded to 64)
static __host__ __device__ inline int64_t item_floats(int d_k, int d_v)
{
    return (int64_t)GDN_CHUNK * (3 * d_k + d_v + GDN_CHUNK) + 64;
}

// chunk y of the long runs' chunks (run by run in d_long's order): its first row and rows;
// false past the last
static __device__ bool chunk_at(const int32_t *run, int R, const int32_t *lng, int y,
                                int64_t *row, int *n)
{
    const int n_long = lng[0];
    for (int x = 0; x < n_long; x++) {
        const int r = lng[1 + x], len = run[R + r], nc = (len + GDN_CHUNK - 1) / GDN_CHUNK;
        if (y < nc) {
            *row = run[r] + (int64_t)y * GDN_CHUNK;
            *n = min(GDN_CHUNK, len - y * GDN_CHUNK);
            return true;
        }
        y -= nc;
    }
    return false;
}

// ---- TF32 products of a warp ----
static __device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
static __device__ __forceinline__ void split_tf32(float x, uint32_t *hi, uint32_t *lo)
{
    *hi = to_tf32(x);
    *lo = to_tf32(x - __uint_as_float(*hi));
}
static __device__ __forceinline__ void mma_tf32(float c[4], const uint32_t a[4],
                                                const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// c[i] += A_i·B over k in [0, K) (a multiple of 8) for NT 16 x 8 tiles of one B: A(i, r, k),
// r < 16, and B(k, n), n < 8, read through the accessors (shared memory); tile i only where bit
// i of `on` is set (warp-uniform). c[i][q] is the tile's element (g + 8 (q / 2), 2 t + q % 2), g
// = lane / 4, t = lane % 4. The hi·hi products and the two remainder products accumulate in
// separate registers, and the tiles interleave: 2·NT independent chains of mma, not one.
template <int NT, class FA, class FB>
static __device__ __forceinline__ void warp_mma3(float (&c)[NT][4], int K, unsigned on, FA A,
                                                 FB B)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float d[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;
#pragma unroll 2
    for (int k0 = 0; k0 < K; k0 += 8) {
        uint32_t bh[2], bl[2];
        split_tf32(B(k0 + t, g), &bh[0], &bl[0]);
        split_tf32(B(k0 + t + 4, g), &bh[1], &bl[1]);
#pragma unroll
        for (int i = 0; i < NT; i++) {
            if (!(on >> i & 1u)) continue;
            uint32_t ah[4], al[4];
            split_tf32(A(i, g, k0 + t), &ah[0], &al[0]);
            split_tf32(A(i, g + 8, k0 + t), &ah[1], &al[1]);
            split_tf32(A(i, g, k0 + t + 4), &ah[2], &al[2]);
            split_tf32(A(i, g + 8, k0 + t + 4), &ah[3], &al[3]);
            mma_tf32(c[i], ah, bh);
            mma_tf32(d[i], al, bh);
            mma_tf32(d[i], ah, bl);
        }
    }
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int q = 0; q < 4; q++) c[i][q] += d[i][q];
}
// k extent of a product over a chunk's first n rows (rows past n are zeros)
static __device__ __forceinline__ int k_rows(int n)
{
    return (n + 7) & ~7;
}

// ---- launch 1: a (chunk, head) ----
template <int DK> struct prep_smem { // floats; row strides of 4 mod 32 (A operands: the rows g
                                     // and columns t of a fragment in 32 banks) or 8 mod 32
                                     // (B operands read as [k][n])
    static constexpr int LK = DK + 4, LV = GDN_CHUNK_MAX_DV + 8, LL = GDN_CHUNK + 4;
    static constexpr int Q = 0;                       // [64][LK] q, normed and scaled
    static constexpr int K = Q + GDN_CHUNK * LK;      // [64][LK] k, normed
    static constexpr int V = K + GDN_CHUNK * LK;      // [64][LV] βv
    static constexpr int M = V + GDN_CHUNK * LV;      // [64][LL] M, then T diag(β e^γ)
    static constexpr int A = M + GDN_CHUNK * LL;      // [64][LL]
    static constexpr int T = A + GDN_CHUNK * LL;      // [64][LL] (I + M)⁻¹
    static constexpr int Y = T + GDN_CHUNK * LL;      // [3][16][16] Σ_K M_IK T_KJ
    static constexpr int G = Y + 3 * 256;             // [64] γ
    static constexpr int B = G + GDN_CHUNK;           // [64] β
    static constexpr int RAW = B + GDN_CHUNK;         // [64] the rows' g before the sum
    static constexpr int FLOATS = RAW + GDN_CHUNK;
    static constexpr size_t BYTES = (size_t)FLOATS * 4;
};

template <int EPL> // d_k = 32 * EPL
static __global__ void __launch_bounds__(GDN_CHUNK_THREADS)
    gdn_chunk_prep_kernel(const float *__restrict__ conv, int64_t ld_conv,
                          const float *__restrict__ bb, const float *__restrict__ aa,
                          int64_t ld_ba, const float *__restrict__ dt_bias,
                          const float *__restrict__ ssm_a, int n_k, int d_v, float eps,
                          const int32_t *__restrict__ run, int R, const int32_t *__restrict__ lng,
                          float *__restrict__ scratch)
{
    constexpr int DK = 32 * EPL, L = GDN_CHUNK;
    using SM = prep_smem<DK>;
    constexpr int LK = SM::LK, LV = SM::LV, LL = SM::LL;
    extern __shared__ float sm[];
    float *sQ = sm + SM::Q, *sK = sm + SM::K, *sV = sm + SM::V, *sM = sm + SM::M;
    float *sA = sm + SM::A, *sT = sm + SM::T, *sY = sm + SM::Y, *sG = sm + SM::G;
    float *sB = sm + SM::B, *sRaw = sm + SM::RAW;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int hv = blockIdx.x, n_v = gridDim.x, kh = hv % n_k, D_k = n_k * DK;
    ds_grid_dep();
    int64_t row0;
    int n;
    if (!chunk_at(run, R, lng, blockIdx.y, &row0, &n)) return; // past the chunks
    const float dt_hv = dt_bias[hv], A_hv = ssm_a[hv];
    // 0. rows: q, k L2-normed as gdn_decode (q also by 1/sqrt(d_k)), gates, βv; zeros past n
    for (int i = warp; i < L; i += GDN_NW) {
        if (i >= n) {
            for (int a = lane; a < DK; a += 32) sQ[i * LK + a] = sK[i * LK + a] = 0.0f;
            for (int j = lane; j < d_v; j += 32) sV[i * LV + j] = 0.0f;
            if (lane == 0) sRaw[i] = sB[i] = 0.0f;
            continue;
        }
        const float *cr = conv + (row0 + i) * ld_conv;
        float q[EPL], k[EPL], ssq = 0.0f, ssk = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            q[e] = cr[kh * DK + lane * EPL + e];
            k[e] = cr[D_k + kh * DK + lane * EPL + e];
            ssq += q[e] * q[e];
            ssk += k[e] * k[e];
        }
        ssq = ds_warp_sum(ssq);
        ssk = ds_warp_sum(ssk);
        const float rq = 1.0f / sqrtf(ssq + eps) / sqrtf((float)DK), rk = 1.0f / sqrtf(ssk + eps);
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            sQ[i * LK + lane * EPL + e] = q[e] * rq;
            sK[i * LK + lane * EPL + e] = k[e] * rk;
        }
        const int64_t rowi = row0 + i;
        const float beta = 1.0f / (1.0f + expf(-bb[rowi * ld_ba + hv]));
        if (lane == 0) {
            const float x = aa[rowi * ld_ba + hv] + dt_hv;
            sRaw[i] = A_hv * (x > 20.0f ? x : log1pf(expf(x)));
            sB[i] = beta;
        }
        for (int j = lane; j < d_v; j += 32)
            sV[i * LV + j] = beta * cr[2 * D_k + (int64_t)hv * d_v + j];
    }
    __syncthreads();
    if (tid == 0) { // γ_i = Σ_{j<=i} g_j, in order (as the twin); constant past n
        float acc = 0.0f;
        for (int i = 0; i < L; i++) sG[i] = acc += sRaw[i];
    }
    __syncthreads();
    // 1. M (strictly lower) and A (lower with the diagonal): K Kᵀ and Q Kᵀ by 16 x 8 tiles, a
    //    warp the column block nt = warp of both (8 tiles, one B), then β, the decays and the
    //    masks on the tile's elements (tiles of rows past n, or above the diagonal, stay zeros)
    {
        const int nt = warp;
        float c[8][4] = {};
        unsigned on = 0;
        for (int i = 0; i < 8; i++)
            on |= (unsigned)((i & 3) * 16 < n && nt * 8 <= (i & 3) * 16 + 15 && nt * 8 < n) << i;
        warp_mma3<8>(
            c, DK, on,
            [&](int i, int r, int k) { return (i < 4 ? sK : sQ)[((i & 3) * 16 + r) * LK + k]; },
            [&](int k, int nn) { return sK[(nt * 8 + nn) * LK + k]; });
#pragma unroll
        for (int ti = 0; ti < 8; ti++) {
            const bool isA = ti >= 4;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int i = (ti & 3) * 16 + g + 8 * (q >> 1), j = nt * 8 + 2 * t + (q & 1);
                const bool in = i < n && j < n;
                const float d = in && j <= i ? expf(sG[i] - sG[j]) : 0.0f;
                if (isA) sA[i * LL + j] = in && j <= i ? c[ti][q] * d : 0.0f;
                else sM[i * LL + j] = in && j < i ? sB[i] * c[ti][q] * d : 0.0f;
            }
        }
    }
    __syncthreads();
    // 2. T = (I + M)⁻¹, unit lower triangular, by 16 x 16 blocks. The diagonal blocks: a thread a
    //    column, forward substitution down its rows; the blocks above them zeros
    if (tid < 64) {
        const int b0 = 16 * (tid >> 4), c = tid & 15;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++) { // unrolled: x stays in registers
            float acc = r == c ? 1.0f : 0.0f;
#pragma unroll
            for (int k = 0; k < 15; k++)
                if (k < r && k >= c) acc -= sM[(b0 + r) * LL + b0 + k] * x[k];
            x[r] = acc;
        }
#pragma unroll
        for (int r = 0; r < 16; r++) sT[(b0 + r) * LL + b0 + c] = x[r];
    } else {
        for (int e = tid - 64; e < 6 * 256; e += GDN_CHUNK_THREADS - 64) {
            const int blk = e >> 8, r = (e >> 4) & 15, c = e & 15;
            // upper blocks (I, J), J > I: (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
            const int I = blk < 3 ? 0 : blk < 5 ? 1 : 2, J = blk < 3 ? blk + 1 : blk < 5 ? blk - 1 : 3;
            sT[(16 * I + r) * LL + 16 * J + c] = 0.0f;
        }
    }
    __syncthreads();
    //    then the blocks below, by their distance d from the diagonal: T_IJ = −T_II Y_IJ, Y_IJ =
    //    Σ_{K=J}^{I−1} M_IK T_KJ, a thread an element of each block of that distance
    for (int d = 1; d < 4; d++) {
        const int r = tid >> 4, c = tid & 15;
        for (int J = 0; J + d < 4; J++) {
            const int I = J + d;
            float acc = 0.0f;
            for (int k = 16 * J; k < 16 * I; k++)
                acc += sM[(16 * I + r) * LL + k] * sT[k * LL + 16 * J + c];
            sY[J * 256 + r * 16 + c] = acc;
        }
        __syncthreads();
        for (int J = 0; J + d < 4; J++) {
            const int I = J + d;
            float acc = 0.0f;
            for (int k = 0; k < 16; k++)
                acc += sT[(16 * I + r) * LL + 16 * I + k] * sY[J * 256 + k * 16 + c];
            sT[(16 * I + r) * LL + 16 * J + c] = -acc;
        }
        __syncthreads();
    }
    //    and T diag(β e^γ) into M's place (M is done)
    for (int e = tid; e < L * L; e += GDN_CHUNK_THREADS) {
        const int i = e >> 6, j = e & 63;
        sM[i * LL + j] = sT[i * LL + j] * (sB[j] * expf(sG[j]));
    }
    __syncthreads();
    // 3. W = T diag(β e^γ) K and U = T βV by 16 x 8 tiles (T lower: k up to the tile's last
    //    row), straight out to the scratch
    float *it = scratch + ((int64_t)blockIdx.y * n_v + hv) * item_floats(DK, d_v);
    float *oQ = it, *oW = oQ + L * DK, *oK = oW + L * DK, *oU = oK + L * DK, *oA = oU + L * d_v;
    //    a warp the column blocks warp, warp + 8, ... of W then U, the 4 row blocks of each
    unsigned on = 0;
    for (int i = 0; i < 4; i++) on |= (unsigned)(i * 16 < n) << i;
    for (int x = warp; x < DK / 8 + d_v / 8; x += GDN_NW) {
        const bool isW = x < DK / 8;
        const int nt = isW ? x : x - DK / 8, ld = isW ? DK : d_v;
        const float *Ta = isW ? sM : sT, *Xb = isW ? sK + nt * 8 : sV + nt * 8;
        const int lb = isW ? LK : LV;
        float c[4][4] = {};
        warp_mma3<4>(
            c, k_rows(n), on, [&](int i, int r, int k) { return Ta[(i * 16 + r) * LL + k]; },
            [&](int k, int nn) { return Xb[k * lb + nn]; });
        float *out = isW ? oW : oU;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                out[(i * 16 + g + 8 * (q >> 1)) * ld + nt * 8 + 2 * t + (q & 1)] = c[i][q];
    }
    // 4. out: Qg_i = e^{γi} q_i, Ke_i = e^{γlast−γi} k_i, A, e^{γlast} (zeros past n)
    const float g_last = sG[n - 1];
    for (int e = tid; e < L * DK; e += GDN_CHUNK_THREADS) {
        const int i = e / DK, a = e % DK;
        oQ[e] = expf(sG[i]) * sQ[i * LK + a];
        oK[e] = expf(g_last - sG[i]) * sK[i * LK + a];
    }
    for (int e = tid; e < L * L; e += GDN_CHUNK_THREADS) oA[e] = sA[(e >> 6) * LL + (e & 63)];
    if (tid == 0) oA[L * L] = expf(g_last);
}

// ---- launch 2: a run, head and 32 state columns, the chunks in order ----
template <int DK> struct scan_smem { // floats
    static constexpr int LS = GDN_CHUNK_COLS + 8, LQ = DK + 4, LKT = DK + 8, LL = GDN_CHUNK + 4;
    static constexpr int S = 0;                          // [DK][LS] the state's columns
    static constexpr int Q = S + DK * LS;                // [64][LQ] Qg
    static constexpr int W = Q + GDN_CHUNK * LQ;         // [64][LQ]
    static constexpr int K = W + GDN_CHUNK * LQ;         // [64][LKT] Ke (read transposed)
    static constexpr int U = K + GDN_CHUNK * LKT;        // [64][LS] U, then Ũ
    static constexpr int A = U + GDN_CHUNK * LS;         // [64][LL]
    static constexpr int FLOATS = A + GDN_CHUNK * LL;
    static constexpr size_t BYTES = (size_t)FLOATS * 4;
};

template <int EPL, class ST> // ST: the state's storage type (gdn.h "State storage")
static __global__ void __launch_bounds__(GDN_CHUNK_THREADS)
    gdn_chunk_scan_kernel(int d_v, ST *__restrict__ S_base, int64_t S_stride,
                          const int32_t *__restrict__ slot, const int32_t *__restrict__ run, int R,
                          const int32_t *__restrict__ lng, const float *__restrict__ scratch,
                          float *__restrict__ o, int64_t ld_o)
{
    constexpr int DK = 32 * EPL, L = GDN_CHUNK, C = GDN_CHUNK_COLS;
    using SM = scan_smem<DK>;
    constexpr int LS = SM::LS, LQ = SM::LQ, LKT = SM::LKT, LL = SM::LL;
    extern __shared__ __align__(16) float sm[];
    float *sS = sm + SM::S, *sQ = sm + SM::Q, *sW = sm + SM::W, *sK = sm + SM::K;
    float *sU = sm + SM::U, *sA = sm + SM::A;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int hv = blockIdx.x, n_v = gridDim.x, j0 = blockIdx.y * C;
    const int64_t IF = item_floats(DK, d_v);
    // chunk item's arrays into shared memory, rows past n as zeros: Qg and W; Ke, U's columns
    // and A
    auto load_qw = [&](const float *it, int n) {
        for (int e = tid; e < L * (DK / 4); e += GDN_CHUNK_THREADS) {
            const int i = e / (DK / 4), u = e % (DK / 4);
            const bool ok = i < n;
            cp_async16(sQ + i * LQ + 4 * u, it + (ok ? i * DK + 4 * u : 0), ok);
            cp_async16(sW + i * LQ + 4 * u, it + L * DK + (ok ? i * DK + 4 * u : 0), ok);
        }
        cp_async_commit();
    };
    auto load_kua = [&](const float *it, int n) {
        const float *iK = it + 2 * L * DK, *iU = iK + L * DK, *iA = iU + L * d_v;
        for (int e = tid; e < L * (DK / 4); e += GDN_CHUNK_THREADS) {
            const int i = e / (DK / 4), u = e % (DK / 4);
            cp_async16(sK + i * LKT + 4 * u, iK + (i < n ? i * DK + 4 * u : 0), i < n);
        }
        for (int e = tid; e < L * (C / 4); e += GDN_CHUNK_THREADS) {
            const int i = e / (C / 4), u = e % (C / 4);
            cp_async16(sU + i * LS + 4 * u, iU + (i < n ? (int64_t)i * d_v + j0 + 4 * u : 0),
                       i < n);
        }
        for (int e = tid; e < L * (L / 4); e += GDN_CHUNK_THREADS) {
            const int i = e / (L / 4), u = e % (L / 4);
            cp_async16(sA + i * LL + 4 * u, iA + (i < n ? i * L + 4 * u : 0), i < n);
        }
        cp_async_commit();
    };
    ds_grid_dep();
    const int n_long = lng[0];
    int y0 = 0, x_done = 0; // chunks of the runs before run x
    for (int x = blockIdx.z; x < n_long; x += gridDim.z) {
        for (; x_done < x; x_done++) y0 += (run[R + lng[1 + x_done]] + L - 1) / L;
        const int r = lng[1 + x];
        const int64_t row0 = run[r], n_run = run[R + r];
        ST *S = S_base + slot[row0] * S_stride + ((int64_t)hv * d_v + j0) * DK;
        __syncthreads(); // the last run's state is stored
        for (int i = tid; i < C * DK; i += GDN_CHUNK_THREADS)
            sS[(i % DK) * LS + i / DK] = gdn_state_get(S + i);
        {
            const int n = (int)min((int64_t)L, n_run);
            const float *it = scratch + ((int64_t)y0 * n_v + hv) * IF;
            load_qw(it, n);
            load_kua(it, n);
        }
        for (int64_t t0 = 0, y = y0; t0 < n_run; t0 += L, y++) {
            const int n = (int)min((int64_t)L, n_run - t0);
            const float elast = scratch[(y * n_v + hv) * IF + 3 * L * DK + L * d_v + L * L];
            const bool more = t0 + L < n_run;
            const int n_next = more ? (int)min((int64_t)L, n_run - t0 - L) : 0;
            const float *it_next = scratch + ((y + 1) * n_v + hv) * IF;
            cp_async_wait_all();
            __syncthreads();
            // Ũ = U − W·S_c and O = Qg·S_c: the warp's column block nt of the 64 x 32 and row
            // blocks m0, m0 + 1 (4 tiles of one B: W's two, Qg's two)
            const int nt = warp & 3, m0 = 2 * (warp >> 2);
            const unsigned on2 = (unsigned)(m0 * 16 < n) | (unsigned)((m0 + 1) * 16 < n) << 1;
            float xo[4][4] = {};
            warp_mma3<4>(
                xo, DK, on2 | on2 << 2,
                [&](int i, int rr, int k) { return (i < 2 ? sW : sQ)[((m0 + (i & 1)) * 16 + rr) * LQ + k]; },
                [&](int k, int nn) { return sS[k * LS + nt * 8 + nn]; });
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int i = (m0 + h) * 16 + g + 8 * (q >> 1), j = nt * 8 + 2 * t + (q & 1);
                    sU[i * LS + j] -= xo[h][q];
                }
            __syncthreads(); // Ũ complete; Qg and W are done with
            if (more) load_qw(it_next, n_next);
            // O += A·Ũ (A lower: k up to the blocks' last row), the rows out
            {
                float oc[2][4];
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int q = 0; q < 4; q++) oc[h][q] = xo[2 + h][q];
                warp_mma3<2>(
                    oc, min(16 * m0 + 32, k_rows(n)), on2,
                    [&](int i, int rr, int k) { return sA[((m0 + i) * 16 + rr) * LL + k]; },
                    [&](int k, int nn) { return sU[k * LS + nt * 8 + nn]; });
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const int i = (m0 + h) * 16 + g + 8 * (q >> 1), j = nt * 8 + 2 * t + (q & 1);
                        if (i < n) o[(row0 + t0 + i) * ld_o + (int64_t)hv * d_v + j0 + j] = oc[h][q];
                    }
            }
            // S_c ← e^{γlast} S_c + Keᵀ·Ũ: the warp's column block nt, row blocks (of d_k)
            // warp / 4, + 2, + 4, ...
            {
                constexpr int NM = DK / 32; // row blocks a warp
                const int mb = warp >> 2;
                float c[NM][4];
#pragma unroll
                for (int i = 0; i < NM; i++)
#pragma unroll
                    for (int q = 0; q < 4; q++)
                        c[i][q] = elast * sS[((mb + 2 * i) * 16 + g + 8 * (q >> 1)) * LS + nt * 8 +
                                             2 * t + (q & 1)];
                warp_mma3<NM>(
                    c, k_rows(n), ~0u,
                    [&](int i, int rr, int k) { return sK[k * LKT + (mb + 2 * i) * 16 + rr]; },
                    [&](int k, int nn) { return sU[k * LS + nt * 8 + nn]; });
#pragma unroll
                for (int i = 0; i < NM; i++)
#pragma unroll
                    for (int q = 0; q < 4; q++)
                        sS[((mb + 2 * i) * 16 + g + 8 * (q >> 1)) * LS + nt * 8 + 2 * t + (q & 1)] =
                            gdn_state_round<ST>(c[i][q]); // bf16: rounded after every chunk
            }
            __syncthreads(); // Ke, Ũ and A are done with
            if (more) load_kua(it_next, n_next);
        }
        __syncthreads();
        for (int i = tid; i < C * DK; i += GDN_CHUNK_THREADS)
            gdn_state_put(S + i, sS[(i % DK) * LS + i / DK]);
    }
}

extern "C" size_t gdn_chunk_smem_bytes(int d_k)
{
    switch (d_k) {
    case 32: return prep_smem<32>::BYTES > scan_smem<32>::BYTES ? prep_smem<32>::BYTES : scan_smem<32>::BYTES;
    case 64: return prep_smem<64>::BYTES > scan_smem<64>::BYTES ? prep_smem<64>::BYTES : scan_smem<64>::BYTES;
    case 128: return prep_smem<128>::BYTES > scan_smem<128>::BYTES ? prep_smem<128>::BYTES : scan_smem<128>::BYTES;
    default: return 0;
    }
}

// chunks of the long runs of a pass of `rows` rows: sum of ceil(len / 64) <= rows / 64 + (runs)
static int max_chunks(int rows, int long_rows)
{
    return rows / GDN_CHUNK + rows / (long_rows > 2 ? long_rows : 2) + 1;
}

extern "C" int64_t gdn_chunk_scratch_floats(int n_v, int d_k, int d_v, int rows, int long_rows)
{
    return (int64_t)max_chunks(rows, long_rows) * n_v * item_floats(d_k, d_v);
}

extern "C" int gdn_chunk_init(status *st)
{
    const cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
#define GDN_CHUNK_INIT(EPL)                                                                      \
    CUDA_TRY(st, cudaFuncSetAttribute(gdn_chunk_prep_kernel<EPL>, smem,                          \
                                      (int)prep_smem<32 * EPL>::BYTES));                         \
    CUDA_TRY(st, cudaFuncSetAttribute(gdn_chunk_scan_kernel<EPL, float>, smem,                   \
                                      (int)scan_smem<32 * EPL>::BYTES));                         \
    CUDA_TRY(st, cudaFuncSetAttribute(gdn_chunk_scan_kernel<EPL, __nv_bfloat16>, smem,           \
                                      (int)scan_smem<32 * EPL>::BYTES))
    GDN_CHUNK_INIT(1);
    GDN_CHUNK_INIT(2);
    GDN_CHUNK_INIT(4);
#undef GDN_CHUNK_INIT
    return STATUS_OK;
}

extern "C" cuda_launch_dims gdn_chunk_runs_dims(int n_v, int d_v, int R)
{
    return (cuda_launch_dims){(unsigned)n_v, (unsigned)(d_v / GDN_CHUNK_COLS),
                              (unsigned)(R < GDN_CHUNK_RUN_CTAS ? R : GDN_CHUNK_RUN_CTAS),
                              GDN_CHUNK_THREADS};
}

extern "C" void gdn_chunk_runs(const float *d_conv, int64_t ld_conv, const float *d_b,
                               const float *d_a, int64_t ld_ba, const float *d_dt_bias,
                               const float *d_ssm_a, int n_k, int n_v, int d_k, int d_v,
                               float eps, void *d_S, bool S_bf16, int64_t S_slot_stride,
                               const int32_t *d_slot, const int32_t *d_run,
                               const int32_t *d_long, float *d_o, int64_t ld_o, int R, int rows,
                               int long_rows, float *d_scratch, const cuda_launch *l)
{
    DS_ASSERT(n_k > 0 && n_v % n_k == 0 && d_v > 0 && d_v % GDN_CHUNK_COLS == 0 &&
              d_v <= GDN_CHUNK_MAX_DV && R >= 1 && R <= 65535 && rows >= 1 && long_rows >= 2);
    const cuda_launch_dims d = gdn_chunk_runs_dims(n_v, d_v, R);
    const dim3 prep_grid((unsigned)n_v, (unsigned)max_chunks(rows, long_rows));
#define GDN_CHUNK_LAUNCH(EPL)                                                                   \
    ds_launch(gdn_chunk_prep_kernel<EPL>, prep_grid, GDN_CHUNK_THREADS,                          \
              prep_smem<32 * EPL>::BYTES, l, d_conv, ld_conv, d_b, d_a, ld_ba, d_dt_bias,        \
              d_ssm_a, n_k, d_v, eps, d_run, R, d_long, d_scratch);                              \
    if (S_bf16)                                                                                  \
        ds_launch(gdn_chunk_scan_kernel<EPL, __nv_bfloat16>, ds_grid(d), d.block,                \
                  scan_smem<32 * EPL>::BYTES, l, d_v, (__nv_bfloat16 *)d_S, S_slot_stride,       \
                  d_slot, d_run, R, d_long, (const float *)d_scratch, d_o, ld_o);                \
    else                                                                                         \
        ds_launch(gdn_chunk_scan_kernel<EPL, float>, ds_grid(d), d.block,                        \
                  scan_smem<32 * EPL>::BYTES, l, d_v, (float *)d_S, S_slot_stride, d_slot,       \
                  d_run, R, d_long, (const float *)d_scratch, d_o, ld_o)
    switch (d_k) {
    case 32: GDN_CHUNK_LAUNCH(1); break;
    case 64: GDN_CHUNK_LAUNCH(2); break;
    case 128: GDN_CHUNK_LAUNCH(4); break;
    default: DS_ASSERT(!"gdn_chunk_runs: d_k must be 32, 64 or 128");
    }
#undef GDN_CHUNK_LAUNCH
}
