// Gated attention decode kernels (attn.h).
//
// attn_split: grid (n_kv, split CTAs, B). A CTA takes super-chunks (attn.h) of one KV head and
// all G = n_h/n_kv query heads that read it, so K and V are read once; its warps split each
// ATTN_CHUNK positions of a super-chunk and run an online softmax each through all of its
// chunks (below). Partials (o unnormalised, max m, sum l) are
// merged by attn_combine, which also applies the sigmoid gate. The cache's element type T
// (__half or float, attn_kv_type) is a template parameter of prep and split.
//
// Every kernel takes B rows (the grid's last dimension: row = sequence slot d_slot[row] at
// position d_pos[row]); the B = 1 launchers are the rows launchers with B = 1 and no slot map.
#include <cuda_fp16.h>

#include "kernels/cuda/attn.h"
#include "kernels/cuda/attn_kv.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/q8.cuh"


// ---- prep: norms, rope, cache append ----
static __device__ __forceinline__ void kv_store(__half *p, float x) { *p = __float2half(x); }
static __device__ __forceinline__ void kv_store(float *p, float x) { *p = x; }

template <typename T> // cache element: __half or float
static __global__ void attn_prep_kernel(const float *__restrict__ qg, const float *__restrict__ k,
                                        const float *__restrict__ v, int64_t ld_in,
                                        const float *__restrict__ qw, const float *__restrict__ kw,
                                        int n_h, int n_kv, int d_h, int n_rot, float base,
                                        float eps, const int32_t *__restrict__ d_pos,
                                        const int32_t *__restrict__ d_slot,
                                        const int32_t *__restrict__ table, int table_ld,
                                        T *__restrict__ kc, T *__restrict__ vc,
                                        float *__restrict__ q_out, int64_t ld_q)
{
    ds_grid_dep();
    __shared__ float xs[256], scratch[32];
    const int hd = blockIdx.x, t = threadIdx.x; // blockDim.x == d_h
    const int64_t r = blockIdx.y;                // the row
    const bool is_q = hd < n_h;
    const int j = is_q ? hd : hd - n_h;
    const int pos = d_pos[r];
    const float x = is_q ? qg[r * ld_in + (int64_t)j * 2 * d_h + t] : k[r * ld_in + (int64_t)j * d_h + t];
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
        q_out[r * ld_q + (int64_t)j * d_h + t] = y;
    } else {
        const int64_t slot = d_slot ? d_slot[r] : 0;
        const int64_t blk = attn_kv_block(table, table_ld, slot, pos / ATTN_KV_BLOCK);
        const int64_t at = ((blk * ATTN_KV_BLOCK + pos % ATTN_KV_BLOCK) * n_kv + j) * d_h + t;
        kv_store(kc + at, y);
        kv_store(vc + at, v[r * ld_in + (int64_t)j * d_h + t]);
    }
}

extern "C" cuda_launch_dims attn_prep_rows_dims(int n_h, int n_kv, int d_h, int B)
{
    return (cuda_launch_dims){(unsigned)(n_h + n_kv), (unsigned)B, 1, (unsigned)d_h};
}

extern "C" void attn_prep_rows(const float *d_qg, const float *d_k, const float *d_v,
                               int64_t ld_in, const float *d_q_norm_w, const float *d_k_norm_w,
                               int n_h, int n_kv, int d_h, int n_rot, float rope_base, float eps,
                               const int32_t *d_pos, const int32_t *d_slot,
                               const int32_t *d_table, int table_ld, void *d_k_cache,
                               void *d_v_cache, float *d_q_out, int64_t ld_q,
                               attn_kv_type kv_type, int B, const cuda_launch *l)
{
    DS_ASSERT(d_h % 32 == 0 && d_h <= 256 && n_rot <= d_h && n_rot % 2 == 0);
    DS_ASSERT(kv_type == ATTN_KV_F16 || kv_type == ATTN_KV_F32);
    DS_ASSERT(B >= 1 && B <= 65535);
    const cuda_launch_dims d = attn_prep_rows_dims(n_h, n_kv, d_h, B);
    if (kv_type == ATTN_KV_F32)
        ds_launch(attn_prep_kernel<float>, ds_grid(d), d.block, 0, l, d_qg, d_k, d_v, ld_in,
                  d_q_norm_w, d_k_norm_w, n_h, n_kv, d_h, n_rot, rope_base, eps, d_pos, d_slot,
                  d_table, table_ld, (float *)d_k_cache, (float *)d_v_cache, d_q_out, ld_q);
    else
        ds_launch(attn_prep_kernel<__half>, ds_grid(d), d.block, 0, l, d_qg, d_k, d_v, ld_in,
                  d_q_norm_w, d_k_norm_w, n_h, n_kv, d_h, n_rot, rope_base, eps, d_pos, d_slot,
                  d_table, table_ld, (__half *)d_k_cache, (__half *)d_v_cache, d_q_out, ld_q);
}

