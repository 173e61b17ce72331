/* The CPU forward behind the forward contract (model/forward_cpu.h, through fwd_create("cpu")
 * and the //model:backends_cpu registry) on the reference models:
 *  - greedy tokens of fwd_step (prompt rows, then one decode row a step, the sampler behind the
 *    forward) equal the reference forward's (qwen35_prefill / qwen35_decode_batch + argmax), and
 *    the logits a row asks for equal the reference's (the delta rule token by token, as the
 *    fwd CPU forward runs it) bit for bit;
 *  - several slots in one step (prompt runs beside decode rows, small KV blocks so the slots'
 *    blocks interleave in the pool) give each slot the tokens it gets alone;
 *  - ranks = 2 gives the tokens of ranks = 1;
 *  - a sampled row returns its logprobs (greedy and drawn), equal to the log-softmax of the
 *    row's logits;
 *  - a step the pool cannot hold fails with STATUS_EXHAUSTED and changes nothing (positions,
 *    blocks, the next tokens); seq_end gives every block back; bad rows are refused by name;
 *  - fill() then decode works; nothing is allocated per step (malloc, calloc and realloc
 *    wrapped). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward_test_util.h"
#include "model/forward.h"
#include "model/fwd.h"
#include "tests/testutil/alloc_count.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

#define STEPS 24
#define MAX_SEQ 3

static ref_case case_list[REF_CASES_MAX];
static int N_CASES;
static qwen35_model *models[REF_CASES_MAX];
static ref_prompt *prompts[REF_CASES_MAX];
static int n_prompts[REF_CASES_MAX];

static const sampling_params GREEDY = {.top_p = 1, .repetition_penalty = 1}; /* resolved */

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
        if (qwen35_model_load(&models[c], path, &st)) {
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
        forward_test_free_prompts(prompts[c], n_prompts[c]);
        qwen35_model_free(models[c]);
    }
    return 0;
}

static fwd *make(const qwen35_model *m, fwd_opts o)
{
    if (!o.n_threads) o.n_threads = 2;
    fwd *f = NULL;
    status st;
    if (fwd_create("cpu", m, &o, &f, &st)) fprintf(stderr, "fwd_create: %s\n", st.msg);
    return f;
}

/* ---- sequences driven through fwd_step ---- */

/* What one slot feeds: its prompt, then its own sampled tokens. */
typedef struct seq {
    int slot;
    const int32_t *prompt;
    int n_prompt, fed;  /* prompt tokens fed so far */
    int32_t out[STEPS];
    int n_out;
} seq;

/* Rows of s for the next step, at most chunk prompt tokens (0: the whole rest); returns the
 * count. The last prompt row, and every decode row, samples. */
static int seq_rows(fwd *f, seq *s, int chunk, fwd_row *rows)
{
    int n = 0;
    const int pos = fwd_n_past(f, s->slot);
    if (s->fed < s->n_prompt) {
        int left = s->n_prompt - s->fed;
        if (chunk && left > chunk) left = chunk;
        for (int k = 0; k < left; k++)
            rows[n++] = (fwd_row){.token = s->prompt[s->fed + k], .slot = s->slot, .pos = pos + k,
                                  .prompt = true, .sample = s->fed + k == s->n_prompt - 1};
        return n;
    }
    rows[0] = (fwd_row){.token = s->out[s->n_out - 1], .slot = s->slot, .pos = pos, .sample = true};
    return 1;
}

/* After a step: the prompt tokens fed, the sampled ones kept. */
static void seq_took(seq *s, const fwd_row *rows, int n)
{
    for (int i = 0; i < n; i++) {
        if (rows[i].prompt) s->fed++;
        if (rows[i].sample && s->n_out < STEPS) s->out[s->n_out++] = rows[i].out.token;
    }
}

/* Runs the sequences together: every step, every unfinished one's rows (prompt chunks of at
 * most chunk tokens; start[i] delays sequence i by that many steps). */
