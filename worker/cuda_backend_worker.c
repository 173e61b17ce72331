/* The CUDA engine behind the worker's backend interface (worker/backend.h): one engine slot per
 * worker slot, one token at a time (prefill is fed token by token through the step graph; decode
 * items of a step run one after the other). Greedy sequences (temperature 0, no penalties, no
 * logprobs) take the argmax the step graph computes (8 bytes read back). The others sample on
 * the GPU (kernels/cuda/sample.h: docs/SAMPLER.md's definition, the same as the CPU backend's
 * model/sampler.c, so a seed gives the same tokens from the same logits): the step is enqueued
 * without a sync, the sampler launched behind it on the same stream, and one sync reads back
 * the id and the logprobs when asked.
 *
 * Host fallback: when the device cannot run the sampler's cluster kernel (sample_create says
 * STATUS_UNSUPPORTED: a vocabulary above SAMPLE_MAX_VOCAB, or fewer than 16 free SMs in a GPC,
 * e.g. a small MIG slice), every slot samples on the host from copied-back logits with the
 * worker's host sampler (worker/sample.h), as before; one log line says so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/sample.h"
#include "worker/backend.h"
#include "worker/cuda_backend.h"
#include "worker/sample.h"

typedef struct cuda_worker {
    worker_backend base;
    cuda_backend *eng;          /* owned */
    sample_slot **gpu;          /* owned, [n_slots] GPU samplers; NULL: host fallback */
    worker_sampler **samplers;  /* owned, [n_slots] host samplers (fallback only) */
    bool *greedy;               /* owned, [n_slots] */
    float *logits;              /* owned, [V] (fallback only) */
} cuda_worker;

/* worker_sampling -> the GPU sampler's resolved parameters, as worker/sample.c maps it to
 * model/sampler.h (penalties count the prompt, over the whole sequence). */
static sample_params cw_params(const worker_sampling *p)
{
    return (sample_params){
        .temperature = p->temperature,
        .top_k = p->top_k,
        .top_p = p->top_p == 0.0f ? 1.0f : p->top_p,
        .min_p = p->min_p,
        .repetition_penalty = p->repetition_penalty == 0.0f ? 1.0f : p->repetition_penalty,
        .presence_penalty = p->presence_penalty,
        .frequency_penalty = p->frequency_penalty,
        .penalize_prompt = true,
        .penalty_window = 0,
        .seed = p->seed,
        .n_logprobs = p->n_logprobs,
        .want_logprob = p->n_logprobs > 0,
    };
}

static int cw_seq_start(worker_backend *b, int slot, const worker_sampling *s, status *st)
{
    cuda_worker *c = (cuda_worker *)b;
    DS_ASSERT(slot >= 0 && slot < b->n_slots);
    c->greedy[slot] = s->temperature == 0.0f && s->repetition_penalty == 1.0f &&
                      s->presence_penalty == 0.0f && s->frequency_penalty == 0.0f &&
                      s->n_logprobs == 0;
    if (cuda_backend_reset(c->eng, slot, st)) return st->code;
    if (c->gpu) {
        const sample_params sp = cw_params(s);
        return sample_reset(c->gpu[slot], &sp, cuda_backend_stream(c->eng), st);
    }
    return worker_sampler_start(c->samplers[slot], s, st);
}

/* Records the item's tokens with the slot's sampler (on the engine's stream). */
static void cw_accept(cuda_worker *c, const worker_batch_item *it)
{
    if (!c->gpu) {
        worker_sampler_accept(c->samplers[it->slot], it->tokens, it->n_tokens, it->prompt);
        return;
    }
    sample_slot *g = c->gpu[it->slot];
    struct CUstream_st *stream = cuda_backend_stream(c->eng);
    if (it->prompt) {
        sample_accept_prompt(g, it->tokens, it->n_tokens, stream);
        return;
    }
    for (int i = 0; i < it->n_tokens; i++) sample_accept(g, it->tokens[i], stream);
}

/* Samples on the GPU from the last step's device logits (the step enqueued before it on the
 * same stream): one launch, then the token's one sync, the result. */
static int cw_sample_gpu(cuda_worker *c, worker_batch_item *it, status *st)
{
    sample_slot *g = c->gpu[it->slot];
    struct CUstream_st *stream = cuda_backend_stream(c->eng);
    sample_run(g, cuda_backend_device_logits(c->eng), stream);
    if (cuda_sync(stream, "GPU sampler", st)) return st->code;
    cuda_backend_step_synced(c->eng);
    const sample_result *r = sample_result_get(g);
    if (r->token < 0 || r->token >= c->base.vocab) /* no weight to draw from: NaN/inf logits */
        return status_fail(st, STATUS_INTERNAL, "slot %d: the GPU sampler found no token "
                           "(%d; NaN or inf logits? are the weights broken?)", it->slot, r->token);
    it->token = r->token;
    it->logprob = r->logprob;
    it->n_top = r->n_top;
    for (int i = 0; i < r->n_top; i++) {
        it->top[i].id = r->top_id[i];
        it->top[i].logprob = r->top_logprob[i];
    }
    return STATUS_OK;
}

