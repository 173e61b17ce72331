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
//
// The kernel runs in phases (sample_penalties, sample_max / sample_logsum, sample_select_top,
// sample_topp, sample_candidates, sample_draw / sample_result_write), each a device function
// called by every thread of the cluster; the barriers inside them are the cluster's.
#include "kernels/cuda/sample_kernel.cuh"

// Who a thread is in the cluster: CTA `rank` of `ncl` owns ids [base, base + 16384), thread t
// the 16 ids from base + my0 on, `valid` (bit e: id base + my0 + e < V) of them real.
struct sample_me {
    int ncl, rank, t, base, my0;
    unsigned valid;
};

// The top-p cut (all 0 when top-p is off): the nucleus target top_p * S, the mass above the
// threshold weight tau, the weights equal to tau and how many of them are kept.
struct sample_cut {
    double target, gt;
    float tau;
    int n_eq, need;
};

// ---- phase 1: penalties ----------------------------------------------------------------------

// The histograms zeroed; z = the penalised logits (counts from the device history) of this
// CTA's ids, -inf beyond V, coalesced into shared memory. Synchronises the CTA.
static __device__ __forceinline__ void sample_penalties(const sample_kargs &a, sample_smem &sh,
                                                        int base, int t)
{
    for (int i = t; i < 2 * 2 * SAMPLE_ZH; i += SAMPLE_THREADS) (&sh.zh[0][0][0])[i] = 0;
    for (int i = t; i < 2 * SAMPLE_PH; i += SAMPLE_THREADS) {
        (&sh.pm[0][0])[i] = 0;
        (&sh.pc[0][0])[i] = 0;
    }
    if (t == 0) sh.topn_cnt = 0;
    for (int j = 0; j < SAMPLE_PER_THREAD; j++) {
        const int li = j * SAMPLE_THREADS + t, id = base + li;
        float z = -INFINITY;
        if (id < a.V) {
            z = a.logits[id];
            if (a.pen) {
                const int c = a.counts[id];
                if (c > 0) z = sample_penalize(z, c, a.rp, a.fp, a.pp);
            }
        }
        sh.z[li] = z;
    }
    __syncthreads();
}

// ---- phase 2: the maximum and the logprobs' normaliser ---------------------------------------

// sh.g_maxkey = the cluster's (z, lowest id) maximum; with zsel, the first radix level of z
// (key >> 21) for the top-k / top-n selections into sh.zh[0][0]. Cluster-wide.
static __device__ __forceinline__ void sample_max(cg::cluster_group &cl, sample_smem &sh,
                                                  const sample_me &me, bool zsel)
{
    u64 best = 0;
    for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
        const float z = sh.z[me.my0 + e];
        const unsigned key = sample_key(z);
        if (me.valid >> e & 1) {
            const u64 k64 = (u64)key << 32 | (0xFFFFFFFFu - (unsigned)(me.base + me.my0 + e));
            best = k64 > best ? k64 : best;
        }
        if (zsel) hist_add(sh.zh[0][0], (me.valid >> e & 1) ? (int)(key >> 21) : -1);
    }
    best = cta_reduce<u64>(best, sh.scr64, op_max64());
    if (me.t == 0) sh.part.maxkey = best;
    cl.sync();
    if (me.t < 32) {
        u64 v = me.t < me.ncl ? remote(cl, &sh.part.maxkey, me.t) : 0;
        for (int o = 16; o; o >>= 1) {
            const u64 u = __shfl_xor_sync(0xffffffffu, v, o);
            v = u > v ? u : v;
        }
        if (me.t == 0) sh.g_maxkey = v;
    }
    __syncthreads();
}

// sh.part.s1 = this CTA's sum of E(z - zmax) (any fixed order: it only feeds lse).
static __device__ __forceinline__ void sample_logsum(sample_smem &sh, const sample_me &me,
                                                     float zmax)
{
    double s = 0;
    for (int e = 0; e < SAMPLE_PER_THREAD; e++)
        if (me.valid >> e & 1) s += (double)sample_exp(__fsub_rn(sh.z[me.my0 + e], zmax));
    s = cta_reduce<double>(s, sh.scrd, op_sumd());
    if (me.t == 0) sh.part.s1 = s;
}

// ---- phase 3: top-k and the top-n logprobs ---------------------------------------------------

