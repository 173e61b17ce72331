/* worker_sampling -> model/sampler.h. Penalties count prompt and generated tokens alike
 * (penalize_prompt, llama.cpp's choice; documented in the .proto), over the whole sequence. */
#include "worker/sample.h"

#include <stdlib.h>

#include "model/sampler.h"

struct worker_sampler {
    sampler *s;      /* owned */
    int n_logprobs;  /* of the current request */
    sampler_logprob top[SAMPLER_MAX_LOGPROBS]; /* scratch */
};

_Static_assert(WORKER_MAX_LOGPROBS == SAMPLER_MAX_LOGPROBS, "one logprob limit");

static sampler_params to_params(const worker_sampling *p)
{
    sampler_params sp = {0};
    sp.temperature = p->temperature;
    sp.top_k = p->top_k;
    sp.top_p = p->top_p;
    sp.min_p = p->min_p;
    sp.repetition_penalty = p->repetition_penalty;
    sp.presence_penalty = p->presence_penalty;
    sp.frequency_penalty = p->frequency_penalty;
    sp.penalize_prompt = true;
    sp.penalty_window = 0;
    sp.seed = p->seed;
    sp.n_logprobs = p->n_logprobs;
    return sp;
}

int worker_sampler_create(int vocab, int n_ctx, worker_sampler **out, status *st)
{
    *out = NULL;
    worker_sampler *w = calloc(1, sizeof *w);
    if (!w) return status_fail(st, STATUS_NOMEM, "sampler: out of memory");
    sampler_params greedy = {0};
    if (sampler_create(&w->s, vocab, n_ctx, &greedy, st)) {
        free(w);
        return st->code;
    }
    *out = w;
    return STATUS_OK;
}

void worker_sampler_destroy(worker_sampler *w)
{
    if (!w) return;
    sampler_destroy(w->s);
    free(w);
}

int worker_sampler_start(worker_sampler *w, const worker_sampling *p, status *st)
{
    sampler_params sp = to_params(p);
    w->n_logprobs = p->n_logprobs;
    return sampler_reset(w->s, &sp, st);
}

void worker_sampler_accept(worker_sampler *w, const int32_t *tokens, int n, bool prompt)
{
    if (prompt) {
        sampler_accept_prompt(w->s, tokens, n);
        return;
    }
    for (int i = 0; i < n; i++) sampler_accept(w->s, tokens[i]);
}

int worker_sampler_sample(worker_sampler *w, float *logits, worker_batch_item *it, status *st)
{
    bool lp = w->n_logprobs > 0;
    it->token = sampler_sample(w->s, logits, lp ? w->top : NULL, lp ? &it->logprob : NULL);
    if (it->token < 0)
        return status_fail(st, STATUS_INTERNAL, "slot %d: the model produced no finite logit "
                           "(NaN or inf; are the weights broken?)", it->slot);
    it->n_top = lp ? w->n_logprobs : 0;
    for (int i = 0; i < it->n_top; i++) {
        it->top[i].id = w->top[i].token;
        it->top[i].logprob = w->top[i].logprob;
    }
    return STATUS_OK;
}
