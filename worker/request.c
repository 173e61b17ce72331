#include "worker/request.h"

#include <string.h>

#include "common/utf8.h"
#include "rpc/rpc_sampling.h"

int worker_request_parse(const Deltaserve__V1__WorkerGenerateRequest *req,
                         const worker_limits *lim, uint64_t random_seed, const char *fallback_id,
                         engine_params *out, status *st)
{
    memset(out, 0, sizeof *out);
    const char *id = req->request_id && req->request_id[0] ? req->request_id : fallback_id;
    if (strlen(id) > ENGINE_REQUEST_ID_MAX)
        return status_fail(st, STATUS_INVALID, "request_id: longer than %d bytes",
                           ENGINE_REQUEST_ID_MAX);
    if (!utf8_valid(id, strlen(id))) /* it is echoed in every response */
        return status_fail(st, STATUS_INVALID, "request_id: not valid UTF-8");
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

    sampling_params sp = rpc_sampling_from_proto(req->sampling, req->logprobs);
    if (sampling_params_validate(&sp, "sampling.", st)) {
        char m[sizeof st->msg];
        snprintf(m, sizeof m, "%s", st->msg);
        return status_fail(st, STATUS_INVALID, "request %s: %s", id, m);
    }
    if (sp.seed == 0) sp.seed = random_seed;
    out->sampling = sampling_params_resolve(&sp);
    out->no_speculation = req->no_speculation != 0;
    if (req->stream_interval > WORKER_MAX_STREAM_INTERVAL)
        return status_fail(st, STATUS_INVALID, "request %s: stream_interval: %u exceeds %d", id,
                           req->stream_interval, WORKER_MAX_STREAM_INTERVAL);

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
