// The chunked gated delta rule of prefill runs (gdn.h "Chunked runs"): the WY / UT form of
// ref_gdn_chunked (kernels/cpu/gdn.c, QWEN35.md §3) over chunks of GDN_CHUNK tokens, in two
// launches.
//
// 1. Per chunk (every long run's chunks, in d_long's order) and value head, all at once: what
//    does not depend on the state. q, k L2-normed (q also by 1/sqrt(d_k)), the gates β and the
//    cumulative log decays γ, M = β_i k_i·k_j e^{γi−γj} (strictly lower), A = q_i·k_j e^{γi−γj}
//    (lower with the diagonal), then by forward substitution with (I + M) the rows
//    U = (I+M)⁻¹ βV and W = (I+M)⁻¹ β e^γ K; out to the scratch with Qg_i = e^{γi} q_i,
//    Ke_i = e^{γlast−γi} k_i and e^{γlast}. A CTA a (chunk, head); nothing of it is computed
//    twice.
// 2. Per run, value head and 32 state columns: the chunks in order, the columns S_c in shared
//    memory from the run's first chunk to its last: Ũ = U − W·S_c, O = Qg·S_c + A·Ũ (the rows'
//    outputs), S_c ← e^{γlast} S_c + Keᵀ·Ũ. Only this part is sequential, and it is three small
//    products a chunk.
// FP32 on the CUDA cores, the twin's order of operations where it has one.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/q8.cuh"

#define GDN_CHUNK 64
#define GDN_CHUNK_COLS 32    // value columns of a launch-2 CTA
#define GDN_CHUNK_THREADS 256
#define GDN_CHUNK_RUN_CTAS 8 // runs in flight per head and column group (launch 2)
#define GDN_CHUNK_MAX_DV 128

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

