/* The wire's sampling fields (proto SamplingParams + the request's `logprobs`) as the one
 * sampling type, common/sampling.h. Shared by the router and the worker, which both validate
 * the result with sampling_params_validate(&p, "sampling.", st), so a knob added to the
 * .proto is copied here once. */
#ifndef DS_RPC_RPC_SAMPLING_H
#define DS_RPC_RPC_SAMPLING_H

#include <stdint.h>

#include "common/sampling.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"

/* A field-for-field copy, not validated, not resolved: s NULL = all zero (greedy). Penalties
 * count prompt tokens too (penalize_prompt, as the .proto documents) over the whole sequence
 * (penalty_window 0). logprobs above INT32_MAX becomes INT32_MAX (still refused). */
sampling_params rpc_sampling_from_proto(const Deltaserve__V1__SamplingParams *s,
                                        uint32_t logprobs);

#endif
