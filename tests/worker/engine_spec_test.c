/* Speculative decoding in the engine (worker/spec.h, engine.c) on a synthetic tiny model with an
 * MTP head (gguf synth --mtp; F32 and Q8_0), the CPU forward:
 *  - greedy tokens with speculation on (k = 1 and 4, three requests at once) equal those with
 *    it off, and verify runs happened (engine_load.spec_*);
 *  - a request with no_speculation, and a sampled one with a penalty, run no verify run;
 *  - sampled requests (no penalties) speculate, each verify row drawing as a one-row step would:
 *    seed for seed, the tokens of speculation off;
 *  - the rolling acceptance rule (engine_opts.spec_min_accept): the mean's arithmetic
 *    (spec_accept_mean: the first run sets it, each later one weighs 1/8); at 0.99 each of three
 *    greedy requests makes exactly SPEC_ACCEPT_MIN_RUNS verify runs, then decodes plainly to its
 *    end with the tokens of speculation off, each counted once in engine_load.spec_switched_off
 *    and deltaserve:spec_switched_off_total; at 0 (the rule off) they speculate to the end;
 *    a value outside 0..1 (or NaN) is refused at engine_create;
 *  - the crowd rule (SPEC_CROWDED_STEPS): three requests decoding together with spec_max_batch
 *    2 are switched off for good after that many steps, their tokens unchanged;
 *  - the gate (engine_opts.spec_gate, spec_gate_*): its rule on given step times (both sides
 *    measured first, then the cheaper, the other every SPEC_GATE_PROBE-th step, per number of
 *    sequences, following a change), and in the engine on this model, whose head accepts nothing
 *    (a verify step costs more and gives one token): a greedy request speculates on a few steps
 *    only, its tokens those of speculation off. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/metrics.h"
#include "gguf/synth.h"
#include "model/qwen35.h"
#include "tests/testutil/testutil.h"
#include "worker/backend.h"
#include "tests/testutil/engine_collector.h"
#include "worker/engine.h"
#include "worker/spec.h"

#define N_REQ 3
#define N_NEW 40

static const int32_t PROMPTS[N_REQ][6] = {{1, 5, 9, 2, 7, 3}, {4, 4, 8, 1, 0, 6}, {11, 3, 2, 9, 5, 1}};

static bool g_gate; /* open_engine's engines with the gate on */

/* The model at path on a 4-slot CPU backend and an engine speculating k drafts (0: off). */
static void open_engine(const char *path, int k, qwen35_model **m, worker_backend **b, engine **e)
{
    status st;
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(m, path, &st), STATUS_OK);
    const worker_backend_opts bo = {.n_slots = 4, .n_ctx = 128, .n_threads = 2,
                                    .max_prefill_tokens = 64, .verify_rows = k ? k + 1 : 0};
    CU_ASSERT_EQUAL_FATAL(worker_backend_create("cpu", *m, &bo, b, &st), STATUS_OK);
    const engine_opts eo = {.queue = 8, .step_tokens = 64, .spec_k = k, .spec_threads = 2,
                            .spec_gate = g_gate};
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

#define N_SEEDS 48

typedef struct sampled_run {
    engine_collector c[N_SEEDS];
    int32_t tokens[N_SEEDS][N_NEW];
    engine_load load;
} sampled_run;

/* N_SEEDS sampled requests (seeds 1..) of N_NEW tokens on model path with speculation k (0:
 * off), 4 at a time; their tokens in run->tokens. */