static int run_together(fwd *f, seq *ss, int n_seq, int chunk, const int *start, status *st)
{
    fwd_row rows[512];
    for (int step = 0;; step++) {
        int n = 0, lens[MAX_SEQ] = {0};
        for (int i = 0; i < n_seq; i++) {
            if (ss[i].n_out == STEPS || (start && step < start[i])) continue;
            lens[i] = seq_rows(f, &ss[i], chunk, rows + n);
            n += lens[i];
        }
        if (!n) {
            bool done = true;
            for (int i = 0; i < n_seq; i++) done &= ss[i].n_out == STEPS;
            if (done) return STATUS_OK;
            continue;
        }
        if (fwd_step(f, rows, n, st)) return st->code;
        for (int i = 0, at = 0; i < n_seq; i++) {
            seq_took(&ss[i], rows + at, lens[i]);
            at += lens[i];
        }
    }
}

static seq seq_of(int slot, const ref_prompt *p)
{
    return (seq){.slot = slot, .prompt = p->ids, .n_prompt = p->n_ids};
}

/* The reference: prefill, then argmax and decode, STEPS tokens. */
static void reference_greedy(const qwen35_model *m, const ref_prompt *p, int32_t *out)
{
    const int V = m->cfg.V;
    qwen35_ctx *ctx;
    qwen35_state *s;
    status st;
    float *lg = malloc(sizeof(float) * V);
    CU_ASSERT_FATAL(qwen35_ctx_create(m, &(qwen35_ctx_opts){.max_batch = 1, .n_threads = 2}, &ctx, &st) == 0);
    CU_ASSERT_FATAL(qwen35_state_create(m, p->n_ids + STEPS + 1, &s, &st) == 0);
    CU_ASSERT_EQUAL(qwen35_prefill(ctx, s, p->ids, p->n_ids, lg, false, &st), 0);
    for (int g = 0; g < STEPS; g++) {
        out[g] = forward_test_argmax(lg, V);
        CU_ASSERT_EQUAL(qwen35_decode_batch(ctx, &s, &out[g], 1, lg, &st), 0);
    }
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    free(lg);
}

static int same_prefix(const int32_t *a, const int32_t *b, int n)
{
    int k = 0;
    while (k < n && a[k] == b[k]) k++;
    return k;
}

/* ---- (a) one sequence: the reference's tokens and logits ---- */

static void test_greedy_is_reference(void)
{
    for (int c = 0; c < N_CASES; c++)
        for (int i = 0; i < n_prompts[c]; i++) {
            const ref_prompt *p = &prompts[c][i];
            int32_t want[STEPS];
            reference_greedy(models[c], p, want);
            fwd *f = make(models[c], (fwd_opts){.n_slots = 1, .n_ctx = p->n_ids + STEPS + 1,
                                                .max_rows = 512});
            CU_ASSERT_FATAL(f != NULL);
            status st;
            seq s = seq_of(0, p);
            CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &GREEDY, &st), 0);
            CU_ASSERT_EQUAL(run_together(f, &s, 1, 0, NULL, &st), 0);
            const int same = same_prefix(s.out, want, STEPS);
            if (same != STEPS)
                fprintf(stderr, "%s prompt %d: fwd greedy differs from the reference at %d\n",
                        case_list[c].name, i, same);
            CU_ASSERT_EQUAL(same, STEPS);
            CU_ASSERT_EQUAL(fwd_n_past(f, 0), p->n_ids + STEPS - 1);
            fwd_destroy(f);
        }
}

/* Teacher-forced logits of every row, prompt in one step then one row a step, against the
 * reference's, bit for bit (the same passes: the same arithmetic). */