extern "C" void attn_prep(const float *d_qg, const float *d_k, const float *d_v,
                          const float *d_q_norm_w, const float *d_k_norm_w, int n_h, int n_kv,
                          int d_h, int n_rot, float rope_base, float eps, const int32_t *d_pos,
                          const int32_t *d_table, void *d_k_cache, void *d_v_cache,
                          float *d_q_out, attn_kv_type kv_type, const cuda_launch *l)
{
    attn_prep_rows(d_qg, d_k, d_v, 0, d_q_norm_w, d_k_norm_w, n_h, n_kv, d_h, n_rot, rope_base,
                   eps, d_pos, NULL, d_table, 0, d_k_cache, d_v_cache, d_q_out, 0, kv_type, 1, l);
}

extern "C" int64_t attn_partial_floats(int n_h, int d_h, int n_ctx)
{
    return partial_row_floats(n_h, attn_n_split(n_ctx), d_h);
}

extern "C" int64_t attn_partial_floats_rows(int n_h, int d_h, int n_ctx, int B)
{
    return (int64_t)B * attn_partial_floats(n_h, d_h, n_ctx);
}

// partial layout, per row: o [n_h][n_split][d_h], then m [n_h][n_split], then l [n_h][n_split]
// (row r's at r·attn_partial_floats, a multiple of 64 floats; n_split = attn_n_split(n_ctx))
//
// attn_split: grid (n_kv, split CTAs, B), ATTN_SPLIT_WARPS warps. The CTA takes super-chunks
// `split` = blockIdx.y, + gridDim.y, ... below its row's position (at B = 1 gridDim.y is n_split:
// one super-chunk at most; attn_decode_rows_dims); super-chunk `split` is positions
// [split·sp, split·sp + sp) of KV head j (sp = attn_split_positions(n_ctx)), for its G = n_h/n_kv
// query heads, computed the same whichever CTA takes it. It goes chunk by chunk (ATTN_CHUNK
// positions, in one KV block); each warp takes ATTN_CHUNK/ATTN_SPLIT_WARPS consecutive positions
// of every chunk and keeps one online softmax through them all, lanes over d_h (lane l holds dims
// [EPL·l, EPL·l + EPL)). Per batch of ATTN_BATCH positions the warp first loads every K and V
// row (16 bytes a lane at d_h 256 in F16, 2 x 16 in F32: all of a batch's DRAM requests in
// flight at once), then per position and head: score = warp sum of q·k, online softmax
// (running max m, sum l, the o accumulator rescaled), o += p·v in registers. The warps' (m, l,
// o) are merged through shared memory into the super-chunk's partial. Registers hold q and o for exactly G heads (G is a template
// parameter), which is what keeps the kernel at several CTAs per SM. An F32 row takes twice the
// registers of an F16 one, so the F32 batches are halved where q and o already fill most.
#define ATTN_SPLIT_WARPS 4
#define ATTN_BATCH 8

template <typename T, int EPL> struct kv_raw; // EPL elements of one row, as loaded
template <> struct kv_raw<__half, 1> { unsigned short v; };
template <> struct kv_raw<__half, 2> { unsigned v; };
template <> struct kv_raw<__half, 4> { uint2 v; };
template <> struct kv_raw<__half, 8> { uint4 v; };
template <> struct kv_raw<float, 1> { float v; };
template <> struct kv_raw<float, 2> { float2 v; };
template <> struct kv_raw<float, 4> { float4 v; };
template <> struct kv_raw<float, 8> { float4 v, w; }; // two 16-byte loads

