// The sampler's slot on the host (sample.h): device state allocated once, per-request reset,
// the accepted-token history and penalty counts (sample_push_kernel), and sample_run, which
// launches the cluster kernel of sample.cu.
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/sample_kernel.cuh"

// Records accepted positions [start, start + n) (token `tok` when >= 0, else the ids already
// copied into hist) and keeps counts = the counted tokens of the last `window` positions.
static __global__ void sample_push_kernel(int32_t *hist, int32_t *counts, int start, int n, int counted,
                                          int window, int tok)
{
    ds_grid_dep();
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

// what the device writes for the host: mapped pinned memory
struct sample_mapped {
    sample_result res;
    sample_topp_diag diag;
};

struct sample_slot {
    int32_t V, n_ctx_max;
    int ncl;                // CTAs per cluster
    sampling_params p;      // resolved
    bool want_lp;           // the chosen token's logprob (or n_logprobs > 0)
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
    sample_mapped *h_out;   // owned, pinned (mapped), [SAMPLE_MAX_ROWS]: a result per row
    sample_mapped *d_out;   // its device address
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
    int rc = sample_kernel_setup(s->ncl, st);
    if (rc) goto fail;
    if ((rc = cuda_alloc((void **)&s->d_counts, (size_t)n_vocab * 4, "sample counts", st)) ||
        (rc = cuda_alloc((void **)&s->d_hist, (size_t)n_ctx_max * 4, "sample history", st)) ||
        (rc = cuda_alloc((void **)&s->d_cand_w, (size_t)n_vocab * 4, "sample candidates", st)) ||
        (rc = cuda_alloc((void **)&s->d_cand_id, (size_t)n_vocab * 4, "sample candidate ids", st)) ||
        (rc = cuda_alloc((void **)&s->d_bsum, SAMPLE_MAX_BLOCKS * sizeof(double), "sample block sums", st)) ||
        (rc = cuda_host_alloc((void **)&s->h_staging, (size_t)n_ctx_max * 4, "sample staging", st)) ||
        (rc = cuda_host_alloc((void **)&s->h_out, SAMPLE_MAX_ROWS * sizeof(sample_mapped), "sample result", st)) ||
        (rc = cuda_memset(s->d_counts, 0, (size_t)n_vocab * 4, st)))
        goto fail;
    memset(s->h_out, 0, SAMPLE_MAX_ROWS * sizeof *s->h_out);
    {
        const cudaError_t e = cudaHostGetDevicePointer((void **)&s->d_out, s->h_out, 0);
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
    cuda_host_free(s->h_out);
    free(s);
}

extern "C" int sample_reset(sample_slot *s, const sampling_params *p, bool want_logprob,
                            const cuda_launch *l, status *st)
{
    if (s->staging_pending) { // the last request's prompt copy must be done with h_staging
        if (cuda_sync(ds_stream(l), "sample_reset", st)) return st->code;
        s->staging_pending = false;
    }
    if (s->counts_dirty) {
        CUDA_TRY(st, cudaMemsetAsync(s->d_counts, 0, (size_t)s->V * 4, ds_stream(l)));
        s->counts_dirty = false;
    }
    s->p = *p;
    s->want_lp = want_logprob || p->n_logprobs > 0;
    s->inv_t = p->temperature > 0 ? 1.0f / p->temperature : 0.0f;
    s->pen = p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    s->n_seq = 0;
    s->step = 0;
    return STATUS_OK;
}

static void sample_push(sample_slot *s, int64_t n, bool counted, int32_t tok, const cuda_launch *l)
{
    const int blocks = (int)(n < 256 * 64 ? ds_div_up(n, 256) : 64);
    ds_launch(sample_push_kernel, blocks, 256, 0, l, s->d_hist, s->d_counts, (int)s->n_seq, (int)n,
              (int)counted, (int)s->p.penalty_window, (int)tok);
    s->counts_dirty = true;
}

extern "C" void sample_accept_prompt(sample_slot *s, const int32_t *ids, int64_t n,
                                     const cuda_launch *l)
{
    DS_ASSERT(n >= 0 && s->n_seq + n <= s->n_ctx_max);
    if (n == 0) return;
    if (s->pen) {
        for (int64_t i = 0; i < n; i++) DS_ASSERT(ids[i] >= 0 && ids[i] < s->V);
        memcpy(s->h_staging + s->n_seq, ids, (size_t)n * 4);
        cudaMemcpyAsync(s->d_hist + s->n_seq, s->h_staging + s->n_seq, (size_t)n * 4, cudaMemcpyHostToDevice,
                        ds_stream(l));
        s->staging_pending = true;
        sample_push(s, n, s->p.penalize_prompt, -1, l);
    }
    s->n_seq += n;
}

extern "C" void sample_accept(sample_slot *s, int32_t token, const cuda_launch *l)
{
    DS_ASSERT(token >= 0 && token < s->V && s->n_seq < s->n_ctx_max);
    if (s->pen) sample_push(s, 1, true, token, l);
    s->n_seq++;
}

extern "C" void sample_run(sample_slot *s, const float *d_logits, const cuda_launch *l)
{
    sample_run_row(s, d_logits, 0, l);
}

extern "C" void sample_run_row(sample_slot *s, const float *d_logits, int row, const cuda_launch *l)
{
    DS_ASSERT(row >= 0 && row < SAMPLE_MAX_ROWS);
    sample_kargs a;
    a.logits = d_logits;
    a.counts = s->d_counts;
    a.cand_w = s->d_cand_w;
    a.cand_id = s->d_cand_id;
    a.bsum = s->d_bsum;
    a.res = &s->d_out[row].res;
    a.diag = &s->d_out[row].diag;
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
    a.want_lp = s->want_lp;
    a.seed = s->p.seed;
    a.step = s->step++;
    sample_kernel_launch(a, s->ncl, l);
}

extern "C" const sample_result *sample_result_get(const sample_slot *s) { return &s->h_out->res; }
extern "C" const sample_result *sample_result_row(const sample_slot *s, int row)
{
    DS_ASSERT(row >= 0 && row < SAMPLE_MAX_ROWS);
    return &s->h_out[row].res;
}
extern "C" uint64_t sample_step(const sample_slot *s) { return s->step; }
extern "C" void sample_set_step(sample_slot *s, uint64_t step)
{
    DS_ASSERT(!s->pen && step <= s->step);
    s->step = step;
}
extern "C" const sample_topp_diag *sample_topp_diag_get(const sample_slot *s) { return &s->h_out->diag; }
extern "C" int sample_cluster_size(const sample_slot *s) { return s->ncl; }
