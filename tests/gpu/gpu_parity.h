/* Helpers shared by the GPU parity tests and benches (tests/gpu): the element-wise check
 * (atol + rtol*|ref|, as llm.c's validate_result) plus NMSE (as ggml's test-backend-ops),
 * printing the first mismatches; a seeded RNG; random GGUF blocks of every supported type. */
#ifndef DS_TESTS_GPU_GPU_PARITY_H
#define DS_TESTS_GPU_GPU_PARITY_H

#include <stdbool.h>
#include <stdint.h>

typedef struct gpu_parity_result {
    int64_t n_bad;      /* elements outside atol + rtol*|ref| (NaN/Inf in got counts as bad) */
    int64_t first_bad;  /* index of the first, -1 if none */
    double max_abs_err; /* over all elements */
    double nmse;        /* sum (got-ref)^2 / sum ref^2 */
} gpu_parity_result;

/* Compares got with ref over n elements. Prints "name: n_bad/n, max|err|, nmse" and up to 5
 * first mismatches. Returns true when n_bad == 0 and nmse <= max_nmse. quiet: print only on
 * failure. */
bool gpu_parity_check(const char *name, const float *got, const float *ref, int64_t n,
                      double atol, double rtol, double max_nmse, bool quiet,
                      gpu_parity_result *res);

/* splitmix64-seeded xorshift; uniform in [0,1) and standard normal. */
typedef struct gpu_rng {
    uint64_t s;
} gpu_rng;
void gpu_rng_seed(gpu_rng *r, uint64_t seed);
uint64_t gpu_rng_u64(gpu_rng *r);
float gpu_rng_uniform(gpu_rng *r);
float gpu_rng_normal(gpu_rng *r);
/* n floats scale·N(0, 1) in a new host buffer (the process stops when there is no memory). */
float *gpu_rand_vec(gpu_rng *r, int64_t n, float scale);
/* a[0 .. n) = a random permutation of 0 .. n-1. */
void gpu_rng_permutation(gpu_rng *r, int32_t *a, int n);

/* Rows in runs (kernels/cuda/gdn.h "Runs"): run k is len[k] consecutive rows on slot
 * slot_of[k]. Writes each row's slot (slot[], sum of len entries) and the run table (run[],
 * [2][R]: first rows then lengths; entries n_runs .. R empty). */
void gpu_runs_make(const int *len, int n_runs, int R, const int32_t *slot_of, int32_t *slot,
                   int32_t *run);

/* Fills dst with n elements (whole blocks) of ggml type `type`: random bytes for every quant
 * field (all bit patterns of scales/qh/qs) and finite scales d, dmin of magnitude ~scale;
 * F32/F16/BF16 get normal values times scale. Returns the number of bytes written. */
uint64_t gpu_random_tensor(uint32_t type, int64_t n, float scale, gpu_rng *r, void *dst);

/* true when a CUDA device is usable; otherwise prints "no GPU (<why>): <what> skipped", or,
 * with DS_REQUIRE_GPU=1 (tools/gpu-test sets it on the GPU host), says so and exits 1: a GPU
 * test must not pass where a GPU is expected and missing. */
bool gpu_test_have_gpu(const char *what);



/* CPU twin of gemv_quantize_x (kernels/cuda/gemv.h): per 32 elements d = max|x|/127,
 * q = round(x/d), s = d·Σq. x_deq (may be NULL) gets d·q: the x the GPU GEMV effectively dots. */
void gpu_twin_q8_quantize(const float *x, int64_t n, int8_t *qs, float *d, float *s,
                          float *x_deq);

/* A GPU Q8 activation gq (gemv_xq_bytes(n): int8 then (d, s) per 32) against the twin's
 * quantisation of v, the GPU's own F32 output it was made from: the int8 and d exact, s within
 * float rounding. Prints "what: Q8 of the output: N mismatches" when any. */
bool gpu_check_q8_of(const char *what, const float *v, const int8_t *gq, int64_t n);

#endif