template <typename T, int EPL>
static __device__ __forceinline__ kv_raw<T, EPL> load_kv(const T *p)
{
    kv_raw<T, EPL> r;
    if constexpr (sizeof(T) * EPL > 16) {
        r.v = ((const float4 *)p)[0];
        r.w = ((const float4 *)p)[1];
    } else {
        r.v = *(const decltype(r.v) *)p;
    }
    return r;
}
// element e (a compile-time constant after unrolling) by shifts, so nothing goes to local memory
static __device__ __forceinline__ unsigned kv_word(const kv_raw<__half, 8> &r, int k)
{
    return k == 0 ? r.v.x : k == 1 ? r.v.y : k == 2 ? r.v.z : r.v.w;
}
static __device__ __forceinline__ unsigned kv_word(const kv_raw<__half, 4> &r, int k)
{
    return k == 0 ? r.v.x : r.v.y;
}
static __device__ __forceinline__ unsigned kv_word(const kv_raw<__half, 2> &r, int) { return r.v; }
static __device__ __forceinline__ unsigned kv_word(const kv_raw<__half, 1> &r, int) { return r.v; }
template <int EPL>
static __device__ __forceinline__ float kv_at(const kv_raw<__half, EPL> &r, int e)
{
    const unsigned w = kv_word(r, e >> 1);
    return __half2float(__ushort_as_half((unsigned short)((e & 1) ? w >> 16 : w & 0xffffu)));
}
static __device__ __forceinline__ float f4_at(const float4 &v, int e)
{
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}
static __device__ __forceinline__ float kv_at(const kv_raw<float, 8> &r, int e)
{
    return e < 4 ? f4_at(r.v, e) : f4_at(r.w, e - 4);
}
static __device__ __forceinline__ float kv_at(const kv_raw<float, 4> &r, int e) { return f4_at(r.v, e); }
static __device__ __forceinline__ float kv_at(const kv_raw<float, 2> &r, int e)
{
    return e == 0 ? r.v.x : r.v.y;
}
static __device__ __forceinline__ float kv_at(const kv_raw<float, 1> &r, int) { return r.v; }

// What a warp stages of its positions: the K rows then the V rows (d_h elements of head j each)
// in shared memory, copied by cp.async, 16 bytes a lane at a time; positions [a, b) of the
// warp's first position w0. The lanes wait for their copies and meet at a __syncwarp before
// reading (attn_split_kernel).
template <typename T, int d_h>
static __device__ __forceinline__ void stage_rows(T *sk, T *sv, const T *kb, const T *vb,
                                                  int64_t rs, int w0, int a, int b, int lane)
{
    constexpr int P = d_h * (int)sizeof(T) / 16; // 16-byte pieces of a row
    for (int i = lane; i < (b - a) * P; i += 32) {
        const int t = a + i / P, p = i % P;
        cp_async16((uint4 *)(sk + (t - w0) * d_h) + p, (const uint4 *)(kb + t * rs) + p, true);
        cp_async16((uint4 *)(sv + (t - w0) * d_h) + p, (const uint4 *)(vb + t * rs) + p, true);
    }
}

// K and V of a chunk staged in shared memory when they fit beside the other buffers (every F16
// cache; F32 up to d_h 128); else each warp loads its rows into registers.
// A staged chunk's positions go through the online softmax 2 at a time (its K and V already in
// shared memory, the batch does not set the loads in flight), and its registers are capped for
// 4 CTAs an SM: one wave for a 4K context at B = 1. On the H200 (27B / 4B decode at 4K, tok/s):
// registers 141.3 / 538.5, staged with the register build's batch 142.2 / 542.5, capped for 3
// CTAs 142.5 / 546.4, 2 a batch capped for 4 (this) 143.0 / 548.5.
#define ATTN_STAGE_BYTES 32768
#define ATTN_STAGE_BATCH 2
template <typename T, int EPL> static constexpr __host__ __device__ bool attn_staged()
{
    return 2 * ATTN_CHUNK * 32 * EPL * (int)sizeof(T) <= ATTN_STAGE_BYTES;
}

