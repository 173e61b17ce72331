/* Test helpers for the tokenizer tests: the `tokenizer` entries of a reference NAME.json
 * ({text, ids, decoded}) read with a small JSON parser. */
#ifndef DS_TESTS_MODEL_TOKENIZER_TEST_UTIL_H
#define DS_TESTS_MODEL_TOKENIZER_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer_test_case {
    char *text;     /* owned, UTF-8, text_len bytes + NUL */
    size_t text_len;
    int32_t *ids;   /* owned, [n_ids] */
    size_t n_ids;
    char *decoded;  /* owned, decoded_len bytes + NUL */
    size_t decoded_len;
} tokenizer_test_case;

/* Reads the "tokenizer" array of a reference JSON file. Returns the number of cases (>= 0) and
 * a malloc'd array in *cases, or -1 (message on stderr). */
int tokenizer_test_read_cases(const char *json_path, tokenizer_test_case **cases);
void tokenizer_test_free_cases(tokenizer_test_case *cases, int n);

#endif
