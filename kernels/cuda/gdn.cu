// Gated DeltaNet decode kernels (gdn.h).
//
// Every kernel takes B rows (the grid's last dimension; gdn.h "Rows"); the B = 1 launchers are
// the rows launchers with B = 1 and no slot map.
//
// gdn_decode: grid (n_v, d_v / 32, B), 4 warps per CTA. Every CTA normalises its key head's q and
// k (128 values each, cheap to redo), then owns 32 value columns j, 8 a warp: lanes hold
// S[hv][j][lane*EPL ..] (coalesced), decay, u = S_j·k (warp sum), δ = β(v_j − u), S_j += δ k,
// o_j = S_j·q (warp sum). Columns are independent, which is what
// lets one head spread over several CTAs; the per-head norm runs in gdn_norm_gated.
#include <limits.h>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/gdn_conv.cuh"
#include "kernels/cuda/gdn_state.cuh"
#include "kernels/cuda/q8.cuh"

#define GDN_WARPS 4
#define GDN_CPW 8 // S columns in flight per warp

// out may alias mixed (in place: each element is read, then written, by one thread). Without
// runs, grid row blockIdx.y is row blockIdx.y; with runs (run: [2][R], starts then lengths), it is
// run blockIdx.y, whose rows go through the channel's window in order.
// AHEAD: rows of a run whose conv inputs are loaded together: 8 for decode rows and short runs
// (52 registers), 32 beside prompt chunks (128 registers; 8 took 41 µs a 4B layer of one
// 256-row run: 32 CTAs, each thread 32 dependent load round trips)
template <int AHEAD>
static __global__ void gdn_conv_kernel(const float *mixed, int64_t ld_mixed,
                                       const float *__restrict__ w, float *__restrict__ state,
                                       int64_t state_stride, const int32_t *__restrict__ slot,
                                       const int32_t *__restrict__ run,
                                       const int32_t *__restrict__ keep, int R, int C, int K,
                                       float *out, int64_t ld_out)
{
    ds_grid_dep();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int64_t row0 = run ? run[blockIdx.y] : blockIdx.y, n = run ? run[R + blockIdx.y] : 1;
    if (n <= 0) return;
    const int64_t s = slot ? slot[row0] : 0;
    float *st = state + s * state_stride + (int64_t)c * (K - 1);
    const float *wc = w + (int64_t)c * K;
    if (K != 4 || n == 1) {
        for (int64_t row = row0; row < row0 + n; row++) {
            out[row * ld_out + c] = gdn_conv_channel(mixed[row * ld_mixed + c], wc, st, K);
            if (keep && keep[row] >= 0) {
                float *kp = state + keep[row] * state_stride + (int64_t)c * (K - 1);
                for (int i = 0; i < K - 1; i++) kp[i] = st[i];
            }
        }
        return;
    }
    // a run of the model's 4-tap conv: the window in registers, the inputs of AHEAD rows
    // loaded before the first of them is written (in place, each element is this thread's own),
    // so the loads of a run overlap instead of forming one dependent chain; the arithmetic is
    // gdn_conv_channel's, in its order
    const float w0 = wc[0], w1 = wc[1], w2 = wc[2], w3 = wc[3];
    float s0 = st[0], s1 = st[1], s2 = st[2];
    for (int64_t r0 = row0; r0 < row0 + n; r0 += AHEAD) {
        const int m = (int)min((int64_t)AHEAD, row0 + n - r0);
        float xs[AHEAD];
#pragma unroll
        for (int u = 0; u < AHEAD; u++)
            if (u < m) xs[u] = mixed[(r0 + u) * ld_mixed + c];
#pragma unroll
        for (int u = 0; u < AHEAD; u++) {
            if (u >= m) break;
            float acc = w3 * xs[u];
            acc += w0 * s0;
            acc += w1 * s1;
            acc += w2 * s2;
            s0 = s1, s1 = s2, s2 = xs[u];
            out[(r0 + u) * ld_out + c] = acc / (1.0f + expf(-acc));
            if (keep && keep[r0 + u] >= 0) { // a verify row: the window after it
                float *kp = state + keep[r0 + u] * state_stride + (int64_t)c * 3;
                kp[0] = s0, kp[1] = s1, kp[2] = s2;
            }
        }
    }
    st[0] = s0, st[1] = s1, st[2] = s2;
}