template <typename T, int EPL, int G> // T: cache element, d_h = 32 * EPL, G = n_h / n_kv
static __global__ void __launch_bounds__(ATTN_SPLIT_WARPS * 32, attn_staged<T, EPL>() ? 4 : 1)
    attn_split_kernel(const float *__restrict__ q, int64_t ld_q, const T *__restrict__ kc,
                      const T *__restrict__ vc, const int32_t *__restrict__ table, int table_ld,
                      const int32_t *__restrict__ d_slot, const int32_t *__restrict__ d_pos,
                      const int32_t *__restrict__ d_skip, int n_h, int n_kv,
                      float *__restrict__ part, int n_split, int sp, int early)
{
    constexpr int d_h = 32 * EPL, NW = ATTN_SPLIT_WARPS, PPW = ATTN_CHUNK / NW;
    constexpr int big = sizeof(T) == 2 ? 32 : 16; // registers: q, o for G heads, the rows
    constexpr int ST = 2 * ATTN_CHUNK * d_h * (int)sizeof(T); // a chunk's K and V
    constexpr bool STAGE = attn_staged<T, EPL>();
    constexpr int B = STAGE ? ATTN_STAGE_BATCH : G * EPL > big ? ATTN_BATCH / 2 : ATTN_BATCH;
    constexpr int OB = NW * G * d_h * 4, SB = STAGE && ST > OB ? ST : OB;
    __shared__ float s_m[NW][G], s_l[NW][G];
    // the warps' o for the merge, and (staging) the chunk's K and V before it: the merge begins
    // after a barrier that follows the last read of the staged rows
    __shared__ __align__(16) unsigned char s_buf[SB];
    float(*s_o)[G][d_h] = reinterpret_cast<float(*)[G][d_h]>(s_buf);
    T *const sk = reinterpret_cast<T *>(s_buf) + (threadIdx.x >> 5) * 2 * PPW * d_h;
    T *const sv = sk + PPW * d_h;
    const int j = blockIdx.x;
    const int64_t row = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t rs = (int64_t)n_kv * d_h; // elements between positions
    // early (B = 1, attn_decode): the position and the cache rows below it were written before
    // the preceding launch, so its first chunk's rows below the position are copied before
    // waiting for it (under PDL they overlap attn_prep); the position's own row after
    int n = 0, staged = 0; // positions of the first chunk staged early: [w0, staged)
    int64_t shift0 = 0;
    if (STAGE && early) {
        n = d_pos[row] + 1;
        const int split = blockIdx.y, t0 = split * sp;
        if (t0 < n) {
            const int t1 = min(t0 + ATTN_CHUNK, n), w0 = t0 + warp * PPW, w1 = min(w0 + PPW, t1);
            const int64_t slot = d_slot ? d_slot[row] : 0, b0 = t0 / ATTN_KV_BLOCK;
            shift0 = (attn_kv_block(table, table_ld, slot, (int)b0) - b0) * ATTN_KV_BLOCK * rs;
            staged = max(w0, min(w1, n - 1));
            stage_rows<T, d_h>(sk, sv, kc + j * d_h + shift0, vc + j * d_h + shift0, rs, w0, w0,
                               staged, lane);
        }
    }
    ds_grid_dep();
    if (d_skip && d_skip[blockIdx.z]) return; // attn_prefill_runs wrote this row's partials
    n = d_pos[row] + 1;
    // a super-chunk past the row's position has no partial: attn_combine reads those below it
    if ((int)blockIdx.y * sp >= n) return;
    const int64_t slot = d_slot ? d_slot[row] : 0;
    part += row * partial_row_floats(n_h, n_split, d_h);
    float *po = part, *pm = part + (int64_t)n_h * n_split * d_h, *pl = pm + (int64_t)n_h * n_split;
    const T *kh = kc + (int64_t)j * d_h + lane * EPL, *vh = vc + (int64_t)j * d_h + lane * EPL;
    const float scale = rsqrtf((float)d_h);
    q += row * ld_q;
    // staging: the G scaled query heads in shared memory too (registers for o, not q: 4 CTAs
    // an SM where the register build held 2)
    __shared__ __align__(16) float s_q[STAGE ? G : 1][d_h];
    if constexpr (STAGE) {
        for (int i = threadIdx.x; i < G * d_h; i += NW * 32)
            s_q[i / d_h][i % d_h] = q[(int64_t)j * G * d_h + i] * scale;
        __syncthreads();
    }
    for (int split = blockIdx.y; split * sp < n; split += gridDim.y) {
        if (split != (int)blockIdx.y) __syncthreads(); // the last split's merge has read s_*
        float qr[STAGE ? 1 : G][EPL], o[G][EPL], m[G], l[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                if constexpr (!STAGE) qr[g][e] = q[(int64_t)(j * G + g) * d_h + lane * EPL + e] * scale;
                o[g][e] = 0.0f;
            }
        }
        const int s0 = split * sp, s1 = min(s0 + sp, n);
        for (int t0 = s0; t0 < s1; t0 += ATTN_CHUNK) {
            const int t1 = min(t0 + ATTN_CHUNK, s1);
            // the chunk lies in one KV block: position t of it at kh + shift + t·rs
            const int64_t b0 = t0 / ATTN_KV_BLOCK;
            const int64_t shift =
                (attn_kv_block(table, table_ld, slot, (int)b0) - b0) * ATTN_KV_BLOCK * rs;
            const T *kb = kh + shift, *vb = vh + shift;
            const int w0 = t0 + warp * PPW, w1 = min(w0 + PPW, t1);
            if constexpr (STAGE) {
                if (t0 != s0) __syncwarp(); // every lane has read the warp's rows of the last chunk
                const int from = split == (int)blockIdx.y && t0 == s0 && staged > w0 ? staged : w0;
                stage_rows<T, d_h>(sk, sv, kc + j * d_h + shift, vc + j * d_h + shift, rs, w0, from,
                                   w1, lane);
                cp_async_commit();
                cp_async_wait_all();
                __syncwarp();
            }
            for (int tb = w0; tb < w1; tb += B) {
                kv_raw<T, EPL> kr[B], vr[B];
#pragma unroll
                for (int b = 0; b < B; b++) { // past w1: reload the batch's first row (in bounds)
                    const int64_t t = tb + b < w1 ? tb + b : tb;
                    if constexpr (STAGE) {
                        kr[b] = load_kv<T, EPL>(sk + (t - w0) * d_h + lane * EPL);
                        vr[b] = load_kv<T, EPL>(sv + (t - w0) * d_h + lane * EPL);
                    } else {
                        kr[b] = load_kv<T, EPL>(kb + t * rs);
                        vr[b] = load_kv<T, EPL>(vb + t * rs);
                    }
                }
                // every score of the batch first (B x G independent warp sums, interleaved),
                // then one online-softmax step per head for the whole batch
                float sc[B][G];
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float qv[EPL];
#pragma unroll
                    for (int e = 0; e < EPL; e++) {
                        if constexpr (STAGE) qv[e] = s_q[g][lane * EPL + e];
                        else qv[e] = qr[g][e];
                    }
#pragma unroll
                    for (int b = 0; b < B; b++) {
                        float a = 0.0f;
#pragma unroll
                        for (int e = 0; e < EPL; e++) a += qv[e] * kv_at(kr[b], e);
                        sc[b][g] = a;
                    }
                }
                ds_warp_sum_n<B * G>(&sc[0][0]);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float mn = m[g];
#pragma unroll
                    for (int b = 0; b < B; b++)
                        if (tb + b < w1) mn = fmaxf(mn, sc[b][g]);
                    const float r = __expf(m[g] - mn);
                    m[g] = mn;
                    l[g] *= r;
#pragma unroll
                    for (int e = 0; e < EPL; e++) o[g][e] *= r;
#pragma unroll
                    for (int b = 0; b < B; b++) {
                        const float p = tb + b < w1 ? __expf(sc[b][g] - mn) : 0.0f;
                        l[g] += p;
#pragma unroll
                        for (int e = 0; e < EPL; e++) o[g][e] += p * kv_at(vr[b], e);
                    }
                }
            }
        }
        // merge the warps (a warp without positions has m = -inf, l = 0, o = 0); s_o overlays
        // the staged rows, which every warp has finished reading after this barrier
        if constexpr (STAGE) __syncthreads();
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (lane == 0) s_m[warp][g] = m[g], s_l[warp][g] = l[g];
#pragma unroll
            for (int e = 0; e < EPL; e++) s_o[warp][g][lane * EPL + e] = o[g][e];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < G * d_h; i += NW * 32) {
            const int g = i / d_h, c = i % d_h;
            float M = -INFINITY;
#pragma unroll
            for (int w = 0; w < NW; w++) M = fmaxf(M, s_m[w][g]);
            float acc = 0.0f, L = 0.0f;
#pragma unroll
            for (int w = 0; w < NW; w++) {
                const float f = s_l[w][g] > 0.0f ? __expf(s_m[w][g] - M) : 0.0f;
                acc += f * s_o[w][g][c];
                L += f * s_l[w][g];
            }
            const int64_t hs = (int64_t)(j * G + g) * n_split + split;
            po[hs * d_h + c] = acc;
            if (c == 0) {
                pm[hs] = M;
                pl[hs] = L;
            }
        }
    }
}