static int cw_step(worker_backend *b, worker_batch_item *items, int n, status *st)
{
    cuda_worker *c = (cuda_worker *)b;
    for (int i = 0; i < n; i++) {
        worker_batch_item *it = &items[i];
        DS_ASSERT(it->slot >= 0 && it->slot < b->n_slots && it->n_tokens >= 1);
        if (cuda_backend_n_past(c->eng, it->slot) + it->n_tokens > b->n_ctx)
            return status_fail(st, STATUS_RANGE, "slot %d: %d + %d tokens exceed the context %d",
                               it->slot, cuda_backend_n_past(c->eng, it->slot), it->n_tokens,
                               b->n_ctx);
        int32_t next = 0;
        for (int k = 0; k < it->n_tokens; k++) {
            const bool last = k == it->n_tokens - 1;
            if (last && it->sample && !c->greedy[it->slot] && c->gpu) {
                /* the GPU sampler follows on the stream and its readback is the one sync */
                if (cuda_backend_decode_enqueue(c->eng, it->slot, it->tokens[k], st))
                    return st->code;
                continue;
            }
            float *lg = last && it->sample && !c->greedy[it->slot] && !c->gpu ? c->logits : NULL;
            if (cuda_backend_decode(c->eng, it->slot, it->tokens[k], lg, &next, st))
                return st->code;
        }
        cw_accept(c, it);
        if (!it->sample) continue;
        if (c->greedy[it->slot]) {
            if (next < 0 || next >= b->vocab)
                return status_fail(st, STATUS_INTERNAL, "slot %d: the GPU argmax gave token %d "
                                   "of %d", it->slot, next, b->vocab);
            it->token = next;
            it->logprob = 0.0f;
            it->n_top = 0;
        } else if (c->gpu) {
            if (cw_sample_gpu(c, it, st)) return st->code;
        } else {
            if (worker_sampler_sample(c->samplers[it->slot], c->logits, it, st)) return st->code;
        }
    }
    return STATUS_OK;
}

static void cw_destroy(worker_backend *b)
{
    cuda_worker *c = (cuda_worker *)b;
    if (!c) return;
    for (int i = 0; c->samplers && i < b->n_slots; i++) worker_sampler_destroy(c->samplers[i]);
    for (int i = 0; c->gpu && i < b->n_slots; i++) sample_destroy(c->gpu[i]);
    cuda_backend_destroy(c->eng);
    free(c->gpu);
    free(c->samplers);
    free(c->greedy);
    free(c->logits);
    free(c);
}

static const worker_backend_vt cw_vt = {cw_seq_start, cw_step, cw_destroy, NULL};

int worker_backend_cuda_create(const qwen35_model *m, const worker_backend_opts *o,
                               worker_backend **out, status *st)
{
    *out = NULL;
    if (o->n_slots < 1 || o->n_ctx < 2)
        return status_fail(st, STATUS_INVALID, "cuda backend: need slots >= 1 and ctx >= 2 (got %d, %d)",
                           o->n_slots, o->n_ctx);
    cuda_worker *c = calloc(1, sizeof *c);
    if (!c) return status_fail(st, STATUS_NOMEM, "cuda backend");
    worker_backend *b = &c->base;
    b->vt = &cw_vt;
    b->model = m;
    b->n_slots = o->n_slots;
    b->n_ctx = o->n_ctx;
    b->vocab = m->cfg.V;
    c->greedy = calloc((size_t)o->n_slots, sizeof *c->greedy);
    c->gpu = calloc((size_t)o->n_slots, sizeof *c->gpu);
    if (!c->greedy || !c->gpu) {
        status_fail(st, STATUS_NOMEM, "cuda backend: %d slots", o->n_slots);
        goto fail;
    }
    if (cuda_backend_create(m, &(cuda_backend_opts){.n_ctx = o->n_ctx, .n_slots = o->n_slots,
                                                    .verbose = true}, &c->eng, st))
        goto fail;
    for (int i = 0; i < o->n_slots; i++) {
        if (!sample_create(&c->gpu[i], m->cfg.V, o->n_ctx, st)) continue;
        if (st->code != STATUS_UNSUPPORTED) goto fail;
        LOG_WARN("cuda backend: sampling on the host (%s)", st->msg);
        status_clear(st);
        for (int j = 0; j < i; j++) sample_destroy(c->gpu[j]);
        free(c->gpu);
        c->gpu = NULL;
        break;
    }
    if (!c->gpu) {
        c->samplers = calloc((size_t)o->n_slots, sizeof *c->samplers);
        c->logits = malloc((size_t)m->cfg.V * sizeof(float));
        if (!c->samplers || !c->logits) {
            status_fail(st, STATUS_NOMEM, "cuda backend: %d host samplers", o->n_slots);
            goto fail;
        }
        for (int i = 0; i < o->n_slots; i++)
            if (worker_sampler_create(m->cfg.V, o->n_ctx, &c->samplers[i], st)) goto fail;
    }
    cuda_backend_stats s;
    cuda_backend_get_stats(c->eng, &s);
    b->state_bytes = s.state_bytes / (uint64_t)o->n_slots;
    snprintf(b->device, sizeof b->device, "cuda:0 %s", cuda_backend_device_name(c->eng));
    *out = b;
    return STATUS_OK;
fail:
    cw_destroy(b);
    return st->code;
}