static void run_sampled(const char *path, int k, const sampling_params *sp, sampled_run *run)
{
    qwen35_model *m = NULL;
    worker_backend *b = NULL;
    engine *e = NULL;
    status st;
    open_engine(path, k, &m, &b, &e);
    for (int i0 = 0; i0 < N_SEEDS; i0 += 4) {
        for (int i = i0; i < i0 + 4; i++) {
            engine_collector *c = &run->c[i];
            engine_collector_init(c, run->tokens[i], N_NEW);
            sampling_params s = *sp;
            s.seed = 1 + (uint64_t)i;
            engine_params p = {.prompt = PROMPTS[1], .n_prompt = 6, .max_new_tokens = N_NEW,
                               .sampling = sampling_params_resolve(&s), .ignore_eos = true};
            snprintf(p.id, sizeof p.id, "sampled-%d", i);
            CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &engine_collector_sink, c, &st),
                                  STATUS_OK);
        }
        for (int i = i0; i < i0 + 4; i++) {
            engine_collector_wait(&run->c[i]);
            CU_ASSERT_EQUAL(run->c[i].n, N_NEW);
            engine_collector_destroy(&run->c[i]);
        }
    }
    engine_get_load(e, &run->load);
    engine_destroy(e);
    worker_backend_destroy(b);
    qwen35_model_free(m);
}

/* Sampled requests speculate (the head's argmax drafts, each verify row drawing as a one-row
 * step would) and their tokens are those of speculation off, seed for seed, at two settings.
 * (This head accepts nothing: tests/models:demo_eval_test has sampled runs that keep drafts.) */
static void test_sampled(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/engine_spec_%d_sampled.gguf", testutil_tmp_dir(), (int)getpid());
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = SYNTH_QUANT_F32, .seed = 7,
                       .mtp = true, .n_threads = 2};
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_write(path, &o, NULL, &st), STATUS_OK);
    static sampled_run on, off;
    const sampling_params params[2] = {{.temperature = 1.0f}, {.temperature = 0.7f, .top_k = 2}};
    for (int j = 0; j < 2; j++) {
        run_sampled(path, 0, &params[j], &off);
        run_sampled(path, 2, &params[j], &on);
        CU_ASSERT_EQUAL(off.load.spec_steps, 0);
        CU_ASSERT(on.load.spec_steps > 0);
        CU_ASSERT(on.load.spec_accepted <= on.load.spec_drafted);
        int same = 0;
        for (int i = 0; i < N_SEEDS; i++)
            same += memcmp(on.tokens[i], off.tokens[i], sizeof on.tokens[i]) == 0;
        printf("\n    sampled k=2, temperature %.1f top-k %d: %llu verify runs, %llu drafted, "
               "%llu accepted; %d of %d seeds gave the tokens of speculation off",
               (double)params[j].temperature, params[j].top_k,
               (unsigned long long)on.load.spec_steps, (unsigned long long)on.load.spec_drafted,
               (unsigned long long)on.load.spec_accepted, same, N_SEEDS);
        CU_ASSERT_EQUAL(same, N_SEEDS);
    }
    unlink(path);
}

/* ---- the rolling acceptance rule ---- */

