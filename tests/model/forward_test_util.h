/* Helpers for the forward-pass tests: the `prompts` of a reference NAME.json (read with a small
 * purpose-written JSON scanner) and their logits; the folder is testutil_reference_dir. */
#ifndef DS_TESTS_MODEL_FORWARD_TEST_UTIL_H
#define DS_TESTS_MODEL_FORWARD_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

typedef struct ref_prompt {
    int32_t *ids;     /* owned, [n_ids] prompt ids */
    int n_ids;
    int32_t *greedy;  /* owned, [n_greedy] HF greedy continuation */
    int n_greedy;
    long logits_offset; /* in floats, into NAME.logits.f32 */
    int rows, V;      /* logits_shape: rows = n_ids + n_greedy */
    float *logits;    /* owned, [rows][V] reference logits (teacher forced) */
} ref_prompt;

/* The same from the folder dir (a case of ref_cases.h). */
int forward_test_read_prompts_in(const char *dir, const char *name, ref_prompt **out);
void forward_test_free_prompts(ref_prompt *p, int n);

/* ids + greedy as one malloc'ed array of rows entries. */
int32_t *forward_test_full_ids(const ref_prompt *p);

/* Worst over rows of max_v |got - ref| / max_v |ref| (a NaN counts as worst). */
double forward_test_rows_rel(const float *got, const float *ref, int rows, int V);

/* Index of the largest of x[0..n) (the first on a tie). */
int forward_test_argmax(const float *x, int n);

#endif
