// Gated DeltaNet decode kernels (gdn.h).
//
// gdn_decode: grid (n_v, splits), 4 warps per CTA. Every CTA normalises its key head's q and k
// (128 values each, cheap to redo), then owns d_v/splits value columns j; a warp takes one
// column at a time: lanes hold S[hv][j][lane*EPL ..] (coalesced), decay, u = S_j·k (warp sum),
// δ = β(v_j − u), S_j += δ k, o_j = S_j·q (warp sum). Columns are independent, which is what
// lets one head spread over several CTAs; the per-head norm runs in gdn_norm_gated.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/gdn_conv.cuh"
#include "kernels/cuda/q8.cuh"

#define GDN_WARPS 4
#define GDN_CPW 8 // S columns in flight per warp

static __global__ void gdn_conv_kernel(const float *__restrict__ mixed,
                                       const float *__restrict__ w, float *__restrict__ state,
                                       int C, int K, float *__restrict__ out)
{
    ds_grid_dep();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    out[c] = gdn_conv_channel(mixed[c], w + (int64_t)c * K, state + (int64_t)c * (K - 1), K);
}

extern "C" void gdn_conv(const float *d_mixed, const float *d_conv_w, float *d_conv_state, int C,
                         int K_conv, float *d_out, const cuda_launch *l)
{
    DS_ASSERT(C > 0 && K_conv >= 1);
    ds_launch(gdn_conv_kernel, ds_div_up(C, 256), 256, 0, l, d_mixed, d_conv_w, d_conv_state, C,
                                                           K_conv, d_out);
}

// what gdn_decode_norm adds: the gated RMSNorm of a head by the last of its CTAs to finish
template <int EPL> // d_k = 32 * EPL
static __global__ void __launch_bounds__(GDN_WARPS * 32)
    gdn_decode_kernel(const float *__restrict__ conv, const float *__restrict__ b,
                      const float *__restrict__ a, const float *__restrict__ dt_bias,
                      const float *__restrict__ ssm_a, int n_k, int d_v, float eps,
                      float *__restrict__ S, float *__restrict__ o, int cols)
{
    constexpr int d_k = 32 * EPL;
    __shared__ float sq[d_k], sk[d_k], scratch[32];
    const int hv = blockIdx.x, kh = hv % n_k, D_k = n_k * d_k;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j0 = blockIdx.y * cols, j1 = min(j0 + cols, d_v);
    // batches of GDN_WARPS * GDN_CPW columns: every S column of a batch is loaded before the
    // first is used (one memory latency per batch, not one per column); the first batch's loads
    // are issued before the q/k norms so they overlap them
    const float *v = conv + 2 * D_k + (int64_t)hv * d_v;
    float s[GDN_CPW][EPL] = {}, vj[GDN_CPW] = {};
    auto load_batch = [&](int jb) {
#pragma unroll
        for (int c = 0; c < GDN_CPW; c++) {
            const int j = jb + warp + GDN_WARPS * c;
            if (j >= j1) break;
            const float *Sj = S + ((int64_t)hv * d_v + j) * d_k + lane * EPL;
            if constexpr (EPL == 4) {
                const float4 t = *(const float4 *)Sj;
                s[c][0] = t.x, s[c][1] = t.y, s[c][2] = t.z, s[c][3] = t.w;
            } else {
#pragma unroll
                for (int e = 0; e < EPL; e++) s[c][e] = Sj[e];
            }
        }
    };
    auto load_v = [&](int jb) {
#pragma unroll
        for (int c = 0; c < GDN_CPW; c++) {
            const int j = jb + warp + GDN_WARPS * c;
            if (j >= j1) break;
            vj[c] = v[j];
        }
    };
    // S (this layer's state, last written by this kernel one token ago) and the weights do not
    // depend on the preceding kernel: under programmatic dependent launch their loads go out
    // before griddepcontrol.wait and overlap the in-projection GEMV's tail
    load_batch(j0);
    const float dt_hv = dt_bias[hv], A_hv = ssm_a[hv];
    ds_grid_dep();
    load_v(j0);
    const float b_hv = b[hv], a_hv = a[hv];
    // q, k of key head kh: L2 norm (x / sqrt(Σx² + eps)), q also scaled by 1/sqrt(d_k)
    float qv = 0.0f, kv = 0.0f;
    for (int i = threadIdx.x; i < d_k; i += blockDim.x) {
        qv = conv[kh * d_k + i];
        kv = conv[D_k + kh * d_k + i];
        sq[i] = qv;
        sk[i] = kv;
    }
    float ssq = 0.0f, ssk = 0.0f;
    for (int i = threadIdx.x; i < d_k; i += blockDim.x) ssq += sq[i] * sq[i], ssk += sk[i] * sk[i];
    ssq = ds_block_sum(ssq, scratch);
    ssk = ds_block_sum(ssk, scratch);
    const float rq = 1.0f / sqrtf(ssq + eps) / sqrtf((float)d_k), rk = 1.0f / sqrtf(ssk + eps);
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
    // the batch's GDN_CPW columns of a warp are independent: each step below runs over all of
    // them before the next, so their warp sums interleave (two shuffle chains per batch, not
    // two per column). Columns past j1 compute on stale registers and are not stored.
    for (int jb = j0; jb < j1; jb += GDN_WARPS * GDN_CPW) {
        if (jb != j0) load_batch(jb), load_v(jb);
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
#pragma unroll
        for (int c = 0; c < GDN_CPW; c++) {
            const int j = jb + warp + GDN_WARPS * c;
            if (j >= j1) break;
            float *Sj = S + ((int64_t)hv * d_v + j) * d_k + lane * EPL;
            if constexpr (EPL == 4) {
                *(float4 *)Sj = make_float4(s[c][0], s[c][1], s[c][2], s[c][3]);
            } else {
#pragma unroll
                for (int e = 0; e < EPL; e++) Sj[e] = s[c][e];
            }
            if (lane == 0) o[(int64_t)hv * d_v + j] = oj[c];
        }
    }
}