static void test_accept_mean(void)
{
    CU_ASSERT_DOUBLE_EQUAL(spec_accept_mean(0.9, 1, 4, 1), 0.25, 1e-12); /* the first run sets it */
    CU_ASSERT_DOUBLE_EQUAL(spec_accept_mean(0.5, 2, 2, 2), 0.5 + 0.5 / 8, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(spec_accept_mean(0.5, 9, 3, 0), 0.5 * 7 / 8, 1e-12);
    double m = 0;
    int n = 0;
    m = spec_accept_mean(m, ++n, 2, 2);
    for (int i = 0; i < 7; i++) m = spec_accept_mean(m, ++n, 2, 0);
    CU_ASSERT_DOUBLE_EQUAL(m, pow(7.0 / 8, 7), 1e-12);
}

/* What a request's on_finish saw, besides its tokens (the collector is the sink's arg too). */
typedef struct fin_collector {
    engine_collector c; /* first: engine_collector_sink's calls take the same arg */
    int spec_steps, spec_drafted, spec_accepted;
    bool switched_off;
    double accept;
} fin_collector;

static void fin_on_finish(void *arg, const engine_request *r)
{
    fin_collector *f = arg;
    f->spec_steps = r->spec_steps;
    f->spec_drafted = r->spec_drafted;
    f->spec_accepted = r->spec_accepted;
    f->switched_off = r->spec_switched_off;
    f->accept = r->spec_accept;
    engine_collector_sink.on_finish(arg, r);
}

/* The value of the unlabelled series name in m's exposition (-1: absent). */
static double metric_value(metrics *m, const char *name)
{
    size_t len;
    char *text = metrics_render(m, &len);
    CU_ASSERT_FATAL(text != NULL);
    double v = -1;
    const size_t n = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
        if (!strncmp(l, name, n) && l[n] == ' ') v = strtod(l + n + 1, NULL);
    free(text);
    return v;
}

#define ROLL_NEW 48

/* The three greedy requests at once, ROLL_NEW tokens each, on model path with speculation k
 * (0: off) and spec_min_accept min; tokens, what each one's end said and the engine's counters
 * out; *switched the metric deltaserve:spec_switched_off_total (-1 without a draft head). */
static void run_rolling_batch(const char *path, int k, float min, int max_batch,
                              int32_t out[N_REQ][ROLL_NEW], fin_collector fin[N_REQ],
                              engine_load *load, double *switched)
{
    qwen35_model *m = NULL;
    worker_backend *b = NULL;
    engine *e = NULL;
    metrics *mx = NULL;
    status st;
    CU_ASSERT_EQUAL_FATAL(metrics_create(64, &mx, &st), STATUS_OK);
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, path, &st), STATUS_OK);
    const worker_backend_opts bo = {.n_slots = 4, .n_ctx = 128, .n_threads = 2,
                                    .max_prefill_tokens = 64, .verify_rows = k ? k + 1 : 0};
    CU_ASSERT_EQUAL_FATAL(worker_backend_create("cpu", m, &bo, &b, &st), STATUS_OK);
    const engine_opts eo = {.queue = 8, .step_tokens = 64, .spec_k = k, .spec_threads = 2,
                            .spec_min_accept = min, .spec_max_batch = max_batch, .metrics = mx};
    CU_ASSERT_EQUAL_FATAL(engine_create(b, &eo, &e, &st), STATUS_OK);
    const engine_sink sink = {.cancelled = engine_collector_sink.cancelled,
                              .on_token = engine_collector_sink.on_token,
                              .on_finish = fin_on_finish};
    for (int i = 0; i < N_REQ; i++) {
        memset(&fin[i], 0, sizeof fin[i]);
        engine_collector_init(&fin[i].c, out[i], ROLL_NEW);
        engine_params p = {.prompt = PROMPTS[i], .n_prompt = 6, .max_new_tokens = ROLL_NEW,
                           .sampling = sampling_params_resolve(&(sampling_params){0}),
                           .ignore_eos = true};
        snprintf(p.id, sizeof p.id, "rolling-%d", i);
        CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &sink, &fin[i], &st), STATUS_OK);
    }
    for (int i = 0; i < N_REQ; i++) {
        engine_collector_wait(&fin[i].c);
        CU_ASSERT_EQUAL(fin[i].c.n, ROLL_NEW);
        engine_collector_destroy(&fin[i].c);
    }
    engine_get_load(e, load);
    *switched = metric_value(mx, "deltaserve:spec_switched_off_total");
    engine_destroy(e);
    worker_backend_destroy(b);
    qwen35_model_free(m);
    metrics_destroy(mx);
}

static void run_rolling(const char *path, int k, float min, int32_t out[N_REQ][ROLL_NEW],
                        fin_collector fin[N_REQ], engine_load *load, double *switched)
{
    run_rolling_batch(path, k, min, 0, out, fin, load, switched);
}

/* Writes the synthetic tiny F32 model with an MTP head to a temporary path named by tag. */
static void tiny_mtp_model(char *path, size_t n, const char *tag)
{
    snprintf(path, n, "%s/engine_spec_%d_%s.gguf", testutil_tmp_dir(), (int)getpid(), tag);
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = SYNTH_QUANT_F32, .seed = 7,
                       .mtp = true, .n_threads = 2};
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_write(path, &o, NULL, &st), STATUS_OK);
}