// Radix select by (z desc, id asc) of the top-k candidates (slot 0: the returned mask of this
// thread's ids, of `alive`) and the top-n logprobs (slot 1: gathered into CTA 0's topn list).
// Digits key >> 21, (key >> 10) & 0x7FF, key & 0x3FF. Cluster-wide.
static __device__ __forceinline__ unsigned sample_select_top(cg::cluster_group &cl,
                                                             const sample_kargs &a,
                                                             sample_smem &sh, const sample_me &me,
                                                             bool topk, int kn, unsigned alive)
{
    const int t = me.t, my0 = me.my0;
    const unsigned valid = me.valid;
    const unsigned ks[2] = {topk ? (unsigned)a.top_k : 0u, (unsigned)kn};
    for (int s = 0; s < 2; s++)
        if (ks[s]) sample_find_digit(cl, me.ncl, sh.zh[0][0], SAMPLE_ZH, ks[s], sh, s);
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
        sample_find_digit(cl, me.ncl, sh.zh[1][s], SAMPLE_ZH, sh.sel_k[s], sh, s);
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
        sample_find_digit(cl, me.ncl, sh.zh[0][s], 1024, sh.sel_k[s], sh, s);
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
        const int allow =
            sample_allow(me.ncl, me.rank, need, [&](int r) { return (int)remote(cl, &hz[d3], r); });
        const unsigned sel = gt | sample_take_ties(eq, allow, sh);
        if (s == 0) {
            alive &= sel;
        } else {
            for (int e = 0; e < SAMPLE_PER_THREAD; e++)
                if (sel >> e & 1) {
                    int *cnt = cl.map_shared_rank(&sh.topn_cnt, 0);
                    const int slot = atomicAdd(cnt, 1);
                    if (slot < SAMPLING_MAX_LOGPROBS) {
                        *cl.map_shared_rank(&sh.topn_z[slot], 0) = sh.z[my0 + e];
                        *cl.map_shared_rank(&sh.topn_id[slot], 0) = me.base + my0 + e;
                    }
                }
        }
        __syncthreads();
    }
    return alive;
}

// ---- phase 4: top-p --------------------------------------------------------------------------

// The nucleus of the weights w of the `alive` candidates: a 3-level radix search over the
// cluster for the threshold weight tau where the running mass from the top reaches
// top_p * S (exact mantissa sums per bucket), then the weights above tau and the first `need`
// equal to it (in id order) stay alive. *dense stays true when every weight >= tau is kept.
// Cluster-wide.
static __device__ __forceinline__ unsigned sample_topp(cg::cluster_group &cl,
                                                       const sample_kargs &a, sample_smem &sh,
                                                       const sample_me &me, const float *w,
                                                       unsigned alive, bool *dense,
                                                       sample_cut *cut)
{
    const int t = me.t;
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
    for (int r = 0; r < me.ncl; r++) m += remote(cl, &sh.pm[0][b1_t], r);
    const double mass1 = ldexp((double)m, sample_bucket_exp(b1_t));
    double total;
    (void)cta_excl<double>(mass1, sh.scrd, &total); // S: the same fixed tree every call
    cut->target = (double)a.top_p * total;
    bool ok = sample_find_mass(mass1, 0.0, cut->target, sh, &total);
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
        for (int r = 0; r < me.ncl; r++) m2 += remote(cl, &sh.pm[1][SAMPLE_PH - 1 - t], r);
        const double mass2 = ldexp((double)m2, sample_bucket_exp(b1));
        ok = sample_find_mass(mass2, above1, cut->target, sh, &total);
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
        for (int r = 0; r < me.ncl; r++) c += remote(cl, &sh.pc[0][d], r);
        const double mass3 = (double)c * (double)__uint_as_float(pre << 10 | d);
        ok = sample_find_mass(mass3, above2, cut->target, sh, &total);
        d3 = SAMPLE_PH - 1 - (unsigned)sh.p_win_t;
    }
    if (ok) {
        cut->tau = __uint_as_float(b1 << 20 | b2 << 10 | d3);
        cut->gt = sh.p_above;
        cut->n_eq = (int)(sh.p_mass / (double)cut->tau + 0.5);
        const double q = ceil((cut->target - cut->gt) / (double)cut->tau);
        cut->need = q < 1 ? 1 : (q > cut->n_eq ? cut->n_eq : (int)q);
    } // else rounding left the target unreached: tau = 0, keep every positive weight
    const float tau = cut->tau;
    unsigned gt = 0, eq = 0;
    for (int e = 0; e < SAMPLE_PER_THREAD; e++) {
        gt |= (unsigned)(w[e] > tau) << e;
        eq |= (unsigned)(w[e] == tau) << e;
    }
    gt &= alive;
    eq &= alive;
    if (*dense && cut->need == cut->n_eq)
        return alive & (gt | eq); // w >= tau (tau = 0: everything)
    unsigned *pc0 = sh.pc[0];
    const int allow =
        ok ? sample_allow(me.ncl, me.rank, cut->need, [&](int r) { return (int)remote(cl, &pc0[d3], r); })
           : 0;
    *dense = false;
    return alive & (gt | sample_take_ties(eq, allow, sh));
}

