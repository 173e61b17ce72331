#include "worker/request.h"

#include <math.h>
#include <string.h>

static int check_sampling(const Deltaserve__V1__SamplingParams *s, uint64_t random_seed,
                          worker_sampling *o, status *st)
{
    *o = (worker_sampling){.top_p = 1.0f, .repetition_penalty = 1.0f, .seed = random_seed};
    if (!s) return STATUS_OK;
    if (!isfinite(s->temperature) || s->temperature < 0)
        return status_fail(st, STATUS_INVALID, "sampling.temperature: %g must be finite and >= 0",
                           s->temperature);
    if (s->top_k < 0)
        return status_fail(st, STATUS_INVALID, "sampling.top_k: %d must be >= 0", s->top_k);
    if (isnan(s->top_p) || s->top_p < 0 || s->top_p > 1)
        return status_fail(st, STATUS_INVALID, "sampling.top_p: %g is outside (0, 1]", s->top_p);
    if (isnan(s->min_p) || s->min_p < 0 || s->min_p > 1)
        return status_fail(st, STATUS_INVALID, "sampling.min_p: %g is outside [0, 1]", s->min_p);
    if (!isfinite(s->repetition_penalty) || s->repetition_penalty < 0)
        return status_fail(st, STATUS_INVALID,
                           "sampling.repetition_penalty: %g must be > 0 (0 = default 1)",
                           s->repetition_penalty);
    if (isnan(s->presence_penalty) || fabsf(s->presence_penalty) > 2)
        return status_fail(st, STATUS_INVALID, "sampling.presence_penalty: %g is outside [-2, 2]",
                           s->presence_penalty);
    if (isnan(s->frequency_penalty) || fabsf(s->frequency_penalty) > 2)
        return status_fail(st, STATUS_INVALID, "sampling.frequency_penalty: %g is outside [-2, 2]",
                           s->frequency_penalty);
    o->temperature = s->temperature;
    o->top_k = s->top_k;
    o->top_p = s->top_p > 0 ? s->top_p : 1.0f;
    o->min_p = s->min_p;
    o->repetition_penalty = s->repetition_penalty > 0 ? s->repetition_penalty : 1.0f;
    o->presence_penalty = s->presence_penalty;
    o->frequency_penalty = s->frequency_penalty;
    o->seed = s->seed ? s->seed : random_seed;
    return STATUS_OK;
}

int worker_request_parse(const Deltaserve__V1__WorkerGenerateRequest *req,
                         const worker_limits *lim, uint64_t random_seed, const char *fallback_id,
                         engine_params *out, status *st)
{
    memset(out, 0, sizeof *out);
    const char *id = req->request_id && req->request_id[0] ? req->request_id : fallback_id;
    if (strlen(id) > ENGINE_REQUEST_ID_MAX)
        return status_fail(st, STATUS_INVALID, "request_id: longer than %d bytes",
                           ENGINE_REQUEST_ID_MAX);
    strcpy(out->id, id);

    int n = (int)req->n_prompt_token_ids;
    if (req->n_prompt_token_ids == 0)
        return status_fail(st, STATUS_INVALID, "request %s: prompt_token_ids: empty prompt", id);
    if (req->n_prompt_token_ids >= (size_t)lim->n_ctx)
        return status_fail(st, STATUS_INVALID,
                           "request %s: prompt_token_ids: %zu tokens do not fit the context of %d "
                           "(at most %d, leaving room for one generated token)",
                           id, req->n_prompt_token_ids, lim->n_ctx, lim->n_ctx - 1);
    for (int i = 0; i < n; i++)
        if (req->prompt_token_ids[i] < 0 || req->prompt_token_ids[i] >= lim->vocab)
            return status_fail(st, STATUS_INVALID,
                               "request %s: prompt_token_ids[%d]: id %d is outside the vocabulary "
                               "[0, %d)", id, i, req->prompt_token_ids[i], lim->vocab);
    out->prompt = req->prompt_token_ids;
    out->n_prompt = n;

    if (check_sampling(req->sampling, random_seed, &out->sampling, st)) {
        char m[sizeof st->msg];
        snprintf(m, sizeof m, "%s", st->msg);
        return status_fail(st, STATUS_INVALID, "request %s: %s", id, m);
    }
    if (req->logprobs > WORKER_MAX_LOGPROBS)
        return status_fail(st, STATUS_INVALID, "request %s: logprobs: %u is more than %d", id,
                           req->logprobs, WORKER_MAX_LOGPROBS);
    out->sampling.n_logprobs = (int)req->logprobs;

    int room = lim->n_ctx - n;
    const Deltaserve__V1__StoppingCriteria *s = req->stopping;
    out->max_new_tokens = room < WORKER_DEFAULT_MAX_NEW_TOKENS ? room : WORKER_DEFAULT_MAX_NEW_TOKENS;
    if (!s) return STATUS_OK;
    if (s->max_new_tokens > (uint32_t)room)
        return status_fail(st, STATUS_INVALID,
                           "request %s: stopping.max_new_tokens: %u exceeds the context left after "
                           "the %d-token prompt (%d of %d)", id, s->max_new_tokens, n, room, lim->n_ctx);
    if (s->max_new_tokens) out->max_new_tokens = (int)s->max_new_tokens;
    if (s->n_stop_token_ids > ENGINE_MAX_STOP_IDS)
        return status_fail(st, STATUS_INVALID, "request %s: stopping.stop_token_ids: %zu ids, at most %d",
                           id, s->n_stop_token_ids, ENGINE_MAX_STOP_IDS);
    for (size_t i = 0; i < s->n_stop_token_ids; i++) {
        if (s->stop_token_ids[i] < 0 || s->stop_token_ids[i] >= lim->vocab)
            return status_fail(st, STATUS_INVALID,
                               "request %s: stopping.stop_token_ids[%zu]: id %d is outside the "
                               "vocabulary [0, %d)", id, i, s->stop_token_ids[i], lim->vocab);
        out->stop_ids[i] = s->stop_token_ids[i];
    }
    out->n_stop_ids = (int)s->n_stop_token_ids;
    out->ignore_eos = s->ignore_eos != 0;
    return STATUS_OK;
}
