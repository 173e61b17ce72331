// The chunked gated delta rule of prefill runs (gdn.h "Chunked runs"): the WY / UT form of
// ref_gdn_chunked (kernels/cpu/gdn.c, QWEN35.md §3) over chunks of GDN_CHUNK tokens.
//
// Grid (n_v, d_v / 32, G): a CTA owns one value head's 32 state columns (S[hv][j0 .. j0+32][:],
// in shared memory from the run's first chunk to its last) and takes the runs z, z + G, ... of
// two or more rows. Everything of a chunk that does not depend on the value columns (q, k norms,
// gates, the decays γ, M = β_i k_i·k_j e^{γi−γj}, A = q_i·k_j e^{γi−γj}, W = (I+M)⁻¹ β e^γ K) is
// computed by each of a head's d_v / 32 CTAs: cheap next to what it saves (one CTA a head would
// leave most of the GPU idle for one sequence's prompt). FP32 on the CUDA cores, the twin's
// order of operations where it has one. The runs come as a list of the long ones (d_long), so a
// pass of decode rows only costs each CTA one load.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/q8.cuh"

#define GDN_CHUNK 64
#define GDN_CHUNK_COLS 32    // value columns of a CTA
#define GDN_CHUNK_THREADS 256
#define GDN_CHUNK_RUN_CTAS 8 // G: runs in flight per head and column group

// shared memory, floats: rows of d_k at stride d_k + 1 (odd: column-wise reads spread over banks)
template <int DK> struct chunk_smem {
    static constexpr int LK = DK + 1, LC = GDN_CHUNK_COLS + 1, LL = GDN_CHUNK + 1;
    static constexpr int Q = 0;                              // [64][LK] q, normed and scaled
    static constexpr int K = Q + GDN_CHUNK * LK;             // [64][LK] k, normed
    static constexpr int W = K + GDN_CHUNK * LK;             // [64][LK] W
    static constexpr int S = W + GDN_CHUNK * LK;             // [32][LK] the state's columns
    static constexpr int M = S + GDN_CHUNK_COLS * LK;        // [64][LL]
    static constexpr int A = M + GDN_CHUNK * LL;             // [64][LL]
    static constexpr int U = A + GDN_CHUNK * LL;             // [64][LC] βv, U, then Ũ
    static constexpr int O = U + GDN_CHUNK * LC;             // [64][LC] outputs
    static constexpr int G = O + GDN_CHUNK * LC;             // [64] γ (cumulative log decay)
    static constexpr int B = G + GDN_CHUNK;                  // [64] β
    static constexpr int E = B + GDN_CHUNK;                  // [64] e^{γlast−γi}
    static constexpr int RAW = E + GDN_CHUNK;                // [64] the rows' g before the sum
    static constexpr int FLOATS = RAW + GDN_CHUNK;
    static constexpr size_t BYTES = (size_t)FLOATS * 4;
};

