/* INTERIM: greedy sampling with logprobs until model/sampler.h lands (then this file becomes a
 * thin adapter over it). temperature > 0 is refused with STATUS_UNSUPPORTED. */
#include "worker/sample.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

struct worker_sampler {
    int vocab;
    worker_sampling p;
};

int worker_sampler_create(int vocab, int n_ctx, worker_sampler **out, status *st)
{
    (void)n_ctx;
    worker_sampler *s = calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "sampler: out of memory");
    s->vocab = vocab;
    *out = s;
    return STATUS_OK;
}

void worker_sampler_destroy(worker_sampler *s) { free(s); }

int worker_sampler_start(worker_sampler *s, const worker_sampling *p, status *st)
{
    if (p->temperature > 0)
        return status_fail(st, STATUS_UNSUPPORTED, "sampling with temperature > 0 is not built yet");
    s->p = *p;
    return STATUS_OK;
}

void worker_sampler_accept(worker_sampler *s, const int32_t *tokens, int n)
{
    (void)s;
    (void)tokens;
    (void)n;
}

void worker_sampler_sample(worker_sampler *s, float *logits, worker_batch_item *it)
{
    int V = s->vocab, best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    it->token = best;
    it->n_top = 0;
    if (s->p.n_logprobs <= 0) return;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - logits[best]);
    float lse = logits[best] + (float)log(sum);
    it->logprob = logits[best] - lse;
    int k = s->p.n_logprobs < V ? s->p.n_logprobs : V;
    for (int j = 0; j < k; j++) { /* k <= 20 passes: fine for an interim */
        int arg = -1;
        for (int i = 0; i < V; i++) {
            bool taken = false;
            for (int q = 0; q < j && !taken; q++) taken = it->top[q].id == i;
            if (!taken && (arg < 0 || logits[i] > logits[arg])) arg = i;
        }
        it->top[j].id = arg;
        it->top[j].logprob = logits[arg] - lse;
    }
    it->n_top = k;
}