// ---- launch 1: a (chunk, head) ----
template <int DK> struct prep_smem { // floats; rows of d_k at stride d_k + 1 (odd: spread banks)
    static constexpr int LK = DK + 1, LU = GDN_CHUNK_MAX_DV + 1, LL = GDN_CHUNK + 1;
    static constexpr int Q = 0;                       // [64][LK] q, normed and scaled
    static constexpr int K = Q + GDN_CHUNK * LK;      // [64][LK] k, normed
    static constexpr int W = K + GDN_CHUNK * LK;      // [64][LK]
    static constexpr int U = W + GDN_CHUNK * LK;      // [64][LU] βv, then U
    static constexpr int M = U + GDN_CHUNK * LU;      // [64][LL]
    static constexpr int A = M + GDN_CHUNK * LL;      // [64][LL]
    static constexpr int G = A + GDN_CHUNK * LL;      // [64] γ
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
    constexpr int LK = SM::LK, LU = SM::LU, LL = SM::LL;
    extern __shared__ float sm[];
    float *sQ = sm + SM::Q, *sK = sm + SM::K, *sW = sm + SM::W, *sU = sm + SM::U;
    float *sM = sm + SM::M, *sA = sm + SM::A, *sG = sm + SM::G, *sB = sm + SM::B;
    float *sRaw = sm + SM::RAW;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int NW = GDN_CHUNK_THREADS / 32;
    const int hv = blockIdx.x, n_v = gridDim.x, kh = hv % n_k, D_k = n_k * DK;
    ds_grid_dep();
    int64_t row0;
    int n;
    if (!chunk_at(run, R, lng, blockIdx.y, &row0, &n)) return; // past the chunks
    const float dt_hv = dt_bias[hv], A_hv = ssm_a[hv];
    // 0. rows: q, k L2-normed as gdn_decode (q also by 1/sqrt(d_k)), gates, βv
    for (int i = warp; i < n; i += NW) {
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
            sU[i * LU + j] = beta * cr[2 * D_k + (int64_t)hv * d_v + j];
    }
    __syncthreads();
    if (tid == 0) { // γ_i = Σ_{j<=i} g_j, in order (as the twin)
        float acc = 0.0f;
        for (int i = 0; i < n; i++) sG[i] = acc += sRaw[i];
    }
    __syncthreads();
    // 1. M (strictly lower) and A (lower with the diagonal): 4 x 4 tiles a thread
    {
        const int i0 = 4 * (tid / 16), c0 = 4 * (tid % 16);
        float kk[4][4] = {}, qk[4][4] = {};
        if (i0 < n && c0 <= i0 + 3 && c0 < n) {
            for (int a = 0; a < DK; a++) {
                float ki[4], qi[4], kj[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    ki[u] = sK[(i0 + u) * LK + a];
                    qi[u] = sQ[(i0 + u) * LK + a];
                    kj[u] = sK[(c0 + u) * LK + a];
                }
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        kk[u][w] += ki[u] * kj[w];
                        qk[u][w] += qi[u] * kj[w];
                    }
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const int i = i0 + u, j = c0 + w;
                const bool in = i < n && j < n;
                const float d = in && j <= i ? expf(sG[i] - sG[j]) : 0.0f;
                sM[i * LL + j] = in && j < i ? sB[i] * kk[u][w] * d : 0.0f;
                sA[i * LL + j] = in && j <= i ? qk[u][w] * d : 0.0f;
            }
    }
    __syncthreads();
    // 2. forward substitution with (I + M): U_i = βv_i − Σ_{j<i} M_ij U_j (d_v columns),
    //    W_i = β_i e^{γi} k_i − Σ_{j<i} M_ij W_j (d_k columns); a thread a column, its rows in
    //    order (a column needs only its own earlier rows)
    for (int col = tid; col < d_v + DK; col += GDN_CHUNK_THREADS) {
        const bool isU = col < d_v;
        float *X = isU ? sU + col : sW + (col - d_v);
        const int ld = isU ? LU : LK;
        for (int i = 0; i < n; i++) {
            float acc = isU ? X[i * ld] : sB[i] * expf(sG[i]) * sK[i * LK + col - d_v];
            for (int j = 0; j < i; j++) acc -= sM[i * LL + j] * X[j * ld];
            X[i * ld] = acc;
        }
    }
    __syncthreads();
    // 3. out: Qg_i = e^{γi} q_i, W, Ke_i = e^{γlast−γi} k_i, U, A, e^{γlast}
    float *it = scratch + ((int64_t)blockIdx.y * n_v + hv) * item_floats(DK, d_v);
    float *oQ = it, *oW = oQ + L * DK, *oK = oW + L * DK, *oU = oK + L * DK, *oA = oU + L * d_v;
    const float g_last = sG[n - 1];
    for (int e = tid; e < n * DK; e += GDN_CHUNK_THREADS) {
        const int i = e / DK, a = e % DK;
        oQ[e] = expf(sG[i]) * sQ[i * LK + a];
        oW[e] = sW[i * LK + a];
        oK[e] = expf(g_last - sG[i]) * sK[i * LK + a];
    }
    for (int e = tid; e < n * d_v; e += GDN_CHUNK_THREADS) oU[e] = sU[(e / d_v) * LU + e % d_v];
    for (int e = tid; e < n * L; e += GDN_CHUNK_THREADS) oA[e] = sA[(e / L) * LL + e % L];
    if (tid == 0) oA[L * L] = expf(g_last);
}

// ---- launch 2: a run, head and 32 state columns, the chunks in order ----
template <int DK> struct scan_smem { // floats
    static constexpr int LK = DK + 1, LC = GDN_CHUNK_COLS + 1, LL = GDN_CHUNK + 1;
    static constexpr int S = 0;                              // [32][LK] the state's columns
    static constexpr int Q = S + GDN_CHUNK_COLS * LK;        // [64][LK] Qg
    static constexpr int W = Q + GDN_CHUNK * LK;             // [64][LK]
    static constexpr int K = W + GDN_CHUNK * LK;             // [64][LK] Ke
    static constexpr int U = K + GDN_CHUNK * LK;             // [64][LC] U, then Ũ
    static constexpr int O = U + GDN_CHUNK * LC;             // [64][LC]
    static constexpr int A = O + GDN_CHUNK * LC;             // [64][LL]
    static constexpr int FLOATS = A + GDN_CHUNK * LL;
    static constexpr size_t BYTES = (size_t)FLOATS * 4;
};

