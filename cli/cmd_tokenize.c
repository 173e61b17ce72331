/* deltaserve tokenize --model F (--text S | --text-file P): prints the token ids of the text as
 * a JSON array on one line, e.g. "[9707,11,1879,0]\n". No BOS is added; special-token text in
 * the input ("<|im_start|>") becomes the special id. Exit 0 ok, 1 runtime failure (model not
 * loadable, text not valid UTF-8, file unreadable), 2 usage. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/flags.h"
#include "model/tokenizer.h"

typedef struct tokenize_opts {
    const char *model;
    const char *text;
    const char *text_file;
} tokenize_opts;

static const flag_spec tokenize_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(tokenize_opts, model), "GGUF model file"},
    {"text", NULL, NULL, FLAG_STR, offsetof(tokenize_opts, text), "text to tokenize"},
    {"text-file", NULL, NULL, FLAG_STR, offsetof(tokenize_opts, text_file),
     "read the text from this file instead (\"-\": standard input), byte for byte"},
    {0},
};

/* Reads a whole file (or stdin for "-") into a malloc'd buffer. */
static char *read_all(const char *path, size_t *n)
{
    FILE *f = path[0] == '-' && !path[1] ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        char *g = realloc(buf, cap *= 2);
        if (!g) free(buf);
        buf = g;
    }
    int err = ferror(f);
    if (f != stdin) fclose(f);
    if (err) {
        free(buf);
        return NULL;
    }
    *n = len;
    return buf;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *usage = "deltaserve tokenize --model F (--text S | --text-file P)";
    tokenize_opts o = {0};
    status st = {0};
    int rc = flags_parse(tokenize_flags, &o, argc, argv, usage, &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc) {
        fprintf(stderr, "%s\n", st.msg);
        return 2;
    }
    if (!o.model || !!o.text == !!o.text_file) {
        fprintf(stderr, "usage: %s (see --help)\n", usage);
        return 2;
    }
    char *file_text = NULL;
    size_t len = 0;
    if (o.text_file && !(file_text = read_all(o.text_file, &len))) {
        fprintf(stderr, "deltaserve tokenize: cannot read %s\n", o.text_file);
        return 1;
    }
    const char *text = o.text ? o.text : file_text;
    if (o.text) len = strlen(o.text);

    tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_load_path(&t, o.model, &st) || tokenizer_encode(t, text, len, &ids, &n, &st)) {
        fprintf(stderr, "deltaserve tokenize: %s\n", st.msg);
        rc = 1;
    } else {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
        printf("]\n");
        rc = fflush(stdout) ? 1 : 0;
    }
    free(ids);
    tokenizer_destroy(t);
    free(file_text);
    return rc;
}