static void test_logits_are_reference(void)
{
    for (int c = 0; c < N_CASES; c++) {
        const ref_prompt *p = &prompts[c][0];
        const int T = p->rows, V = p->V;
        int32_t *ids = forward_test_full_ids(p);
        float *a = malloc(sizeof(float) * T * V), *b = malloc(sizeof(float) * T * V);
        qwen35_ctx *ctx;
        qwen35_state *s;
        status st;
        /* the fwd CPU forward runs the delta rule token by token (split invariance) */
        CU_ASSERT_FATAL(qwen35_ctx_create(models[c], &(qwen35_ctx_opts){.max_batch = 1, .n_threads = 2,
                                                                        .gdn_mode = QWEN35_GDN_RECURRENT},
                                          &ctx, &st) == 0);
        CU_ASSERT_FATAL(qwen35_state_create(models[c], T + 1, &s, &st) == 0);
        CU_ASSERT_EQUAL(qwen35_prefill(ctx, s, ids, p->n_ids, a, true, &st), 0);
        for (int t = p->n_ids; t < T; t++)
            CU_ASSERT_EQUAL(qwen35_decode_batch(ctx, &s, ids + t, 1, a + (size_t)t * V, &st), 0);
        fwd *f = make(models[c], (fwd_opts){.n_slots = 2, .n_ctx = T + 1, .max_rows = T,
                                            .kv_block_tokens = 8});
        CU_ASSERT_FATAL(f != NULL);
        fwd_row *rows = malloc(sizeof *rows * (size_t)T);
        CU_ASSERT_EQUAL(fwd_seq_start(f, 1, &GREEDY, &st), 0);
        for (int t = 0; t < p->n_ids; t++)
            rows[t] = (fwd_row){.token = ids[t], .slot = 1, .pos = t, .prompt = true,
                                .logits = b + (size_t)t * V};
        CU_ASSERT_EQUAL(fwd_step(f, rows, p->n_ids, &st), 0);
        for (int t = p->n_ids; t < T; t++) {
            rows[0] = (fwd_row){.token = ids[t], .slot = 1, .pos = t, .logits = b + (size_t)t * V};
            CU_ASSERT_EQUAL(fwd_step(f, rows, 1, &st), 0);
        }
        CU_ASSERT_EQUAL(memcmp(a, b, sizeof(float) * T * V), 0);
        free(rows);
        fwd_destroy(f);
        qwen35_state_destroy(s);
        qwen35_ctx_destroy(ctx);
        free(a), free(b), free(ids);
    }
}

/* ---- (b) several slots in one step ---- */

static void check_together(int c, int ranks)
{
    const qwen35_model *m = models[c];
    const int n_seq = n_prompts[c] < MAX_SEQ ? n_prompts[c] : MAX_SEQ;
    int32_t alone[MAX_SEQ][STEPS];
    status st;
    for (int i = 0; i < n_seq; i++) { /* each alone, one rank, default blocks */
        const ref_prompt *p = &prompts[c][i];
        fwd *f = make(m, (fwd_opts){.n_slots = 1, .n_ctx = p->n_ids + STEPS + 1, .max_rows = 512});
        CU_ASSERT_FATAL(f != NULL);
        seq s = seq_of(0, p);
        CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &GREEDY, &st), 0);
        CU_ASSERT_EQUAL(run_together(f, &s, 1, 0, NULL, &st), 0);
        memcpy(alone[i], s.out, sizeof s.out);
        fwd_destroy(f);
    }
    /* together: slots in reverse order, prompts in chunks of 5 tokens beside the others'
     * decode rows, later sequences starting later, KV blocks of 4 positions */
    fwd *f = make(m, (fwd_opts){.n_slots = 4, .n_ctx = 512, .kv_block_tokens = 4, .ranks = ranks});
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_EQUAL(f->ranks, ranks);
    seq ss[MAX_SEQ];
    const int start[MAX_SEQ] = {0, 2, 3};
    for (int i = 0; i < n_seq; i++) {
        ss[i] = seq_of(3 - i, &prompts[c][i]);
        CU_ASSERT_EQUAL(fwd_seq_start(f, ss[i].slot, &GREEDY, &st), 0);
    }
    CU_ASSERT_EQUAL(run_together(f, ss, n_seq, 5, start, &st), 0);
    for (int i = 0; i < n_seq; i++) {
        const int same = same_prefix(ss[i].out, alone[i], STEPS);
        if (same != STEPS)
            fprintf(stderr, "%s ranks %d: sequence %d together differs from alone at %d\n",
                    case_list[c].name, ranks, i, same);
        CU_ASSERT_EQUAL(same, STEPS);
        /* the slot holds the blocks of its positions */
        CU_ASSERT_EQUAL(kv_pool_held(f->kv, ss[i].slot),
                        (int)kv_pool_blocks_for(f->kv, fwd_n_past(f, ss[i].slot) + 0));
    }
    fwd_destroy(f);
}