static void test_rolling_switch_off(void)
{
    char path[512];
    tiny_mtp_model(path, sizeof path, "rolling");
    static int32_t off[N_REQ][ROLL_NEW], on[N_REQ][ROLL_NEW];
    fin_collector fin[N_REQ];
    engine_load l;
    double switched;
    run_rolling(path, 0, 0.99f, off, fin, &l, &switched);
    CU_ASSERT_EQUAL(l.spec_steps, 0);
    CU_ASSERT_EQUAL(switched, -1); /* no draft head: no spec series */
    const int K = 2;
    /* 0.99: every request stops after exactly SPEC_ACCEPT_MIN_RUNS runs (its first eight would
       have to accept nearly every draft to stay on) */
    run_rolling(path, K, 0.99f, on, fin, &l, &switched);
    CU_ASSERT(memcmp(off, on, sizeof off) == 0);
    for (int i = 0; i < N_REQ; i++) {
        CU_ASSERT_EQUAL(fin[i].spec_steps, SPEC_ACCEPT_MIN_RUNS);
        CU_ASSERT(fin[i].switched_off);
        CU_ASSERT(fin[i].accept < 0.99);
        CU_ASSERT(fin[i].spec_drafted == K * SPEC_ACCEPT_MIN_RUNS);
        printf("\n    min 0.99 request %d: %d verify runs, %d drafted, %d accepted, rolling %.3f",
               i, fin[i].spec_steps, fin[i].spec_drafted, fin[i].spec_accepted, fin[i].accept);
    }
    CU_ASSERT_EQUAL(l.spec_steps, (uint64_t)N_REQ * SPEC_ACCEPT_MIN_RUNS);
    CU_ASSERT_EQUAL(l.spec_switched_off, N_REQ);
    CU_ASSERT_EQUAL(switched, N_REQ);
    /* 0: the rule off, each speculates to its end */
    run_rolling(path, K, 0, on, fin, &l, &switched);
    CU_ASSERT(memcmp(off, on, sizeof off) == 0);
    uint64_t runs = 0;
    for (int i = 0; i < N_REQ; i++) {
        CU_ASSERT(fin[i].spec_steps > SPEC_ACCEPT_MIN_RUNS);
        CU_ASSERT_FALSE(fin[i].switched_off);
        /* every token after the first came from a verify run (a + 1 per run) but perhaps the
           last, which leaves no room for a draft */
        const int from_runs = fin[i].spec_steps + fin[i].spec_accepted;
        CU_ASSERT(from_runs == ROLL_NEW - 1 || from_runs == ROLL_NEW - 2);
        runs += (uint64_t)fin[i].spec_steps;
        printf("\n    min 0 request %d: %d verify runs, %d drafted, %d accepted, rolling %.3f", i,
               fin[i].spec_steps, fin[i].spec_drafted, fin[i].spec_accepted, fin[i].accept);
    }
    CU_ASSERT_EQUAL(l.spec_steps, runs);
    CU_ASSERT_EQUAL(l.spec_switched_off, 0);
    CU_ASSERT_EQUAL(switched, 0);
    unlink(path);
}

/* The crowd rule (spec.h SPEC_CROWDED_STEPS): the three requests decode together with
 * spec_max_batch 2, so those steps may not speculate; after SPEC_CROWDED_STEPS of them each
 * stops speculating for good (counted as switched off), its tokens those of speculation off. */