extern "C" cuda_launch_dims gdn_conv_rows_dims(int C, int B)
{
    return (cuda_launch_dims){ds_div_up(C, 256), (unsigned)B, 1, 256};
}

extern "C" void gdn_conv_rows(const float *d_mixed, int64_t ld_mixed, const float *d_conv_w,
                              float *d_conv_state, int64_t state_slot_stride,
                              const int32_t *d_slot, int C, int K_conv, float *d_out,
                              int64_t ld_out, int B, const cuda_launch *l)
{
    gdn_conv_runs(d_mixed, ld_mixed, d_conv_w, d_conv_state, state_slot_stride, d_slot, NULL,
                  NULL, 0, C, K_conv, d_out, ld_out, B, l);
}

extern "C" void gdn_conv_runs(const float *d_mixed, int64_t ld_mixed, const float *d_conv_w,
                              float *d_conv_state, int64_t state_slot_stride,
                              const int32_t *d_slot, const int32_t *d_run,
                              const int32_t *d_keep, int long_rows, int C, int K_conv,
                              float *d_out, int64_t ld_out, int R, const cuda_launch *l)
{
    DS_ASSERT(C > 0 && K_conv >= 1 && R >= 1 && R <= 65535);
    const cuda_launch_dims d = gdn_conv_rows_dims(C, R);
    if (long_rows > 0)
        ds_launch(gdn_conv_kernel<32>, ds_grid(d), d.block, 0, l, d_mixed, ld_mixed, d_conv_w,
                  d_conv_state, state_slot_stride, d_slot, d_run, d_keep, R, C, K_conv, d_out,
                  ld_out);
    else
        ds_launch(gdn_conv_kernel<8>, ds_grid(d), d.block, 0, l, d_mixed, ld_mixed, d_conv_w,
                  d_conv_state, state_slot_stride, d_slot, d_run, d_keep, R, C, K_conv, d_out,
                  ld_out);
}

extern "C" void gdn_conv(const float *d_mixed, const float *d_conv_w, float *d_conv_state, int C,
                         int K_conv, float *d_out, const cuda_launch *l)
{
    gdn_conv_rows(d_mixed, C, d_conv_w, d_conv_state, 0, NULL, C, K_conv, d_out, C, 1, l);
}

