// Token sampling on the GPU (sample.h): docs/SAMPLER.md's definition, bit for bit where the
// definition fixes the arithmetic (penalties, E, the block sums and the draw), one cluster
// kernel per sample. CPU twin: model/sampler.c (tests/gpu/sample_parity).
//
// Layout: a cluster of ncl = ceil(V / 16384) CTAs (<= 16) of 1024 threads; CTA r owns ids
// [r*16384, (r+1)*16384), thread t of it the 16 consecutive ids from t*16 on. The penalised
// logits z and the weights w stay in shared memory for the whole sample. Decisions that need
// the whole vocabulary (max, radix-select digits, top-p bucket, candidate positions) are made
// redundantly by every CTA from the per-CTA partials of all CTAs read over distributed shared
// memory after a cluster barrier, so every CTA takes the same branch and the barriers match.
// Per-CTA histograms are double-buffered so a CTA can start the next level while others still
// read the previous one.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/sample.h"

namespace cg = cooperative_groups;

#define SAMPLE_THREADS 1024
#define SAMPLE_PER_THREAD 16
#define SAMPLE_CTA_ELEMS (SAMPLE_THREADS * SAMPLE_PER_THREAD) // 16384
#define SAMPLE_MAX_CLUSTER 16
#define SAMPLE_BLOCK 256     // docs/SAMPLER.md "Σ": blocks of 256, 8 double lanes
#define SAMPLE_MAX_BLOCKS (SAMPLE_MAX_VOCAB / SAMPLE_BLOCK) // 1024
#define SAMPLE_ZH 2048       // z-key radix digits: 11, 11, 10 bits
#define SAMPLE_PH 1024       // weight radix digits: bits >> 20 (<= 0x3F8), 10, 10 bits
#define SAMPLE_FLAG 0x80000000u // history: the position counts for the penalties

static_assert(SAMPLE_MAX_VOCAB == SAMPLE_MAX_CLUSTER * SAMPLE_CTA_ELEMS, "one vocabulary bound");
static_assert(SAMPLE_CTA_ELEMS % SAMPLE_BLOCK == 0, "CTAs own whole sum blocks");

typedef unsigned long long u64;

struct sample_kargs {
    const float *logits;    // [V]
    const int32_t *counts;  // [V] penalty counts
    float *cand_w;          // [V] compacted candidate weights (scratch)
    int32_t *cand_id;       // [V] their ids
    double *bsum;           // [SAMPLE_MAX_BLOCKS] block sums (scratch)
    sample_result *res;     // mapped pinned
    int V;
    int top_k;              // 0 = off (0 < top_k < V)
    float temperature, inv_t, top_p, min_p;
    float rp, fp, pp;
    int pen;                // penalties on
    int n_top;              // logprob alternatives
    int want_lp;            // logprobs at all
    uint64_t seed, step;
};

// Per-CTA values the other CTAs read after a barrier (each written once per sample).
struct sample_part {
    u64 maxkey;    // (ordered z << 32) | ~id: max = largest z, lowest id
    double s1;     // sum of E(z - zmax) over the CTA (logprobs)
    int n_alive;   // candidates (compacted lists)
    int last_pos;  // largest list position with a positive weight, -1 if none
};

struct sample_smem {
    float z[SAMPLE_CTA_ELEMS];                 // penalised logits, -inf beyond V
    float w[SAMPLE_CTA_ELEMS];                 // weights E((z - zmax) / T); final ones (dense)
    unsigned zh[2][2][SAMPLE_ZH];              // [buffer][0 top-k, 1 top-n][digit] counts
    u64 pm[2][SAMPLE_PH];                      // [buffer][digit] exact mantissa sums (top-p)
    unsigned pc[2][SAMPLE_PH];                 // [buffer][digit] counts (top-p)
    double post[SAMPLE_MAX_BLOCKS];            // CTA 0: running sum after each block
    float blk[SAMPLE_BLOCK];                   // CTA 0: the weights of the crossing block
    sample_part part;
    u64 scr64[33];
    double scrd[33];
    int scri[33];
    unsigned scru[33];
    // decisions (every CTA computes the same)
    u64 g_maxkey;
    unsigned sel_d[2], sel_k[2]; // radix select: digit found, rank left inside it
    unsigned sel_prefix[2];      // digits so far
    int p_win_t;                 // top-p: winning thread (bucket 1023 - t)
    double p_above, p_mass;      // mass above the winning bucket; its mass
    int bfirst;
    // top-n gather (CTA 0; filled by every CTA over DSMEM)
    int topn_cnt;
    float topn_z[SAMPLE_MAX_LOGPROBS];
    int topn_id[SAMPLE_MAX_LOGPROBS];
};

// ---- the arithmetic of docs/SAMPLER.md, without FMA contraction ----------------------------

