/* The tensor-parallel CPU forward (model/forward_cpu.h: fwd_opts.ranks over model/tp_shard.h)
 * against the unsharded reference forward (model/forward.h), on every reference case of
 * ref_cases.h:
 *  - the split rules: every rank's ranges, their union (each row, column, head exactly once;
 *    replicated KV / key heads the expected number of times), the local configs, the 27B's
 *    ranges, and a clear STATUS_UNSUPPORTED naming the dimension for an N that does not split;
 *  - N = 1 is the unsharded forward bit for bit;
 *  - N = 2 and 4 (where the case's heads split): teacher-forced logits (prompt in one step or
 *    7-row steps, then one row a step; and all rows as prompt), 32 greedy tokens identical,
 *    batched decode, a Q8_0 copy in both dot modes; a Q4_K copy whose FFN columns are not whole
 *    blocks is refused naming the tensor;
 * Tolerance: max|Δ| <= 1e-5·max|logit| per row for batched decode and the Q8_0 copy.
 * For the prompt rows the bound is max(1e-5, 3 x the unsharded forward's disagreement with
 * itself when only its summation order changes, 512- vs 7-token prefill steps): these random
 * models amplify rounding ~10-20x (forward_quant_test.c), so a reordered sum moves a row by up to
 * 2e-5 (unsharded 512 vs 7 steps: 2.1e-5 on tiny-r3-gqa3, 1.25e-5 on tiny-r2-tied). Measured:
 * tp vs unsharded worst row 2.0e-5 (tiny-r2-tied prompt 1, all rows by prefill), most prompts
 * 2e-6..1e-5; against the Hugging Face logits the tp and the unsharded forward are equally close
 * (e.g. 2.38e-5 and 2.45e-5). Greedy tokens are exact everywhere.
 *  - errors leave every rank's state unchanged, nothing is allocated per token (malloc, calloc
 *    and realloc wrapped), and the comparison fails on a model with one weight swapped. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward_test_util.h"
#include "gguf/quant.h"
#include "gguf_rewrite.h"
#include "model/forward.h"
#include "model/fwd.h"
#include "model/tp_shard.h"
#include "tests/testutil/alloc_count.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

#define TP_TOL 1e-5 /* max|Δ| <= 1e-5 · max|logit| per row */
#define GREEDY_STEPS 32

static ref_case case_list[REF_CASES_MAX];
static int N_CASES;
static qwen35_model *models[REF_CASES_MAX];
static ref_prompt *prompts[REF_CASES_MAX];
static int n_prompts[REF_CASES_MAX];
static qwen35_ctx *ctx1[REF_CASES_MAX]; /* unsharded: max_batch 4, max_tokens 512 */

/* the unsharded reference: the delta rule token by token, as the fwd CPU forward runs it */
static const qwen35_ctx_opts OPTS = {.max_batch = 4, .max_tokens = 512, .n_threads = 2,
                                     .gdn_mode = QWEN35_GDN_RECURRENT};
static const qwen35_ctx_opts OPTS_SMALL = {.max_batch = 4, .max_tokens = 7, .n_threads = 2};

static int setup(void)
{
    N_CASES = ref_cases_list(case_list, REF_CASES_MAX);
    if (N_CASES <= 0) {
        fprintf(stderr, "no reference cases (shared/reference, tests/reference)\n");
        return 1;
    }
    for (int c = 0; c < N_CASES; c++) {
        char path[4400];
        status st;
        ref_case_path(&case_list[c], ".gguf", path, sizeof path);
        if (qwen35_model_load(&models[c], path, &st) ||
            qwen35_ctx_create(models[c], &OPTS, &ctx1[c], &st)) {
            fprintf(stderr, "%s: %s\n", path, st.msg);
            return 1;
        }
        n_prompts[c] = forward_test_read_prompts_in(case_list[c].dir, case_list[c].name, &prompts[c]);
        if (n_prompts[c] <= 0) return 1;
    }
    return 0;
}

static int teardown(void)
{
    for (int c = 0; c < N_CASES; c++) {
        qwen35_ctx_destroy(ctx1[c]);
        forward_test_free_prompts(prompts[c], n_prompts[c]);
        qwen35_model_free(models[c]);
    }
    return 0;
}

/* ---- runs: the first n_pre ids by prefill, the rest decoded one by one ---- */

static int run_ref(qwen35_ctx *ctx, const qwen35_model *m, const int32_t *ids, int T, int n_pre,
                   float *logits)
{
    qwen35_state *s;
    status st;
    if (qwen35_state_create(m, T + 1, &s, &st)) return -1;
    int rc = n_pre ? qwen35_prefill(ctx, s, ids, n_pre, logits, true, &st) : 0;
    for (int t = n_pre; t < T && !rc; t++)
        rc = qwen35_decode_batch(ctx, &s, ids + t, 1, logits + (long)t * m->cfg.V, &st);
    if (rc) fprintf(stderr, "run_ref: %s\n", st.msg);
    qwen35_state_destroy(s);
    return rc;
}

