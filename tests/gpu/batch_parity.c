/* Batched decode on the GPU (model/forward_cuda_batch.c, through worker/backend.h "cuda"):
 *  - batch invariance: 64 sequences with prompts of different lengths, fed as the engine feeds
 *    them (one token of every running sequence a step, so the batch grows and shrinks), give the
 *    same greedy tokens run all together, in pairs, or each alone (with --batch-invariant, so
 *    that a step of one row, the lone sequence or the last one left, also takes the batched
 *    kernels; without it such steps take the batch-1 GEMV graphs, another rounding: their
 *    agreement is printed, not required); with a fixed seed the sampled tokens (temperature,
 *    top-k, top-p) are the same alone and together;
 *  - prefill: with --batch-invariant (the delta rule row by row), the prompts fed as chunks
 *    (whole, or 7 tokens a step; every sequence together or alone) give the same greedy and
 *    sampled tokens as token by token, and, on the reference models, bit-identical logits on
 *    every row (a chunk is a run of the batched pass: model/forward_cuda_batch.c); by default
 *    (the chunked delta rule) the logits within 1e-3 of max|logit| of token by token;
 *  - the batched logits against the CPU forward (the specification) on the reference models:
 *    float weights keep F16 remainders in the batched GEMM, bound 2e-3 of max|logit| (H200 run
 *    31: at most 3.9e-4); a
 *    perturbed copy must fail that check;
 *  - slots: 64 sequences started and abandoned mid-way, then reused, and the device memory the
 *    process holds is the same before and after;
 *  - the dense path (kernels/cuda/gemm.h, --dense-rows): on a synthetic Q4_K_M model (the tiny
 *    shape, written here), 64 prompts fed whole, every pass of 128 rows or more on it, F16
 *    copies resident and dequantised per pass: the logits of the prompt rows of the first
 *    pass within 1e-2 of max|logit| of the quantised GEMM's (the same F16 weights and x; only
 *    the order of the sums differs, which the random weights amplify; later passes of fewer
 *    rows take gemv_mma's Q8 rows on both sides, where a last-bit difference upstream flips a
 *    Q8 value), and every row up to the first token two runs disagree on no farther from the
 *    CPU forward's than the quantised GEMM's (1.5x + 1e-3).
 *  - bf16 recurrent state (fwd_opts.state_dtype, kernels/cuda/gdn.h "State storage") on the
 *    reference models, batch invariant: alone = all together (greedy tokens), prompts in one
 *    chunk = token by token (bit-identical logits: both round S after every row), and the
 *    logits against the CPU forward's with bf16 state within 1e-1 of max|logit| (the F32
 *    state's bound is 2e-3: an S element whose F32 value lies within the GPU's rounding error of
 *    a bf16 midpoint rounds the other way, a 2^-8 step, and these random-weight models amplify
 *    a perturbed state: tests/model/fwd_bf16_test; measured on an H100: 5.2e-3 on own-r2-tied,
 *    5.4e-2 on own-r1-untied, which fails 2e-2. The bit-identical checks carry the weight here;
 *    tests/model/fwd_bf16_test bounds bf16 against F32 on the trained demo model).
 * Models: the reference models and the synthetic ones of DS_ENGINE_GGUF (required with
 * DS_REQUIRE_GPU=1, as engine_parity). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sampling.h"
#include "common/splitmix64.h"
#include "common/status.h"
#include "gguf/synth.h"
#include "kernels/cuda/cuda_device.h"
#include "model/qwen35.h"
#include "tests/gpu/gpu_parity.h"
#include "tests/model/ref_cases.h"
#include "worker/backend.h"

#define N_SEQ 64
#define N_GEN 24
#define MAX_PROMPT 40

static bool g_have_gpu;

typedef struct seqs {
    int n;
    int plen[N_SEQ];
    int32_t prompt[N_SEQ][MAX_PROMPT];
    sampling_params sp[N_SEQ];
} seqs;

static void seqs_make(seqs *s, int V, bool sampled)
{
    uint64_t r = 1234;
    s->n = N_SEQ;
    for (int i = 0; i < N_SEQ; i++) {
        s->plen[i] = 1 + (i * 7) % MAX_PROMPT;
        for (int k = 0; k < s->plen[i]; k++) s->prompt[i][k] = (int32_t)(splitmix64_next(&r) % (uint64_t)V);
        s->sp[i] = (sampling_params){.temperature = 0, .top_p = 1, .repetition_penalty = 1};
        if (sampled)
            s->sp[i] = (sampling_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f,
                                         .repetition_penalty = 1, .seed = 100 + (uint64_t)i};
    }
}

/* The sequences in groups of `group` (1: each alone), every step up to `chunk` prompt tokens
 * (1: token by token, as the engine fed them before prefill) or the one generated token of
 * every running sequence of the group; out[i][0..N_GEN) the generated tokens. logits (may be
 * NULL): [N_SEQ][MAX_PROMPT + N_GEN][V], every row's logits. */