// E(x) for x <= 0: Cephes expf as model/sampler.c's sampler_exp, operation for operation.
static __device__ __forceinline__ float sample_exp(float x)
{
    const bool small = x < -87.0f;
    const float xc = small ? -87.0f : x;
    const float n = __fsub_rn(__fadd_rn(__fmul_rn(xc, 1.44269504088896341f), 12582912.0f), 12582912.0f);
    const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, 0.693359375f)), __fmul_rn(n, -2.12194440e-4f));
    const float r2 = __fmul_rn(r, r);
    float y = 1.9875691500e-4f;
    y = __fadd_rn(__fmul_rn(y, r), 1.3981999507e-3f);
    y = __fadd_rn(__fmul_rn(y, r), 8.3334519073e-3f);
    y = __fadd_rn(__fmul_rn(y, r), 4.1665795894e-2f);
    y = __fadd_rn(__fmul_rn(y, r), 1.6666665459e-1f);
    y = __fadd_rn(__fmul_rn(y, r), 5.0000001201e-1f);
    y = __fadd_rn(__fadd_rn(__fmul_rn(y, r2), r), 1.0f);
    const float scale = __int_as_float(((int)n + 127) << 23);
    return small ? 0.0f : __fmul_rn(y, scale);
}

static __device__ __forceinline__ float sample_penalize(float z, int c, float rp, float fp, float pp)
{
    z = z > 0.0f ? __fdiv_rn(z, rp) : __fmul_rn(z, rp);
    return __fsub_rn(z, __fadd_rn(__fmul_rn(__int2float_rn(c), fp), pp));
}

// Philox-4x32-10 and U(seed, step) (docs/SAMPLER.md "RNG").
static __device__ float sample_uniform(uint64_t seed, uint64_t step)
{
    unsigned c0 = (unsigned)step, c1 = (unsigned)(step >> 32), c2 = 0, c3 = 0;
    unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    }
    return __fmul_rn(__uint2float_rn(c0 >> 8), 0x1p-24f);
}

// Order-preserving key of a float (-0 and +0 equal, as the CPU's float compares).
static __device__ __forceinline__ unsigned sample_key(float z)
{
    unsigned u = __float_as_uint(z);
    if (z == 0.0f) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ float sample_unkey(unsigned k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// ---- CTA-wide helpers (1024 threads; deterministic trees) ------------------------------------

template <typename T> static __device__ __forceinline__ T warp_incl(T v)
{
    const int lane = threadIdx.x & 31;
    for (int o = 1; o < 32; o <<= 1) {
        const T n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v = v + n;
    }
    return v;
}

// Exclusive scan in thread order; *total = the sum of all. Synchronises.
template <typename T> static __device__ T cta_excl(T v, T *scr, T *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const T inc = warp_incl(v);
    T exc = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 0) exc = T(0);
    if (lane == 31) scr[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        const T si = warp_incl(scr[lane]);
        T se = __shfl_up_sync(0xffffffffu, si, 1);
        if (lane == 0) se = T(0);
        scr[lane] = se;
        if (lane == 31) scr[32] = si;
    }
    __syncthreads();
    const T r = scr[warp] + exc;
    *total = scr[32];
    __syncthreads();
    return r;
}

struct op_max64 {
    __device__ u64 operator()(u64 a, u64 b) const { return a > b ? a : b; }
};
struct op_maxi {
    __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct op_sumd {
    __device__ double operator()(double a, double b) const { return a + b; }
};

template <typename T, typename Op> static __device__ T cta_reduce(T v, T *scr, Op op)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) scr[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = scr[lane];
        for (int o = 16; o; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) scr[32] = v;
    }
    __syncthreads();
    const T r = scr[32];
    __syncthreads();
    return r;
}

// Histogram add with the lanes of a warp that hit the same digit combined (d < 0: none).
static __device__ __forceinline__ void hist_add(unsigned *h, int d)
{
    const unsigned m = __match_any_sync(0xffffffffu, d);
    if (d >= 0 && (int)(threadIdx.x & 31) == __ffs(m) - 1) atomicAdd(&h[d], (unsigned)__popc(m));
}

template <typename T> static __device__ __forceinline__ T remote(cg::cluster_group &cl, T *p, int r)
{
    return *cl.map_shared_rank(p, r);
}

// Radix select step over the cluster-merged histogram h[nb] (nb = 2048 or 1024): the digit d
// with above(d) < k <= above(d) + h[d], counting from the top; sel_d/sel_k[slot] get d and
// k - above(d).
static __device__ void sample_find_digit(cg::cluster_group &cl, int ncl, unsigned *h, int nb,
                                         unsigned k, sample_smem &sh, int slot)
{
    const int per = nb / SAMPLE_THREADS;
    unsigned c[2] = {0, 0}, tot = 0;
    for (int i = 0; i < per; i++) {
        const int b = nb - 1 - (int)(threadIdx.x * per + i);
        for (int r = 0; r < ncl; r++) c[i] += remote(cl, &h[b], r);
        tot += c[i];
    }
    unsigned total;
    unsigned above = cta_excl<unsigned>(tot, sh.scru, &total);
    for (int i = 0; i < per; i++) {
        if (above < k && k <= above + c[i]) {
            sh.sel_d[slot] = (unsigned)(nb - 1 - (int)(threadIdx.x * per + i));
            sh.sel_k[slot] = k - above;
        }
        above += c[i];
    }
    __syncthreads();
}

// Top-p step: thread t holds the mass of digit 1023 - t; the lowest t whose running mass from
// the top (base + exclusive scan) reaches target wins. Returns false when none does.
static __device__ bool sample_find_mass(double mass, double base, double target, sample_smem &sh,
                                        double *total)
{
    if (threadIdx.x == 0) sh.p_win_t = SAMPLE_THREADS;
    const double ex = cta_excl<double>(mass, sh.scrd, total); // synchronises
    const double cur = base + ex;
    if (mass > 0 && cur + mass >= target) atomicMin(&sh.p_win_t, (int)threadIdx.x);
    __syncthreads();
    const bool found = sh.p_win_t < SAMPLE_THREADS;
    if (found && (int)threadIdx.x == sh.p_win_t) {
        sh.p_above = cur;
        sh.p_mass = mass;
    }
    __syncthreads();
    return found;
}