static void test_slots_together(void)
{
    for (int c = 0; c < N_CASES; c++) check_together(c, 1);
}

/* ---- (c) ranks = 2 is ranks = 1 ---- */

static void test_two_ranks(void)
{
    int ran = 0;
    for (int c = 0; c < N_CASES; c++) {
        fwd *f = NULL;
        status st;
        const int rc = fwd_create("cpu", models[c], &(fwd_opts){.n_ctx = 16, .ranks = 2, .n_threads = 2}, &f, &st);
        if (rc) { /* the heads do not split: said so */
            CU_ASSERT_EQUAL(rc, STATUS_UNSUPPORTED);
            printf("\n    %s ranks 2: %s", case_list[c].name, st.msg);
            continue;
        }
        CU_ASSERT_PTR_NOT_NULL(strstr(f->device, "2 simulated ranks"));
        fwd_destroy(f);
        check_together(c, 2);
        ran++;
    }
    CU_ASSERT(ran >= 1);
}

/* ---- (d) logprobs ---- */

static double log_softmax_at(const float *z, int V, int id)
{
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = z[i] > mx ? z[i] : mx;
    for (int i = 0; i < V; i++) sum += exp((double)z[i] - mx);
    return (double)z[id] - mx - log(sum);
}

static void test_logprobs(void)
{
    const qwen35_model *m = models[0];
    const ref_prompt *p = &prompts[0][0];
    const int V = m->cfg.V;
    float *lg = malloc(sizeof(float) * V);
    status st;
    fwd *f = make(m, (fwd_opts){.n_slots = 2, .n_ctx = p->n_ids + 8});
    CU_ASSERT_FATAL(f != NULL);
    const sampling_params lp_greedy = {.top_p = 1, .repetition_penalty = 1, .n_logprobs = 5};
    const sampling_params lp_drawn = {.temperature = 0.8f, .top_p = 1, .repetition_penalty = 1,
                                      .seed = 7, .n_logprobs = 3};
    const sampling_params *ps[2] = {&lp_greedy, &lp_drawn};
    for (int k = 0; k < 2; k++) {
        CU_ASSERT_EQUAL(fwd_seq_start(f, k, ps[k], &st), 0);
        fwd_row rows[256];
        for (int t = 0; t < p->n_ids; t++)
            rows[t] = (fwd_row){.token = p->ids[t], .slot = k, .pos = t, .prompt = true,
                                .sample = t == p->n_ids - 1, .logits = t == p->n_ids - 1 ? lg : NULL};
        CU_ASSERT_EQUAL(fwd_step(f, rows, p->n_ids, &st), 0);
        const sample_result *o = &rows[p->n_ids - 1].out;
        CU_ASSERT_EQUAL(o->n_top, ps[k]->n_logprobs);
        CU_ASSERT(o->token >= 0 && o->token < V);
        CU_ASSERT(fabs(o->logprob - log_softmax_at(lg, V, o->token)) < 1e-4);
        CU_ASSERT_EQUAL(o->top_id[0], forward_test_argmax(lg, V));
        for (int j = 0; j < o->n_top; j++) {
            CU_ASSERT(fabs(o->top_logprob[j] - log_softmax_at(lg, V, o->top_id[j])) < 1e-4);
            if (j) CU_ASSERT(o->top_logprob[j] <= o->top_logprob[j - 1]);
        }
        if (k == 0) { /* greedy: the most likely */
            CU_ASSERT_EQUAL(o->token, o->top_id[0]);
            CU_ASSERT_EQUAL(o->logprob, o->top_logprob[0]);
        }
        printf("\n    %s: token %d logprob %.4f, top %d at %.4f", k ? "drawn" : "greedy", o->token,
               o->logprob, o->top_id[0], o->top_logprob[0]);
    }
    /* without logprobs asked: none returned */
    CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &GREEDY, &st), 0);
    fwd_row r = {.token = p->ids[0], .slot = 0, .pos = 0, .prompt = true, .sample = true};
    r.out.n_top = 99;
    CU_ASSERT_EQUAL(fwd_step(f, &r, 1, &st), 0);
    CU_ASSERT_EQUAL(r.out.n_top, 0);
    fwd_destroy(f);
    free(lg);
}