template <int EPL, class ST> // d_k = 32 * EPL; ST: the state's storage type
static __global__ void __launch_bounds__(GDN_WARPS * 32)
    gdn_decode_kernel(const float *__restrict__ conv, int64_t ld_conv,
                      const float *__restrict__ b, const float *__restrict__ a, int64_t ld_ba,
                      const float *__restrict__ dt_bias, const float *__restrict__ ssm_a, int n_k,
                      int d_v, float eps, ST *__restrict__ S, int64_t S_stride,
                      const int32_t *__restrict__ slot, const int32_t *__restrict__ run,
                      const int32_t *__restrict__ keep, int R, int max_len,
                      float *__restrict__ o, int64_t ld_o)
{
    constexpr int d_k = 32 * EPL, NC = GDN_WARPS * GDN_CPW; // NC: the CTA's columns
    __shared__ float sq[d_k], sk[d_k], scratch[32];
    // grid z: a row, or a run of rows of one sequence (gdn.h "Runs"), and every gridDim.z-th
    // after it; the slot and the runs are step inputs, read before ds_grid_dep like S itself
    // (gdn.h)
    for (int z = blockIdx.z; z < R; z += gridDim.z) {
        const int64_t row0 = run ? run[z] : z, n = run ? run[R + z] : 1;
        if (n <= 0 || n > max_len) continue; // longer runs: gdn_chunk_runs
        if (z != (int)blockIdx.z) __syncthreads(); // every lane has read the last run's sq, sk
        const int hv = blockIdx.x, kh = hv % n_k, D_k = n_k * d_k;
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        const int j0 = blockIdx.y * NC; // this CTA's columns j0 + warp + GDN_WARPS * c
        ST *Sz = S + (slot ? slot[row0] : 0) * S_stride + (int64_t)hv * d_v * d_k +
                 lane * EPL; // + j·d_k
        // the CTA's S columns stay in registers through every row of the run: loaded once,
        // before the q/k norms and (under programmatic dependent launch) before
        // griddepcontrol.wait, so the loads overlap the in-projection's tail; stored once after
        // the last row (bf16: rounded after every row, as a store would, so that a run's rows
        // equal rows run one at a time)
        float s[GDN_CPW][EPL];
    #pragma unroll
        for (int c = 0; c < GDN_CPW; c++)
            gdn_state_load<EPL>(Sz + (int64_t)(j0 + warp + GDN_WARPS * c) * d_k, s[c]);
        const float dt_hv = dt_bias[hv], A_hv = ssm_a[hv];
        ds_grid_dep();
        for (int64_t row = row0; row < row0 + n; row++) {
            const float *cr = conv + row * ld_conv, *v = cr + 2 * D_k + (int64_t)hv * d_v;
            float vj[GDN_CPW];
    #pragma unroll
            for (int c = 0; c < GDN_CPW; c++) vj[c] = v[j0 + warp + GDN_WARPS * c];
            const float b_hv = b[row * ld_ba + hv], a_hv = a[row * ld_ba + hv];
            if (row != row0) __syncthreads(); // every lane has read the last row's sq, sk
            // q, k of key head kh: L2 norm (x / sqrt(Σx² + eps)), q also scaled by 1/sqrt(d_k)
            for (int i = threadIdx.x; i < d_k; i += blockDim.x) {
                sq[i] = cr[kh * d_k + i];
                sk[i] = cr[D_k + kh * d_k + i];
            }
            float ssq = 0.0f, ssk = 0.0f;
            for (int i = threadIdx.x; i < d_k; i += blockDim.x)
                ssq += sq[i] * sq[i], ssk += sk[i] * sk[i];
            ssq = ds_block_sum(ssq, scratch);
            ssk = ds_block_sum(ssk, scratch);
            const float rq = 1.0f / sqrtf(ssq + eps) / sqrtf((float)d_k);
            const float rk = 1.0f / sqrtf(ssk + eps);
            float q[EPL], k[EPL];
    #pragma unroll
            for (int e = 0; e < EPL; e++) {
                q[e] = sq[lane * EPL + e] * rq;
                k[e] = sk[lane * EPL + e] * rk;
            }
            // gates: β = sigmoid(b), g = ssm_a · softplus(a + dt_bias)
            const float beta = 1.0f / (1.0f + expf(-b_hv));
            const float x = a_hv + dt_hv;
            const float g = A_hv * (x > 20.0f ? x : log1pf(expf(x)));
            const float eg = expf(g);
            // a warp's GDN_CPW columns are independent: each step below runs over all of them
            // before the next, so their warp sums interleave (two shuffle chains, not two a column)
            float u[GDN_CPW], oj[GDN_CPW];
    #pragma unroll
            for (int c = 0; c < GDN_CPW; c++) {
                u[c] = 0.0f;
    #pragma unroll
                for (int e = 0; e < EPL; e++) {
                    s[c][e] *= eg;
                    u[c] += s[c][e] * k[e];
                }
            }
            ds_warp_sum_n<GDN_CPW>(u);
    #pragma unroll
            for (int c = 0; c < GDN_CPW; c++) {
                const float delta = beta * (vj[c] - u[c]);
                oj[c] = 0.0f;
    #pragma unroll
                for (int e = 0; e < EPL; e++) {
                    s[c][e] += k[e] * delta;
                    oj[c] += s[c][e] * q[e];
                }
            }
            ds_warp_sum_n<GDN_CPW>(oj);
            if constexpr (!std::is_same<ST, float>::value) {
    #pragma unroll
                for (int c = 0; c < GDN_CPW; c++)
    #pragma unroll
                    for (int e = 0; e < EPL; e++) s[c][e] = gdn_state_round<ST>(s[c][e]);
            }
            if (lane == 0)
    #pragma unroll
                for (int c = 0; c < GDN_CPW; c++)
                    o[row * ld_o + (int64_t)hv * d_v + j0 + warp + GDN_WARPS * c] = oj[c];
            if (keep && keep[row] >= 0) { // a verify row: the state after it (gdn.h "Keep")
                ST *Sk = S + keep[row] * S_stride + (int64_t)hv * d_v * d_k + lane * EPL;
    #pragma unroll
                for (int c = 0; c < GDN_CPW; c++)
                    gdn_state_store<EPL>(Sk + (int64_t)(j0 + warp + GDN_WARPS * c) * d_k, s[c]);
            }
        }
    #pragma unroll
        for (int c = 0; c < GDN_CPW; c++)
            gdn_state_store<EPL>(Sz + (int64_t)(j0 + warp + GDN_WARPS * c) * d_k, s[c]);
    }
}