// Bit e of the result: element e of this thread is among the first `allow` elements of `ties`
// (in id order) of this CTA.
static __device__ unsigned sample_take_ties(unsigned ties, int allow, sample_smem &sh)
{
    int total;
    int before = cta_excl<int>(__popc(ties), sh.scri, &total);
    unsigned take = 0;
    for (int e = 0; e < SAMPLE_PER_THREAD; e++)
        if (ties >> e & 1) {
            if (before < allow) take |= 1u << e;
            before++;
        }
    return take;
}

// The CTAs before this one hold `before` of the cluster's ties, this one `mine` (read from the
// per-CTA histograms: cnt_of(r)); how many of this CTA's ties are among the first `need`.
template <typename F>
static __device__ int sample_allow(int ncl, int rank, int need, F cnt_of)
{
    int before = 0;
    for (int r = 0; r < rank; r++) before += cnt_of(r);
    const int mine = cnt_of(rank);
    int allow = need - before;
    return allow < 0 ? 0 : (allow > mine ? mine : allow);
}

static __device__ __forceinline__ int sample_mant(unsigned bits)
{
    const unsigned e = bits >> 23;
    return (int)((bits & 0x7FFFFFu) | (e ? 0x800000u : 0u));
}
// 2^(exponent - 150) of a weight bucket keyed by bits >> 20 (denormals: 2^-149)
static __device__ __forceinline__ int sample_bucket_exp(unsigned b1)
{
    const int e = (int)(b1 >> 3);
    return (e ? e : 1) - 150;
}

// ---- the kernel ------------------------------------------------------------------------------

