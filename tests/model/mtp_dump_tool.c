/* mtp_dump_tool MODEL.gguf OUT.bin [exact]: runs the main model over a fixed prompt
 * (qwen35_prefill_hidden, the delta rule token by token) and the MTP head over its pairs, and
 * writes what tests/model/mtp_py_test.py recomputes in numpy from the GGUF:
 *   int32 T, K, H, V; int32 pairs[T]; f32 h[T][H]; f32 logits[T][V]; f32 g[T][H];
 *   int32 drafts[K] (qwen35_mtp_draft from (h[T-1], pairs[T-1]) after the first T-1 pairs).
 * exact: quantised weights dotted in F32 (QWEN35_DOT_EXACT), so that a dequantising reference
 * can match. Exit 1 with a message on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/mtp.h"

#define T 10
#define K 4

static int die(const char *what, const status *st)
{
    fprintf(stderr, "mtp_dump_tool: %s: %s\n", what, st ? st->msg : "");
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mtp_dump_tool MODEL.gguf OUT.bin [exact]\n");
        return 2;
    }
    status st;
    qwen35_model *m;
    if (qwen35_model_load(&m, argv[1], &st)) return die("load", &st);
    qwen35_ctx_opts o = {.n_threads = 2, .gdn_mode = QWEN35_GDN_RECURRENT,
                         .dot_mode = argc > 3 && !strcmp(argv[3], "exact") ? QWEN35_DOT_EXACT : QWEN35_DOT_DEFAULT};
    qwen35_ctx *ctx;
    qwen35_state *s;
    qwen35_mtp_state *ms;
    if (qwen35_ctx_create(m, &o, &ctx, &st) || qwen35_state_create(m, 64, &s, &st) ||
        qwen35_mtp_state_create(m, 64, &ms, &st))
        return die("create", &st);
    const int32_t H = m->cfg.H, V = m->cfg.V;
    int32_t prompt[T], pairs[T], drafts[K];
    for (int i = 0; i < T; i++) prompt[i] = (int32_t)((i * 131 + 7) % V);
    float *h = malloc(sizeof(float) * T * H), *g = malloc(sizeof(float) * T * H);
    float *lg = malloc(sizeof(float) * T * V);
    if (!h || !g || !lg) return die("out of memory", NULL);
    if (qwen35_prefill_hidden(ctx, s, prompt, T, lg, true, h, &st)) return die("prefill", &st);
    int32_t next = 0;
    for (int v = 1; v < V; v++)
        if (lg[(long)(T - 1) * V + v] > lg[(long)(T - 1) * V + next]) next = v;
    for (int i = 0; i + 1 < T; i++) pairs[i] = prompt[i + 1];
    pairs[T - 1] = next;
    if (qwen35_mtp_step(ctx, ms, h, pairs, T, lg, g, &st)) return die("mtp step", &st);
    qwen35_mtp_truncate(ms, T - 1);
    if (qwen35_mtp_draft(ctx, ms, h + (long)(T - 1) * H, next, K, drafts, &st)) return die("draft", &st);
    FILE *f = fopen(argv[2], "wb");
    int32_t hdr[4] = {T, K, H, V};
    if (!f || fwrite(hdr, sizeof hdr, 1, f) != 1 || fwrite(pairs, sizeof pairs, 1, f) != 1 ||
        fwrite(h, sizeof(float) * T * H, 1, f) != 1 || fwrite(lg, sizeof(float) * T * V, 1, f) != 1 ||
        fwrite(g, sizeof(float) * T * H, 1, f) != 1 || fwrite(drafts, sizeof drafts, 1, f) != 1 ||
        fclose(f))
        return die("write", NULL);
    free(h), free(g), free(lg);
    qwen35_mtp_state_destroy(ms);
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    qwen35_model_free(m);
    return 0;
}