// attn_combine: merge the splits that hold positions (the others are skipped), divide, gate,
// write F32 + Q8.
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

// The whole CTA: M = the largest m of the head's splits that hold positions (l > 0), L = the
// sum of exp(m_s - M)·l_s over them.
static __device__ __forceinline__ void combine_ml(const float *pm, const float *pl, int ns,
                                                  float *scratch, float *M_out, float *L_out)
{
    const int t = threadIdx.x, nt = blockDim.x;
    float M = -INFINITY;
    for (int s = t; s < ns; s += nt)
        if (pl[s] > 0.0f) M = fmaxf(M, pm[s]);
    M = block_max(M, scratch);
    float L = 0.0f;
    for (int s = t; s < ns; s += nt)
        if (pl[s] > 0.0f) L += expf(pm[s] - M) * pl[s];
    *M_out = M;
    *L_out = ds_block_sum(L, scratch);
}

// d_h threads = d_h/32 warps a CTA. Block max M of the valid splits' m, the weights w_s =
// exp(m_s - M) into shared memory (tiles of COMBINE_TILE splits), block sum L = Σ w_s l_s; then
// warp k sums w_s o_s over splits s = k, k + d_h/32, ... for the CTA's dims, and the warps' sums
// are added in a fixed order through shared memory, divided, gated and written (F32 and Q8).
// SLICE (B = 1): grid (n_h · d_h/32, 1), a CTA takes 32 dims of its head (lane l: dim l of the
// slice, a warp's dims one 128-byte line) and warp 0 finishes them: 8x the CTAs of a 256-dim
// head, each computing the same M and L. Else grid (n_h, B), a CTA takes the head's d_h dims
// (lane l: dims [EPL·l, EPL·l + EPL), read as float4); a batch of prompt rows merges with
// fewer, larger CTAs. Both are the same arithmetic for every dim, so B = 1 and rows agree.
template <int EPL, bool SLICE> // d_h = 32 * EPL
static __global__ void attn_combine_kernel(const float *__restrict__ part,
                                           const float *__restrict__ qg, int64_t ld_qg, int n_h,
                                           int n_split, int sp,
                                           const int32_t *__restrict__ d_pos,
                                           float *__restrict__ o, int64_t ld_o,
                                           void *__restrict__ oq)
{
    ds_grid_dep();
    constexpr int d_h = 32 * EPL, NW = EPL, LE = SLICE ? 1 : EPL, SW = 32 * LE;
    __shared__ float sw[COMBINE_TILE], scratch[32];
    __shared__ float red[NW][SW];
    const int h = SLICE ? blockIdx.x / NW : blockIdx.x;
    const int c = SLICE ? (blockIdx.x % NW) * 32 : 0; // the CTA's first dim
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int64_t row = blockIdx.y;
    d_pos += row;
    part += row * partial_row_floats(n_h, n_split, d_h);
    qg += row * ld_qg;
    o = ds_row(o, row, ld_o);
    oq = ds_row_bytes(oq, row, ds_q8_bytes((int64_t)n_h * d_h));
    const float *po = part, *pm = part + (int64_t)n_h * n_split * d_h, *pl = pm + (int64_t)n_h * n_split;
    pm += (int64_t)h * n_split;
    pl += (int64_t)h * n_split;
    po += (int64_t)h * n_split * d_h + c + lane * LE;
    const int ns = min(n_split, (*d_pos + 1 + sp - 1) / sp);
    float M, L;
    combine_ml(pm, pl, ns, scratch, &M, &L);
    float acc[LE];
#pragma unroll
    for (int e = 0; e < LE; e++) acc[e] = 0.0f;
    for (int s0 = 0; s0 < ns; s0 += COMBINE_TILE) {
        const int s1 = min(ns, s0 + COMBINE_TILE);
        __syncthreads();
        for (int s = s0 + t; s < s1; s += d_h) sw[s - s0] = pl[s] > 0.0f ? expf(pm[s] - M) : 0.0f;
        __syncthreads();
#pragma unroll 4
        for (int s = s0 + warp; s < s1; s += NW) {
            const float w = sw[s - s0];
            if (w == 0.0f) continue; // an emptied split (a prefill segment's): its o is not read
            const float *ps = po + (int64_t)s * d_h;
            if constexpr (LE % 4 == 0) {
#pragma unroll
                for (int e = 0; e < LE; e += 4) {
                    const float4 v = *(const float4 *)(ps + e);
                    acc[e] += w * v.x, acc[e + 1] += w * v.y, acc[e + 2] += w * v.z, acc[e + 3] += w * v.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < LE; e++) acc[e] += w * ps[e];
            }
        }
    }
#pragma unroll
    for (int e = 0; e < LE; e++) red[warp][lane * LE + e] = acc[e];
    __syncthreads();
    if (t >= SW) return; // SLICE: warp 0 finishes the slice
    float r = 0.0f;
#pragma unroll
    for (int k = 0; k < NW; k++) r += red[k][t];
    const float gate = qg[(int64_t)h * 2 * d_h + d_h + c + t];
    r = r / L * (1.0f / (1.0f + expf(-gate)));
    const int64_t i = (int64_t)h * d_h + c + t;
    if (o) o[i] = r;
    if (oq) ds_q8_store_warp(r, i & ~(int64_t)31, (int64_t)n_h * d_h, oq);
}