static __global__ void __launch_bounds__(SAMPLE_THREADS, 1) sample_kernel(sample_kargs a)
{
    extern __shared__ __align__(16) unsigned char sample_smem_raw[];
    sample_smem &sh = *reinterpret_cast<sample_smem *>(sample_smem_raw);
    cg::cluster_group cl = cg::this_cluster();
    const int ncl = (int)cl.num_blocks(), rank = (int)cl.block_rank();
    const int t = threadIdx.x;
    const int base = rank * SAMPLE_CTA_ELEMS; // first id of this CTA
    const int my0 = t * SAMPLE_PER_THREAD;    // this thread's first local index
    const int V = a.V;

    for (int i = t; i < 2 * 2 * SAMPLE_ZH; i += SAMPLE_THREADS) (&sh.zh[0][0][0])[i] = 0;
    for (int i = t; i < 2 * SAMPLE_PH; i += SAMPLE_THREADS) {
        (&sh.pm[0][0])[i] = 0;
        (&sh.pc[0][0])[i] = 0;
    }
    if (t == 0) sh.topn_cnt = 0;

    // 1. penalties (counts from the device history), coalesced into shared memory
    for (int j = 0; j < SAMPLE_PER_THREAD; j++) {
        const int li = j * SAMPLE_THREADS + t, id = base + li;
        float z = -INFINITY;
        if (id < V) {
            z = a.logits[id];
            if (a.pen) {
                const int c = a.counts[id];
                if (c > 0) z = sample_penalize(z, c, a.rp, a.fp, a.pp);
            }
        }
        sh.z[li] = z;
    }
    __syncthreads();
    const int n_valid = min(max(V - (base + my0), 0), SAMPLE_PER_THREAD);
    const unsigned valid = n_valid >= 32 ? 0xFFFFFFFFu : (1u << n_valid) - 1;

    // 2. max (lowest id on ties) and the first radix level of z for top-k / top-n
    const bool topk = a.top_k > 0;
    const int kn = min(a.n_top, V);
    const bool zsel = topk || kn > 0;
    {
        u64 best = 0;
        for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
            const float z = sh.z[my0 + e];
            const unsigned key = sample_key(z);
            if (valid >> e & 1) {
                const u64 k64 = (u64)key << 32 | (0xFFFFFFFFu - (unsigned)(base + my0 + e));
                best = k64 > best ? k64 : best;
            }
            if (zsel) hist_add(sh.zh[0][0], (valid >> e & 1) ? (int)(key >> 21) : -1);
        }
        best = cta_reduce<u64>(best, sh.scr64, op_max64());
        if (t == 0) sh.part.maxkey = best;
    }
    cl.sync();
    if (t < 32) {
        u64 v = t < ncl ? remote(cl, &sh.part.maxkey, t) : 0;
        for (int o = 16; o; o >>= 1) {
            const u64 u = __shfl_xor_sync(0xffffffffu, v, o);
            v = u > v ? u : v;
        }
        if (t == 0) sh.g_maxkey = v;
    }
    __syncthreads();
    const float zmax = sample_unkey((unsigned)(sh.g_maxkey >> 32));
    const int argmax = (int)(0xFFFFFFFFu - (unsigned)sh.g_maxkey);

    // 3. logprobs: S1 = sum E(z - zmax) (any fixed order: it only feeds lse)
    const bool lp = a.want_lp || kn > 0;
    if (lp) {
        double s = 0;
        for (int e = 0; e < SAMPLE_PER_THREAD; e++)
            if (valid >> e & 1) s += (double)sample_exp(__fsub_rn(sh.z[my0 + e], zmax));
        s = cta_reduce<double>(s, sh.scrd, op_sumd());
        if (t == 0) sh.part.s1 = s;
    }

    // 4. radix select of the top-k candidates (slot 0) and the top-n logprobs (slot 1) by
    //    (z desc, id asc): digits key >> 21, (key >> 10) & 0x7FF, key & 0x3FF
    unsigned alive = valid;
    if (zsel) {
        const unsigned ks[2] = {topk ? (unsigned)a.top_k : 0u, (unsigned)kn};
        for (int s = 0; s < 2; s++)
            if (ks[s]) sample_find_digit(cl, ncl, sh.zh[0][0], SAMPLE_ZH, ks[s], sh, s);
        for (int s = 0; s < 2; s++) {
            if (!ks[s]) continue;
            const unsigned d1 = sh.sel_d[s];
            for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
                const unsigned key = sample_key(sh.z[my0 + e]);
                hist_add(sh.zh[1][s], ((valid >> e & 1) && key >> 21 == d1) ? (int)(key >> 10 & 0x7FF) : -1);
            }
        }
        cl.sync();
        for (int i = t; i < 2 * SAMPLE_ZH; i += SAMPLE_THREADS) (&sh.zh[0][0][0])[i] = 0;
        for (int s = 0; s < 2; s++) {
            if (!ks[s]) continue;
            const unsigned d1 = sh.sel_d[s];
            __syncthreads();
            sample_find_digit(cl, ncl, sh.zh[1][s], SAMPLE_ZH, sh.sel_k[s], sh, s);
            if (t == 0) sh.sel_prefix[s] = d1 << 11 | sh.sel_d[s];
            __syncthreads();
        }
        for (int s = 0; s < 2; s++) {
            if (!ks[s]) continue;
            const unsigned pre = sh.sel_prefix[s];
            for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
                const unsigned key = sample_key(sh.z[my0 + e]);
                hist_add(sh.zh[0][s], ((valid >> e & 1) && key >> 10 == pre) ? (int)(key & 0x3FF) : -1);
            }
        }
        cl.sync();
        for (int s = 0; s < 2; s++) {
            if (!ks[s]) continue;
            sample_find_digit(cl, ncl, sh.zh[0][s], 1024, sh.sel_k[s], sh, s);
            const unsigned d3 = sh.sel_d[s];
            const unsigned K = sh.sel_prefix[s] << 10 | d3;
            const int need = (int)sh.sel_k[s];
            unsigned gt = 0, eq = 0;
            for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
                const unsigned key = sample_key(sh.z[my0 + e]);
                if (valid >> e & 1) {
                    gt |= (unsigned)(key > K) << e;
                    eq |= (unsigned)(key == K) << e;
                }
            }
            unsigned *hz = sh.zh[0][s];
            const int allow = sample_allow(ncl, rank, need, [&](int r) { return (int)remote(cl, &hz[d3], r); });
            const unsigned sel = gt | sample_take_ties(eq, allow, sh);
            if (s == 0) {
                alive &= sel;
            } else {
                for (int e = 0; e < SAMPLE_PER_THREAD; e++)
                    if (sel >> e & 1) {
                        int *cnt = cl.map_shared_rank(&sh.topn_cnt, 0);
                        const int slot = atomicAdd(cnt, 1);
                        if (slot < SAMPLE_MAX_LOGPROBS) {
                            *cl.map_shared_rank(&sh.topn_z[slot], 0) = sh.z[my0 + e];
                            *cl.map_shared_rank(&sh.topn_id[slot], 0) = base + my0 + e;
                        }
                    }
            }
            __syncthreads();
        }
    }

    // 5. weights, top-p, min-p, the candidate list and its block sums
    const bool draw = a.temperature > 0.0f;
    bool dense = !topk;
    int n_list = V;
    double topp_target = 0, topp_gt = 0;
    float tau = 0;
    int n_eq_all = 0, need = 0;
    if (draw) {
        float w[SAMPLE_PER_THREAD];
        for (int e = 0; e < SAMPLE_PER_THREAD; e++)
            w[e] = (valid >> e & 1) ? sample_exp(__fmul_rn(__fsub_rn(sh.z[my0 + e], zmax), a.inv_t)) : 0.0f;

        if (a.top_p < 1.0f) {
            // level 1: buckets by bits >> 20 (exponent + 3 mantissa bits), exact mantissa sums
            for (int e = 0; e < SAMPLE_PER_THREAD; e++)
                if ((alive >> e & 1) && w[e] > 0.0f) {
                    const unsigned bits = __float_as_uint(w[e]);
                    atomicAdd(&sh.pm[0][bits >> 20], (u64)sample_mant(bits));
                    atomicAdd(&sh.pc[0][bits >> 20], 1u);
                }
            cl.sync();
            const unsigned b1_t = SAMPLE_PH - 1 - t;
            u64 m = 0;
            for (int r = 0; r < ncl; r++) m += remote(cl, &sh.pm[0][b1_t], r);
            const double mass1 = ldexp((double)m, sample_bucket_exp(b1_t));
            double total;
            (void)cta_excl<double>(mass1, sh.scrd, &total); // S: the same fixed tree every call
            topp_target = (double)a.top_p * total;
            bool ok = sample_find_mass(mass1, 0.0, topp_target, sh, &total);
            unsigned b1 = SAMPLE_PH - 1 - (unsigned)sh.p_win_t, b2 = 0, d3 = 0;
            if (ok) {
                // level 2: bits 19..10 inside bucket b1 (one exponent: exact sums)
                for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
                    const unsigned bits = __float_as_uint(w[e]);
                    if ((alive >> e & 1) && w[e] > 0.0f && bits >> 20 == b1) {
                        atomicAdd(&sh.pm[1][bits >> 10 & 0x3FF], (u64)sample_mant(bits));
                        atomicAdd(&sh.pc[1][bits >> 10 & 0x3FF], 1u);
                    }
                }
                cl.sync();
                for (int i = t; i < SAMPLE_PH; i += SAMPLE_THREADS) sh.pc[0][i] = 0;
                const double above1 = sh.p_above;
                u64 m2 = 0;
                for (int r = 0; r < ncl; r++) m2 += remote(cl, &sh.pm[1][SAMPLE_PH - 1 - t], r);
                const double mass2 = ldexp((double)m2, sample_bucket_exp(b1));
                ok = sample_find_mass(mass2, above1, topp_target, sh, &total);
                b2 = SAMPLE_PH - 1 - (unsigned)sh.p_win_t;
            }
            if (ok) {
                // level 3: bits 9..0: one value per digit
                const unsigned pre = b1 << 10 | b2;
                for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
                    const unsigned bits = __float_as_uint(w[e]);
                    if ((alive >> e & 1) && w[e] > 0.0f && bits >> 10 == pre) atomicAdd(&sh.pc[0][bits & 0x3FF], 1u);
                }
                cl.sync();
                const double above2 = sh.p_above;
                const unsigned d = SAMPLE_PH - 1 - t;
                unsigned c = 0;
                for (int r = 0; r < ncl; r++) c += remote(cl, &sh.pc[0][d], r);
                const double mass3 = (double)c * (double)__uint_as_float(pre << 10 | d);
                ok = sample_find_mass(mass3, above2, topp_target, sh, &total);
                d3 = SAMPLE_PH - 1 - (unsigned)sh.p_win_t;
            }
            if (ok) {
                tau = __uint_as_float(b1 << 20 | b2 << 10 | d3);
                topp_gt = sh.p_above;
                n_eq_all = (int)(sh.p_mass / (double)tau + 0.5);
                const double q = ceil((topp_target - topp_gt) / (double)tau);
                need = q < 1 ? 1 : (q > n_eq_all ? n_eq_all : (int)q);
            } // else rounding left the target unreached: tau = 0, keep every positive weight
            unsigned gt = 0, eq = 0;
            for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
                gt |= (unsigned)(w[e] > tau) << e;
                eq |= (unsigned)(w[e] == tau) << e;
            }
            gt &= alive;
            eq &= alive;
            if (dense && need == n_eq_all) {
                alive &= gt | eq; // w >= tau (tau = 0: everything)
            } else {
                unsigned *pc0 = sh.pc[0];
                const int allow =
                    ok ? sample_allow(ncl, rank, need, [&](int r) { return (int)remote(cl, &pc0[d3], r); }) : 0;
                alive &= gt | sample_take_ties(eq, allow, sh);
                dense = false;
            }
        }
        if (a.min_p > 0.0f)
            for (int e = 0; e < SAMPLE_PER_THREAD; e++)
                if (!(w[e] >= a.min_p)) alive &= ~(1u << e);

        int last = -1;
        if (dense) {
            for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
                const float x = (alive >> e & 1) ? w[e] : 0.0f;
                sh.w[my0 + e] = x;
                if (x > 0.0f) last = base + my0 + e;
            }
            last = cta_reduce<int>(last, sh.scri, op_maxi()); // synchronises: sh.w complete
            if (t == 0) sh.part.last_pos = last;
            // block sums of this CTA's 64 blocks: thread (b, lane) sums lane's 32 entries in order
            const int b = t >> 3, l = t & 7;
            double s = 0;
            if (b < SAMPLE_CTA_ELEMS / SAMPLE_BLOCK)
                for (int j = 0; j < SAMPLE_BLOCK / 8; j++) s += (double)sh.w[b * SAMPLE_BLOCK + l + 8 * j];
            s = s + __shfl_xor_sync(0xffffffffu, s, 1);
            s = s + __shfl_xor_sync(0xffffffffu, s, 2);
            s = s + __shfl_xor_sync(0xffffffffu, s, 4);
            const int gb = base / SAMPLE_BLOCK + b;
            if (l == 0 && b < SAMPLE_CTA_ELEMS / SAMPLE_BLOCK && gb * SAMPLE_BLOCK < V) a.bsum[gb] = s;
            __threadfence();
        } else {
            int total;
            int pos = cta_excl<int>(__popc(alive), sh.scri, &total);
            if (t == 0) sh.part.n_alive = total;
            cl.sync();
            int before = 0;
            n_list = 0;
            for (int r = 0; r < ncl; r++) {
                const int c = remote(cl, &sh.part.n_alive, r);
                if (r < rank) before += c;
                n_list += c;
            }
            pos += before;
            for (int e = 0; e < SAMPLE_PER_THREAD; e++)
                if (alive >> e & 1) {
                    a.cand_w[pos] = w[e];
                    a.cand_id[pos] = base + my0 + e;
                    if (w[e] > 0.0f) last = pos;
                    pos++;
                }
            last = cta_reduce<int>(last, sh.scri, op_maxi());
            if (t == 0) sh.part.last_pos = last;
            __threadfence();
            cl.sync(); // the list is complete in global memory
            const int nblk = (n_list + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
            const int n_thr = ncl * SAMPLE_THREADS;
            for (int it = 0; it * n_thr < nblk * 8; it++) {
                const int p = it * n_thr + rank * SAMPLE_THREADS + t, b = p >> 3, l = p & 7;
                double s = 0;
                if (b < nblk)
                    for (int j = 0; j < SAMPLE_BLOCK / 8; j++) {
                        const int q = b * SAMPLE_BLOCK + l + 8 * j;
                        if (q < n_list) s += (double)__ldcg(&a.cand_w[q]);
                    }
                s = s + __shfl_xor_sync(0xffffffffu, s, 1);
                s = s + __shfl_xor_sync(0xffffffffu, s, 2);
                s = s + __shfl_xor_sync(0xffffffffu, s, 4);
                if (l == 0 && b < nblk) a.bsum[b] = s;
            }
            __threadfence();
        }
    }
    cl.sync(); // block sums, S1 partials, the top-n list and last_pos are complete

    // 6. CTA 0: the draw, logprobs, the result
    if (rank == 0) {
        double lse = 0;
        if (lp && t == 0) {
            double s1 = 0;
            for (int r = 0; r < ncl; r++) s1 += remote(cl, &sh.part.s1, r);
            lse = (double)zmax + log(s1);
        }
        int token = argmax;
        if (draw) {
            const int nblk = (n_list + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
            if (t < nblk) sh.post[t] = __ldcg(&a.bsum[t]);
            if (t == 0) sh.bfirst = nblk;
            __syncthreads();
            double target = 0;
            if (t == 0) {
                double acc = 0;
                for (int b = 0; b < nblk; b++) {
                    const double bs = sh.post[b];
                    if (bs != 0.0) acc = acc + bs; // adding 0 changes nothing
                    sh.post[b] = acc;
                }
                target = (double)sample_uniform(a.seed, a.step) * acc;
                sh.p_above = target;
            }
            __syncthreads();
            target = sh.p_above;
            if (t < nblk && sh.post[t] > target) atomicMin(&sh.bfirst, t);
            __syncthreads();
            const int bf = sh.bfirst;
            if (bf < nblk && t < SAMPLE_BLOCK) {
                const int pos = bf * SAMPLE_BLOCK + t;
                float x = 0.0f;
                if (pos < n_list)
                    x = dense ? *cl.map_shared_rank(&sh.w[pos % SAMPLE_CTA_ELEMS], pos / SAMPLE_CTA_ELEMS)
                              : __ldcg(&a.cand_w[pos]);
                sh.blk[t] = x;
            }
            __syncthreads();
            if (t == 0) {
                // model/sampler.c's loop from the crossing block on (later blocks only when
                // the in-block running sum falls short of the block sum's: rounding)
                double acc = bf > 0 ? sh.post[bf - 1] : 0.0;
                int pick = -1;
                for (int b = bf; b < nblk && pick < 0; b++) {
                    if (b > bf) {
                        const double bs = __ldcg(&a.bsum[b]);
                        if (acc + bs <= target) {
                            acc += bs;
                            continue;
                        }
                    }
                    const int end = min(n_list, (b + 1) * SAMPLE_BLOCK);
                    for (int q = b * SAMPLE_BLOCK; q < end && pick < 0; q++) {
                        const float x = b == bf ? sh.blk[q - b * SAMPLE_BLOCK]
                                        : dense ? *cl.map_shared_rank(&sh.w[q % SAMPLE_CTA_ELEMS], q / SAMPLE_CTA_ELEMS)
                                                : __ldcg(&a.cand_w[q]);
                        acc += (double)x;
                        if (acc > target) pick = q;
                    }
                }
                if (pick < 0) { // rounding: the last candidate with a weight
                    for (int r = 0; r < ncl; r++) pick = max(pick, remote(cl, &sh.part.last_pos, r));
                    if (pick < 0) pick = 0;
                }
                sh.bfirst = dense ? pick : __ldcg(&a.cand_id[pick]);
            }
            __syncthreads();
            token = sh.bfirst;
        }
        if (t == 0) {
            sample_result *res = a.res;
            res->token = token;
            res->step = a.step;
            res->logprob = 0.0f;
            if (lp) {
                float zt = a.logits[token];
                if (a.pen) {
                    const int c = a.counts[token];
                    if (c > 0) zt = sample_penalize(zt, c, a.rp, a.fp, a.pp);
                }
                res->logprob = (float)((double)zt - lse);
            }
            // the top-n list by (z desc, id asc)
            const int n = min(sh.topn_cnt, SAMPLE_MAX_LOGPROBS);
            for (int i = 1; i < n; i++)
                for (int j = i; j > 0; j--) {
                    const float zj = sh.topn_z[j], zp = sh.topn_z[j - 1];
                    const int ij = sh.topn_id[j], ip = sh.topn_id[j - 1];
                    if (!(zj > zp || (zj == zp && ij < ip))) break;
                    sh.topn_z[j] = zp, sh.topn_z[j - 1] = zj;
                    sh.topn_id[j] = ip, sh.topn_id[j - 1] = ij;
                }
            res->n_top = a.n_top;
            for (int j = 0; j < a.n_top; j++) {
                res->top_id[j] = j < n ? sh.topn_id[j] : -1;
                res->top_logprob[j] = j < n ? (float)((double)sh.topn_z[j] - lse) : -INFINITY;
            }
            res->topp_target = topp_target;
            res->topp_mass_gt = topp_gt;
            res->topp_mass_ge = topp_gt + (double)n_eq_all * (double)tau;
            res->topp_tau = tau;
            res->topp_n_eq = n_eq_all;
            res->topp_need = need;
        }
    }
    cl.sync(); // CTA 0 read the others' shared memory
}