static void test_crowd_switch_off(void)
{
    char path[512];
    tiny_mtp_model(path, sizeof path, "crowd");
    static int32_t off[N_REQ][ROLL_NEW], on[N_REQ][ROLL_NEW];
    fin_collector fin[N_REQ];
    engine_load l;
    double switched;
    CU_ASSERT_FATAL(ROLL_NEW > SPEC_CROWDED_STEPS + 1);
    run_rolling(path, 0, 0, off, fin, &l, &switched);
    run_rolling_batch(path, 2, 0, N_REQ - 1, on, fin, &l, &switched);
    CU_ASSERT(memcmp(off, on, sizeof off) == 0);
    /* (a request that decoded before the others were admitted may have speculated then) */
    for (int i = 0; i < N_REQ; i++) CU_ASSERT(fin[i].switched_off);
    CU_ASSERT_EQUAL(l.spec_switched_off, N_REQ);
    CU_ASSERT_EQUAL(switched, N_REQ);
    /* with room for all three, none is switched off (the rolling rule off) */
    run_rolling_batch(path, 2, 0, N_REQ, on, fin, &l, &switched);
    CU_ASSERT(memcmp(off, on, sizeof off) == 0);
    for (int i = 0; i < N_REQ; i++) CU_ASSERT_FALSE(fin[i].switched_off);
    CU_ASSERT(l.spec_steps > 0);
    CU_ASSERT_EQUAL(l.spec_switched_off, 0);
    unlink(path);
}

/* engine_create refuses a spec_min_accept outside 0..1. */
static void test_min_accept_range(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/engine_spec_%d_range.gguf", testutil_tmp_dir(), (int)getpid());
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = SYNTH_QUANT_F32, .seed = 7,
                       .mtp = true, .n_threads = 2};
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_write(path, &o, NULL, &st), STATUS_OK);
    qwen35_model *m = NULL;
    worker_backend *b = NULL;
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, path, &st), STATUS_OK);
    const worker_backend_opts bo = {.n_slots = 2, .n_ctx = 64, .n_threads = 2,
                                    .max_prefill_tokens = 64, .verify_rows = 3};
    CU_ASSERT_EQUAL_FATAL(worker_backend_create("cpu", m, &bo, &b, &st), STATUS_OK);
    const float bad[] = {-0.1f, 1.5f, NAN};
    for (int i = 0; i < 3; i++) {
        engine *e = NULL;
        const engine_opts eo = {.queue = 2, .step_tokens = 64, .spec_k = 2, .spec_threads = 2,
                                .spec_min_accept = bad[i]};
        CU_ASSERT_EQUAL(engine_create(b, &eo, &e, &st), STATUS_INVALID);
        CU_ASSERT(strstr(st.msg, "spec_min_accept") != NULL);
    }
    engine *e = NULL;
    const engine_opts eo = {.queue = 2, .step_tokens = 64, .spec_k = 2, .spec_threads = 2,
                            .spec_min_accept = 1};
    CU_ASSERT_EQUAL(engine_create(b, &eo, &e, &st), STATUS_OK);
    engine_destroy(e);
    worker_backend_destroy(b);
    qwen35_model_free(m);
    unlink(path);
}

/* ---- the gate ---- */

static void test_gate_rule(void)
{
    spec_gate g;
    memset(&g, 0, sizeof g);
    /* both sides measured first, the one with fewer steps next (speculating on a tie) */
    int spec = 0;
    for (int i = 0; i < 2 * SPEC_GATE_MIN; i++) {
        const bool s = spec_gate_choose(&g, 1);
        CU_ASSERT_EQUAL(s, i % 2 == 0);
        spec += s;
        spec_gate_record(&g, 1, s, s ? 0.010 : 0.008, s ? 2 : 1); /* 5 ms a token against 8 */
    }
    CU_ASSERT_EQUAL(spec, SPEC_GATE_MIN);
    /* then the faster, the other every SPEC_GATE_PROBE-th step */
    int plain = 0;
    for (int i = 0; i < 4 * SPEC_GATE_PROBE; i++) {
        const bool s = spec_gate_choose(&g, 1);
        plain += !s;
        spec_gate_record(&g, 1, s, s ? 0.010 : 0.008, s ? 2 : 1);
    }
    CU_ASSERT_EQUAL(plain, 4);
    /* per number of sequences: b = 2 starts afresh */
    CU_ASSERT(spec_gate_choose(&g, 2));
    spec_gate_record(&g, 2, true, 0.010, 1);
    CU_ASSERT_FALSE(spec_gate_choose(&g, 2));
    /* speculation turns slow (drafts accepted no longer): its window fills with slow steps,
     * and plain steps take over */
    int last_spec = -1;
    for (int i = 0; i < 20 * SPEC_GATE_PROBE; i++) {
        const bool s = spec_gate_choose(&g, 1);
        if (s) last_spec = i;
        spec_gate_record(&g, 1, s, s ? 0.030 : 0.008, 1);
    }
    CU_ASSERT(last_spec >= 0);
    spec = 0;
    for (int i = 0; i < 4 * SPEC_GATE_PROBE; i++) {
        const bool s = spec_gate_choose(&g, 1);
        spec += s;
        spec_gate_record(&g, 1, s, s ? 0.030 : 0.008, 1);
    }
    CU_ASSERT_EQUAL(spec, 4);
    /* nothing measured from a step without tokens; b past the last as the last */
    spec_gate_record(&g, SPEC_GATE_MAX_B + 5, true, 1.0, 0);
    CU_ASSERT_EQUAL(g.n[1][SPEC_GATE_MAX_B], 0);
    spec_gate_record(&g, SPEC_GATE_MAX_B + 5, true, 1.0, 1);
    CU_ASSERT_EQUAL(g.n[1][SPEC_GATE_MAX_B], 1);
}

