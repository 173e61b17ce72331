// Gated attention decode kernels (attn.h).
//
// attn_split: grid (n_kv, n_split), 256 threads. A CTA takes ATTN_CHUNK positions of one KV head
// and all G = n_h/n_kv query heads that read it, so K and V are read once. Scores: warp per
// position, lanes over d_h (coalesced F16 row), one warp sum per query head; softmax within the
// chunk; then thread t < d_h accumulates Σ p_t v_t[t] for the G heads. Partials (o unnormalised,
// max m, sum l) are merged by attn_combine, which also applies the sigmoid gate.
#include <cuda_fp16.h>

#include "kernels/cuda/attn.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/q8.cuh"

#define ATTN_THREADS 256

// ---- prep: norms, rope, cache append ----
static __global__ void attn_prep_kernel(const float *__restrict__ qg, const float *__restrict__ k,
                                        const float *__restrict__ v,
                                        const float *__restrict__ qw, const float *__restrict__ kw,
                                        int n_h, int n_kv, int d_h, int n_rot, float base,
                                        float eps, const int32_t *__restrict__ d_pos,
                                        __half *__restrict__ kc, __half *__restrict__ vc,
                                        float *__restrict__ q_out)
{
    ds_grid_dep();
    __shared__ float xs[256], scratch[32];
    const int hd = blockIdx.x, t = threadIdx.x; // blockDim.x == d_h
    const bool is_q = hd < n_h;
    const int j = is_q ? hd : hd - n_h;
    const int pos = *d_pos;
    const float x = is_q ? qg[(int64_t)j * 2 * d_h + t] : k[(int64_t)j * d_h + t];
    const float ss = ds_block_sum(x * x, scratch);
    const float xn = x / sqrtf(ss / (float)d_h + eps) * (is_q ? qw[t] : kw[t]);
    xs[t] = xn;
    __syncthreads();
    float y = xn;
    const int half = n_rot / 2;
    if (t < n_rot) {
        const int i = t < half ? t : t - half;
        const float inv_freq = 1.0f / powf(base, (float)(2 * i) / (float)n_rot);
        const float ang = (float)pos * inv_freq;
        const float c = cosf(ang), s = sinf(ang);
        const float a = xs[i], b = xs[i + half];
        y = t < half ? a * c - b * s : a * s + b * c;
    }
    if (is_q) {
        q_out[(int64_t)j * d_h + t] = y;
    } else {
        const int64_t row = ((int64_t)pos * n_kv + j) * d_h + t;
        kc[row] = __float2half(y);
        vc[row] = __float2half(v[(int64_t)j * d_h + t]);
    }
}

extern "C" void attn_prep(const float *d_qg, const float *d_k, const float *d_v,
                          const float *d_q_norm_w, const float *d_k_norm_w, int n_h, int n_kv,
                          int d_h, int n_rot, float rope_base, float eps, const int32_t *d_pos,
                          void *d_k_cache, void *d_v_cache, float *d_q_out, cuda_stream stream)
{
    DS_ASSERT(d_h % 32 == 0 && d_h <= 256 && n_rot <= d_h && n_rot % 2 == 0);
    ds_launch(attn_prep_kernel, n_h + n_kv, d_h, 0, stream, 
        d_qg, d_k, d_v, d_q_norm_w, d_k_norm_w, n_h, n_kv, d_h, n_rot, rope_base, eps, d_pos,
        (__half *)d_k_cache, (__half *)d_v_cache, d_q_out);
}

extern "C" int64_t attn_partial_floats(int n_h, int d_h, int n_ctx)
{
    const int64_t n_split = (n_ctx + ATTN_CHUNK - 1) / ATTN_CHUNK;
    return (int64_t)n_h * n_split * (d_h + 2);
}

// partial layout: o [n_h][n_split][d_h], then m [n_h][n_split], then l [n_h][n_split]
//
// attn_split: the CTA first queues its chunk of V (ATTN_CHUNK rows of d_h F16) into shared
// memory with cp.async, then each warp loads all of its K rows (ATTN_CHUNK / 8 positions, 16
// bytes a lane) before the first dot, so the chunk costs about one memory latency, not one per
// position.
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}

