/* Shared helpers of the worker tests: the reference model path and its prompts. */
#ifndef DS_TESTS_WORKER_TEST_UTIL_H
#define DS_TESTS_WORKER_TEST_UTIL_H

#include <stdint.h>

#define WT_MAX_PROMPTS 8
#define WT_MAX_IDS 128

typedef struct wt_prompt {
    int32_t ids[WT_MAX_IDS];
    int n_ids;
    int32_t greedy[WT_MAX_IDS];
    int n_greedy;
} wt_prompt;

/* "<dir>/<name><suffix>" of shared case name, else of its own equivalent in tests/reference
 * (ref_case_resolve_path of tests/model/ref_cases.h). */
void wt_reference_path(char *out, int cap, const char *name, const char *suffix);

/* Reads the prompts (ids, greedy) of reference case name. Returns how many (0 on failure). */
int wt_load_prompts(const char *name, wt_prompt *out, int max);

#endif