template <int EPL> // d_k = 32 * EPL
static __global__ void __launch_bounds__(GDN_CHUNK_THREADS)
    gdn_chunk_kernel(const float *__restrict__ conv, int64_t ld_conv,
                     const float *__restrict__ bb, const float *__restrict__ aa, int64_t ld_ba,
                     const float *__restrict__ dt_bias, const float *__restrict__ ssm_a, int n_k,
                     int d_v, float eps, float *__restrict__ S_base, int64_t S_stride,
                     const int32_t *__restrict__ slot, const int32_t *__restrict__ run, int R,
                     const int32_t *__restrict__ lng, float *__restrict__ o, int64_t ld_o)
{
    constexpr int DK = 32 * EPL, L = GDN_CHUNK, C = GDN_CHUNK_COLS;
    using SM = chunk_smem<DK>;
    constexpr int LK = SM::LK, LC = SM::LC, LL = SM::LL;
    extern __shared__ float sm[];
    float *sQ = sm + SM::Q, *sK = sm + SM::K, *sW = sm + SM::W, *sS = sm + SM::S;
    float *sM = sm + SM::M, *sA = sm + SM::A, *sU = sm + SM::U, *sO = sm + SM::O;
    float *sG = sm + SM::G, *sB = sm + SM::B, *sE = sm + SM::E, *sRaw = sm + SM::RAW;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int NW = GDN_CHUNK_THREADS / 32;
    const int hv = blockIdx.x, kh = hv % n_k, D_k = n_k * DK, j0 = blockIdx.y * C;
    const float dt_hv = dt_bias[hv], A_hv = ssm_a[hv];
    ds_grid_dep();
    const int n_long = lng[0];
    for (int x = blockIdx.z; x < n_long; x += gridDim.z) {
        const int r = lng[1 + x];
        const int64_t row0 = run[r], n_run = run[R + r];
        if (n_run < 2) continue; // one-row runs: gdn_decode_runs
        float *S = S_base + slot[row0] * S_stride + ((int64_t)hv * d_v + j0) * DK;
        __syncthreads(); // the last run's state is stored
        for (int i = tid; i < C * DK; i += GDN_CHUNK_THREADS) sS[(i / DK) * LK + i % DK] = S[i];
        for (int64_t t0 = 0; t0 < n_run; t0 += L) {
            const int n = (int)min((int64_t)L, n_run - t0);
            __syncthreads(); // the last chunk is done with every array
            // 0. rows: q, k L2-normed as gdn_decode (q also by 1/sqrt(d_k)), gates, βv columns
            for (int i = warp; i < n; i += NW) {
                const float *cr = conv + (row0 + t0 + i) * ld_conv;
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
                const float rq = 1.0f / sqrtf(ssq + eps) / sqrtf((float)DK),
                            rk = 1.0f / sqrtf(ssk + eps);
#pragma unroll
                for (int e = 0; e < EPL; e++) {
                    sQ[i * LK + lane * EPL + e] = q[e] * rq;
                    sK[i * LK + lane * EPL + e] = k[e] * rk;
                }
                const int64_t rowi = row0 + t0 + i;
                const float beta = 1.0f / (1.0f + expf(-bb[rowi * ld_ba + hv]));
                if (lane == 0) {
                    const float x = aa[rowi * ld_ba + hv] + dt_hv;
                    sRaw[i] = A_hv * (x > 20.0f ? x : log1pf(expf(x)));
                    sB[i] = beta;
                }
                sU[i * LC + lane] = beta * cr[2 * D_k + (int64_t)hv * d_v + j0 + lane];
            }
            __syncthreads();
            if (tid == 0) { // γ_i = Σ_{j<=i} g_j, in order (as the twin)
                float acc = 0.0f;
                for (int i = 0; i < n; i++) sG[i] = acc += sRaw[i];
            }
            __syncthreads();
            if (tid < n) sE[tid] = expf(sG[n - 1] - sG[tid]);
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
            // 2. forward substitution with (I + M): U_i = βv_i − Σ_{j<i} M_ij U_j (32 columns),
            //    W_i = β_i e^{γi} k_i − Σ_{j<i} M_ij W_j (d_k columns); a thread a column, its
            //    rows in order (a column needs only its own earlier rows)
            for (int col = tid; col < C + DK; col += GDN_CHUNK_THREADS) {
                const bool isU = col < C;
                float *X = isU ? sU + col : sW + (col - C);
                const int ld = isU ? LC : LK;
                for (int i = 0; i < n; i++) {
                    float acc = isU ? X[i * ld] : sB[i] * expf(sG[i]) * sK[i * LK + col - C];
                    for (int j = 0; j < i; j++) acc -= sM[i * LL + j] * X[j * ld];
                    X[i * ld] = acc;
                }
            }
            __syncthreads();
            // 3. with the incoming state: Ũ_i = U_i − W_i·S_c and O_i = e^{γi} q_i·S_c; rows
            //    i0, i0 + 1, columns c0 .. c0 + 3 a thread
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
                    const float eg = expf(sG[i]);
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        sU[i * LC + c0 + w] -= ws[u][w];
                        sO[i * LC + c0 + w] = eg * qs[u][w];
                    }
                }
            }
            __syncthreads();
            // 4. intra-chunk: O_i += Σ_{j<=i} A_ij Ũ_j, then the rows out
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
            // 5. S_c ← e^{γlast} S_c + Σ_i (e^{γlast−γi} k_i) Ũ_i[c]: column lane, rows of d_k
            //    warp, warp + NW, ...
            {
                const float elast = expf(sG[n - 1]);
                for (int a = warp; a < DK; a += NW) {
                    float s = sS[lane * LK + a] * elast;
                    for (int i = 0; i < n; i++) s += sU[i * LC + lane] * (sE[i] * sK[i * LK + a]);
                    sS[lane * LK + a] = s;
                }
            }
        }
        __syncthreads();
        for (int i = tid; i < C * DK; i += GDN_CHUNK_THREADS) S[i] = sS[(i / DK) * LK + i % DK];
    }
}

extern "C" size_t gdn_chunk_smem_bytes(int d_k)
{
    switch (d_k) {
    case 32: return chunk_smem<32>::BYTES;
    case 64: return chunk_smem<64>::BYTES;
    case 128: return chunk_smem<128>::BYTES;
    default: return 0;
    }
}

extern "C" int gdn_chunk_init(status *st)
{
    const cudaFuncAttribute smem = cudaFuncAttributeMaxDynamicSharedMemorySize;
    CUDA_TRY(st, cudaFuncSetAttribute(gdn_chunk_kernel<1>, smem, (int)chunk_smem<32>::BYTES));
    CUDA_TRY(st, cudaFuncSetAttribute(gdn_chunk_kernel<2>, smem, (int)chunk_smem<64>::BYTES));
    CUDA_TRY(st, cudaFuncSetAttribute(gdn_chunk_kernel<4>, smem, (int)chunk_smem<128>::BYTES));
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
                               const int32_t *d_long, float *d_o, int64_t ld_o, int R,
                               const cuda_launch *l)
{
    DS_ASSERT(n_k > 0 && n_v % n_k == 0 && d_v > 0 && d_v % GDN_CHUNK_COLS == 0 && R >= 1 &&
              R <= 65535);
    const cuda_launch_dims d = gdn_chunk_runs_dims(n_v, d_v, R);
    const size_t smem = gdn_chunk_smem_bytes(d_k);
#define GDN_CHUNK_LAUNCH(EPL)                                                                   \
    ds_launch(gdn_chunk_kernel<EPL>, ds_grid(d), d.block, smem, l, d_conv, ld_conv, d_b, d_a,    \
              ld_ba, d_dt_bias, d_ssm_a, n_k, d_v, eps, d_S, S_slot_stride, d_slot, d_run, R,   \
              d_long, d_o, ld_o)
    switch (d_k) {
    case 32: GDN_CHUNK_LAUNCH(1); break;
    case 64: GDN_CHUNK_LAUNCH(2); break;
    case 128: GDN_CHUNK_LAUNCH(4); break;
    default: DS_ASSERT(!"gdn_chunk_runs: d_k must be 32, 64 or 128");
    }
#undef GDN_CHUNK_LAUNCH
}