// Records accepted positions [start, start + n) (token `tok` when >= 0, else the ids already
// copied into hist) and keeps counts = the counted tokens of the last `window` positions.
static __global__ void sample_push_kernel(int32_t *hist, int32_t *counts, int start, int n, int counted,
                                          int window, int tok)
{
    const int end = start + n;
    const int stride = gridDim.x * blockDim.x;
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    const int keep_from = window > 0 ? max(start, end - window) : start;
    for (int p = start + g; p < end; p += stride) {
        const int v = (tok >= 0 ? tok : hist[p]) & 0x7FFFFFFF;
        hist[p] = (int32_t)((unsigned)v | (counted ? SAMPLE_FLAG : 0u));
        if (counted && p >= keep_from) atomicAdd(&counts[v], 1);
    }
    if (window > 0) { // positions that left the window
        const int lo = max(0, start - window), hi = min(start, end - window);
        for (int q = lo + g; q < hi; q += stride) {
            const unsigned v = (unsigned)hist[q];
            if (v & SAMPLE_FLAG) atomicSub(&counts[v & 0x7FFFFFFFu], 1);
        }
    }
}

// ---- host ------------------------------------------------------------------------------------

struct sample_slot {
    int32_t V, n_ctx_max;
    int ncl;                // CTAs per cluster
    size_t smem_bytes;
    sample_params p;
    float inv_t;
    bool pen;               // the request has penalties
    bool counts_dirty;      // d_counts not all zero
    bool staging_pending;   // a prompt copy may still read h_staging
    int64_t n_seq;          // accepted positions
    uint64_t step;          // RNG step of the next sample_run
    int32_t *d_counts;      // owned, device, [V]
    int32_t *d_hist;        // owned, device, [n_ctx_max] token | SAMPLE_FLAG if counted
    float *d_cand_w;        // owned, device, [V]
    int32_t *d_cand_id;     // owned, device, [V]
    double *d_bsum;         // owned, device, [SAMPLE_MAX_BLOCKS]
    int32_t *h_staging;     // owned, pinned, [n_ctx_max]
    sample_result *h_res;   // owned, pinned (mapped)
    sample_result *d_res;   // its device address
};

