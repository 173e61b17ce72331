/* Speculative decoding in the engine (worker/spec.h, engine.c) on a synthetic tiny model with an
 * MTP head (gguf synth --mtp; F32 and Q8_0), the CPU forward:
 *  - greedy tokens with speculation on (k = 1 and 4, three requests at once) equal those with
 *    it off, and verify runs happened (engine_load.spec_*);
 *  - a request with no_speculation, and a sampled one with a penalty, run no verify run;
 *  - sampled requests (no penalties) speculate by the speculative sampling rule: a seed gives
 *    the same tokens run to run, and over many seeds the second generated token (the first a
 *    verify row chooses) is distributed as without speculation (a two-sample chi-square). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gguf/synth.h"
#include "model/qwen35.h"
#include "tests/testutil/testutil.h"
#include "worker/backend.h"
#include "tests/testutil/engine_collector.h"
#include "worker/engine.h"

#define N_REQ 3
#define N_NEW 40

static const int32_t PROMPTS[N_REQ][6] = {{1, 5, 9, 2, 7, 3}, {4, 4, 8, 1, 0, 6}, {11, 3, 2, 9, 5, 1}};

/* The model at path on a 4-slot CPU backend and an engine speculating k drafts (0: off). */
static void open_engine(const char *path, int k, qwen35_model **m, worker_backend **b, engine **e)
{
    status st;
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(m, path, &st), STATUS_OK);
    const worker_backend_opts bo = {.n_slots = 4, .n_ctx = 128, .n_threads = 2,
                                    .max_prefill_tokens = 64, .verify_rows = k ? k + 1 : 0};
    CU_ASSERT_EQUAL_FATAL(worker_backend_create("cpu", *m, &bo, b, &st), STATUS_OK);
    const engine_opts eo = {.queue = 8, .step_tokens = 64, .spec_k = k, .spec_threads = 2};
    CU_ASSERT_EQUAL_FATAL(engine_create(*b, &eo, e, &st), STATUS_OK);
}

/* Runs the three greedy requests (and, spec on, the two that must not speculate) on model path
 * with speculation k (0: off); tokens out [N_REQ][N_NEW]. */
static void run(const char *path, int k, int32_t out[N_REQ][N_NEW], engine_load *load)
{
    qwen35_model *m = NULL;
    worker_backend *b = NULL;
    engine *e = NULL;
    status st;
    open_engine(path, k, &m, &b, &e);
    CU_ASSERT_FATAL(m->mtp.present);
    engine_collector c[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        engine_collector_init(&c[i], out[i], N_NEW);
        engine_params p = {.prompt = PROMPTS[i], .n_prompt = 6, .max_new_tokens = N_NEW,
                           .sampling = sampling_params_resolve(&(sampling_params){0}),
                           .ignore_eos = true};
        snprintf(p.id, sizeof p.id, "greedy-%d", i);
        CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &engine_collector_sink, &c[i], &st),
                              STATUS_OK);
    }
    for (int i = 0; i < N_REQ; i++) {
        engine_collector_wait(&c[i]);
        CU_ASSERT_EQUAL(c[i].n, N_NEW);
        engine_collector_destroy(&c[i]);
    }
    engine_get_load(e, load);
    if (k) { /* neither of these speculates */
        engine_params p = {.prompt = PROMPTS[0], .n_prompt = 6, .max_new_tokens = 8,
                           .sampling = sampling_params_resolve(&(sampling_params){0}),
                           .ignore_eos = true, .no_speculation = true};
        snprintf(p.id, sizeof p.id, "off");
        int32_t d_tok[N_NEW];
        engine_collector d;
        engine_collector_init(&d, d_tok, N_NEW);
        CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &engine_collector_sink, &d, &st), STATUS_OK);
        engine_collector_wait(&d);
        CU_ASSERT(memcmp(d.tokens, out[0], 8 * sizeof(int32_t)) == 0);
        p.no_speculation = false;
        p.sampling = sampling_params_resolve(&(sampling_params){.temperature = 0.8f, .seed = 3,
                                                                .repetition_penalty = 1.1f});
        engine_collector_reset(&d);
        CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &engine_collector_sink, &d, &st), STATUS_OK);
        engine_collector_wait(&d);
        CU_ASSERT_EQUAL(d.n, 8);
        engine_load l2;
        engine_get_load(e, &l2);
        CU_ASSERT_EQUAL(l2.spec_steps, load->spec_steps);
    }
    engine_destroy(e);
    worker_backend_destroy(b);
    qwen35_model_free(m);
}