#define GDN_RUNS_BESIDE_CHUNKS 64

// Column split: d_v/32 CTAs of 32 columns per head (4 at d_v 128), the same at every B: a CTA's
// columns are one batch, all their S loads in flight at once and kept in registers through a
// run; a column's arithmetic does not depend on the split. Grid (n_v, d_v/32, B or R): 48 x 4 x
// 256 for the 27B at B 256.
extern "C" cuda_launch_dims gdn_decode_rows_dims(int n_v, int d_v, int B)
{
    return (cuda_launch_dims){(unsigned)n_v, (unsigned)(d_v / (GDN_WARPS * GDN_CPW)), (unsigned)B,
                              GDN_WARPS * 32};
}

extern "C" void gdn_decode_runs(const float *d_conv, int64_t ld_conv, const float *d_b,
                                const float *d_a, int64_t ld_ba, const float *d_dt_bias,
                                const float *d_ssm_a, int n_k, int n_v, int d_k, int d_v,
                                float eps, void *d_S, bool S_bf16, int64_t S_slot_stride,
                                const int32_t *d_slot, const int32_t *d_run,
                                const int32_t *d_keep, int long_rows, float *d_o, int64_t ld_o,
                                int R, const cuda_launch *l)
{
    static_assert(GDN_WARPS * GDN_CPW == 32, "a CTA owns 32 S columns");
    DS_ASSERT(n_k > 0 && n_v % n_k == 0 && d_v > 0 && d_v % 32 == 0 && R >= 1 && R <= 65535);
    // S is read 4 elements at a time (a float4, or 8 bytes of bf16)
    DS_ASSERT(S_slot_stride % 4 == 0 && (uintptr_t)d_S % 16 == 0);
    cuda_launch_dims d = gdn_decode_rows_dims(n_v, d_v, R);
    // beside the chunked rule (long_rows > 0) most of the R run slots of a prompt pass are
    // empty: GDN_RUNS_BESIDE_CHUNKS CTAs of z each take every that-many-th run (an empty grid of
    // R = 256 cost 22 µs a 4B layer)
    if (long_rows > 0 && d.grid_z > GDN_RUNS_BESIDE_CHUNKS) d.grid_z = GDN_RUNS_BESIDE_CHUNKS;
#define GDN_DECODE_LAUNCH_ST(EPL, ST)                                                           \
    ds_launch(gdn_decode_kernel<EPL, ST>, ds_grid(d), d.block, 0, l, d_conv, ld_conv, d_b, d_a,  \
              ld_ba, d_dt_bias, d_ssm_a, n_k, d_v, eps, (ST *)d_S, S_slot_stride, d_slot, d_run, \
              d_keep, R, long_rows > 0 ? long_rows - 1 : INT_MAX, d_o, ld_o)
#define GDN_DECODE_LAUNCH(EPL)                                                                  \
    do {                                                                                        \
        if (S_bf16) GDN_DECODE_LAUNCH_ST(EPL, __nv_bfloat16);                                   \
        else GDN_DECODE_LAUNCH_ST(EPL, float);                                                  \
    } while (0)
    switch (d_k) {
    case 32: GDN_DECODE_LAUNCH(1); break;
    case 64: GDN_DECODE_LAUNCH(2); break;
    case 128: GDN_DECODE_LAUNCH(4); break;
    default: DS_ASSERT(!"gdn_decode: d_k must be 32, 64 or 128");
    }
#undef GDN_DECODE_LAUNCH
#undef GDN_DECODE_LAUNCH_ST
}