extern "C" int sample_create(sample_slot **out, int32_t n_vocab, int32_t n_ctx_max, status *st)
{
    *out = NULL;
    if (n_vocab < 1 || n_ctx_max < 1)
        return status_fail(st, STATUS_INVALID, "sample: n_vocab %d, n_ctx_max %d: must be >= 1", (int)n_vocab,
                           (int)n_ctx_max);
    if (n_vocab > SAMPLE_MAX_VOCAB)
        return status_fail(st, STATUS_UNSUPPORTED, "sample: vocabulary %d > %d (16 CTAs x 16384)", (int)n_vocab,
                           SAMPLE_MAX_VOCAB);
    if (!cuda_device_available(st)) return st->code;
    sample_slot *s = (sample_slot *)calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "sample: out of memory");
    s->V = n_vocab;
    s->n_ctx_max = n_ctx_max;
    s->ncl = (int)ds_div_up(n_vocab, SAMPLE_CTA_ELEMS);
    s->smem_bytes = sizeof(sample_smem);
    int rc = STATUS_OK;
    {
        cudaError_t e = cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)s->smem_bytes);
        if (e == cudaSuccess && s->ncl > 8)
            e = cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        int n_clusters = 0;
        if (e == cudaSuccess) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(s->ncl);
            cfg.blockDim = dim3(SAMPLE_THREADS);
            cfg.dynamicSmemBytes = s->smem_bytes;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = s->ncl;
            at[0].val.clusterDim.y = 1;
            at[0].val.clusterDim.z = 1;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            e = cudaOccupancyMaxActiveClusters(&n_clusters, sample_kernel, &cfg);
        }
        if (e != cudaSuccess || n_clusters < 1) {
            rc = status_fail(st, STATUS_UNSUPPORTED,
                             "sample: a cluster of %d CTAs x %d threads with %zu B of shared memory cannot run (%s)",
                             s->ncl, SAMPLE_THREADS, s->smem_bytes,
                             e != cudaSuccess ? cudaGetErrorString(e) : "no active cluster");
            cudaGetLastError();
            goto fail;
        }
    }
    if ((rc = cuda_alloc((void **)&s->d_counts, (size_t)n_vocab * 4, "sample counts", st)) ||
        (rc = cuda_alloc((void **)&s->d_hist, (size_t)n_ctx_max * 4, "sample history", st)) ||
        (rc = cuda_alloc((void **)&s->d_cand_w, (size_t)n_vocab * 4, "sample candidates", st)) ||
        (rc = cuda_alloc((void **)&s->d_cand_id, (size_t)n_vocab * 4, "sample candidate ids", st)) ||
        (rc = cuda_alloc((void **)&s->d_bsum, SAMPLE_MAX_BLOCKS * sizeof(double), "sample block sums", st)) ||
        (rc = cuda_host_alloc((void **)&s->h_staging, (size_t)n_ctx_max * 4, "sample staging", st)) ||
        (rc = cuda_host_alloc((void **)&s->h_res, sizeof(sample_result), "sample result", st)) ||
        (rc = cuda_memset(s->d_counts, 0, (size_t)n_vocab * 4, st)))
        goto fail;
    memset(s->h_res, 0, sizeof *s->h_res);
    {
        const cudaError_t e = cudaHostGetDevicePointer((void **)&s->d_res, s->h_res, 0);
        if (e != cudaSuccess) {
            rc = status_fail(st, STATUS_DEVICE, "sample: cudaHostGetDevicePointer: %s", cudaGetErrorString(e));
            goto fail;
        }
    }
    s->p.top_p = 1.0f;
    s->p.repetition_penalty = 1.0f;
    *out = s;
    return STATUS_OK;
