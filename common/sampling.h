/* The sampling parameters of one sequence: the one type from the wire (proto SamplingParams +
 * logprobs) to both samplers (model/sampler.h on the host, kernels/cuda/sample.h on the GPU).
 * Validated once, where a request enters a process (router_request.c, worker/request.c, the
 * CLI), with sampling_params_validate; resolved once with sampling_params_resolve. The
 * samplers take resolved, valid parameters and assert nothing else about them.
 *
 * Zero-initialised = greedy decoding with no penalties and no logprobs: proto3 fields that
 * are absent arrive as 0, and 0 means "default" wherever that default is the neutral value. */
#ifndef DS_COMMON_SAMPLING_H
#define DS_COMMON_SAMPLING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

#define SAMPLING_MAX_LOGPROBS 20

/* What sampling one row gives, on every layer (the CPU and GPU samplers, the forward's rows, the
 * engine's items, the sinks): the token, and its logprob and the top alternatives when the
 * sequence asked for n_logprobs > 0 (n_top = n_logprobs then, else 0). */
typedef struct sample_result {
    int32_t token;
    float logprob;                           /* of token, when asked */
    int32_t n_top;
    int32_t top_id[SAMPLING_MAX_LOGPROBS];   /* most likely first */
    float top_logprob[SAMPLING_MAX_LOGPROBS];
} sample_result;

typedef struct sampling_params {
    float temperature;        /* 0 = greedy; > 0 divides the logits. Finite, >= 0 */
    int32_t top_k;            /* keep the k most likely; 0 = off (all). >= 0 */
    float top_p;              /* nucleus mass in (0, 1]; 0 = default = 1 (off) */
    float min_p;              /* drop p < min_p * p_max, in [0, 1]; 0 = off */
    float repetition_penalty; /* > 0; 0 = default = 1 (off). Divides positive logits of
                                 penalised tokens, multiplies negative ones */
    float presence_penalty;   /* in [-2, 2]; subtracted once from each penalised token */
    float frequency_penalty;  /* in [-2, 2]; subtracted count times */
    bool penalize_prompt;     /* prompt tokens count for the penalties (llama.cpp); false:
                                 only generated tokens count (vLLM presence/frequency) */
    int32_t penalty_window;   /* penalties see the last N accepted tokens; 0 = all. >= 0 */
    uint64_t seed;            /* RNG key (resolved by the caller: 0 is just seed 0 here) */
    int32_t n_logprobs;       /* top alternatives to report, 0..SAMPLING_MAX_LOGPROBS */
} sampling_params;

/* Checks every field; STATUS_INVALID with one message naming the first bad field as the
 * .proto spells it, prefixed by `prefix` (e.g. "sampling." gives "sampling.top_p: 1.5 is
 * outside (0, 1]"; NULL = no prefix). st may be NULL. n_logprobs is named "logprobs" without
 * the prefix: on the wire it sits beside `sampling`, not inside it. */
int sampling_params_validate(const sampling_params *p, const char *prefix, status *st);

/* p with the defaults filled in (top_p 0 -> 1, repetition_penalty 0 -> 1); p must be valid. */
sampling_params sampling_params_resolve(const sampling_params *p);

/* true when the resolved parameters pick the argmax (temperature 0 or top_k 1) and change no
 * logit (no penalty): the step's fused argmax is the sample. */
bool sampling_params_is_greedy(const sampling_params *p);

/* true when no penalty changes a logit (repetition 1 or 0, presence and frequency 0): the draws
 * depend on the logits and the seed alone, so a verify row's draw is the one a one-row step
 * would make (speculative decoding, worker/spec.h). */
bool sampling_params_no_penalty(const sampling_params *p);

#endif
