/* deltaserve detokenize --model F --ids 1,2,3: prints the decoded text exactly, with no
 * newline added, so scripts can compare it byte for byte ("[1, 2, 3]", as printed by tokenize,
 * is accepted too; an empty list prints nothing). Special ids print as their text; invalid UTF-8
 * is replaced by U+FFFD as Hugging Face does. Exit 0 ok, 1 runtime failure (model not loadable,
 * unparsable ids, id outside the vocabulary), 2 usage. */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_ids.h"
#include "common/flags.h"
#include "model/tokenizer.h"

typedef struct detokenize_opts {
    const char *model;
    const char *ids;
} detokenize_opts;

static const flag_spec detokenize_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(detokenize_opts, model), "GGUF model file"},
    {"ids", NULL, NULL, FLAG_STR, offsetof(detokenize_opts, ids),
     "token ids: \"1,2,3\" or \"[1, 2, 3]\""},
    {0},
};

/* True for "", "  " and "[ ]": an empty list, which cli_ids_parse rejects. */
static int empty_list(const char *s)
{
    int bracket = 0;
    for (; *s; s++) {
        if (isspace((unsigned char)*s)) continue;
        if (*s == '[' && bracket == 0) bracket = 1;
        else if (*s == ']' && bracket == 1) bracket = 2;
        else return 0;
    }
    return bracket != 1;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *usage = "deltaserve detokenize --model F --ids 1,2,3";
    detokenize_opts o = {0};
    status st = {0};
    int rc = flags_parse(detokenize_flags, &o, argc, argv, usage, &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc) {
        fprintf(stderr, "%s\n", st.msg);
        return 2;
    }
    if (!o.model || !o.ids) {
        fprintf(stderr, "usage: %s (see --help)\n", usage);
        return 2;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (!empty_list(o.ids) && cli_ids_parse(o.ids, &ids, &n, &st)) {
        fprintf(stderr, "deltaserve detokenize: %s\n", st.msg);
        return 1;
    }
    tokenizer *t = NULL;
    char *text = NULL;
    size_t len = 0;
    if (tokenizer_load_path(&t, o.model, &st) ||
        tokenizer_decode(t, ids, (size_t)n, &text, &len, &st)) {
        fprintf(stderr, "deltaserve detokenize: %s\n", st.msg);
        rc = 1;
    } else {
        rc = fwrite(text, 1, len, stdout) != len || fflush(stdout) ? 1 : 0;
    }
    free(text);
    tokenizer_destroy(t);
    free(ids);
    return rc;
}