fail:
    sample_destroy(s);
    return rc;
}

extern "C" void sample_destroy(sample_slot *s)
{
    if (!s) return;
    cuda_free(s->d_counts);
    cuda_free(s->d_hist);
    cuda_free(s->d_cand_w);
    cuda_free(s->d_cand_id);
    cuda_free(s->d_bsum);
    cuda_host_free(s->h_staging);
    cuda_host_free(s->h_res);
    free(s);
}

extern "C" int sample_reset(sample_slot *s, const sample_params *p, cuda_stream stream, status *st)
{
    if (s->staging_pending) { // the last request's prompt copy must be done with h_staging
        if (cuda_sync(stream, "sample_reset", st)) return st->code;
        s->staging_pending = false;
    }
    if (s->counts_dirty) {
        CUDA_TRY(st, cudaMemsetAsync(s->d_counts, 0, (size_t)s->V * 4, (cudaStream_t)stream));
        s->counts_dirty = false;
    }
    s->p = *p;
    s->inv_t = p->temperature > 0 ? 1.0f / p->temperature : 0.0f;
    s->pen = p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    s->n_seq = 0;
    s->step = 0;
    return STATUS_OK;
}

static void sample_push(sample_slot *s, int64_t n, bool counted, int32_t tok, cuda_stream stream)
{
    const int blocks = (int)(n < 256 * 64 ? ds_div_up(n, 256) : 64);
    sample_push_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(s->d_hist, s->d_counts, (int)s->n_seq, (int)n,
                                                                 counted, s->p.penalty_window, tok);
    s->counts_dirty = true;
}