extern "C" void gdn_decode(const float *d_conv, const float *d_b, const float *d_a,
                           const float *d_dt_bias, const float *d_ssm_a, int n_k, int n_v,
                           int d_k, int d_v, float eps, float *d_S, float *d_o,
                           const cuda_launch *l)
{
    DS_ASSERT(n_k > 0 && n_v % n_k == 0 && d_v > 0 && d_v % 32 == 0);
    const int splits = d_v >= 128 ? 4 : d_v / 32; // 32 columns per CTA
    const int cols = d_v / splits;
    const dim3 grid(n_v, splits);
    switch (d_k) {
    case 32:
        ds_launch(gdn_decode_kernel<1>, grid, GDN_WARPS * 32, 0, l, d_conv, d_b, d_a, d_dt_bias,
                  d_ssm_a, n_k, d_v, eps, d_S, d_o, cols);
        break;
    case 64:
        ds_launch(gdn_decode_kernel<2>, grid, GDN_WARPS * 32, 0, l, d_conv, d_b, d_a, d_dt_bias,
                  d_ssm_a, n_k, d_v, eps, d_S, d_o, cols);
        break;
    case 128:
        ds_launch(gdn_decode_kernel<4>, grid, GDN_WARPS * 32, 0, l, d_conv, d_b, d_a, d_dt_bias,
                  d_ssm_a, n_k, d_v, eps, d_S, d_o, cols);
        break;
    default:
        DS_ASSERT(!"gdn_decode: d_k must be 32, 64 or 128");
    }
}

// One CTA per value head, d_v threads (d_v % 32 == 0, <= 1024).
static __global__ void gdn_norm_gated_kernel(const float *__restrict__ o,
                                             const float *__restrict__ z,
                                             const float *__restrict__ w, int d_v, float eps,
                                             float *__restrict__ y, void *__restrict__ yq, int n)
{
    ds_grid_dep();
    __shared__ float scratch[32];
    const int64_t i = (int64_t)blockIdx.x * d_v + threadIdx.x;
    const float v = o[i];
    const float ss = ds_block_sum(v * v, scratch);
    const float zi = z[i];
    const float r = v / sqrtf(ss / (float)d_v + eps) * w[threadIdx.x] * (zi / (1.0f + expf(-zi)));
    if (y) y[i] = r;
    if (yq) ds_q8_store_warp(r, i & ~(int64_t)31, n, yq);
}

extern "C" void gdn_norm_gated(const float *d_o, const float *d_z, const float *d_norm_w, int n_v,
                               int d_v, float eps, float *d_y, void *d_y_q8, const cuda_launch *l)
{
    DS_ASSERT(d_v % 32 == 0 && d_v <= 1024);
    ds_launch(gdn_norm_gated_kernel, n_v, d_v, 0, l, d_o, d_z, d_norm_w, d_v, eps, d_y, d_y_q8,
              n_v * d_v);
}
