/* sampling_params -> model/sampler.h, with the Worker API's logprobs. The parameters come
 * validated and resolved from worker/request.c (penalize_prompt set by rpc/rpc_sampling.c,
 * as the .proto documents). */
#include "worker/sample.h"

#include <stdlib.h>

#include "model/sampler.h"

struct worker_sampler {
    sampler *s;      /* owned */
    int n_logprobs;  /* of the current request */
    sampler_logprob top[SAMPLER_MAX_LOGPROBS]; /* scratch */
};

int worker_sampler_create(int vocab, int n_ctx, worker_sampler **out, status *st)
{
    *out = NULL;
    worker_sampler *w = calloc(1, sizeof *w);
    if (!w) return status_fail(st, STATUS_NOMEM, "sampler: out of memory");
    const sampling_params greedy = sampling_params_resolve(&(sampling_params){0});
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

void worker_sampler_start(worker_sampler *w, const sampling_params *p)
{
    w->n_logprobs = p->n_logprobs;
    sampler_reset(w->s, p);
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
