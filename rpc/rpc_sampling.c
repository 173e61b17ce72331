#include "rpc/rpc_sampling.h"

sampling_params rpc_sampling_from_proto(const Deltaserve__V1__SamplingParams *s,
                                        uint32_t logprobs)
{
    sampling_params p = {
        .penalize_prompt = true,
        .n_logprobs = logprobs > INT32_MAX ? INT32_MAX : (int32_t)logprobs,
    };
    if (!s) return p;
    p.temperature = s->temperature;
    p.top_k = s->top_k;
    p.top_p = s->top_p;
    p.min_p = s->min_p;
    p.repetition_penalty = s->repetition_penalty;
    p.presence_penalty = s->presence_penalty;
    p.frequency_penalty = s->frequency_penalty;
    p.seed = s->seed;
    return p;
}