extern "C" void gdn_decode_rows(const float *d_conv, int64_t ld_conv, const float *d_b,
                                const float *d_a, int64_t ld_ba, const float *d_dt_bias,
                                const float *d_ssm_a, int n_k, int n_v, int d_k, int d_v,
                                float eps, void *d_S, bool S_bf16, int64_t S_slot_stride,
                                const int32_t *d_slot, float *d_o, int64_t ld_o, int B,
                                const cuda_launch *l)
{
    gdn_decode_runs(d_conv, ld_conv, d_b, d_a, ld_ba, d_dt_bias, d_ssm_a, n_k, n_v, d_k, d_v, eps,
                    d_S, S_bf16, S_slot_stride, d_slot, NULL, NULL, 0, d_o, ld_o, B, l);
}

extern "C" void gdn_decode(const float *d_conv, const float *d_b, const float *d_a,
                           const float *d_dt_bias, const float *d_ssm_a, int n_k, int n_v,
                           int d_k, int d_v, float eps, void *d_S, bool S_bf16, float *d_o,
                           const cuda_launch *l)
{
    gdn_decode_rows(d_conv, 0, d_b, d_a, 0, d_dt_bias, d_ssm_a, n_k, n_v, d_k, d_v, eps, d_S,
                    S_bf16, 0, NULL, d_o, 0, 1, l);
}

// One CTA per value head and row, d_v threads (d_v % 32 == 0, <= 1024).
static __global__ void gdn_norm_gated_kernel(const float *__restrict__ o, int64_t ld_o,
                                             const float *__restrict__ z, int64_t ld_z,
                                             const float *__restrict__ w, int d_v, float eps,
                                             float *__restrict__ y, int64_t ld_y,
                                             void *__restrict__ yq, int n)
{
    ds_grid_dep();
    __shared__ float scratch[32];
    const int64_t row = blockIdx.y;
    o += row * ld_o;
    z += row * ld_z;
    y = ds_row(y, row, ld_y);
    yq = ds_row_bytes(yq, row, ds_q8_bytes(n));
    const int64_t i = (int64_t)blockIdx.x * d_v + threadIdx.x;
    const float v = o[i];
    const float ss = ds_block_sum(v * v, scratch);
    const float zi = z[i];
    const float r = v / sqrtf(ss / (float)d_v + eps) * w[threadIdx.x] * (zi / (1.0f + expf(-zi)));
    if (y) y[i] = r;
    if (yq) ds_q8_store_warp(r, i & ~(int64_t)31, n, yq);
}

extern "C" cuda_launch_dims gdn_norm_gated_rows_dims(int n_v, int d_v, int B)
{
    return (cuda_launch_dims){(unsigned)n_v, (unsigned)B, 1, (unsigned)d_v};
}

extern "C" void gdn_norm_gated_rows(const float *d_o, int64_t ld_o, const float *d_z,
                                    int64_t ld_z, const float *d_norm_w, int n_v, int d_v,
                                    float eps, float *d_y, int64_t ld_y, void *d_y_q8, int B,
                                    const cuda_launch *l)
{
    DS_ASSERT(d_v % 32 == 0 && d_v <= 1024 && B >= 1 && B <= 65535);
    const cuda_launch_dims d = gdn_norm_gated_rows_dims(n_v, d_v, B);
    ds_launch(gdn_norm_gated_kernel, ds_grid(d), d.block, 0, l, d_o, ld_o, d_z, ld_z, d_norm_w,
              d_v, eps, d_y, ld_y, d_y_q8, n_v * d_v);
}

extern "C" void gdn_norm_gated(const float *d_o, const float *d_z, const float *d_norm_w, int n_v,
                               int d_v, float eps, float *d_y, void *d_y_q8, const cuda_launch *l)
{
    gdn_norm_gated_rows(d_o, 0, d_z, 0, d_norm_w, n_v, d_v, eps, d_y, 0, d_y_q8, 1, l);
}
