/* The CUDA forward's sampling (forward_cuda_impl.h): one GPU sampler per slot
 * (kernels/cuda/sample.h) run behind the step's graphs on the same stream, or, where the device
 * cannot run its cluster kernel, host samplers (model/sampler.h) on copied-back logits; the
 * tokens each slot's sampler counts; the sampled row's result read after the step's sync. Only
 * rank 0 samples under tensor parallelism (fc_samples). */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/forward_cuda_impl.h"

int fc_samplers_create(fc_rank *e, status *st)
{
    const int V = e->cfg.V;
    if (!fc_samples(e)) return STATUS_OK; /* tensor parallel: rank 0 samples */
    for (int i = 0; i < e->n_slots; i++) {
        if (!sample_create(&e->slots[i].sampler, V, e->n_ctx, st)) continue;
        if (st->code != STATUS_UNSUPPORTED) return st->code;
        LOG_WARN("cuda: sampling on the host (%s)", st->msg);
        status_clear(st);
        for (int j = 0; j <= i; j++) {
            sample_destroy(e->slots[j].sampler);
            e->slots[j].sampler = NULL;
        }
        e->h_logits = malloc((size_t)V * sizeof(float));
        if (!e->h_logits) return status_fail(st, STATUS_NOMEM, "cuda: host sampler logits");
        const sampling_params greedy = {0};
        for (int j = 0; j < e->n_slots; j++)
            if (sampler_create(&e->slots[j].host_sampler, V, e->n_ctx, &greedy, st))
                return st->code;
        return STATUS_OK;
    }
    return STATUS_OK;
}

void fc_samplers_destroy(fc_rank *e)
{
    for (int i = 0; e->slots && i < e->n_slots; i++) {
        sample_destroy(e->slots[i].sampler);
        sampler_destroy(e->slots[i].host_sampler);
    }
    free(e->h_logits);
}

int fc_sampler_start(fc_rank *e, fc_slot *sl, const sampling_params *p, status *st)
{
    sl->params = sampling_params_resolve(p); /* resolved by the caller; idempotent */
    p = &sl->params;
    sl->greedy = sampling_params_is_greedy(p);
    if (!fc_samples(e)) return STATUS_OK;
    if (sl->sampler) return sample_reset(sl->sampler, p, p->n_logprobs > 0, &e->launch, st);
    sampler_reset(sl->host_sampler, p);
    return STATUS_OK;
}

void fc_sampler_prompt(fc_rank *e, fc_slot *sl, const int32_t *ids, int n)
{
    if (!fc_samples(e) || !n) return;
    if (sl->sampler)
        sample_accept_prompt(sl->sampler, ids, n, &e->launch);
    else
        sampler_accept_prompt(sl->host_sampler, ids, n);
}

/* Tokens the slot's sampler counts (penalties), rows [i, j) of one slot, in order: the prompt
 * rows in one call (the GPU sampler stages them through its pinned buffer once per step). A
 * verify run's rows are not counted: its sequence has no penalties (fwd.h rollback). */
static void accept_rows(fc_rank *e, const fwd_row *rows, int i, int j)
{
    if (!fc_samples(e) || rows[i].verify) return;
    fc_slot *sl = &e->slots[rows[i].slot];
    int n = 0;
    for (int k = i; k < j; k++)
        if (rows[k].prompt) e->h_ids[n++] = rows[k].token;
    fc_sampler_prompt(e, sl, e->h_ids, n);
    for (int k = i; k < j; k++) {
        if (rows[k].prompt) continue;
        if (sl->sampler)
            sample_accept(sl->sampler, rows[k].token, &e->launch);
        else
            sampler_accept(sl->host_sampler, rows[k].token);
    }
}

int fc_read_sample(fc_rank *e, fwd_row *r, int32_t greedy_next, status *st)
{
    fc_slot *sl = &e->slots[r->slot];
    sample_result *out = &r->out;
    if (sl->greedy) {
        out->token = greedy_next;
        out->logprob = 0;
        out->n_top = 0;
    } else if (sl->sampler) { /* a verify run's row i: result i */
        *out = *sample_result_row(sl->sampler, r->verify ? fc_verify_row(sl, r) : 0);
    } else {
        out->token = sampler_sample(sl->host_sampler, e->h_logits, out);
    }
    if (out->token < 0 || out->token >= e->cfg.V)
        return status_fail(st, STATUS_INTERNAL, "slot %d: sampling found no token (%d; NaN or "
                           "inf logits? are the weights broken?)", r->slot, out->token);
    return STATUS_OK;
}

/* Host fallback: the row's logits back, then the host sampler (one more sync: this path only
 * runs where the device cannot run the GPU sampler). */
static int sample_on_host(fc_rank *e, fwd_row *r, const float *d_logits, status *st)
{
    cuda_copy_d2h_async(e->h_logits, d_logits, (size_t)e->cfg.V * 4, e->launch.stream);
    e->stats.d2h_bytes += (uint64_t)e->cfg.V * 4;
    if (cuda_sync(e->launch.stream, "step (host sampler)", st)) return st->code;
    return fc_read_sample(e, r, -1, st);
}

int fc_sample_run(fc_rank *e, fwd_row *rows, int i, int j, const float *d_logits,
                  status *st)
{
    fwd_row *r = &rows[j - 1];
    const fc_slot *sl = &e->slots[r->slot];
    accept_rows(e, rows, i, j);
    if (r->sample && !sl->greedy && sl->sampler) sample_run(sl->sampler, d_logits, &e->launch);
    if (r->sample && !sl->greedy && !sl->sampler && fc_samples(e) &&
        sample_on_host(e, r, d_logits, st))
        return st->code;
    return STATUS_OK;
}

/* ---- hidden outputs (the MTP head's h), read back like the samples ---- */

void fc_hidden_copy(fc_rank *e, int i, const float *d_h)
{
    if (!fc_samples(e)) return; /* tensor parallel: rank 0's rows carry the outputs */
    const size_t H = (size_t)e->cfg.H;
    cuda_copy_d2h_async(e->h_hidden + (size_t)i * H, d_h, H * 4, e->launch.stream);
    e->stats.d2h_bytes += (uint64_t)H * 4;
}

void fc_hidden_out(fc_rank *e, fwd_row *rows, int B)
{
    if (!fc_samples(e)) return;
    const size_t H = (size_t)e->cfg.H;
    for (int i = 0; i < B; i++)
        if (rows[i].hidden) memcpy(rows[i].hidden, e->h_hidden + (size_t)i * H, H * 4);
}
