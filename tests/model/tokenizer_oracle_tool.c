/* Helper for tokenizer_oracle_test.py: encodes and decodes records read from stdin with the C
 * tokenizer so a script can compare them with the Hugging Face tokenizers library.
 *
 *   tokenizer_oracle_tool MODEL.gguf < records
 * Records, one per line of input: "E <n>\n" followed by n raw bytes of text and "\n", or
 * "D <k> id1 ... idk\n". Output, one line per record: for E the ids separated by spaces (or
 * "ERR <message>"), for D the decoded bytes as lower-case hex (so any byte survives). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf < records\n", argv[0]);
        return 2;
    }
    status st = {0};
    tokenizer *t;
    if (tokenizer_load_path(&t, argv[1], &st)) {
        fprintf(stderr, "%s\n", st.msg);
        return 1;
    }
    char kind;
    size_t n;
    while (scanf(" %c %zu", &kind, &n) == 2) {
        if (kind == 'E') {
            if (getchar() != '\n') return 1;
            char *buf = malloc(n + 1);
            if (!buf || fread(buf, 1, n, stdin) != n || getchar() != '\n') return 1;
            int32_t *ids;
            size_t n_ids;
            if (tokenizer_encode(t, buf, n, &ids, &n_ids, &st)) {
                printf("ERR %s\n", st.msg);
            } else {
                for (size_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
                printf("\n");
                free(ids);
            }
            free(buf);
        } else if (kind == 'D') {
            int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
            if (!ids) return 1;
            for (size_t i = 0; i < n; i++)
                if (scanf("%d", &ids[i]) != 1) return 1;
            char *text;
            size_t len;
            if (tokenizer_decode(t, ids, n, &text, &len, &st)) {
                printf("ERR %s\n", st.msg);
            } else {
                for (size_t i = 0; i < len; i++) printf("%02x", (unsigned char)text[i]);
                printf("\n");
                free(text);
            }
            free(ids);
        } else {
            return 1;
        }
    }
    tokenizer_destroy(t);
    return 0;
}