static void check(synth_quant q, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/engine_spec_%d_%s.gguf", testutil_tmp_dir(), (int)getpid(), name);
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = q, .seed = 7, .mtp = true,
                       .n_threads = 2};
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_write(path, &o, NULL, &st), STATUS_OK);
    int32_t off[N_REQ][N_NEW], on[N_REQ][N_NEW];
    engine_load l;
    run(path, 0, off, &l);
    CU_ASSERT_FALSE(l.speculative);
    CU_ASSERT_EQUAL(l.spec_steps, 0);
    for (int k = 1; k <= 4; k += 3) {
        run(path, k, on, &l);
        CU_ASSERT(l.speculative);
        CU_ASSERT(l.spec_steps > 0);
        CU_ASSERT(l.spec_drafted <= l.spec_steps * (uint64_t)k);
        CU_ASSERT(l.spec_accepted <= l.spec_drafted);
        printf("\n    %s k=%d: %llu verify runs, %llu drafted, %llu accepted", name, k,
               (unsigned long long)l.spec_steps, (unsigned long long)l.spec_drafted,
               (unsigned long long)l.spec_accepted);
        CU_ASSERT(memcmp(off, on, sizeof off) == 0);
    }
    unlink(path);
}

/* ---- sampled requests ---- */

#define N_SEEDS 1500
#define SAMPLED_NEW 3

typedef struct sampled_run {
    engine_collector c[N_SEEDS];
    int32_t tokens[N_SEEDS][N_NEW];
    engine_load load;
} sampled_run;

/* N_SEEDS sampled requests (seeds 1..) of SAMPLED_NEW tokens on model path with speculation k
 * (0: off), 4 at a time; their tokens in run->tokens. */
static void run_sampled(const char *path, int k, const sampling_params *sp, int n_new,
                        sampled_run *run, int n_seeds)
{
    qwen35_model *m = NULL;
    worker_backend *b = NULL;
    engine *e = NULL;
    status st;
    open_engine(path, k, &m, &b, &e);
    for (int i0 = 0; i0 < n_seeds; i0 += 4) {
        const int n = n_seeds - i0 < 4 ? n_seeds - i0 : 4;
        for (int i = i0; i < i0 + n; i++) {
            engine_collector *c = &run->c[i];
            engine_collector_init(c, run->tokens[i], N_NEW);
            sampling_params s = *sp;
            s.seed = 1 + (uint64_t)i;
            engine_params p = {.prompt = PROMPTS[1], .n_prompt = 6, .max_new_tokens = n_new,
                               .sampling = sampling_params_resolve(&s), .ignore_eos = true};
            snprintf(p.id, sizeof p.id, "sampled-%d", i);
            CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &engine_collector_sink, c, &st),
                                  STATUS_OK);
        }
        for (int i = i0; i < i0 + n; i++) {
            engine_collector_wait(&run->c[i]);
            CU_ASSERT_EQUAL(run->c[i].n, n_new);
            engine_collector_destroy(&run->c[i]);
        }
    }
    engine_get_load(e, &run->load);
    engine_destroy(e);
    worker_backend_destroy(b);
    qwen35_model_free(m);
}

/* Pearson's two-sample (homogeneity) statistic of tokens a and b (ids < V), over the cells
 * where the two together have at least 10, the rest pooled in one; *df its degrees of freedom. */