static const sampling_params GREEDY = {.top_p = 1, .repetition_penalty = 1}; /* resolved */

/* ids[0 .. n_pre) as prompt rows of slot 0 (steps of max_rows), then one row a step; logits of
 * every row. */
static int run_tp(fwd *f, int V, const int32_t *ids, int T, int n_pre, float *logits)
{
    status st;
    fwd_row *rows = malloc(sizeof *rows * (size_t)f->max_rows);
    int rc = fwd_seq_start(f, 0, &GREEDY, &st);
    for (int t = 0; t < T && !rc;) {
        int n = t < n_pre ? n_pre - t : 1;
        if (n > f->max_rows) n = f->max_rows;
        for (int k = 0; k < n; k++)
            rows[k] = (fwd_row){.token = ids[t + k], .slot = 0, .pos = t + k, .prompt = t + k < n_pre,
                                .logits = logits + (long)(t + k) * V};
        rc = fwd_step(f, rows, n, &st);
        t += n;
    }
    if (rc) fprintf(stderr, "run_tp: %s\n", st.msg);
    if (!rc && fwd_n_past(f, 0) != T) rc = -1;
    fwd_seq_end(f, 0);
    free(rows);
    return rc;
}

/* Greedy continuation of the prompt: GREEDY_STEPS ids into out. f NULL: the unsharded
 * reference (argmax of its logits); else the forward's sampler. */
static int greedy(qwen35_ctx *ctx, const qwen35_model *m, fwd *f, const ref_prompt *p,
                  int32_t *out)
{
    int V = m->cfg.V, n = p->n_ids + GREEDY_STEPS + 1, rc;
    status st;
    if (f) {
        fwd_row *rows = malloc(sizeof *rows * (size_t)p->n_ids);
        rc = fwd_seq_start(f, 0, &GREEDY, &st);
        for (int t = 0; t < p->n_ids; t++)
            rows[t] = (fwd_row){.token = p->ids[t], .slot = 0, .pos = t, .prompt = true,
                                .sample = t == p->n_ids - 1};
        if (!rc) rc = fwd_step(f, rows, p->n_ids, &st);
        for (int g = 0; g < GREEDY_STEPS && !rc; g++) {
            out[g] = rows[g ? 0 : p->n_ids - 1].out.token;
            rows[0] = (fwd_row){.token = out[g], .slot = 0, .pos = p->n_ids + g, .sample = true};
            rc = fwd_step(f, rows, 1, &st);
        }
        if (rc) fprintf(stderr, "greedy: %s\n", st.msg);
        fwd_seq_end(f, 0);
        free(rows);
        return rc;
    }
    float *lg = malloc(sizeof(float) * V);
    qwen35_state *s = NULL;
    rc = qwen35_state_create(m, n, &s, &st);
    if (!rc) rc = qwen35_prefill(ctx, s, p->ids, p->n_ids, lg, false, &st);
    for (int g = 0; g < GREEDY_STEPS && !rc; g++) {
        out[g] = forward_test_argmax(lg, V);
        rc = qwen35_decode_batch(ctx, &s, &out[g], 1, lg, &st);
    }
    if (rc) fprintf(stderr, "greedy: %s\n", st.msg);
    qwen35_state_destroy(s);
    free(lg);
    return rc;
}

/* ---- the split rules (pure functions of the config) ---- */

static qwen35_config cfg_of(int H, int F, int V, int n_h, int n_kv, int d_h, int n_k, int n_v,
                            int d_k)
{
    qwen35_config c = {0};
    c.n_layer = 4;
    c.H = H, c.F = F, c.V = V, c.n_h = n_h, c.n_kv = n_kv, c.d_h = d_h;
    c.n_k = n_k, c.n_v = n_v, c.d_k = c.d_v = d_k, c.K_conv = 4;
    c.C = 2 * n_k * d_k + n_v * d_k;
    c.n_attn_layers = 1, c.n_gdn_layers = 3;
    return c;
}

/* How often each index of the full dimension of part is owned, over all ranks. */
static void coverage(const qwen35_config *c, int N, tp_shard_part part, int64_t full, int *count)
{
    memset(count, 0, sizeof(int) * full);
    for (int r = 0; r < N; r++) {
        tp_shard_ranges rg;
        tp_shard_ranges_get(c, N, r, part, &rg);
        int64_t total = 0;
        for (int i = 0; i < rg.n; i++) {
            CU_ASSERT(rg.r[i].n > 0 && rg.r[i].begin >= 0 && rg.r[i].begin + rg.r[i].n <= full);
            for (int64_t k = rg.r[i].begin; k < rg.r[i].begin + rg.r[i].n && k < full; k++) count[k]++;
            total += rg.r[i].n;
        }
        CU_ASSERT_EQUAL(total, rg.total);
    }
}