static int run_chunks(worker_backend *b, const seqs *s, int group, int chunk,
                      int32_t out[N_SEQ][N_GEN], float *logits, status *st)
{
    const int V = b->vocab;
    worker_batch_item it[N_SEQ];
    int32_t tok[N_SEQ];
    for (int g0 = 0; g0 < s->n; g0 += group) {
        const int g1 = g0 + group < s->n ? g0 + group : s->n;
        int fed[N_SEQ] = {0}, gen[N_SEQ] = {0};
        for (int i = g0; i < g1; i++)
            if (worker_backend_seq_start(b, i - g0, &s->sp[i], st)) return st->code;
        for (;;) {
            int n = 0, who[N_SEQ];
            for (int i = g0; i < g1; i++) {
                if (gen[i] == N_GEN) continue;
                const bool prompt = fed[i] < s->plen[i];
                int nt = 1;
                if (prompt) nt = s->plen[i] - fed[i] < chunk ? s->plen[i] - fed[i] : chunk;
                tok[n] = prompt ? 0 : out[i][gen[i] - 1];
                it[n] = (worker_batch_item){
                    .slot = i - g0, .tokens = prompt ? &s->prompt[i][fed[i]] : &tok[n],
                    .n_tokens = nt, .prompt = prompt, .sample = fed[i] + nt >= s->plen[i],
                    .logits = logits ? logits + ((size_t)i * (MAX_PROMPT + N_GEN) + fed[i]) * V : NULL};
                who[n++] = i;
            }
            if (!n) break;
            if (worker_backend_step(b, it, n, st)) return st->code;
            for (int k = 0; k < n; k++) {
                const int i = who[k];
                fed[i] += it[k].n_tokens;
                if (it[k].sample) out[i][gen[i]++] = it[k].out.token;
            }
        }
    }
    return STATUS_OK;
}

static int run_groups(worker_backend *b, const seqs *s, int group, int32_t out[N_SEQ][N_GEN],
                      float *logits, status *st)
{
    return run_chunks(b, s, group, 1, out, logits, st);
}

static int count_same(int32_t a[N_SEQ][N_GEN], int32_t b[N_SEQ][N_GEN])
{
    int n = 0;
    for (int i = 0; i < N_SEQ; i++)
        for (int k = 0; k < N_GEN; k++) n += a[i][k] == b[i][k];
    return n;
}

/* worst over rows of max|a-b| / max|a| (inf for a non-finite b) */
static double worst_rel(const float *a, const float *b, int64_t rows, int V)
{
    double w = 0;
    for (int64_t r = 0; r < rows; r++) {
        double ma = 0, md = 0;
        for (int v = 0; v < V; v++) {
            const float x = a[r * V + v], y = b[r * V + v];
            if (!isfinite(y)) return INFINITY;
            ma = fmax(ma, fabs(x));
            md = fmax(md, fabs((double)x - y));
        }
        w = fmax(w, md / (ma > 0 ? ma : 1));
    }
    return w;
}

/* One model: invariance (greedy and sampled), and with cpu_logits the batched logits against
 * the CPU backend's. */
