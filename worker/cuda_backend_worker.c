/* The CUDA engine behind the worker's backend interface (worker/backend.h): one engine slot per
 * worker slot, one token at a time (prefill is fed token by token through the step graph; decode
 * items of a step run one after the other). Greedy sequences (temperature 0, no penalties, no
 * logprobs) take the argmax computed on the GPU and read back 8 bytes; the others copy the
 * logits back and sample with the worker's host sampler (worker/sample.h), exactly as the CPU
 * backend does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/backend.h"
#include "worker/cuda_backend.h"
#include "worker/sample.h"

typedef struct cuda_worker {
    worker_backend base;
    cuda_backend *eng;          /* owned */
    worker_sampler **samplers;  /* owned, [n_slots] */
    bool *greedy;               /* owned, [n_slots] */
    float *logits;              /* owned, [V] */
} cuda_worker;

static int cw_seq_start(worker_backend *b, int slot, const worker_sampling *s, status *st)
{
    cuda_worker *c = (cuda_worker *)b;
    DS_ASSERT(slot >= 0 && slot < b->n_slots);
    c->greedy[slot] = s->temperature == 0.0f && s->repetition_penalty == 1.0f &&
                      s->presence_penalty == 0.0f && s->frequency_penalty == 0.0f &&
                      s->n_logprobs == 0;
    if (cuda_backend_reset(c->eng, slot, st)) return st->code;
    return worker_sampler_start(c->samplers[slot], s, st);
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
            float *lg = last && it->sample && !c->greedy[it->slot] ? c->logits : NULL;
            if (cuda_backend_decode(c->eng, it->slot, it->tokens[k], lg, &next, st))
                return st->code;
        }
        worker_sampler *s = c->samplers[it->slot];
        worker_sampler_accept(s, it->tokens, it->n_tokens, it->prompt);
        if (!it->sample) continue;
        if (c->greedy[it->slot]) {
            it->token = next;
            it->logprob = 0.0f;
            it->n_top = 0;
        } else {
            worker_sampler_sample(s, c->logits, it);
        }
    }
    return STATUS_OK;
}

static void cw_destroy(worker_backend *b)
{
    cuda_worker *c = (cuda_worker *)b;
    if (!c) return;
    for (int i = 0; c->samplers && i < b->n_slots; i++) worker_sampler_destroy(c->samplers[i]);
    cuda_backend_destroy(c->eng);
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
    c->samplers = calloc((size_t)o->n_slots, sizeof *c->samplers);
    c->greedy = calloc((size_t)o->n_slots, sizeof *c->greedy);
    c->logits = malloc((size_t)m->cfg.V * sizeof(float));
    if (!c->samplers || !c->greedy || !c->logits) {
        status_fail(st, STATUS_NOMEM, "cuda backend: %d slots", o->n_slots);
        goto fail;
    }
    if (cuda_backend_create(m, &(cuda_backend_opts){.n_ctx = o->n_ctx, .n_slots = o->n_slots,
                                                    .verbose = true}, &c->eng, st))
        goto fail;
    for (int i = 0; i < o->n_slots; i++)
        if (worker_sampler_create(m->cfg.V, o->n_ctx, &c->samplers[i], st)) goto fail;
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