static void check_split(const qwen35_config *c, int N)
{
    int64_t Dk = (int64_t)c->n_k * c->d_k, Dv = (int64_t)c->n_v * c->d_v;
    int64_t big = c->V > c->F ? c->V : c->F;
    if (big < c->C) big = c->C;
    int *cnt = malloc(sizeof(int) * (size_t)(big > 2 * c->n_h * c->d_h ? big : 2 * c->n_h * c->d_h));
    const struct { tp_shard_part part; int64_t full; } once[] = {
        {TP_SHARD_ATTN_Q, 2LL * c->n_h * c->d_h}, {TP_SHARD_ATTN_O, (int64_t)c->n_h * c->d_h},
        {TP_SHARD_GDN_V, Dv}, {TP_SHARD_GDN_HEAD, c->n_v}, {TP_SHARD_FFN, c->F}, {TP_SHARD_VOCAB, c->V}};
    for (size_t p = 0; p < sizeof once / sizeof once[0]; p++) {
        coverage(c, N, once[p].part, once[p].full, cnt);
        int bad = 0;
        for (int64_t k = 0; k < once[p].full; k++) bad += cnt[k] != 1;
        CU_ASSERT_EQUAL(bad, 0);
    }
    int kv_times = c->n_kv % N == 0 ? 1 : N / c->n_kv, k_times = c->n_k % N == 0 ? 1 : N / c->n_k;
    coverage(c, N, TP_SHARD_ATTN_KV, (int64_t)c->n_kv * c->d_h, cnt);
    for (int64_t k = 0; k < (int64_t)c->n_kv * c->d_h; k++) CU_ASSERT_EQUAL_FATAL(cnt[k], kv_times);
    coverage(c, N, TP_SHARD_GDN_QKV, c->C, cnt);
    for (int64_t k = 0; k < c->C; k++) CU_ASSERT_EQUAL_FATAL(cnt[k], k < 2 * Dk ? k_times : 1);
    for (int r = 0; r < N; r++) { /* local dims agree with the ranges */
        qwen35_config l;
        tp_shard_config(c, N, r, &l);
        tp_shard_ranges q, kv, qkv, v, h, f;
        tp_shard_ranges_get(c, N, r, TP_SHARD_ATTN_Q, &q);
        tp_shard_ranges_get(c, N, r, TP_SHARD_ATTN_KV, &kv);
        tp_shard_ranges_get(c, N, r, TP_SHARD_GDN_QKV, &qkv);
        tp_shard_ranges_get(c, N, r, TP_SHARD_GDN_V, &v);
        tp_shard_ranges_get(c, N, r, TP_SHARD_GDN_HEAD, &h);
        tp_shard_ranges_get(c, N, r, TP_SHARD_FFN, &f);
        CU_ASSERT(q.total == 2LL * l.n_h * l.d_h && kv.total == (int64_t)l.n_kv * l.d_h);
        CU_ASSERT(qkv.total == l.C && l.C == 2 * l.n_k * l.d_k + l.n_v * l.d_v);
        CU_ASSERT(v.total == (int64_t)l.n_v * l.d_v && h.total == l.n_v && f.total == l.F);
        CU_ASSERT(l.n_v % l.n_k == 0 && l.n_h % l.n_kv == 0 && l.V == c->V && l.H == c->H);
        /* the local query heads read the local KV heads the global rule assigns */
        for (int hl = 0; hl < l.n_h; hl++) {
            int h_g = r * l.n_h + hl, kv_g = h_g / (c->n_h / c->n_kv);
            int kv_l = hl / (l.n_h / l.n_kv);
            CU_ASSERT_EQUAL(kv.r[0].begin / c->d_h + kv_l, kv_g);
        }
        /* local value head hv_l reads local key head hv_l % n_k_l: the same heads as globally */
        int64_t k_first = qkv.r[0].begin / c->d_k;
        for (int hvl = 0; hvl < l.n_v; hvl++) {
            int64_t hv_g = -1, seen = 0; /* the hvl-th head of the GDN_HEAD ranges */
            for (int i = 0; i < h.n && hv_g < 0; i++) {
                if (hvl < seen + h.r[i].n) hv_g = h.r[i].begin + (hvl - seen);
                seen += h.r[i].n;
            }
            CU_ASSERT_EQUAL(hv_g % c->n_k, k_first + hvl % l.n_k);
        }
    }
    free(cnt);
}