// attn_split for cache element T: one instantiation per (d_h, G) the asserts admit
template <typename T>
static void attn_split(const cuda_launch_dims &d, const float *d_q, int64_t ld_q,
                       const void *d_k_cache, const void *d_v_cache, const int32_t *d_table,
                       int table_ld, const int32_t *d_slot, const int32_t *d_pos,
                       const int32_t *d_skip,
                       int n_h, int n_kv, int d_h, int n_split, int sp, float *d_partial,
                       int early, const cuda_launch *l)
{
    const T *kc = (const T *)d_k_cache, *vc = (const T *)d_v_cache;
    const int G = n_h / n_kv;
#define ATTN_SPLIT_G(E, GG)                                                                     \
    case GG:                                                                                     \
        ds_launch(attn_split_kernel<T, E, GG>, ds_grid(d), d.block, 0, l, d_q, ld_q, kc, vc,    \
                  d_table, table_ld, d_slot, d_pos, d_skip, n_h, n_kv, d_partial, n_split, sp,  \
                  early);                                                                       \
        break;
#define ATTN_SPLIT_E(E)                                                                         \
    switch (G) {                                                                                 \
        ATTN_SPLIT_G(E, 1) ATTN_SPLIT_G(E, 2) ATTN_SPLIT_G(E, 3) ATTN_SPLIT_G(E, 4)              \
        ATTN_SPLIT_G(E, 5) ATTN_SPLIT_G(E, 6) ATTN_SPLIT_G(E, 7) ATTN_SPLIT_G(E, 8)              \
    default: DS_ASSERT(!"attn_decode: n_h / n_kv must be 1..8");                                 \
    }
    switch (d_h / 32) {
    case 1: ATTN_SPLIT_E(1) break;
    case 2: ATTN_SPLIT_E(2) break;
    case 4: ATTN_SPLIT_E(4) break;
    case 8: ATTN_SPLIT_E(8) break;
    default: DS_ASSERT(!"attn_decode: d_h must be 32, 64, 128 or 256");
    }
#undef ATTN_SPLIT_E
#undef ATTN_SPLIT_G
}