extern "C" void sample_accept_prompt(sample_slot *s, const int32_t *ids, int64_t n, cuda_stream stream)
{
    DS_ASSERT(n >= 0 && s->n_seq + n <= s->n_ctx_max);
    if (n == 0) return;
    if (s->pen) {
        for (int64_t i = 0; i < n; i++) DS_ASSERT(ids[i] >= 0 && ids[i] < s->V);
        memcpy(s->h_staging + s->n_seq, ids, (size_t)n * 4);
        cudaMemcpyAsync(s->d_hist + s->n_seq, s->h_staging + s->n_seq, (size_t)n * 4, cudaMemcpyHostToDevice,
                        (cudaStream_t)stream);
        s->staging_pending = true;
        sample_push(s, n, s->p.penalize_prompt, -1, stream);
    }
    s->n_seq += n;
}

extern "C" void sample_accept(sample_slot *s, int32_t token, cuda_stream stream)
{
    DS_ASSERT(token >= 0 && token < s->V && s->n_seq < s->n_ctx_max);
    if (s->pen) sample_push(s, 1, true, token, stream);
    s->n_seq++;
}

extern "C" void sample_run(sample_slot *s, const float *d_logits, cuda_stream stream)
{
    sample_kargs a;
    a.logits = d_logits;
    a.counts = s->d_counts;
    a.cand_w = s->d_cand_w;
    a.cand_id = s->d_cand_id;
    a.bsum = s->d_bsum;
    a.res = s->d_res;
    a.V = s->V;
    a.top_k = s->p.temperature > 0 && s->p.top_k > 0 && s->p.top_k < s->V ? s->p.top_k : 0; /* greedy ignores it */
    a.temperature = s->p.temperature;
    a.inv_t = s->inv_t;
    a.top_p = s->p.top_p;
    a.min_p = s->p.min_p;
    a.rp = s->p.repetition_penalty;
    a.fp = s->p.frequency_penalty;
    a.pp = s->p.presence_penalty;
    a.pen = s->pen;
    a.n_top = s->p.n_logprobs;
    a.want_lp = s->p.want_logprob || s->p.n_logprobs > 0;
    a.seed = s->p.seed;
    a.step = s->step++;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(s->ncl);
    cfg.blockDim = dim3(SAMPLE_THREADS);
    cfg.dynamicSmemBytes = s->smem_bytes;
    cfg.stream = (cudaStream_t)stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = s->ncl;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, sample_kernel, a);
}

extern "C" const sample_result *sample_result_get(const sample_slot *s) { return s->h_res; }
extern "C" uint64_t sample_step(const sample_slot *s) { return s->step; }
extern "C" int sample_cluster_size(const sample_slot *s) { return s->ncl; }