static void test_split_rules(void)
{
    status st;
    /* the 27B (docs/QWEN35.md §4.2) */
    qwen35_config q27 = cfg_of(5120, 17408, 248320, 24, 4, 256, 16, 48, 128);
    for (int N = 1; N <= 8; N *= 2) {
        CU_ASSERT_EQUAL(tp_shard_check(&q27, N, &st), 0);
        check_split(&q27, N);
    }
    tp_shard_ranges rg;
    tp_shard_ranges_get(&q27, 2, 1, TP_SHARD_GDN_QKV, &rg); /* q, k of key heads 8-15, 3 v groups */
    CU_ASSERT_EQUAL(rg.n, 5);
    CU_ASSERT(rg.r[0].begin == 1024 && rg.r[0].n == 1024 && rg.r[1].begin == 3072 && rg.r[1].n == 1024);
    CU_ASSERT(rg.r[2].begin == 4096 + 8 * 128 && rg.r[3].begin == 4096 + 24 * 128 &&
              rg.r[4].begin == 4096 + 40 * 128 && rg.r[4].n == 1024 && rg.total == 5120);
    tp_shard_ranges_get(&q27, 8, 5, TP_SHARD_ATTN_KV, &rg); /* 4 KV heads on 8 ranks: head 2 */
    CU_ASSERT(rg.n == 1 && rg.r[0].begin == 2 * 256 && rg.r[0].n == 256);
    tp_shard_ranges_get(&q27, 1, 0, TP_SHARD_GDN_QKV, &rg); /* one rank: one range */
    CU_ASSERT(rg.n == 1 && rg.total == 10240);
    CU_ASSERT_EQUAL(tp_shard_check(&q27, 16, &st), STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "n_h = 24"));
    printf("\n    27B over 16: %s", st.msg);
    /* shapes of the reference cases and awkward ones */
    const qwen35_config ok[] = {
        cfg_of(256, 768, 1029, 4, 2, 64, 2, 4, 64),  /* r2: N=4 replicates KV and key heads */
        cfg_of(256, 256, 773, 2, 1, 64, 4, 4, 32),   /* r1 */
        cfg_of(128, 256, 1005, 6, 2, 64, 2, 6, 32),  /* r3-gqa3 */
        cfg_of(64, 96, 9, 8, 8, 16, 8, 16, 16),      /* V barely above N: uneven vocabulary */
    };
    const int oks[][3] = {{2, 4, 0}, {2, 0, 0}, {2, 0, 0}, {2, 4, 8}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        for (int k = 0; k < 3 && oks[i][k]; k++) {
            CU_ASSERT_EQUAL(tp_shard_check(&ok[i], oks[i][k], &st), 0);
            check_split(&ok[i], oks[i][k]);
        }
    /* does not split: the dimension is named */
    const struct { qwen35_config c; int N; const char *what; } bad[] = {
        {cfg_of(256, 768, 1029, 4, 2, 64, 2, 4, 64), 3, "n_h = 4"},
        {cfg_of(256, 256, 773, 2, 1, 64, 4, 4, 32), 4, "n_h = 2"},
        {cfg_of(128, 256, 1005, 8, 2, 64, 2, 6, 32), 4, "n_k = 2"},   /* 3 V heads per K over 2 */
        {cfg_of(128, 256, 1005, 6, 3, 64, 2, 4, 32), 2, "n_kv = 3"},
        {cfg_of(128, 255, 1005, 4, 2, 64, 2, 4, 32), 2, "F = 255"},
        {cfg_of(128, 256, 3, 4, 4, 64, 4, 4, 32), 4, "V = 3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(tp_shard_check(&bad[i].c, bad[i].N, &st), STATUS_UNSUPPORTED);
        CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, bad[i].what));
        if (!strstr(st.msg, bad[i].what)) fprintf(stderr, "want '%s' in '%s'\n", bad[i].what, st.msg);
    }
    CU_ASSERT_EQUAL(tp_shard_check(&ok[0], 0, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(tp_shard_check(&ok[0], TP_SHARD_MAX_RANKS + 1, &st), STATUS_INVALID);
}

/* ---- the sharded forward against the unsharded one ---- */

#define TP_CTX 512 /* positions per slot: the longest prompt and its continuation */

/* The case's forward on N ranks (steps of max_rows rows), or NULL when its heads do not split
 * (then create must say so). */
static fwd *tp_for_model(const qwen35_model *m, int N, int max_rows, bool exact, status *st)
{
    fwd *f = NULL;
    fwd_create("cpu", m, &(fwd_opts){.n_slots = 3, .n_ctx = TP_CTX, .max_rows = max_rows, .ranks = N,
                                     .n_threads = 2, .exact_dot = exact}, &f, st);
    return f;
}

static fwd *tp_for(int c, int N, int max_rows)
{
    status st, st2;
    int want = tp_shard_check(&models[c]->cfg, N, &st);
    fwd *f = tp_for_model(models[c], N, max_rows, false, &st2);
    CU_ASSERT_EQUAL(f ? STATUS_OK : st2.code, want);
    if (!f) {
        CU_ASSERT_EQUAL(st2.code, STATUS_UNSUPPORTED);
        printf("\n    %s N=%d: refused: %s", case_list[c].name, N, st2.msg);
    }
    return f;
}

static const int Ns[] = {2, 4};

static void test_one_rank_is_unsharded(void)
{
    for (int c = 0; c < N_CASES; c++) {
        const ref_prompt *p = &prompts[c][0];
        int32_t *ids = forward_test_full_ids(p);
        int V = p->V;
        float *a = malloc(sizeof(float) * p->rows * V), *b = malloc(sizeof(float) * p->rows * V);
        fwd *f = tp_for(c, 1, OPTS.max_tokens);
        CU_ASSERT_FATAL(f != NULL);
        CU_ASSERT_EQUAL(f->ranks, 1);
        CU_ASSERT_EQUAL(run_ref(ctx1[c], models[c], ids, p->rows, p->n_ids, a), 0);
        CU_ASSERT_EQUAL(run_tp(f, V, ids, p->rows, p->n_ids, b), 0);
        CU_ASSERT_EQUAL(memcmp(a, b, sizeof(float) * p->rows * V), 0);
        fwd_destroy(f);
        /* a one-rank shard would be views of the model too (the forward borrows the model) */
        tp_shard_model *sh;
        status st;
        CU_ASSERT_FATAL(tp_shard_model_create(models[c], 1, 0, &sh, &st) == 0);
        CU_ASSERT_EQUAL(sh->arena_bytes, 0);
        tp_shard_model_destroy(sh);
        free(a), free(b), free(ids);
    }
}

static int ran[2]; /* cases compared, per entry of Ns */

/* The unsharded forward's disagreement with itself on the same rows when only the summation
 * order changes (prefill in 7-token steps instead of one: other matmul paths): the noise floor
 * of these ill-conditioned models (forward_quant_test.c), worst row over every prompt and both
 * run modes. */
static double self_floor(int c, qwen35_ctx *small)
{
    double floor = 0;
    for (int i = 0; i < n_prompts[c]; i++) {
        const ref_prompt *p = &prompts[c][i];
        int32_t *ids = forward_test_full_ids(p);
        float *a = malloc(sizeof(float) * p->rows * p->V), *b = malloc(sizeof(float) * p->rows * p->V);
        for (int mode = 0; mode < 2; mode++) {
            int n_pre = mode == 0 ? p->n_ids : p->rows;
            CU_ASSERT_EQUAL(run_ref(ctx1[c], models[c], ids, p->rows, n_pre, a), 0);
            CU_ASSERT_EQUAL(run_ref(small, models[c], ids, p->rows, n_pre, b), 0);
            floor = fmax(floor, forward_test_rows_rel(b, a, p->rows, p->V));
        }
        free(a), free(b), free(ids);
    }
    return floor;
}

/* Every prompt, prompt rows then one row a step, and all rows as prompt: the ranks against the
 * unsharded ctx of the same prefill step. */
static void check_logits(int c, int N, fwd *f, qwen35_ctx *ref, double tol, bool small)
{
    for (int i = 0; i < n_prompts[c]; i++) {
        const ref_prompt *p = &prompts[c][i];
        int32_t *ids = forward_test_full_ids(p);
        int T = p->rows, V = p->V;
        float *a = malloc(sizeof(float) * T * V), *b = malloc(sizeof(float) * T * V);
        double worst = 0;
        for (int mode = 0; mode < 2; mode++) {
            int n_pre = mode == 0 ? p->n_ids : T;
            CU_ASSERT_EQUAL(run_ref(ref, models[c], ids, T, n_pre, a), 0);
            CU_ASSERT_EQUAL(run_tp(f, V, ids, T, n_pre, b), 0);
            worst = fmax(worst, forward_test_rows_rel(b, a, T, V));
        }
        printf("\n    %s N=%d prompt %d (%d rows%s): worst row rel %.3g (bound %.3g)",
               case_list[c].name, N, i, T, small ? ", 7-token steps" : "", worst, tol);
        CU_ASSERT(worst <= tol);
        free(a), free(b), free(ids);
    }
}

static void test_logits(void)
{
    for (int c = 0; c < N_CASES; c++) {
        qwen35_ctx *small;
        status st;
        CU_ASSERT_FATAL(qwen35_ctx_create(models[c], &OPTS_SMALL, &small, &st) == 0);
        double floor = self_floor(c, small), tol = fmax(TP_TOL, 3 * floor);
        printf("\n    %s: unsharded 512- vs 7-token steps worst row rel %.3g", case_list[c].name, floor);
        for (size_t k = 0; k < 2; k++) {
            fwd *f = tp_for(c, Ns[k], OPTS.max_tokens);
            if (!f) continue;
            ran[k]++;
            check_logits(c, Ns[k], f, ctx1[c], tol, false);
            fwd_destroy(f);
            CU_ASSERT_FATAL((f = tp_for(c, Ns[k], OPTS_SMALL.max_tokens)) != NULL);
            check_logits(c, Ns[k], f, small, tol, true);
            fwd_destroy(f);
        }
        qwen35_ctx_destroy(small);
    }
    /* every case splits over 2; over 4 only where heads allow (r2: KV and key heads replicated) */
    printf("\n    cases compared: %d at N=2, %d at N=4 (of %d)", ran[0], ran[1], N_CASES);
    CU_ASSERT_EQUAL(ran[0], N_CASES);
    CU_ASSERT(ran[1] >= 1);
    int r2 = ref_cases_find(case_list, N_CASES, "own-r2-tied");
    CU_ASSERT(r2 >= 0 && tp_shard_check(&models[r2]->cfg, 4, NULL) == 0);
}

static void test_greedy(void)
{
    int32_t a[GREEDY_STEPS], b[GREEDY_STEPS];
    for (size_t k = 0; k < 2; k++)
        for (int c = 0; c < N_CASES; c++) {
            fwd *f = tp_for(c, Ns[k], OPTS.max_tokens);
            if (!f) continue;
            for (int i = 0; i < n_prompts[c]; i++) {
                const ref_prompt *p = &prompts[c][i];
                CU_ASSERT_EQUAL(greedy(ctx1[c], models[c], NULL, p, a), 0);
                CU_ASSERT_EQUAL(greedy(NULL, models[c], f, p, b), 0);
                int same = 0;
                while (same < GREEDY_STEPS && a[same] == b[same]) same++;
                if (same != GREEDY_STEPS)
                    fprintf(stderr, "%s N=%d prompt %d: greedy differs at %d\n", case_list[c].name,
                            Ns[k], i, same);
                CU_ASSERT_EQUAL(same, GREEDY_STEPS);
            }
            fwd_destroy(f);
        }
}

/* B = 3 sequences of different lengths decoded together by the ranks == each alone unsharded. */
static void test_batch_decode(void)
{
    for (size_t k = 0; k < 2; k++)
        for (int c = 0; c < N_CASES; c++) {
            fwd *f = tp_for(c, Ns[k], OPTS.max_tokens);
            if (!f) continue;
            const qwen35_model *m = models[c];
            int V = m->cfg.V, B = 3, steps = 5;
            qwen35_state *s1[3];
            status st;
            float *lb = malloc(sizeof(float) * B * V), *l1 = malloc(sizeof(float) * V);
            fwd_row rows[TP_CTX];
            for (int b = 0; b < B; b++) {
                const ref_prompt *p = &prompts[c][b % n_prompts[c]];
                int n = p->n_ids > 1 ? p->n_ids - b % 2 : 1;
                CU_ASSERT_FATAL(qwen35_state_create(m, n + steps, &s1[b], &st) == 0);
                CU_ASSERT_EQUAL(qwen35_prefill(ctx1[c], s1[b], p->ids, n, NULL, false, &st), 0);
                CU_ASSERT_EQUAL(fwd_seq_start(f, b, &GREEDY, &st), 0);
                for (int t = 0; t < n; t++)
                    rows[t] = (fwd_row){.token = p->ids[t], .slot = b, .pos = t, .prompt = true};
                CU_ASSERT_EQUAL(fwd_step(f, rows, n, &st), 0);
            }
            double worst = 0;
            for (int step = 0; step < steps; step++) {
                int32_t toks[3];
                for (int b = 0; b < B; b++) {
                    toks[b] = (int32_t)((b * 37 + step * 11) % V);
                    rows[b] = (fwd_row){.token = toks[b], .slot = b, .pos = fwd_n_past(f, b),
                                        .logits = lb + (long)b * V};
                }
                CU_ASSERT_EQUAL(fwd_step(f, rows, B, &st), 0);
                for (int b = 0; b < B; b++) {
                    CU_ASSERT_EQUAL(qwen35_decode_batch(ctx1[c], &s1[b], &toks[b], 1, l1, &st), 0);
                    worst = fmax(worst, forward_test_rows_rel(lb + (long)b * V, l1, 1, V));
                }
            }
            printf("\n    %s N=%d B=%d: batched ranks vs single unsharded worst rel %.3g",
                   case_list[c].name, Ns[k], B, worst);
            CU_ASSERT(worst <= TP_TOL);
            for (int b = 0; b < B; b++) qwen35_state_destroy(s1[b]);
            free(lb), free(l1);
            fwd_destroy(f);
        }
}

/* A Q8_0 copy (row-parallel columns are whole 32-blocks) matches in both dot modes; a Q4_K
 * copy, whose ffn_down F/N = 384 columns are not whole 256-blocks, is refused at create. */
static void test_quantized(void)
{
    char src[4096], dst[4300];
    status st;
    ref_case_resolve_path("tiny-r2-tied", ".gguf", src, sizeof src);
    snprintf(dst, sizeof dst, "%s/tp.q8_0.%d.gguf", testutil_tmp_dir(), (int)getpid());
    CU_ASSERT_FATAL(requant_file(src, dst, REQUANT_Q8_0, 0, &st) == 0);
    qwen35_model *m;
    CU_ASSERT_FATAL(qwen35_model_load(&m, dst, &st) == 0);
    CU_ASSERT(m->layers[0].ffn_down.type == GGML_TYPE_Q8_0);
    int V = m->cfg.V, T = 40;
    int32_t ids[40];
    for (int i = 0; i < T; i++) ids[i] = (i * 37 + 5) % V;
    float *a = malloc(sizeof(float) * T * V), *b = malloc(sizeof(float) * T * V);
    for (int dot = QWEN35_DOT_Q8; dot <= QWEN35_DOT_EXACT; dot++) {
        qwen35_ctx_opts o = OPTS;
        o.dot_mode = (qwen35_dot_mode)dot;
        qwen35_ctx *ctx;
        CU_ASSERT_FATAL(qwen35_ctx_create(m, &o, &ctx, &st) == 0);
        CU_ASSERT_EQUAL(run_ref(ctx, m, ids, T, 20, a), 0);
        for (size_t k = 0; k < 2; k++) {
            fwd *f = tp_for_model(m, Ns[k], OPTS.max_tokens, dot == QWEN35_DOT_EXACT, &st);
            CU_ASSERT_FATAL(f != NULL);
            CU_ASSERT_EQUAL(run_tp(f, V, ids, T, 20, b), 0);
            double rel = forward_test_rows_rel(b, a, T, V);
            printf("\n    q8_0 N=%d %s: worst row rel %.3g", Ns[k],
                   dot == QWEN35_DOT_Q8 ? "integer" : "exact", rel);
            CU_ASSERT(rel <= TP_TOL);
            fwd_destroy(f);
        }
        qwen35_ctx_destroy(ctx);
    }
    qwen35_model_free(m);
    unlink(dst);
    snprintf(dst, sizeof dst, "%s/tp.q4_k.%d.gguf", testutil_tmp_dir(), (int)getpid());
    CU_ASSERT_FATAL(requant_file(src, dst, REQUANT_ALL, GGML_TYPE_Q4_K, &st) == 0);
    CU_ASSERT_FATAL(qwen35_model_load(&m, dst, &st) == 0);
    fwd *f = tp_for_model(m, 2, 64, false, &st);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_EQUAL(st.code, STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "blk.0.ffn_down.weight"));
    printf("\n    q4_k N=2: %s", st.msg);
    f = tp_for_model(m, 1, 64, false, &st); /* one rank: no split */
    CU_ASSERT_PTR_NOT_NULL(f);
    fwd_destroy(f);
    qwen35_model_free(m);
    unlink(dst);
    free(a), free(b);
}