static double chi2_two_sample(const int32_t *a, const int32_t *b, int n, int V, int *df)
{
    int ca[V + 1], cb[V + 1];
    memset(ca, 0, sizeof ca);
    memset(cb, 0, sizeof cb);
    for (int i = 0; i < n; i++) ca[a[i]]++, cb[b[i]]++;
    for (int t = 0; t < V; t++)
        if (ca[t] + cb[t] < 10) ca[V] += ca[t], cb[V] += cb[t], ca[t] = cb[t] = 0;
    double x = 0;
    int cells = 0;
    for (int t = 0; t <= V; t++) {
        const int s = ca[t] + cb[t];
        if (!s) continue;
        cells++;
        const double e = s / 2.0; /* equal sample sizes */
        x += (ca[t] - e) * (ca[t] - e) / e + (cb[t] - e) * (cb[t] - e) / e;
    }
    *df = cells - 1;
    return x;
}

static void test_sampled(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/engine_spec_%d_sampled.gguf", testutil_tmp_dir(), (int)getpid());
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = SYNTH_QUANT_F32, .seed = 7,
                       .mtp = true, .n_threads = 2};
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_write(path, &o, NULL, &st), STATUS_OK);
    static sampled_run on, on2, off;
    /* reproducible: 8 seeds of N_NEW tokens, twice */
    const sampling_params wide = {.temperature = 1.0f};
    run_sampled(path, 2, &wide, N_NEW, &on, 8);
    run_sampled(path, 2, &wide, N_NEW, &on2, 8);
    CU_ASSERT(on.load.spec_steps > 0);
    CU_ASSERT_EQUAL(on.load.spec_steps, on2.load.spec_steps);
    CU_ASSERT_EQUAL(on.load.spec_accepted, on2.load.spec_accepted);
    for (int i = 0; i < 8; i++)
        CU_ASSERT(memcmp(on.tokens[i], on2.tokens[i], sizeof on.tokens[i]) == 0);
    printf("\n    sampled k=2: %llu verify runs, %llu drafted, %llu accepted",
           (unsigned long long)on.load.spec_steps, (unsigned long long)on.load.spec_drafted,
           (unsigned long long)on.load.spec_accepted);
    /* the distribution of the second token over N_SEEDS seeds, with and without speculation */
    const sampling_params narrow = {.temperature = 1.5f, .top_k = 6};
    run_sampled(path, 2, &narrow, SAMPLED_NEW, &on, N_SEEDS);
    run_sampled(path, 0, &narrow, SAMPLED_NEW, &off, N_SEEDS);
    CU_ASSERT(on.load.spec_steps >= N_SEEDS); /* every request's second token was verified */
    CU_ASSERT_EQUAL(off.load.spec_steps, 0);
    static int32_t a[N_SEEDS], b[N_SEEDS];
    int same = 0;
    for (int i = 0; i < N_SEEDS; i++) {
        a[i] = on.tokens[i][1];
        b[i] = off.tokens[i][1];
        same += a[i] == b[i];
    }
    int df;
    const double x = chi2_two_sample(a, b, N_SEEDS, 2048, &df);
    /* Wilson-Hilferty: the chi-square quantile at p ~ 1e-6 (z = 4.75) for df */
    const double w = 2.0 / (9.0 * df), crit = df * pow(1 - w + 4.75 * sqrt(w), 3);
    printf("\n    second token over %d seeds: chi2 %.1f, df %d (limit %.1f); %llu of %llu drafts "
           "accepted; %d seeds gave the same token both ways", N_SEEDS, x, df, crit,
           (unsigned long long)on.load.spec_accepted, (unsigned long long)on.load.spec_drafted,
           same);
    CU_ASSERT(df >= 3);
    CU_ASSERT(x < crit);
    unlink(path);
}

static void test_f32(void) { check(SYNTH_QUANT_F32, "f32"); }
static void test_q8(void) { check(SYNTH_QUANT_Q8_0, "q8_0"); }

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("engine_spec", NULL, NULL);
    CU_add_test(s, "greedy_same_with_speculation_f32", test_f32);
    CU_add_test(s, "greedy_same_with_speculation_q8_0", test_q8);
    CU_add_test(s, "sampled_speculation_exact_and_reproducible", test_sampled);
    return testutil_cunit_run();
}