// Split CTAs per (row, KV head): every super-chunk of n_ctx at B = 1 (the launch B = 1 always
// had); at B > 1 ATTN_ROWS_SPLIT_CTAS / (n_kv·B) of them (at least 1, at most n_split), each
// looping over its super-chunks, so a large batch of short contexts launches few idle CTAs and a
// long context still spreads over the GPU. Which CTA computes a super-chunk changes nothing in
// the arithmetic: the super-chunks and their merge depend only on the row's position and n_ctx.
#define ATTN_ROWS_SPLIT_CTAS 8192

extern "C" void attn_decode_rows_dims(int n_h, int n_kv, int d_h, int n_ctx, int B,
                                      cuda_launch_dims *split, cuda_launch_dims *combine)
{
    const int n_split = attn_n_split(n_ctx);
    int per = n_split;
    if (B > 1) {
        per = ATTN_ROWS_SPLIT_CTAS / (n_kv * B);
        per = per < 1 ? 1 : per > n_split ? n_split : per;
    }
    *split = (cuda_launch_dims){(unsigned)n_kv, (unsigned)per, (unsigned)B, ATTN_SPLIT_WARPS * 32};
    *combine = (cuda_launch_dims){(unsigned)(B == 1 ? n_h * (d_h / 32) : n_h), (unsigned)B, 1,
                                  (unsigned)d_h};
}