/* ---- (e), (f) the pool: exhausted, nothing changed; every block back ---- */

/* The tokens of prompt[0 .. n) alone in a fresh forward. */
static void alone(const qwen35_model *m, const int32_t *prompt, int n, int32_t *out)
{
    status st;
    fwd *f = make(m, (fwd_opts){.n_slots = 1, .n_ctx = 128});
    CU_ASSERT_FATAL(f != NULL);
    seq s = {.slot = 0, .prompt = prompt, .n_prompt = n};
    CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &GREEDY, &st), 0);
    CU_ASSERT_EQUAL(run_together(f, &s, 1, 0, NULL, &st), 0);
    memcpy(out, s.out, sizeof s.out);
    fwd_destroy(f);
}

static void test_pool(void)
{
    const qwen35_model *m = models[0];
    const ref_prompt *p = &prompts[0][0];
    const int V = m->cfg.V, bt = 4;
    status st;
    /* a pool of the blocks slot 0's whole run takes, and one more */
    fwd *f = make(m, (fwd_opts){.n_slots = 2, .n_ctx = 128, .kv_block_tokens = bt,
                                .kv_blocks = (p->n_ids + STEPS - 1 + bt - 1) / bt + 1});
    CU_ASSERT_FATAL(f != NULL);
    const uint32_t total = kv_pool_total_blocks(f->kv);
    CU_ASSERT_EQUAL(kv_pool_block_tokens(f->kv), bt);
    fwd_row rows[256];
    CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &GREEDY, &st), 0);
    CU_ASSERT_EQUAL(fwd_seq_start(f, 1, &GREEDY, &st), 0);
    seq a = seq_of(0, p);
    int n = seq_rows(f, &a, 0, rows);
    CU_ASSERT_EQUAL(fwd_step(f, rows, n, &st), 0);
    seq_took(&a, rows, n);
    /* slot 1's prompt needs one block more than are free */
    const uint32_t free_before = kv_pool_free_blocks(f->kv);
    const int L = (int)free_before * bt + 1;
    CU_ASSERT_FATAL(L + STEPS <= 128 && L <= 200);
    int32_t prompt_b[200];
    for (int i = 0; i < L; i++) prompt_b[i] = (i * 7 + 3) % V;
    seq b = {.slot = 1, .prompt = prompt_b, .n_prompt = L};
    /* slot 0 decodes beside it: the step runs nothing */
    n = seq_rows(f, &a, 0, rows);
    const int n_b = seq_rows(f, &b, 0, rows + n);
    CU_ASSERT_EQUAL(fwd_step(f, rows, n + n_b, &st), STATUS_EXHAUSTED);
    printf("\n    %s", st.msg);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), free_before);
    CU_ASSERT_EQUAL(fwd_n_past(f, 0), p->n_ids);
    CU_ASSERT_EQUAL(fwd_n_past(f, 1), 0);
    CU_ASSERT_EQUAL(kv_pool_held(f->kv, 1), 0);
    /* slot 0 goes on alone to its tokens, as if the failed step had not been */
    int32_t want[STEPS];
    alone(m, p->ids, p->n_ids, want);
    CU_ASSERT_EQUAL(run_together(f, &a, 1, 0, NULL, &st), 0);
    CU_ASSERT_EQUAL(same_prefix(a.out, want, STEPS), STEPS);
    /* slot 0 ends: every block back; slot 1's prompt now runs and samples what it does alone */
    fwd_seq_end(f, 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), total);
    CU_ASSERT_EQUAL(fwd_n_past(f, 0), 0);
    alone(m, prompt_b, L, want);
    n = seq_rows(f, &b, 0, rows);
    CU_ASSERT_EQUAL(fwd_step(f, rows, n, &st), 0);
    CU_ASSERT_EQUAL(rows[n - 1].out.token, want[0]);
    fwd_seq_end(f, 1);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), total);
    /* seq_start gives a slot's blocks back too */
    n = seq_rows(f, &(seq){.slot = 1, .prompt = p->ids, .n_prompt = 5}, 0, rows);
    CU_ASSERT_EQUAL(fwd_step(f, rows, n, &st), 0);
    CU_ASSERT(kv_pool_free_blocks(f->kv) < total);
    CU_ASSERT_EQUAL(fwd_seq_start(f, 1, &GREEDY, &st), 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), total);
    fwd_destroy(f);
}