static void check_model(const char *path, bool cpu_logits)
{
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    worker_backend *inv = NULL, *def = NULL, *cpu = NULL;
    static int32_t alone[N_SEQ][N_GEN], all[N_SEQ][N_GEN], pairs[N_SEQ][N_GEN],
        gemv[N_SEQ][N_GEN], s_alone[N_SEQ][N_GEN], s_all[N_SEQ][N_GEN], c_all[N_SEQ][N_GEN],
        pre_all[N_SEQ][N_GEN], pre_alone[N_SEQ][N_GEN], pre_7[N_SEQ][N_GEN], s_pre[N_SEQ][N_GEN];
    float *lg = NULL, *lc = NULL;
    static seqs greedy, sampled;
    if (qwen35_model_load(&m, path, &st)) goto done;
    const int V = m->cfg.V;
    seqs_make(&greedy, V, false);
    seqs_make(&sampled, V, true);
    const worker_backend_opts oi = {.n_slots = N_SEQ, .n_ctx = MAX_PROMPT + N_GEN + 1,
                                    .max_prefill_tokens = 256, .batch_invariant = true};
    worker_backend_opts od = oi;
    od.batch_invariant = false;
    if (worker_backend_create("cuda", m, &oi, &inv, &st) ||
        worker_backend_create("cuda", m, &od, &def, &st))
        goto done;
    if (run_groups(inv, &greedy, 1, alone, NULL, &st) || run_groups(inv, &greedy, N_SEQ, all, NULL, &st) ||
        run_groups(inv, &greedy, 2, pairs, NULL, &st) || run_groups(def, &greedy, 1, gemv, NULL, &st) ||
        run_groups(inv, &sampled, 1, s_alone, NULL, &st) ||
        run_groups(inv, &sampled, N_SEQ, s_all, NULL, &st))
        goto done;
    /* prefill: each prompt as one chunk (all together: passes of 256 rows cut runs), alone, and
     * in chunks of 7; sampled with whole-prompt chunks */
    if (run_chunks(inv, &greedy, N_SEQ, MAX_PROMPT, pre_all, NULL, &st) ||
        run_chunks(inv, &greedy, 1, MAX_PROMPT, pre_alone, NULL, &st) ||
        run_chunks(inv, &greedy, N_SEQ, 7, pre_7, NULL, &st) ||
        run_chunks(inv, &sampled, N_SEQ, MAX_PROMPT, s_pre, NULL, &st))
        goto done;
    const int n = N_SEQ * N_GEN;
    printf("  %s: prefill chunks = token by token, %d tokens: whole prompts together %d, alone "
           "%d, chunks of 7 %d; sampled %d\n", path, n, count_same(pre_all, all),
           count_same(pre_alone, all), count_same(pre_7, all), count_same(s_pre, s_all));
    CU_ASSERT_EQUAL(count_same(pre_all, all), n);
    CU_ASSERT_EQUAL(count_same(pre_alone, all), n);
    CU_ASSERT_EQUAL(count_same(pre_7, all), n);
    CU_ASSERT_EQUAL(count_same(s_pre, s_all), n);
    printf("  %s: greedy, %d tokens: alone (batch invariant) = all %d together: %d; pairs = all: %d;"
           " sampled alone = together: %d; batch-1 GEMV graphs = batched: %d (not required)\n",
           path, n, N_SEQ, count_same(alone, all), count_same(pairs, all),
           count_same(s_alone, s_all), count_same(gemv, all));
    CU_ASSERT_EQUAL(count_same(alone, all), n);
    CU_ASSERT_EQUAL(count_same(pairs, all), n);
    CU_ASSERT_EQUAL(count_same(s_alone, s_all), n);
    if (cpu_logits) {
        const size_t rows = (size_t)N_SEQ * (MAX_PROMPT + N_GEN);
        lg = calloc(rows * V, sizeof *lg);
        lc = calloc(rows * V, sizeof *lc);
        worker_backend_opts oc = od;
        if (!lg || !lc) {
            status_fail(&st, STATUS_NOMEM, "logits");
            goto done;
        }
        if (worker_backend_create("cpu", m, &oc, &cpu, &st) ||
            run_groups(cpu, &greedy, N_SEQ, c_all, lc, &st) ||
            run_groups(def, &greedy, N_SEQ, all, lg, &st))
            goto done;
        /* rows the run filled: the CPU's tokens decide the rows fed; compare those the GPU's
         * tokens agree on up to there (teacher forcing would need another feed) */
        double w = 0;
        int rows_cmp = 0;
        for (int i = 0; i < N_SEQ; i++) {
            int k = 0;
            while (k < N_GEN && c_all[i][k] == all[i][k]) k++;
            const int64_t r = greedy.plen[i] + k; /* rows up to the first differing token */
            const size_t off = (size_t)i * (MAX_PROMPT + N_GEN) * V;
            w = fmax(w, worst_rel(lc + off, lg + off, r, V));
            rows_cmp += (int)r;
        }
        printf("  %s: batched logits vs CPU over %d rows: worst %.3g of max|logit| (bound 2e-3); "
               "greedy tokens equal to the CPU's: %d of %d\n", path, rows_cmp, w,
               count_same(c_all, all), n);
        CU_ASSERT(w <= 2e-3);
        /* the prompt's rows through prefill runs, bit for bit the rows fed token by token */
        float *lp = calloc(rows * V, sizeof *lp);
        if (!lp) {
            status_fail(&st, STATUS_NOMEM, "logits");
            goto done;
        }
        memset(lg, 0, rows * V * sizeof *lg);
        if (run_chunks(inv, &greedy, N_SEQ, 1, all, lg, &st) ||
            run_chunks(inv, &greedy, N_SEQ, MAX_PROMPT, pre_all, lp, &st)) {
            free(lp);
            goto done;
        }
        const int same_logits = !memcmp(lg, lp, rows * V * sizeof *lg);
        printf("  %s: logits of every row, prompts in one chunk vs token by token (batch "
               "invariant: the delta rule row by row): %s\n", path,
               same_logits ? "bit-identical" : "DIFFERENT");
        CU_ASSERT(same_logits);
        /* the chunked delta rule (the default): within 1e-3 of max|logit|, the forwards' bound */
        memset(lp, 0, rows * V * sizeof *lp);
        if (run_chunks(def, &greedy, N_SEQ, MAX_PROMPT, pre_all, lp, &st)) {
            free(lp);
            goto done;
        }
        double wc = 0;
        for (int i = 0; i < N_SEQ; i++) {
            int k = 0;
            while (k < N_GEN && pre_all[i][k] == all[i][k]) k++;
            const size_t off = (size_t)i * (MAX_PROMPT + N_GEN) * V;
            wc = fmax(wc, worst_rel(lg + off, lp + off, greedy.plen[i] + k, V));
        }
        printf("  %s: chunked prefill vs token by token: worst %.3g of max|logit| (bound 1e-3); "
               "greedy tokens equal: %d of %d\n", path, wc, count_same(pre_all, all), n);
        CU_ASSERT(wc <= 1e-3);
        free(lp);
        lg[(size_t)7 * V + 3] += 0.05f * (1.0f + fabsf(lg[(size_t)7 * V + 3])) * 100;
        CU_ASSERT(worst_rel(lc, lg, 8, V) > 2e-3); /* perturbed: must fail */
    }
done:
    if (st.code) printf("  %s: %s\n", path, st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    free(lg);
    free(lc);
    worker_backend_destroy(inv);
    worker_backend_destroy(def);
    worker_backend_destroy(cpu);
    qwen35_model_free(m);
}

/* bf16 state on one model: see the top */
static void check_bf16(const char *path)
{
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    worker_backend *inv = NULL, *cpu = NULL;
    static int32_t alone[N_SEQ][N_GEN], all[N_SEQ][N_GEN], pre_all[N_SEQ][N_GEN],
        c_all[N_SEQ][N_GEN];
    float *lg = NULL, *lp = NULL, *lc = NULL;
    static seqs greedy;
    if (qwen35_model_load(&m, path, &st)) goto done;
    const int V = m->cfg.V;
    seqs_make(&greedy, V, false);
    const worker_backend_opts oi = {.n_slots = N_SEQ, .n_ctx = MAX_PROMPT + N_GEN + 1,
                                    .max_prefill_tokens = 256, .batch_invariant = true,
                                    .state_dtype = FWD_STATE_BF16};
    const size_t rows = (size_t)N_SEQ * (MAX_PROMPT + N_GEN);
    lg = calloc(rows * V, sizeof *lg);
    lp = calloc(rows * V, sizeof *lp);
    lc = calloc(rows * V, sizeof *lc);
    if (!lg || !lp || !lc) {
        status_fail(&st, STATUS_NOMEM, "logits");
        goto done;
    }
    if (worker_backend_create("cuda", m, &oi, &inv, &st) ||
        worker_backend_create("cpu", m, &oi, &cpu, &st) ||
        run_groups(inv, &greedy, 1, alone, NULL, &st) ||
        run_groups(inv, &greedy, N_SEQ, all, lg, &st) ||
        run_groups(cpu, &greedy, N_SEQ, c_all, lc, &st))
        goto done;
    const int n = N_SEQ * N_GEN;
    printf("  %s, bf16 state: greedy alone = all %d together: %d of %d\n", path, N_SEQ,
           count_same(alone, all), n);
    CU_ASSERT_EQUAL(count_same(alone, all), n);
    double w = 0;
    int rows_cmp = 0;
    for (int i = 0; i < N_SEQ; i++) {
        int k = 0;
        while (k < N_GEN && c_all[i][k] == all[i][k]) k++;
        const size_t off = (size_t)i * (MAX_PROMPT + N_GEN) * V;
        w = fmax(w, worst_rel(lc + off, lg + off, greedy.plen[i] + k, V));
        rows_cmp += greedy.plen[i] + k;
    }
    printf("  %s, bf16 state: logits vs the CPU's (bf16 state) over %d rows: worst %.3g of "
           "max|logit| (bound 1e-1); greedy tokens equal: %d of %d\n", path, rows_cmp, w,
           count_same(c_all, all), n);
    CU_ASSERT(w <= 1e-1);
    memset(lg, 0, rows * V * sizeof *lg);
    if (run_chunks(inv, &greedy, N_SEQ, 1, all, lg, &st) ||
        run_chunks(inv, &greedy, N_SEQ, MAX_PROMPT, pre_all, lp, &st))
        goto done;
    const int same = !memcmp(lg, lp, rows * V * sizeof *lg);
    printf("  %s, bf16 state: logits of every row, prompts in one chunk vs token by token: %s\n",
           path, same ? "bit-identical" : "DIFFERENT");
    CU_ASSERT(same);
done:
    if (st.code) printf("  %s: %s\n", path, st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    free(lg);
    free(lp);
    free(lc);
    worker_backend_destroy(inv);
    worker_backend_destroy(cpu);
    qwen35_model_free(m);
}

static void test_bf16_state(void)
{
    if (!g_have_gpu) return;
    static const char *const names[] = {"tiny-r2-tied", "tiny-r1-untied"};
    char path[1024];
    for (int i = 0; i < 2; i++) {
        ref_case_resolve_path(names[i], ".gguf", path, sizeof path);
        check_bf16(path);
    }
}

static void test_reference(void)
{
    if (!g_have_gpu) return;
    static const char *const names[] = {"tiny-r2-tied", "tiny-r1-untied"};
    char path[1024];
    for (int i = 0; i < 2; i++) {
        ref_case_resolve_path(names[i], ".gguf", path, sizeof path);
        check_model(path, true);
    }
    const char *root = getenv("DS_REPO_ROOT");
    snprintf(path, sizeof path, "%s/tests/reference/tiny-r3-gqa3.gguf", root ? root : ".");
    check_model(path, true);
}

static void test_synthetic(void)
{
    if (!g_have_gpu) return;
    const char *list = getenv("DS_ENGINE_GGUF"), *req = getenv("DS_REQUIRE_GPU");
    if (!list || !*list) {
        printf("  DS_ENGINE_GGUF unset: no synthetic model given\n");
        CU_ASSERT(!(req && !strcmp(req, "1")));
        return;
    }
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL, *p = strtok_r(buf, ":", &save); /* the first (the 0.8B) */
    if (p) check_model(p, false);
}

/* the dense path's first bucket in test_dense: passes of this many rows or more take it */
#define DENSE_FROM 128

static void test_dense(void)
{
    if (!g_have_gpu) return;
    char path[64];
    snprintf(path, sizeof path, "/tmp/batch_parity_dense_%d.gguf", (int)getpid());
    status st;
    status_clear(&st);
    const synth_options so = {.preset = synth_preset_find("tiny"), .quant = SYNTH_QUANT_Q4_K_M,
                              .seed = 7};
    synth_stats ss;
    qwen35_model *m = NULL;
    worker_backend *q = NULL, *dr = NULL, *dp = NULL, *cpu = NULL;
    static int32_t out_q[N_SEQ][N_GEN], out_r[N_SEQ][N_GEN], out_p[N_SEQ][N_GEN],
        out_c[N_SEQ][N_GEN];
    static seqs greedy;
    float *lq = NULL, *lr = NULL, *lp = NULL, *lc = NULL;
    if (synth_write(path, &so, &ss, &st) || qwen35_model_load(&m, path, &st)) goto done;
    const int V = m->cfg.V;
    const size_t rows = (size_t)N_SEQ * (MAX_PROMPT + N_GEN);
    lq = calloc(rows * V, sizeof *lq), lr = calloc(rows * V, sizeof *lr);
    lp = calloc(rows * V, sizeof *lp), lc = calloc(rows * V, sizeof *lc);
    if (!lq || !lr || !lp || !lc) {
        status_fail(&st, STATUS_NOMEM, "logits");
        goto done;
    }
    seqs_make(&greedy, V, false);
    const worker_backend_opts oq = {.n_slots = N_SEQ, .n_ctx = MAX_PROMPT + N_GEN + 1,
                                    .max_prefill_tokens = 256};
    worker_backend_opts orr = oq, op = oq;
    orr.dense_rows = DENSE_FROM, op.dense_rows = DENSE_FROM, op.dense_per_pass = true;
    if (worker_backend_create("cuda", m, &oq, &q, &st) ||
        worker_backend_create("cuda", m, &orr, &dr, &st) ||
        worker_backend_create("cuda", m, &op, &dp, &st) ||
        worker_backend_create("cpu", m, &oq, &cpu, &st) ||
        run_chunks(q, &greedy, N_SEQ, MAX_PROMPT, out_q, lq, &st) ||
        run_chunks(dr, &greedy, N_SEQ, MAX_PROMPT, out_r, lr, &st) ||
        run_chunks(dp, &greedy, N_SEQ, MAX_PROMPT, out_p, lp, &st) ||
        run_chunks(cpu, &greedy, N_SEQ, MAX_PROMPT, out_c, lc, &st))
        goto done;
    /* wqc, wrc: per sequence, the rows up to the first token any two runs disagree on; wr, wp:
     * the prompt rows of the sequences whose prompts are the first DENSE_FROM rows fed, all in
     * the first step's first pass (the dense path on one side, gemm_rows on the other, from
     * the same embeddings) */
    double wr = 0, wp = 0, wqc = 0, wrc = 0;
    int fed = 0;
    for (int i = 0; i < N_SEQ; i++) {
        int k = 0;
        while (k < N_GEN && out_r[i][k] == out_q[i][k] && out_p[i][k] == out_q[i][k] &&
               out_c[i][k] == out_q[i][k])
            k++;
        const size_t off = (size_t)i * (MAX_PROMPT + N_GEN) * V;
        const int64_t r = greedy.plen[i] + k;
        fed += greedy.plen[i];
        if (fed <= DENSE_FROM) {
            wr = fmax(wr, worst_rel(lq + off, lr + off, greedy.plen[i], V));
            wp = fmax(wp, worst_rel(lq + off, lp + off, greedy.plen[i], V));
        }
        wqc = fmax(wqc, worst_rel(lc + off, lq + off, r, V));
        wrc = fmax(wrc, worst_rel(lc + off, lr + off, r, V));
    }
    printf("  dense path (synthetic tiny Q4_K_M): first pass's prompt rows vs the quantised GEMM worst %.3g "
           "(resident), %.3g (per pass) of max|logit| (bound 1e-2); vs the CPU %.3g, the quantised GEMM's "
           "%.3g (bound 1.5x + 1e-3)\n", wr, wp, wrc, wqc);
    /* the same F16 weights and x, only the order of the sums differs, but random weights
     * amplify a rounding difference (2.6e-3 over 4 layers measured on the H200); a wrongly wired
     * matrix differs by O(1). Against the specification the dense path is as close as the
     * quantised GEMM. */
    CU_ASSERT(wr <= 1e-2);
    CU_ASSERT(wp <= 1e-2);
    CU_ASSERT(wrc <= 1.5 * wqc + 1e-3);
    /* the dense path ran: its sums differ from the GEMM's somewhere (no cuBLAS: it falls back
     * and everything is bit-identical) */
    CU_ASSERT(wr > 0 && wp > 0);
done:
    if (st.code) printf("  dense: %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    free(lq), free(lr), free(lp), free(lc);
    worker_backend_destroy(q);
    worker_backend_destroy(dr);
    worker_backend_destroy(dp);
    worker_backend_destroy(cpu);
    qwen35_model_free(m);
    unlink(path);
}

/* Sequences abandoned mid-way leave nothing behind: every slot restarts clean (the tokens of a
 * rerun equal the first run's) and the process's device allocations do not grow. */
static void test_abandon_and_reuse(void)
{
    if (!g_have_gpu) return;
    status st;
    status_clear(&st);
    char path[1024];
    ref_case_resolve_path("tiny-r2-tied", ".gguf", path, sizeof path);
    qwen35_model *m = NULL;
    worker_backend *b = NULL;
    static int32_t first[N_SEQ][N_GEN], again[N_SEQ][N_GEN];
    static seqs s;
    const worker_backend_opts o = {.n_slots = N_SEQ, .n_ctx = MAX_PROMPT + N_GEN + 1,
                                   .max_prefill_tokens = 1};
    if (qwen35_model_load(&m, path, &st) || worker_backend_create("cuda", m, &o, &b, &st)) goto done;
    seqs_make(&s, m->cfg.V, false);
    if (run_groups(b, &s, N_SEQ, first, NULL, &st)) goto done;
    const uint64_t allocs = cuda_alloc_count();
    for (int round = 0; round < 16; round++) { /* 1,024 sequences cut off after a few steps */
        worker_batch_item it[N_SEQ];
        int32_t tok[N_SEQ];
        for (int i = 0; i < N_SEQ; i++)
            if (worker_backend_seq_start(b, i, &s.sp[i], &st)) goto done;
        for (int step = 0; step < 1 + round % 5; step++) {
            for (int i = 0; i < N_SEQ; i++) {
                tok[i] = (int32_t)((i * 31 + step + round) % m->cfg.V);
                it[i] = (worker_batch_item){.slot = i, .tokens = &tok[i], .n_tokens = 1,
                                            .prompt = true, .sample = true};
            }
            if (worker_backend_step(b, it, N_SEQ, &st)) goto done;
        }
    }
    if (run_groups(b, &s, N_SEQ, again, NULL, &st)) goto done;
    printf("  1,024 abandoned sequences: device allocations %llu -> %llu; rerun tokens equal: %d of %d\n",
           (unsigned long long)allocs, (unsigned long long)cuda_alloc_count(), count_same(first, again),
           N_SEQ * N_GEN);
    CU_ASSERT_EQUAL(cuda_alloc_count(), allocs);
    CU_ASSERT_EQUAL(count_same(first, again), N_SEQ * N_GEN);
done:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    worker_backend_destroy(b);
    qwen35_model_free(m);
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("batched decode parity");
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("batch_parity", NULL, NULL);
    CU_add_test(s, "reference models: invariance and logits", test_reference);
    CU_add_test(s, "synthetic: invariance", test_synthetic);
    CU_add_test(s, "abandoned sequences free their slots", test_abandon_and_reuse);
    CU_add_test(s, "the dense path against the quantised GEMM", test_dense);
    CU_add_test(s, "bf16 recurrent state", test_bf16_state);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    return fails ? 1 : 0;
}