// early: attn_decode's (B = 1) promise that the position and the cache rows below it are final
// before the preceding launch (attn_split_kernel)
static void decode_rows(const float *d_q, int64_t ld_q, const float *d_qg, int64_t ld_qg,
                        const void *d_k_cache, const void *d_v_cache, const int32_t *d_slot,
                        const int32_t *d_table, int table_ld, const int32_t *d_pos,
                        const int32_t *d_skip, int n_h, int n_kv, int d_h, int n_ctx,
                        float *d_partial, float *d_o, int64_t ld_o, void *d_o_q8,
                        attn_kv_type kv_type, int B, int early, const cuda_launch *l)
{
    DS_ASSERT(n_kv > 0 && n_h % n_kv == 0 && n_h / n_kv <= ATTN_MAX_GROUP);
    DS_ASSERT(d_h % 32 == 0 && d_h <= 256);
    DS_ASSERT(kv_type == ATTN_KV_F16 || kv_type == ATTN_KV_F32);
    DS_ASSERT(n_ctx >= 1);
    DS_ASSERT(B >= 1 && B <= 65535);
    // K/V rows are read 16 bytes at a time, the partials as float4
    DS_ASSERT((uintptr_t)d_k_cache % 16 == 0 && (uintptr_t)d_v_cache % 16 == 0 &&
              (uintptr_t)d_partial % 16 == 0);
    DS_ASSERT(d_slot == NULL || d_table || table_ld * ATTN_KV_BLOCK >= n_ctx);
    const int n_split = attn_n_split(n_ctx), sp = attn_split_positions(n_ctx);
    cuda_launch_dims ds, dc;
    attn_decode_rows_dims(n_h, n_kv, d_h, n_ctx, B, &ds, &dc);
    if (kv_type == ATTN_KV_F32)
        attn_split<float>(ds, d_q, ld_q, d_k_cache, d_v_cache, d_table, table_ld, d_slot, d_pos,
                          d_skip, n_h, n_kv, d_h, n_split, sp, d_partial, early, l);
    else
        attn_split<__half>(ds, d_q, ld_q, d_k_cache, d_v_cache, d_table, table_ld, d_slot, d_pos,
                           d_skip, n_h, n_kv, d_h, n_split, sp, d_partial, early, l);
#define ATTN_COMBINE(E)                                                                         \
    ds_launch(B == 1 ? attn_combine_kernel<E, true> : attn_combine_kernel<E, false>,            \
              ds_grid(dc), dc.block, 0, l, d_partial, d_qg, ld_qg, n_h, n_split, sp, d_pos,     \
              d_o, ld_o, d_o_q8)
    switch (d_h / 32) {
    case 1: ATTN_COMBINE(1); break;
    case 2: ATTN_COMBINE(2); break;
    case 4: ATTN_COMBINE(4); break;
    case 8: ATTN_COMBINE(8); break;
    }
#undef ATTN_COMBINE
}

extern "C" void attn_decode_rows(const float *d_q, int64_t ld_q, const float *d_qg, int64_t ld_qg,
                                 const void *d_k_cache, const void *d_v_cache,
                                 const int32_t *d_slot, const int32_t *d_table, int table_ld,
                                 const int32_t *d_pos, const int32_t *d_skip, int n_h, int n_kv,
                                 int d_h, int n_ctx, float *d_partial, float *d_o, int64_t ld_o,
                                 void *d_o_q8, attn_kv_type kv_type, int B,
                                 const cuda_launch *l)
{
    decode_rows(d_q, ld_q, d_qg, ld_qg, d_k_cache, d_v_cache, d_slot, d_table, table_ld, d_pos,
                d_skip, n_h, n_kv, d_h, n_ctx, d_partial, d_o, ld_o, d_o_q8, kv_type, B, 0, l);
}

extern "C" void attn_decode(const float *d_q, const float *d_qg, const int32_t *d_table,
                            const void *d_k_cache, const void *d_v_cache, int n_h, int n_kv,
                            int d_h, int n_ctx, const int32_t *d_pos, float *d_partial,
                            float *d_o, void *d_o_q8, attn_kv_type kv_type, const cuda_launch *l)
{
    decode_rows(d_q, 0, d_qg, 0, d_k_cache, d_v_cache, NULL, d_table, 0, d_pos, NULL, n_h, n_kv,
                d_h, n_ctx, d_partial, d_o, 0, d_o_q8, kv_type, 1, 1, l);
}
