/* sampling_params (common/sampling.h): validation naming the .proto field, defaults, greedy. */
#include "common/sampling.h"

#include <math.h>

/* The field name as the .proto spells it, after the caller's prefix ("sampling."). */
#define SP_FAIL(field, fmt, ...)                                                                \
    status_fail(st, STATUS_INVALID, "%s" field ": " fmt, prefix ? prefix : "", __VA_ARGS__)

int sampling_params_validate(const sampling_params *p, const char *prefix, status *st)
{
    /* comparisons are written so that NaN fails them */
    if (!isfinite(p->temperature) || !(p->temperature >= 0))
        return SP_FAIL("temperature", "%.9g must be finite and >= 0 (0 = greedy)",
                       (double)p->temperature);
    if (p->top_k < 0) return SP_FAIL("top_k", "%d must be >= 0 (0 = off)", (int)p->top_k);
    if (!(p->top_p >= 0 && p->top_p <= 1))
        return SP_FAIL("top_p", "%.9g is outside (0, 1] (0 = default 1)", (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return SP_FAIL("min_p", "%.9g is outside [0, 1] (0 = off)", (double)p->min_p);
    if (!isfinite(p->repetition_penalty) || !(p->repetition_penalty >= 0))
        return SP_FAIL("repetition_penalty", "%.9g must be finite and > 0 (0 = default 1)",
                       (double)p->repetition_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return SP_FAIL("presence_penalty", "%.9g is outside [-2, 2]", (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return SP_FAIL("frequency_penalty", "%.9g is outside [-2, 2]",
                       (double)p->frequency_penalty);
    if (p->penalty_window < 0)
        return SP_FAIL("penalty_window", "%d must be >= 0 (0 = all)", (int)p->penalty_window);
    /* logprobs sits beside `sampling` in the requests, not inside it: no prefix */
    if (p->n_logprobs < 0)
        return status_fail(st, STATUS_INVALID, "logprobs: %d is negative", (int)p->n_logprobs);
    if (p->n_logprobs > SAMPLING_MAX_LOGPROBS)
        return status_fail(st, STATUS_INVALID, "logprobs: %d is more than %d", (int)p->n_logprobs,
                           SAMPLING_MAX_LOGPROBS);
    return STATUS_OK;
}

sampling_params sampling_params_resolve(const sampling_params *p)
{
    sampling_params r = *p;
    if (r.top_p == 0) r.top_p = 1;
    if (r.repetition_penalty == 0) r.repetition_penalty = 1;
    return r;
}

bool sampling_params_no_penalty(const sampling_params *p)
{
    return (p->repetition_penalty == 1 || p->repetition_penalty == 0) &&
           p->presence_penalty == 0 && p->frequency_penalty == 0;
}

bool sampling_params_is_greedy(const sampling_params *p)
{
    return (p->temperature == 0 || p->top_k == 1) && sampling_params_no_penalty(p);
}