template <int EPL> // d_h = 32 * EPL
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_split_kernel(const float *__restrict__ q, const __half *__restrict__ kc,
                      const __half *__restrict__ vc, int n_h, int n_kv,
                      const int32_t *__restrict__ d_pos, float *__restrict__ part, int n_split)
{
    ds_grid_dep();
    constexpr int d_h = 32 * EPL, NW = ATTN_THREADS / 32, PPW = ATTN_CHUNK / NW;
    __shared__ float sc[ATTN_MAX_GROUP][ATTN_CHUNK];
    __shared__ float stat[ATTN_MAX_GROUP][2];
    __shared__ __align__(16) __half sv[ATTN_CHUNK][d_h];
    const int j = blockIdx.x, split = blockIdx.y, G = n_h / n_kv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = *d_pos + 1;
    const int t0 = split * ATTN_CHUNK, t1 = min(t0 + ATTN_CHUNK, n);
    float *po = part, *pm = part + (int64_t)n_h * n_split * d_h, *pl = pm + (int64_t)n_h * n_split;
    if (t0 >= n) {
        if (threadIdx.x < G) {
            pm[(int64_t)(j * G + threadIdx.x) * n_split + split] = -INFINITY;
            pl[(int64_t)(j * G + threadIdx.x) * n_split + split] = 0.0f;
        }
        return;
    }
    const int64_t rs = (int64_t)n_kv * d_h; // elements between positions
    // V chunk -> shared memory (16-byte pieces; rows past t1 are not read)
    constexpr int PIECES = d_h / 8; // 16-byte pieces per row
    for (int i = threadIdx.x; i < (t1 - t0) * PIECES; i += ATTN_THREADS) {
        const int t = i / PIECES, c = i % PIECES;
        cp_async16(&sv[t][c * 8], vc + (int64_t)(t0 + t) * rs + (int64_t)j * d_h + c * 8);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    // K rows of this warp's positions t0 + warp + NW*p, all loads first
    float kf[PPW][EPL];
#pragma unroll
    for (int p = 0; p < PPW; p++) {
        const int t = t0 + warp + NW * p;
        const __half *kr = kc + (int64_t)(t < t1 ? t : t0) * rs + (int64_t)j * d_h + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e += 2) {
            const float2 f = __half22float2(*(const __half2 *)(kr + e));
            kf[p][e] = f.x;
            kf[p][e + 1] = f.y;
        }
    }
    const float scale = rsqrtf((float)d_h);
    float qr[ATTN_MAX_GROUP][EPL];
#pragma unroll
    for (int g = 0; g < ATTN_MAX_GROUP; g++)
#pragma unroll
        for (int e = 0; e < EPL; e++)
            qr[g][e] = g < G ? q[(int64_t)(j * G + g) * d_h + lane * EPL + e] * scale : 0.0f;
    // scores
#pragma unroll
    for (int p = 0; p < PPW; p++) {
        const int t = t0 + warp + NW * p;
#pragma unroll
        for (int g = 0; g < ATTN_MAX_GROUP; g++) {
            if (g >= G) break;
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++) s += qr[g][e] * kf[p][e];
            s = ds_warp_sum(s);
            if (lane == 0 && t < t1) sc[g][t - t0] = s;
        }
    }
    __syncthreads();
    // softmax within the chunk: warp g handles head g
    for (int g = warp; g < G; g += NW) {
        float m = -INFINITY;
        for (int t = lane; t < t1 - t0; t += 32) m = fmaxf(m, sc[g][t]);
        m = ds_warp_max(m);
        float l = 0.0f;
        for (int t = lane; t < t1 - t0; t += 32) {
            const float p = expf(sc[g][t] - m);
            sc[g][t] = p;
            l += p;
        }
        l = ds_warp_sum(l);
        if (lane == 0) stat[g][0] = m, stat[g][1] = l;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    // o_g[c] = Σ_p p v_p[c], V from shared memory
    for (int c = threadIdx.x; c < d_h; c += ATTN_THREADS) {
        float acc[ATTN_MAX_GROUP] = {0};
#pragma unroll 8
        for (int t = 0; t < t1 - t0; t++) {
            const float vv = __half2float(sv[t][c]);
#pragma unroll
            for (int g = 0; g < ATTN_MAX_GROUP; g++) acc[g] += sc[g < G ? g : 0][t] * vv;
        }
#pragma unroll
        for (int g = 0; g < ATTN_MAX_GROUP; g++)
            if (g < G) po[((int64_t)(j * G + g) * n_split + split) * d_h + c] = acc[g];
    }
    if (threadIdx.x < G) {
        pm[(int64_t)(j * G + threadIdx.x) * n_split + split] = stat[threadIdx.x][0];
        pl[(int64_t)(j * G + threadIdx.x) * n_split + split] = stat[threadIdx.x][1];
    }
}

// one CTA per query head, d_h threads: merge the splits that hold positions (the others are
// skipped), divide, gate, write F32 + Q8. The threads share the per-split work: block max of m,
// the weights exp(m_s - M) into shared memory (tiles of COMBINE_TILE splits), block sum of
// w_s l_s; then thread t sums w_s o_s[t] with independent loads.
#define COMBINE_TILE 1024

