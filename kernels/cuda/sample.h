/* Token sampling on the GPU for one sequence slot: penalties, logprobs, greedy, temperature,
 * top-k, top-p, min-p and the Philox draw, exactly as docs/SAMPLER.md defines them (the CPU
 * twin is model/sampler.c; tests/gpu/sample_parity compares the two step by step). The host
 * reads back only the small result (token id, and logprobs when asked) after its one sync.
 *
 *   sample_slot *s;  sample_create(&s, V, n_ctx_max, &st);             once per slot
 *   sample_reset(s, &params, want_logprob, &launch, &st);                per request
 *   sample_accept_prompt(s, ids, n, &launch);  sample_accept(s, tok, &launch);  per token kept
 *   sample_run(s, d_logits, &launch);  ...sync the stream...  sample_result_get(s)->token
 *
 * Design (docs/SAMPLER.md, "On the GPU"): one kernel launch per sample, a thread-block cluster
 * of ceil(V / 16384) CTAs of 1024 threads (16 for V = 248320) that keeps the logits and the
 * weights in shared memory, selects top-k / top-p thresholds by 3-level radix histograms
 * merged over distributed shared memory (no sort), and reproduces the CPU's block sums bit for
 * bit for the draw. Penalty counts [V] and the accepted-token history live on the device and
 * are updated by a one-CTA kernel per accept (only while the request has penalties).
 *
 * Nothing is allocated or synchronised after sample_create, except that sample_reset waits for
 * the stream when the previous request's prompt copy may still be in flight. Not thread-safe
 * per slot; slots are independent. */
#ifndef DS_KERNELS_CUDA_SAMPLE_H
#define DS_KERNELS_CUDA_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "common/sampling.h" /* no C++ guards of its own */

#define SAMPLE_MAX_VOCAB (16 * 16384) /* a cluster of at most 16 CTAs x 16384 logits */

/* sample_result (common/sampling.h) is written by the device (pinned, mapped host memory); valid
 * after the stream sync that follows sample_run, until the next sample_run. */

/* For tests: the top-p cut of the last sample_run (all 0 when top-p is off), valid as the
 * result. The nucleus target top_p * S and the masses of the weights above / at-or-above the
 * threshold; a draw whose target is within double rounding of either mass may differ from the
 * CPU (docs/SAMPLER.md "Σ: sums"), which is how sample_parity tells those steps apart. */
typedef struct sample_topp_diag {
    double target, mass_gt, mass_ge;
    float tau;      /* the threshold weight (0: target unreached, every positive kept) */
    int32_t n_eq;   /* weights equal to tau, and how many of them were kept */
    int32_t need;
} sample_topp_diag;

typedef struct sample_slot sample_slot;

/* Allocates the slot's device state: penalty counts [V], accepted-token history [n_ctx_max],
 * candidate scratch [V], block sums, a pinned staging buffer [n_ctx_max] and the pinned
 * result. STATUS_UNSUPPORTED when V > SAMPLE_MAX_VOCAB or the device cannot run the cluster
 * (the caller then samples on the host), STATUS_UNAVAILABLE without a GPU, STATUS_NOMEM. */
int sample_create(sample_slot **out, int32_t n_vocab, int32_t n_ctx_max, status *st);
void sample_destroy(sample_slot *s);

/* A new request: parameters (valid and resolved: common/sampling.h sampling_params_resolve),
 * whether the chosen token's logprob is wanted (implied by p->n_logprobs > 0), empty history,
 * RNG step 0 (penalty counts cleared on l's stream when the previous request left any; waits
 * for the stream when the previous request's prompt copy may still be in flight). */
int sample_reset(sample_slot *s, const sampling_params *p, bool want_logprob,
                 const cuda_launch *l, status *st);

/* Records accepted tokens in order (ids in [0, V); at most n_ctx_max in all: asserted).
 * Prompt tokens count for penalties when penalize_prompt. Without penalties nothing is
 * launched. accept_prompt copies the ids through pinned staging (one H2D copy per call). */
void sample_accept_prompt(sample_slot *s, const int32_t *ids, int64_t n, const cuda_launch *l);
void sample_accept(sample_slot *s, int32_t token, const cuda_launch *l);

/* Enqueues the sampling of one token from d_logits [V] (F32, finite or -inf, at least one
 * finite; read only) on l's stream. Advances the RNG step. Check with cuda_check(); read the
 * result after synchronising the stream. */
void sample_run(sample_slot *s, const float *d_logits, const cuda_launch *l);

/* Several draws of one step (a verify run: row i draws its token from its own logits at the
 * RNG step after row i-1's): sample_run_row writes result `row` (0 <= row < SAMPLE_MAX_ROWS;
 * sample_run is row 0), read with sample_result_row after the sync. sample_step: the RNG step
 * of the next draw; sample_set_step takes it back to `step` (<= it) for a slot without
 * penalties (asserted), the draws past it forgotten (a verify run's rows after the tokens
 * kept). */
#define SAMPLE_MAX_ROWS 8
void sample_run_row(sample_slot *s, const float *d_logits, int row, const cuda_launch *l);
const sample_result *sample_result_row(const sample_slot *s, int row);
uint64_t sample_step(const sample_slot *s);
void sample_set_step(sample_slot *s, uint64_t step);

const sample_result *sample_result_get(const sample_slot *s);
const sample_topp_diag *sample_topp_diag_get(const sample_slot *s);
/* CTAs per cluster (diagnostics). */
int sample_cluster_size(const sample_slot *s);

#ifdef __cplusplus
}
#endif

#endif