#define GATE_NEW 100

/* one greedy request of GATE_NEW tokens, k = 4, the gate on / off: its tokens and verify runs */
static void gate_run(const char *path, bool gate, int32_t *out, uint64_t *runs)
{
    qwen35_model *m = NULL;
    worker_backend *b = NULL;
    engine *e = NULL;
    status st;
    g_gate = gate;
    open_engine(path, 4, &m, &b, &e);
    g_gate = false;
    engine_collector c;
    engine_collector_init(&c, out, GATE_NEW);
    engine_params p = {.prompt = PROMPTS[2], .n_prompt = 6, .max_new_tokens = GATE_NEW,
                       .sampling = sampling_params_resolve(&(sampling_params){0}),
                       .ignore_eos = true};
    snprintf(p.id, sizeof p.id, "gate");
    CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &engine_collector_sink, &c, &st), STATUS_OK);
    engine_collector_wait(&c);
    CU_ASSERT_EQUAL(c.n, GATE_NEW);
    engine_collector_destroy(&c);
    engine_load l;
    engine_get_load(e, &l);
    *runs = l.spec_steps;
    engine_destroy(e);
    worker_backend_destroy(b);
    qwen35_model_free(m);
}

static void test_gate_engine(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/engine_spec_%d_gate.gguf", testutil_tmp_dir(), (int)getpid());
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = SYNTH_QUANT_F32, .seed = 7,
                       .mtp = true, .n_threads = 2};
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_write(path, &o, NULL, &st), STATUS_OK);
    int32_t off[GATE_NEW], on[GATE_NEW];
    uint64_t runs_off, runs_on;
    gate_run(path, false, off, &runs_off);
    gate_run(path, true, on, &runs_on);
    printf("\n    verify runs: %llu without the gate, %llu with it", (unsigned long long)runs_off,
           (unsigned long long)runs_on);
    CU_ASSERT(runs_off >= GATE_NEW - 2); /* nothing accepted: a run a token */
    CU_ASSERT(runs_on >= SPEC_GATE_MIN);
    CU_ASSERT(runs_on <= GATE_NEW / 4); /* measured slower: mostly plain steps */
    CU_ASSERT(memcmp(off, on, sizeof off) == 0);
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
    CU_add_test(s, "sampled_speculation_gives_the_tokens_of_speculation_off", test_sampled);
    CU_add_test(s, "rolling_acceptance_mean", test_accept_mean);
    CU_add_test(s, "rolling_acceptance_switches_off", test_rolling_switch_off);
    CU_add_test(s, "crowd_switches_off", test_crowd_switch_off);
    CU_add_test(s, "min_accept_out_of_range_refused", test_min_accept_range);
    CU_add_test(s, "gate_rule", test_gate_rule);
    CU_add_test(s, "gate_in_the_engine", test_gate_engine);
    return testutil_cunit_run();
}
