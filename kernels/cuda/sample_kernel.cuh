// Internal to kernels/cuda, sampling family (sample.h): the kernel's layout (sample.cu has the
// design), its argument and shared-memory structs, docs/SAMPLER.md's arithmetic operation for
// operation, and the CTA- and cluster-wide helpers the phases of sample_kernel are built from.
#ifndef DS_KERNELS_CUDA_SAMPLE_KERNEL_CUH
#define DS_KERNELS_CUDA_SAMPLE_KERNEL_CUH

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>

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
    sample_topp_diag *diag; // mapped pinned: the top-p cut (tests)
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
    float topn_z[SAMPLING_MAX_LOGPROBS];
    int topn_id[SAMPLING_MAX_LOGPROBS];
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

// ---- between the kernel (sample.cu) and the slot (sample_slot.cu) ----

// STATUS_UNSUPPORTED when a cluster of ncl CTAs with the kernel's shared memory cannot run
// (sets the kernel's attributes: once per slot, at create).
int sample_kernel_setup(int ncl, status *st);
size_t sample_kernel_smem_bytes(void);
// Enqueues one sample_kernel cluster launch.
void sample_kernel_launch(const sample_kargs &a, int ncl, const cuda_launch *l);

#endif