// ---- phase 5: the candidates and their block sums --------------------------------------------

// The final weights of the alive candidates and the block sums of docs/SAMPLER.md "Σ": dense
// (in sh.w, ids in place) or, after top-k / a partial top-p cut, a compacted list in global
// memory (a.cand_w / a.cand_id, in id order). Returns the list length (V when dense).
// Cluster-wide.
static __device__ __forceinline__ int sample_candidates(cg::cluster_group &cl,
                                                        const sample_kargs &a, sample_smem &sh,
                                                        const sample_me &me, const float *w,
                                                        unsigned alive, bool dense)
{
    const int t = me.t, my0 = me.my0, base = me.base;
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
        if (l == 0 && b < SAMPLE_CTA_ELEMS / SAMPLE_BLOCK && gb * SAMPLE_BLOCK < a.V) a.bsum[gb] = s;
        __threadfence();
        return a.V;
    }
    int total;
    int pos = cta_excl<int>(__popc(alive), sh.scri, &total);
    if (t == 0) sh.part.n_alive = total;
    cl.sync();
    int before = 0, n_list = 0;
    for (int r = 0; r < me.ncl; r++) {
        const int c = remote(cl, &sh.part.n_alive, r);
        if (r < me.rank) before += c;
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
    const int n_thr = me.ncl * SAMPLE_THREADS;
    for (int it = 0; it * n_thr < nblk * 8; it++) {
        const int p = it * n_thr + me.rank * SAMPLE_THREADS + t, b = p >> 3, l = p & 7;
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
    return n_list;
}

// ---- phase 6: the draw and the result (CTA 0) ------------------------------------------------

// The weight at list position q: dense from the owning CTA's shared memory, else the list.
static __device__ __forceinline__ float sample_weight_at(cg::cluster_group &cl,
                                                         const sample_kargs &a, sample_smem &sh,
                                                         bool dense, int q)
{
    return dense ? *cl.map_shared_rank(&sh.w[q % SAMPLE_CTA_ELEMS], q / SAMPLE_CTA_ELEMS)
                 : __ldcg(&a.cand_w[q]);
}

// The drawn token: the first candidate whose running sum of weights exceeds u * (the total of
// the block sums), model/sampler.c's loop from the block that crosses it on. CTA 0, all its
// threads (synchronises it).
static __device__ __forceinline__ int sample_draw(cg::cluster_group &cl, const sample_kargs &a,
                                                  sample_smem &sh, int t, int ncl, bool dense,
                                                  int n_list)
{
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
        sh.blk[t] = pos < n_list ? sample_weight_at(cl, a, sh, dense, pos) : 0.0f;
    }
    __syncthreads();
    if (t == 0) {
        // model/sampler.c's loop from the crossing block on (later blocks only when the
        // in-block running sum falls short of the block sum's: rounding)
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
                const float x = b == bf ? sh.blk[q - b * SAMPLE_BLOCK] : sample_weight_at(cl, a, sh, dense, q);
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
    return sh.bfirst;
}

// The result (CTA 0, thread 0): the token, its logprob and the top-n list by (z desc, id asc),
// as log-softmax of the penalised logits (lse from every CTA's S1), and the top-p cut.
static __device__ __forceinline__ void sample_result_write(cg::cluster_group &cl,
                                                           const sample_kargs &a,
                                                           sample_smem &sh, int ncl, int token,
                                                           bool lp, float zmax,
                                                           const sample_cut &cut)
{
    double lse = 0;
    if (lp) {
        double s1 = 0;
        for (int r = 0; r < ncl; r++) s1 += remote(cl, &sh.part.s1, r);
        lse = (double)zmax + log(s1);
    }
    sample_result *res = a.res;
    res->token = token;
    res->logprob = 0.0f;
    if (lp) {
        float zt = a.logits[token];
        if (a.pen) {
            const int c = a.counts[token];
            if (c > 0) zt = sample_penalize(zt, c, a.rp, a.fp, a.pp);
        }
        res->logprob = (float)((double)zt - lse);
    }
    const int n = min(sh.topn_cnt, SAMPLING_MAX_LOGPROBS);
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
    sample_topp_diag *d = a.diag;
    d->target = cut.target;
    d->mass_gt = cut.gt;
    d->mass_ge = cut.gt + (double)cut.n_eq * (double)cut.tau;
    d->tau = cut.tau;
    d->n_eq = cut.n_eq;
    d->need = cut.need;
}

// ---- the kernel ------------------------------------------------------------------------------

static __global__ void __launch_bounds__(SAMPLE_THREADS, 1) sample_kernel(sample_kargs a)
{
    ds_grid_dep();
    extern __shared__ __align__(16) unsigned char sample_smem_raw[];
    sample_smem &sh = *reinterpret_cast<sample_smem *>(sample_smem_raw);
    cg::cluster_group cl = cg::this_cluster();
    sample_me me;
    me.ncl = (int)cl.num_blocks();
    me.rank = (int)cl.block_rank();
    me.t = threadIdx.x;
    me.base = me.rank * SAMPLE_CTA_ELEMS; // first id of this CTA
    me.my0 = me.t * SAMPLE_PER_THREAD;    // this thread's first local index
    const int n_valid = min(max(a.V - (me.base + me.my0), 0), SAMPLE_PER_THREAD);
    me.valid = n_valid >= 32 ? 0xFFFFFFFFu : (1u << n_valid) - 1;

    sample_penalties(a, sh, me.base, me.t);
    const bool topk = a.top_k > 0;
    const int kn = min(a.n_top, a.V);
    sample_max(cl, sh, me, topk || kn > 0);
    const float zmax = sample_unkey((unsigned)(sh.g_maxkey >> 32));
    const int argmax = (int)(0xFFFFFFFFu - (unsigned)sh.g_maxkey);
    const bool lp = a.want_lp || kn > 0;
    if (lp) sample_logsum(sh, me, zmax);
    unsigned alive = me.valid;
    if (topk || kn > 0) alive = sample_select_top(cl, a, sh, me, topk, kn, alive);

    const bool draw = a.temperature > 0.0f;
    bool dense = !topk;
    int n_list = a.V;
    sample_cut cut = {};
    if (draw) {
        float w[SAMPLE_PER_THREAD];
        for (int e = 0; e < SAMPLE_PER_THREAD; e++)
            w[e] = (me.valid >> e & 1) ? sample_exp(__fmul_rn(__fsub_rn(sh.z[me.my0 + e], zmax), a.inv_t))
                                      : 0.0f;
        if (a.top_p < 1.0f) alive = sample_topp(cl, a, sh, me, w, alive, &dense, &cut);
        if (a.min_p > 0.0f)
            for (int e = 0; e < SAMPLE_PER_THREAD; e++)
                if (!(w[e] >= a.min_p)) alive &= ~(1u << e);
        n_list = sample_candidates(cl, a, sh, me, w, alive, dense);
    }
    cl.sync(); // block sums, S1 partials, the top-n list and last_pos are complete

    if (me.rank == 0) {
        const int token = draw ? sample_draw(cl, a, sh, me.t, me.ncl, dense, n_list) : argmax;
        if (me.t == 0) sample_result_write(cl, a, sh, me.ncl, token, lp, zmax, cut);
    }
    cl.sync(); // CTA 0 read the others' shared memory
}

// ---- host: attributes once, then launches -----------------------------------------------------

size_t sample_kernel_smem_bytes(void) { return sizeof(sample_smem); }

// the cluster launch of ncl CTAs (with the programmatic attribute when l->pdl)
static void sample_cfg(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *at, int ncl,
                       const cuda_launch *l)
{
    *cfg = {};
    cfg->gridDim = dim3(ncl);
    cfg->blockDim = dim3(SAMPLE_THREADS);
    cfg->dynamicSmemBytes = sizeof(sample_smem);
    cfg->stream = ds_stream(l);
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = ncl;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg->attrs = at;
    cfg->numAttrs = l && l->pdl ? 2 : 1;
}

int sample_kernel_setup(int ncl, status *st)
{
    const size_t smem = sizeof(sample_smem);
    cudaError_t e = cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e == cudaSuccess && ncl > 8)
        e = cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    int n_clusters = 0;
    if (e == cudaSuccess) {
        cudaLaunchConfig_t cfg;
        cudaLaunchAttribute at[2];
        sample_cfg(&cfg, at, ncl, nullptr);
        e = cudaOccupancyMaxActiveClusters(&n_clusters, sample_kernel, &cfg);
    }
    if (e != cudaSuccess || n_clusters < 1) {
        cudaGetLastError();
        return status_fail(st, STATUS_UNSUPPORTED,
                           "sample: a cluster of %d CTAs x %d threads with %zu B of shared memory "
                           "cannot run (%s)",
                           ncl, SAMPLE_THREADS, smem,
                           e != cudaSuccess ? cudaGetErrorString(e) : "no active cluster");
    }
    return STATUS_OK;
}

void sample_kernel_launch(const sample_kargs &a, int ncl, const cuda_launch *l)
{
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[2];
    sample_cfg(&cfg, at, ncl, l);
    cudaLaunchKernelEx(&cfg, sample_kernel, a);
}