static void test_bad_rows(void)
{
    const qwen35_model *m = models[0];
    const int V = m->cfg.V;
    status st;
    fwd *f = make(m, (fwd_opts){.n_slots = 2, .n_ctx = 4, .max_rows = 8});
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_EQUAL(f->max_rows, 8);
    CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &GREEDY, &st), 0);
    fwd_row r[9] = {{.token = 1, .slot = 0, .pos = 0}, {.token = V, .slot = 0, .pos = 1}};
    CU_ASSERT_EQUAL(fwd_step(f, r, 2, &st), STATUS_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "row 1"));
    r[1] = (fwd_row){.token = 1, .slot = 2, .pos = 0};
    CU_ASSERT_EQUAL(fwd_step(f, r, 2, &st), STATUS_RANGE);
    r[1] = (fwd_row){.token = 1, .slot = 0, .pos = 2}; /* a gap */
    CU_ASSERT_EQUAL(fwd_step(f, r, 2, &st), STATUS_RANGE);
    r[1] = (fwd_row){.token = 1, .slot = 1, .pos = 0};
    r[2] = (fwd_row){.token = 1, .slot = 0, .pos = 1}; /* slot 0 in two runs */
    CU_ASSERT_EQUAL(fwd_step(f, r, 3, &st), STATUS_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "not consecutive"));
    CU_ASSERT_EQUAL(fwd_step(f, r, 0, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(fwd_step(f, r, 9, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(fwd_n_past(f, 0), 0);
    for (int i = 0; i < 5; i++) r[i] = (fwd_row){.token = 1, .slot = 0, .pos = i};
    CU_ASSERT_EQUAL(fwd_step(f, r, 5, &st), STATUS_RANGE); /* past the context of 4 */
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "full"));
    CU_ASSERT_EQUAL(fwd_step(f, r, 4, &st), 0);
    CU_ASSERT_EQUAL(fwd_n_past(f, 0), 4);
    CU_ASSERT_EQUAL(fwd_seq_start(f, 2, &GREEDY, &st), STATUS_RANGE);
    fwd_destroy(f);
    /* options */
    CU_ASSERT_EQUAL(fwd_create("cpu", m, &(fwd_opts){.n_ctx = 0}, &f, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_EQUAL(fwd_create("cpu", m, &(fwd_opts){.n_ctx = 8, .ranks = FWD_MAX_RANKS + 1}, &f, &st),
                    STATUS_INVALID);
    CU_ASSERT_EQUAL(fwd_create("nosuch", m, &(fwd_opts){.n_ctx = 8}, &f, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "nosuch"));
    CU_ASSERT_PTR_NULL(fwd_backend_find("cuda")); /* this test links the CPU registry */
    CU_ASSERT_PTR_NOT_NULL(fwd_backend_find("cpu"));
}

/* fill: the slot continues at n_past with blocks for its positions; then it decodes. */
static void test_fill(void)
{
    const qwen35_model *m = models[0];
    status st;
    fwd *f = make(m, (fwd_opts){.n_slots = 2, .n_ctx = 300, .kv_block_tokens = 16});
    CU_ASSERT_FATAL(f != NULL);
    const uint32_t total = kv_pool_total_blocks(f->kv);
    CU_ASSERT_EQUAL(total, 2 * 19);
    CU_ASSERT_EQUAL(fwd_seq_start(f, 1, &GREEDY, &st), 0);
    CU_ASSERT_EQUAL(fwd_fill(f, 1, 200, &st), 0);
    CU_ASSERT_EQUAL(fwd_n_past(f, 1), 200);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), total - 13);
    fwd_row r = {.token = 3, .slot = 1, .pos = 200, .sample = true};
    for (int i = 0; i < 20; i++) {
        CU_ASSERT_EQUAL(fwd_step(f, &r, 1, &st), 0);
        r = (fwd_row){.token = r.out.token, .slot = 1, .pos = r.pos + 1, .sample = true};
    }
    CU_ASSERT_EQUAL(fwd_n_past(f, 1), 220);
    CU_ASSERT_EQUAL(fwd_fill(f, 1, 300, &st), STATUS_RANGE);
    fwd_stats s;
    fwd_get_stats(f, &s);
    CU_ASSERT_EQUAL(s.tokens, 20);
    CU_ASSERT_EQUAL(s.steps, 20);
    CU_ASSERT(s.state_bytes >= 2 * f->state_bytes);
    fwd_seq_end(f, 1);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), total);
    fwd_destroy(f);
}

