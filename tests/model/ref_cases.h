/* The reference cases the model tests run over: every NAME that has NAME.gguf and NAME.json
 *  1. in the shared folder (testutil_reference_dir: $DS_REFERENCE_DIR, else
 *     <repo>/../shared/reference), when it exists, then
 *  2. in the repository's own folder: $DS_REPO_REFERENCE_DIR when set, else tests/reference
 *     relative to the working directory (the runfiles root under bazel, where the test lists
 *     //tests/reference:cases in its data; the repository root when run by hand).
 * Sorted by name within each folder; a folder met twice (same real path) is read once. */
#ifndef DS_TESTS_MODEL_REF_CASES_H
#define DS_TESTS_MODEL_REF_CASES_H

#include <stddef.h>

#define REF_CASES_MAX 32

typedef struct ref_case {
    char name[128];  /* e.g. "tiny-r2-tied" */
    char dir[4096];  /* the folder holding NAME.gguf, NAME.json, NAME.logits.f32 */
} ref_case;

/* Fills out[0..cap) and returns the count (0 when neither folder has a case). */
int ref_cases_list(ref_case *out, int cap);

/* "<dir>/<name><suffix>". */
void ref_case_path(const ref_case *c, const char *suffix, char *out, size_t cap);

/* The index of the case called name, or -1. */
int ref_cases_find(const ref_case *cs, int n, const char *name);

/* For the tests that name a shared case ("tiny-r2-tied", "tiny-r1-untied"): that case in the
 * shared folder when present there, else the repository's own case of the same shapes, seeds and
 * prompts (the name with "tiny-" replaced by "own-": own-r2-tied, own-r1-untied; made by
 * tools/refgen, different weights and vocabulary) in the repository's folder, so a bare clone
 * runs them too. Fills *out and returns 0; -1 (with a message on stderr) when neither exists. */
int ref_case_resolve(const char *shared_name, ref_case *out);

/* ref_case_resolve, then "<dir>/<name><suffix>" into out (an empty string when neither exists).
 * Returns 0 or -1. */
int ref_case_resolve_path(const char *shared_name, const char *suffix, char *out, size_t cap);

#endif
