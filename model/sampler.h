/* Token sampler: penalties, greedy / temperature / top-k / top-p / min-p, a counter-based
 * RNG, and logprobs. One `sampler` per sequence slot, created once (all scratch allocated
 * then) and reset per request; nothing is allocated per token. docs/SAMPLER.md has the full
 * definition (order of operations, RNG, logprob semantics) that the CUDA sampler matches.
 *
 * Order of operations in sampler_sample, as llama.cpp and vLLM:
 *   1. penalties on the logits, in place (repetition, then frequency and presence);
 *   2. logprobs (if asked): log-softmax of the penalised logits at temperature 1;
 *   3. temperature 0: greedy argmax (lowest id on ties); done;
 *   4. temperature, 5. top-k, 6. top-p, 7. min-p, 8. softmax over what is left, 9. draw.
 *
 * Per token: penalties cost O(distinct tokens in the penalty window); sampling is O(V)
 * (selection by partitioning, no sort of the vocabulary). Not thread-safe per sampler;
 * different samplers are independent. */
#ifndef DS_MODEL_SAMPLER_H
#define DS_MODEL_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sampling.h"
#include "common/status.h"

typedef struct sampler sampler;

/* Allocates a sampler for a vocabulary of n_vocab tokens and sequences of at most n_ctx_max
 * tokens (prompt + generated; bounds the penalty bookkeeping), with params p: valid
 * (sampling_params_validate where the request entered the process; asserted here), resolved
 * or zero-defaulted (the defaults are filled in the same way). STATUS_INVALID for bad sizes,
 * STATUS_NOMEM. Memory: 12 B per vocabulary entry
 * and 29-45 B per context position (about 4 MB for V = 248320, 32 k context). */
int sampler_create(sampler **out, int32_t n_vocab, int32_t n_ctx_max, const sampling_params *p,
                   status *st);
void sampler_destroy(sampler *s);

/* Starts a new request on this sampler: new params (as for sampler_create), no tokens seen,
 * RNG step 0. Costs O(distinct tokens seen before). */
void sampler_reset(sampler *s, const sampling_params *p);

/* Records prompt tokens (counted for penalties only when penalize_prompt) and generated
 * tokens (always counted). The caller accepts every token of the sequence in order; ids must
 * be in [0, n_vocab) and the total at most n_ctx_max (asserted: the engine validates
 * requests first). */
void sampler_accept_prompt(sampler *s, const int32_t *ids, int64_t n);
void sampler_accept(sampler *s, int32_t token);

/* Samples one token from logits [n_vocab] (finite or -inf), which are modified in place
 * (penalties applied), and returns it. Does not accept the token: call sampler_accept. Returns
 * -1 when a logit is NaN or +inf or none is finite (a broken model, never the sampler's doing);
 * the caller reports it as an error.
 * out (may be NULL): the token, and when the sequence asked for n_logprobs > 0 its logprob and
 * n_top = n_logprobs alternatives, the highest penalised logits in descending order (lowest id
 * first on ties; id -1 and -inf past the vocabulary); n_top = 0 and logprob 0 otherwise.
 * Logprobs are log-softmax of the penalised logits at temperature 1, over the whole vocabulary,
 * before top-k/top-p/min-p (vLLM's "processed" logprobs at temperature 1). Each call advances
 * the RNG step by one, drawn or greedy. */
int32_t sampler_sample(sampler *s, float *logits, sample_result *out);

/* Number of sampler_sample calls since create/reset: the RNG counter of the next draw. */
uint64_t sampler_step(const sampler *s);
/* Tokens accepted since create/reset (prompt and generated). */
int64_t sampler_n_accepted(const sampler *s);
/* Speculative rollback: forgets the accepted tokens past the first n_accepted (0 <= n_accepted
 * <= sampler_n_accepted; the penalty window as it was then) and sets the RNG counter to step
 * (<= sampler_step), so the sampler is as it was after those tokens and draws. No allocation;
 * O(tokens forgotten). */
void sampler_rollback(sampler *s, int64_t n_accepted, uint64_t step);

/* The RNG: Philox-4x32-10 (Salmon et al. 2011, Random123's philox4x32_10: multipliers
 * 0xD2511F53, 0xCD9E8D57, Weyl key increments 0x9E3779B9, 0xBB67AE85). */
void sampler_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* The uniform of draw `step` of a request: Philox with key (seed & 0xffffffff, seed >> 32)
 * and counter (step & 0xffffffff, step >> 32, 0, 0); u = (out[0] >> 8) * 2^-24 in [0, 1). */
float sampler_uniform(uint64_t seed, uint64_t step);

#endif