static __device__ __forceinline__ float block_max(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ds_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -INFINITY;
    return ds_warp_max(v);
}

static __global__ void attn_combine_kernel(const float *__restrict__ part,
                                           const float *__restrict__ qg, int n_h, int d_h,
                                           int n_split, const int32_t *__restrict__ d_pos,
                                           float *__restrict__ o, void *__restrict__ oq)
{
    ds_grid_dep();
    __shared__ float sw[COMBINE_TILE], scratch[32];
    const int h = blockIdx.x, t = threadIdx.x;
    const float *po = part, *pm = part + (int64_t)n_h * n_split * d_h, *pl = pm + (int64_t)n_h * n_split;
    pm += (int64_t)h * n_split;
    pl += (int64_t)h * n_split;
    po += (int64_t)h * n_split * d_h;
    const int ns = min(n_split, (*d_pos + 1 + ATTN_CHUNK - 1) / ATTN_CHUNK);
    float M = -INFINITY;
    for (int s = t; s < ns; s += blockDim.x)
        if (pl[s] > 0.0f) M = fmaxf(M, pm[s]);
    M = block_max(M, scratch);
    float L = 0.0f;
    for (int s = t; s < ns; s += blockDim.x)
        if (pl[s] > 0.0f) L += expf(pm[s] - M) * pl[s];
    L = ds_block_sum(L, scratch);
    float acc = 0.0f;
    for (int s0 = 0; s0 < ns; s0 += COMBINE_TILE) {
        const int s1 = min(ns, s0 + COMBINE_TILE);
        __syncthreads();
        for (int s = s0 + t; s < s1; s += blockDim.x)
            sw[s - s0] = pl[s] > 0.0f ? expf(pm[s] - M) : 0.0f;
        __syncthreads();
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        int s = s0;
        for (; s + 4 <= s1; s += 4) {
            a0 += sw[s - s0] * po[(int64_t)s * d_h + t];
            a1 += sw[s + 1 - s0] * po[(int64_t)(s + 1) * d_h + t];
            a2 += sw[s + 2 - s0] * po[(int64_t)(s + 2) * d_h + t];
            a3 += sw[s + 3 - s0] * po[(int64_t)(s + 3) * d_h + t];
        }
        for (; s < s1; s++) a0 += sw[s - s0] * po[(int64_t)s * d_h + t];
        acc += (a0 + a1) + (a2 + a3);
    }
    const float gate = qg[(int64_t)h * 2 * d_h + d_h + t];
    const float r = acc / L * (1.0f / (1.0f + expf(-gate)));
    const int64_t i = (int64_t)h * d_h + t;
    if (o) o[i] = r;
    if (oq) ds_q8_store_warp(r, i & ~(int64_t)31, (int64_t)n_h * d_h, oq);
}

extern "C" void attn_decode(const float *d_q, const float *d_qg, const void *d_k_cache,
                            const void *d_v_cache, int n_h, int n_kv, int d_h, int n_ctx,
                            const int32_t *d_pos, float *d_partial, float *d_o, void *d_o_q8,
                            cuda_stream stream)
{
    DS_ASSERT(n_kv > 0 && n_h % n_kv == 0 && n_h / n_kv <= ATTN_MAX_GROUP);
    DS_ASSERT(d_h % 32 == 0 && d_h <= 256);
    const int n_split = (n_ctx + ATTN_CHUNK - 1) / ATTN_CHUNK;
    const dim3 grid(n_kv, n_split);
    const __half *kc = (const __half *)d_k_cache, *vc = (const __half *)d_v_cache;
    switch (d_h / 32) {
    case 1: ds_launch(attn_split_kernel<1>, grid, ATTN_THREADS, 0, stream, d_q, kc, vc, n_h, n_kv, d_pos, d_partial, n_split); break;
    case 2: ds_launch(attn_split_kernel<2>, grid, ATTN_THREADS, 0, stream, d_q, kc, vc, n_h, n_kv, d_pos, d_partial, n_split); break;
    case 4: ds_launch(attn_split_kernel<4>, grid, ATTN_THREADS, 0, stream, d_q, kc, vc, n_h, n_kv, d_pos, d_partial, n_split); break;
    case 8: ds_launch(attn_split_kernel<8>, grid, ATTN_THREADS, 0, stream, d_q, kc, vc, n_h, n_kv, d_pos, d_partial, n_split); break;
    default: DS_ASSERT(!"attn_decode: d_h must be 32, 64, 128 or 256");
    }
    ds_launch(attn_combine_kernel, n_h, d_h, 0, stream, d_partial, d_qg, n_h, d_h, n_split, d_pos, d_o, d_o_q8);
}