/* ---- no allocation per step ---- */

static void test_no_alloc_per_step(void)
{
    int c = ref_cases_find(case_list, N_CASES, "own-r2-tied");
    if (c < 0) c = 0;
    const qwen35_model *m = models[c];
    const int V = m->cfg.V;
    for (int ranks = 1; ranks <= 2; ranks++) {
        status st;
        fwd *f = NULL;
        if (fwd_create("cpu", m, &(fwd_opts){.n_slots = 3, .n_ctx = 256, .max_rows = 64, .ranks = ranks,
                                             .kv_block_tokens = 16, .n_threads = 2}, &f, &st)) {
            fprintf(stderr, "%s\n", st.msg);
            CU_FAIL("fwd_create");
            continue;
        }
        float *lg = malloc(sizeof(float) * 64 * V);
        fwd_row rows[64];
        const sampling_params lp = {.temperature = 0.7f, .top_p = 0.9f, .top_k = 20,
                                    .repetition_penalty = 1.1f, .penalize_prompt = true,
                                    .n_logprobs = 4};
        const long before = testutil_allocs();
        for (int s = 0; s < 3; s++) CU_ASSERT_EQUAL(fwd_seq_start(f, s, s ? &lp : &GREEDY, &st), 0);
        for (int t = 0; t < 60; t++) /* a prompt of 60 rows with every logits row asked */
            rows[t] = (fwd_row){.token = (t * 37) % V, .slot = 0, .pos = t, .prompt = true,
                                .logits = lg + (size_t)t * V, .sample = t == 59};
        CU_ASSERT_EQUAL(fwd_step(f, rows, 60, &st), 0);
        for (int step = 0; step < 20; step++) { /* 3 decode rows, or a decode row and 2 prompt runs */
            int n = 0;
            for (int s = 0; s < 3; s++) {
                const int len = step < 2 && s ? 7 : 1;
                for (int k = 0; k < len; k++)
                    rows[n++] = (fwd_row){.token = (step * 11 + s * 5 + k) % V, .slot = s,
                                          .pos = fwd_n_past(f, s) + k, .prompt = len > 1,
                                          .sample = k == len - 1};
            }
            CU_ASSERT_EQUAL(fwd_step(f, rows, n, &st), 0);
        }
        for (int s = 0; s < 3; s++) fwd_seq_end(f, s);
        const long during = testutil_allocs() - before;
        printf("\n    ranks %d: allocations during 60 prompt rows and 20 steps of 3 slots: %ld",
               ranks, during);
        CU_ASSERT_EQUAL(during, 0);
        CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), kv_pool_total_blocks(f->kv));
        fwd_destroy(f);
        free(lg);
    }
    CU_ASSERT(testutil_allocs() > 0); /* the counter counts (create allocated) */
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("fwd_cpu", setup, teardown);
    CU_add_test(s, "greedy_is_reference", test_greedy_is_reference);
    CU_add_test(s, "logits_are_reference", test_logits_are_reference);
    CU_add_test(s, "slots_together", test_slots_together);
    CU_add_test(s, "two_ranks", test_two_ranks);
    CU_add_test(s, "logprobs", test_logprobs);
    CU_add_test(s, "pool", test_pool);
    CU_add_test(s, "bad_rows", test_bad_rows);
    CU_add_test(s, "fill", test_fill);
    CU_add_test(s, "no_alloc_per_step", test_no_alloc_per_step);
    return testutil_cunit_run();
}
