/* Per-slot sampling for host-side backends: sampling_params -> the model's sampler
 * (model/sampler.h), with the logprobs the Worker API returns. One per sequence slot, created
 * once; start() re-seeds it for a new request; nothing is allocated after creation. */
#ifndef DS_WORKER_SAMPLE_H
#define DS_WORKER_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "worker/backend.h"

typedef struct worker_sampler worker_sampler;

int worker_sampler_create(int vocab, int n_ctx, worker_sampler **out, status *st);
void worker_sampler_destroy(worker_sampler *s);

/* A new sequence with these parameters (validated and resolved by worker/request.c). */
void worker_sampler_start(worker_sampler *s, const sampling_params *p);

/* Tokens fed to the sequence, in order: prompt tokens (prompt = true) and generated ones. */
void worker_sampler_accept(worker_sampler *s, const int32_t *tokens, int n, bool prompt);

/* Samples from logits [vocab] (modified) into it->token, and it->logprob / it->top / it->n_top
 * when the sequence asked for logprobs. STATUS_INTERNAL when no logit is finite (the model
 * produced NaN or inf: broken weights), so the request fails instead of the worker. */
int worker_sampler_sample(worker_sampler *s, float *logits, worker_batch_item *it, status *st);

#endif