template <int EPL>
static __global__ void __launch_bounds__(GDN_CHUNK_THREADS)
    gdn_chunk_scan_kernel(int d_v, float *__restrict__ S_base, int64_t S_stride,
                          const int32_t *__restrict__ slot, const int32_t *__restrict__ run, int R,
                          const int32_t *__restrict__ lng, const float *__restrict__ scratch,
                          float *__restrict__ o, int64_t ld_o)
{
    constexpr int DK = 32 * EPL, L = GDN_CHUNK, C = GDN_CHUNK_COLS;
    using SM = scan_smem<DK>;
    constexpr int LK = SM::LK, LC = SM::LC, LL = SM::LL;
    extern __shared__ float sm[];
    float *sS = sm + SM::S, *sQ = sm + SM::Q, *sW = sm + SM::W, *sK = sm + SM::K;
    float *sU = sm + SM::U, *sO = sm + SM::O, *sA = sm + SM::A;
    const int tid = threadIdx.x;
    const int hv = blockIdx.x, n_v = gridDim.x, j0 = blockIdx.y * C;
    const int64_t IF = item_floats(DK, d_v);
    ds_grid_dep();
    const int n_long = lng[0];
    int y0 = 0, x_done = 0; // chunks of the runs before run x
    for (int x = blockIdx.z; x < n_long; x += gridDim.z) {
        for (; x_done < x; x_done++) y0 += (run[R + lng[1 + x_done]] + L - 1) / L;
        const int r = lng[1 + x];
        const int64_t row0 = run[r], n_run = run[R + r];
        float *S = S_base + slot[row0] * S_stride + ((int64_t)hv * d_v + j0) * DK;
        __syncthreads(); // the last run's state is stored
        for (int i = tid; i < C * DK; i += GDN_CHUNK_THREADS) sS[(i / DK) * LK + i % DK] = S[i];
        for (int64_t t0 = 0, y = y0; t0 < n_run; t0 += L, y++) {
            const int n = (int)min((int64_t)L, n_run - t0);
            const float *it = scratch + (y * n_v + hv) * IF;
            const float *iQ = it, *iW = iQ + L * DK, *iK = iW + L * DK, *iU = iK + L * DK;
            const float *iA = iU + L * d_v;
            __syncthreads(); // the last chunk is done with every array
            for (int e = tid; e < n * DK; e += GDN_CHUNK_THREADS) {
                const int i = e / DK, a = e % DK;
                sQ[i * LK + a] = iQ[e];
                sW[i * LK + a] = iW[e];
                sK[i * LK + a] = iK[e];
            }
            for (int e = tid; e < n * C; e += GDN_CHUNK_THREADS)
                sU[(e / C) * LC + e % C] = iU[(e / C) * d_v + j0 + e % C];
            for (int e = tid; e < n * L; e += GDN_CHUNK_THREADS) sA[(e / L) * LL + e % L] = iA[e];
            const float elast = iA[L * L];
            __syncthreads();
            // Ũ_i = U_i − W_i·S_c and O_i = Qg_i·S_c; rows i0, i0 + 1, columns c0 .. c0 + 3 a
            // thread
            const int i0 = 2 * (tid / 8), c0 = 4 * (tid % 8);
            if (i0 < n) {
                float ws[2][4] = {}, qs[2][4] = {};
                for (int a = 0; a < DK; a++) {
                    float sc[4];
#pragma unroll
                    for (int w = 0; w < 4; w++) sc[w] = sS[(c0 + w) * LK + a];
#pragma unroll
                    for (int u = 0; u < 2; u++) {
                        const float wi = sW[(i0 + u) * LK + a], qi = sQ[(i0 + u) * LK + a];
#pragma unroll
                        for (int w = 0; w < 4; w++) {
                            ws[u][w] += wi * sc[w];
                            qs[u][w] += qi * sc[w];
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int i = i0 + u;
                    if (i >= n) break;
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        sU[i * LC + c0 + w] -= ws[u][w];
                        sO[i * LC + c0 + w] = qs[u][w];
                    }
                }
            }
            __syncthreads();
            // O_i += Σ_{j<=i} A_ij Ũ_j, the rows out (reads Ũ; the state update below reads
            // it too and writes only S_c, which this does not read)
            if (i0 < n) {
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int i = i0 + u;
                    if (i >= n) break;
                    float acc[4];
#pragma unroll
                    for (int w = 0; w < 4; w++) acc[w] = sO[i * LC + c0 + w];
                    for (int j = 0; j <= i; j++) {
                        const float aij = sA[i * LL + j];
#pragma unroll
                        for (int w = 0; w < 4; w++) acc[w] += aij * sU[j * LC + c0 + w];
                    }
                    float *oi = o + (row0 + t0 + i) * ld_o + (int64_t)hv * d_v + j0 + c0;
#pragma unroll
                    for (int w = 0; w < 4; w++) oi[w] = acc[w];
                }
            }
            // S_c ← e^{γlast} S_c + Σ_i Ke_i Ũ_i[c]: 4 rows of d_k x 4 columns a thread
            for (int t = tid; t < (DK / 4) * (C / 4); t += GDN_CHUNK_THREADS) {
                const int a0 = 4 * (t / (C / 4)), cc = 4 * (t % (C / 4));
                float acc[4][4];
#pragma unroll
                for (int w = 0; w < 4; w++)
#pragma unroll
                    for (int u = 0; u < 4; u++) acc[w][u] = sS[(cc + w) * LK + a0 + u] * elast;
                for (int i = 0; i < n; i++) {
                    float ke[4], uu[4];
#pragma unroll
                    for (int u = 0; u < 4; u++) ke[u] = sK[i * LK + a0 + u];
#pragma unroll
                    for (int w = 0; w < 4; w++) uu[w] = sU[i * LC + cc + w];
#pragma unroll
                    for (int w = 0; w < 4; w++)
#pragma unroll
                        for (int u = 0; u < 4; u++) acc[w][u] += uu[w] * ke[u];
                }
#pragma unroll
                for (int w = 0; w < 4; w++)
#pragma unroll
                    for (int u = 0; u < 4; u++) sS[(cc + w) * LK + a0 + u] = acc[w][u];
            }
        }
        __syncthreads();
        for (int i = tid; i < C * DK; i += GDN_CHUNK_THREADS) S[i] = sS[(i / DK) * LK + i % DK];
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
    CUDA_TRY(st, cudaFuncSetAttribute(gdn_chunk_scan_kernel<EPL>, smem,                          \
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
                               float eps, float *d_S, int64_t S_slot_stride,
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
    ds_launch(gdn_chunk_scan_kernel<EPL>, ds_grid(d), d.block, scan_smem<32 * EPL>::BYTES, l,    \
              d_v, d_S, S_slot_stride, d_slot, d_run, R, d_long, (const float *)d_scratch, d_o,  \
              ld_o)
    switch (d_k) {
    case 32: GDN_CHUNK_LAUNCH(1); break;
    case 64: GDN_CHUNK_LAUNCH(2); break;
    case 128: GDN_CHUNK_LAUNCH(4); break;
    default: DS_ASSERT(!"gdn_chunk_runs: d_k must be 32, 64 or 128");
    }
#undef GDN_CHUNK_LAUNCH
}