static void test_indivisible(void)
{
    char path[4096];
    status st;
    qwen35_model *m;
    ref_case_resolve_path("tiny-r2-tied", ".gguf", path, sizeof path);
    CU_ASSERT_FATAL(qwen35_model_load(&m, path, &st) == 0);
    fwd *f = tp_for_model(m, 3, 64, false, &st);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_EQUAL(st.code, STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "n_h = 4 query heads do not split over 3 ranks"));
    printf("\n    N=3: %s", st.msg);
    CU_ASSERT_PTR_NULL(tp_for_model(m, -1, 64, false, &st));
    CU_ASSERT_EQUAL(st.code, STATUS_INVALID);
    CU_ASSERT_PTR_NULL(tp_for_model(m, 1000, 64, false, &st));
    CU_ASSERT_EQUAL(st.code, STATUS_INVALID);
    f = tp_for_model(m, 0, 64, false, &st); /* 0: one rank */
    CU_ASSERT(f && f->ranks == 1);
    fwd_destroy(f);
    qwen35_model_free(m);
}

/* Refused steps change nothing on any rank: the slot continues as if they had not been. */
static void test_errors(void)
{
    fwd *f;
    status st;
    CU_ASSERT_FATAL((f = tp_for(0, 2, 64)) != NULL);
    const ref_prompt *p = &prompts[0][0];
    int V = models[0]->cfg.V;
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    fwd_row rows[64];
    CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &GREEDY, &st), 0);
    for (int t = 0; t < 3; t++) rows[t] = (fwd_row){.token = p->ids[t], .slot = 0, .pos = t, .prompt = true};
    rows[1].token = V;
    CU_ASSERT_EQUAL(fwd_step(f, rows, 3, &st), STATUS_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "row 1"));
    rows[1].token = -1;
    CU_ASSERT_EQUAL(fwd_step(f, rows, 3, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(fwd_step(f, rows, 0, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(fwd_step(f, rows, 65, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(fwd_n_past(f, 0), 0);
    /* the same 3 tokens after the refusals, and after seq_start: the same logits */
    rows[1].token = p->ids[1];
    rows[2].logits = la;
    CU_ASSERT_EQUAL(fwd_step(f, rows, 3, &st), 0);
    CU_ASSERT_EQUAL(fwd_n_past(f, 0), 3);
    rows[0] = (fwd_row){.token = 1, .slot = 0, .pos = 2};
    CU_ASSERT_EQUAL(fwd_step(f, rows, 1, &st), STATUS_RANGE); /* a position already taken */
    CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &GREEDY, &st), 0);
    for (int t = 0; t < 3; t++) rows[t] = (fwd_row){.token = p->ids[t], .slot = 0, .pos = t, .prompt = true};
    rows[2].logits = lb;
    CU_ASSERT_EQUAL(fwd_step(f, rows, 3, &st), 0);
    CU_ASSERT_EQUAL(memcmp(la, lb, sizeof(float) * V), 0);
    free(la), free(lb);
    fwd_destroy(f);
}

static void test_no_alloc_per_token(void)
{
    int c = ref_cases_find(case_list, N_CASES, "own-r2-tied");
    if (c < 0) c = 0;
    status st;
    fwd *f;
    CU_ASSERT_FATAL((f = tp_for_model(models[c], 2, 48, false, &st)) != NULL);
    int V = models[c]->cfg.V;
    float *logits = malloc(sizeof(float) * 48 * V);
    int32_t ids[130];
    for (int i = 0; i < 130; i++) ids[i] = (i * 37) % V;
    fwd_row rows[48];
    long before = testutil_allocs();
    for (int s = 0; s < 2; s++) CU_ASSERT(fwd_seq_start(f, s, &GREEDY, &st) == 0);
    for (int t = 0; t < 130; t += 48) { /* slot 0: 130 prompt rows in steps of 48, every logit */
        const int n = 130 - t < 48 ? 130 - t : 48;
        for (int k = 0; k < n; k++)
            rows[k] = (fwd_row){.token = ids[t + k], .slot = 0, .pos = t + k, .prompt = true,
                                .logits = logits + (long)k * V};
        CU_ASSERT(fwd_step(f, rows, n, &st) == 0);
    }
    for (int k = 0; k < 5; k++) rows[k] = (fwd_row){.token = ids[k], .slot = 1, .pos = k, .prompt = true};
    CU_ASSERT(fwd_step(f, rows, 5, &st) == 0);
    for (int step = 0; step < 20; step++) {
        for (int s = 0; s < 2; s++)
            rows[s] = (fwd_row){.token = ids[step], .slot = s, .pos = fwd_n_past(f, s), .sample = true};
        CU_ASSERT(fwd_step(f, rows, 2, &st) == 0);
    }
    long during = testutil_allocs() - before;
    printf("\n    allocations during 135 prefill tokens and 40 decoded tokens over 2 ranks: %ld", during);
    CU_ASSERT_EQUAL(during, 0);
    CU_ASSERT(testutil_allocs() > 0); /* the counter counts (create allocated) */
    free(logits);
    fwd_destroy(f);
}

/* The comparison can fail: the ranks over a model with one DeltaNet weight swapped miss the
 * unsharded logits by far more than the tolerance. */
static void test_check_can_fail(void)
{
    qwen35_model *broken = malloc(sizeof *broken);
    *broken = *models[0]; /* shares the mapping; freed with free() */
    const float *t = broken->layers[0].dt_bias;
    broken->layers[0].dt_bias = broken->layers[0].ssm_a;
    broken->layers[0].ssm_a = t;
    status st;
    fwd *f = tp_for_model(broken, 2, OPTS.max_tokens, false, &st);
    CU_ASSERT_FATAL(f != NULL);
    const ref_prompt *p = &prompts[0][0];
    int32_t *ids = forward_test_full_ids(p);
    float *a = malloc(sizeof(float) * p->rows * p->V), *b = malloc(sizeof(float) * p->rows * p->V);
    CU_ASSERT_EQUAL(run_ref(ctx1[0], models[0], ids, p->rows, p->n_ids, a), 0);
    CU_ASSERT_EQUAL(run_tp(f, p->V, ids, p->rows, p->n_ids, b), 0);
    double rel = forward_test_rows_rel(b, a, p->rows, p->V);
    printf("\n    broken model over 2 ranks: worst row rel %.3g", rel);
    CU_ASSERT(rel > 100 * TP_TOL);
    fwd_destroy(f);
    free(a), free(b), free(ids), free(broken);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("forward_tp", setup, teardown);
    CU_add_test(s, "split_rules", test_split_rules);
    CU_add_test(s, "one_rank_is_unsharded", test_one_rank_is_unsharded);
    CU_add_test(s, "logits", test_logits);
    CU_add_test(s, "greedy", test_greedy);
    CU_add_test(s, "batch_decode", test_batch_decode);
    CU_add_test(s, "quantized", test_quantized);
    CU_add_test(s, "indivisible", test_indivisible);
    CU_add_test(s, "errors", test_errors);
    CU_add_test(s, "no_alloc_per_token", test_no_alloc_per_token);
    CU_add_test(s, "check_can_fail", test_check_can_fail);
    return testutil_cunit_run();
}
