/* The engine's KV block scheduling (worker/engine.h) over the CPU backend on the tiny reference
 * model, with small KV pools (model/kv_pool.h, the backend's worker_backend.kv):
 *   - admission counts blocks actually free: more sequences run at once than reserving every
 *     request's worst case would allow, and each still yields the tokens it yields alone;
 *   - a pool too small for every running sequence to reach its end forces preemptions; every
 *     request still yields exactly the greedy tokens it yields alone, also with penalties that
 *     count prompt and generated tokens apart, and the preemption counters move;
 *   - 1,000 requests cancelled at random points (the sink, Worker/Abort from the engine thread
 *     and from another) leave every block and every slot free;
 *   - GetLoad's free and total blocks are the pool's (checked between steps on the engine
 *     thread, and idle).
 * Pool sizes are given in positions and divided by the backend's block size. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <CUnit/Basic.h>

#include "common/metrics.h"
#include "model/kv_pool.h"
#include "tests/testutil/testutil.h"
#include "tests/worker/worker_test_util.h"
#include "worker/backend.h"
#include "worker/engine.h"

#define MAX_NEW 64
#define KV_BLOCK_TOKENS 16 /* small blocks: small pools run dry on short requests */
#define N_CTX 256

static qwen35_model *g_model;
static wt_prompt g_prompts[WT_MAX_PROMPTS];
static int g_n_prompts;
static int g_bt; /* positions per KV block of the CPU backend */
/* each prompt alone, MAX_NEW greedy tokens: plain, and with penalties on generated tokens only */
static int32_t g_alone[2][WT_MAX_PROMPTS][MAX_NEW];

/* GetLoad against the pool, from the sinks (engine thread, between a step and its retire) */
static atomic_int g_load_checks, g_load_mismatches;

/* ---- a sink ---- */

typedef struct req {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char id[32];
    int32_t tokens[MAX_NEW];
    int n_tokens;
    int n_finish;  /* on_finish calls */
    finish_reason finish;
    status result;
    int n_preempted;
    int cancel_after;  /* >= 0: the sink reports the client gone from this many tokens on */
    int abort_after;   /* >= 1: on_token calls engine_abort at this many tokens */
    engine *e;
    const worker_backend *b; /* non-NULL: on_token compares GetLoad with b->kv */
} req;

static void req_init(req *r, const char *id, engine *e, const worker_backend *b)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    snprintf(r->id, sizeof r->id, "%s", id);
    r->cancel_after = -1;
    r->abort_after = -1;
    r->e = e;
    r->b = b;
}

static void req_free(req *r)
{
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

static bool req_cancelled(void *arg)
{
    req *r = arg;
    pthread_mutex_lock(&r->mu);
    bool gone = r->cancel_after >= 0 && r->n_tokens >= r->cancel_after;
    pthread_mutex_unlock(&r->mu);
    return gone;
}

static void req_token(void *arg, const engine_request *er, const worker_batch_item *it)
{
    (void)er;
    req *r = arg;
    pthread_mutex_lock(&r->mu);
    if (r->n_tokens < MAX_NEW) r->tokens[r->n_tokens] = it->out.token;
    r->n_tokens++;
    const bool abort = r->n_tokens == r->abort_after;
    pthread_mutex_unlock(&r->mu);
    if (abort) engine_abort(r->e, r->id);
    if (r->b) { /* no step runs now: the pool holds still */
        engine_load l;
        engine_get_load(r->e, &l);
        const kv_pool *kv = r->b->kv;
        if (l.free_kv_blocks != kv_pool_free_blocks(kv) || l.total_kv_blocks != kv_pool_total_blocks(kv) ||
            l.free_kv_blocks >= l.total_kv_blocks) /* this sequence holds blocks */
            atomic_fetch_add(&g_load_mismatches, 1);
        atomic_fetch_add(&g_load_checks, 1);
    }
}

static void req_finish(void *arg, const engine_request *er)
{
    req *r = arg;
    pthread_mutex_lock(&r->mu);
    r->n_finish++;
    r->finish = er->finish;
    r->result = er->result;
    r->n_preempted = er->n_preempted;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static const engine_sink req_sink = {req_cancelled, req_token, req_finish, NULL, NULL};

/* Waits (<= 60 s) for on_finish. */
static bool req_wait(req *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    while (!r->n_finish && rc == 0) rc = pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    bool ok = r->n_finish > 0;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

/* greedy; penalised: repetition and presence penalties on generated tokens only, so that a
 * generated token re-fed as a prompt token (or the reverse) would change the next tokens */
static engine_params params(const char *id, const wt_prompt *p, int max_new, bool penalised)
{
    engine_params e;
    memset(&e, 0, sizeof e);
    snprintf(e.id, sizeof e.id, "%s", id);
    e.prompt = p->ids;
    e.n_prompt = p->n_ids;
    e.sampling.top_p = 1;
    e.sampling.repetition_penalty = penalised ? 1.5f : 1;
    e.sampling.presence_penalty = penalised ? 0.7f : 0;
    e.sampling.penalize_prompt = !penalised;
    e.max_new_tokens = max_new;
    e.ignore_eos = true;
    return e;
}

/* A CPU backend with a pool of kv_positions / g_bt blocks (0: its default) and an engine. */
static int make_engine(int slots, int kv_positions, int queue, int step_tokens, metrics *mx,
                       worker_backend **b, engine **e)
{
    status st;
    worker_backend_opts bo = {.n_slots = slots, .n_ctx = N_CTX, .n_threads = 2,
                              .max_prefill_tokens = step_tokens,
                              .kv_blocks = g_bt ? kv_positions / g_bt : 0,
                              .kv_block_tokens = KV_BLOCK_TOKENS};
    if (worker_backend_create("cpu", g_model, &bo, b, &st)) return fprintf(stderr, "%s\n", st.msg), -1;
    if (!(*b)->kv) return fprintf(stderr, "the CPU backend has no KV pool\n"), -1;
    engine_opts eo = {.queue = queue, .step_tokens = step_tokens, .metrics = mx};
    if (engine_create(*b, &eo, e, &st)) return fprintf(stderr, "%s\n", st.msg), -1;
    return 0;
}

static void free_engine(worker_backend *b, engine *e)
{
    engine_destroy(e);
    worker_backend_destroy(b);
}

/* Idle: every slot and every KV block free, and GetLoad says so. */
static void check_all_free(engine *e, const worker_backend *b)
{
    CU_ASSERT_FATAL(engine_wait_idle(e, 20000));
    engine_load l;
    engine_get_load(e, &l);
    CU_ASSERT_EQUAL(l.running, 0);
    CU_ASSERT_EQUAL(l.waiting, 0);
    CU_ASSERT_EQUAL(l.free_slots, l.total_slots);
    CU_ASSERT_EQUAL(l.outstanding_tokens, 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(b->kv), kv_pool_total_blocks(b->kv));
    CU_ASSERT_EQUAL(l.free_kv_blocks, kv_pool_free_blocks(b->kv));
    CU_ASSERT_EQUAL(l.total_kv_blocks, kv_pool_total_blocks(b->kv));
    for (int s = 0; s < b->n_slots; s++) CU_ASSERT_EQUAL(kv_pool_held(b->kv, s), 0);
}

static bool same(const req *r, const int32_t *want, int n)
{
    if (r->n_tokens != n) {
        printf("\n  %s: %d tokens, want %d\n", r->id, r->n_tokens, n);
        return false;
    }
    for (int i = 0; i < n; i++)
        if (r->tokens[i] != want[i]) {
            printf("\n  %s: token %d is %d, alone %d\n", r->id, i, r->tokens[i], want[i]);
            return false;
        }
    return true;
}

/* the value of a series without labels in m's exposition */
static double metric(metrics *m, const char *name)
{
    static char buf[1 << 16];
    metrics_format(m, buf, sizeof buf);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(buf, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

/* ---- tests ---- */

/* 8 slots and a pool of 256 positions (16 blocks of 16): the requests' worst cases (prompt +
 * 64 new tokens) need at least 5 blocks each, so reserving them would run 3 at once; admitting
 * on free blocks (a prompt's blocks and the watermark) runs more, and as they grow some are
 * preempted. Every request yields the tokens it yields alone. */
static void test_admits_on_free_blocks(void)
{
    worker_backend *b;
    engine *e;
    CU_ASSERT_FATAL(make_engine(8, 256, 16, 64, NULL, &b, &e) == 0);
    const uint32_t n_blocks = kv_pool_total_blocks(b->kv);
    uint32_t worst = UINT32_MAX; /* the smallest worst case */
    for (int i = 0; i < g_n_prompts; i++) {
        const uint32_t w = kv_pool_blocks_for(b->kv, g_prompts[i].n_ids + MAX_NEW);
        if (w < worst) worst = w;
    }
    const int n = 2 * g_n_prompts;
    req r[2 * WT_MAX_PROMPTS];
    status st;
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "a%d", i);
        req_init(&r[i], id, e, b);
        engine_params p = params(id, &g_prompts[i % g_n_prompts], MAX_NEW, false);
        CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &req_sink, &r[i], &st), STATUS_OK);
    }
    int most = 0;
    for (bool idle = false; !idle;) { /* the most running at once, through GetLoad */
        engine_load l;
        engine_get_load(e, &l);
        if (l.running > most) most = l.running;
        idle = l.running == 0 && l.waiting == 0;
        nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    printf("  %u blocks, worst case %u each: %d running at once (reservation: %u)\n", n_blocks,
           worst, most, n_blocks / worst);
    CU_ASSERT(most > (int)(n_blocks / worst));
    for (int i = 0; i < n; i++) {
        CU_ASSERT_FATAL(req_wait(&r[i]));
        CU_ASSERT_EQUAL(r[i].finish, FINISH_LENGTH);
        CU_ASSERT(same(&r[i], g_alone[0][i % g_n_prompts], MAX_NEW));
        CU_ASSERT_EQUAL(r[i].n_finish, 1);
        req_free(&r[i]);
    }
    check_all_free(e, b);
    free_engine(b, e);
}

/* 4 slots and a pool of 192 positions (12 blocks of 16): all four prompts fit at once, their
 * ends (5 + 5 + 6 + 9 blocks) do not, so sequences are preempted and recomputed; each yields
 * exactly its tokens alone, plain greedy and with penalties on generated tokens only. The
 * counters (GetLoad, deltaserve:num_preemptions_total) move; GetLoad's blocks are the pool's. */
static void preemption_run(bool penalised)
{
    metrics *mx;
    status st;
    CU_ASSERT_EQUAL_FATAL(metrics_create(64, &mx, &st), STATUS_OK);
    worker_backend *b;
    engine *e;
    CU_ASSERT_FATAL(make_engine(4, 192, 8, 32, mx, &b, &e) == 0);
    const int base_checks = atomic_load(&g_load_checks);
    atomic_store(&g_load_mismatches, 0);
    req r[WT_MAX_PROMPTS];
    for (int i = 0; i < g_n_prompts; i++) {
        char id[32];
        snprintf(id, sizeof id, "p%d", i);
        req_init(&r[i], id, e, b);
        engine_params p = params(id, &g_prompts[i], MAX_NEW, penalised);
        CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &req_sink, &r[i], &st), STATUS_OK);
    }
    int preempted = 0;
    for (int i = 0; i < g_n_prompts; i++) {
        CU_ASSERT_FATAL(req_wait(&r[i]));
        CU_ASSERT_EQUAL(r[i].finish, FINISH_LENGTH);
        CU_ASSERT_EQUAL(r[i].result.code, STATUS_OK);
        CU_ASSERT(same(&r[i], g_alone[penalised][i], MAX_NEW));
        preempted += r[i].n_preempted;
    }
    check_all_free(e, b);
    engine_load l;
    engine_get_load(e, &l);
    printf("  %s: %llu preemptions\n", penalised ? "penalised" : "greedy",
           (unsigned long long)l.preemptions);
    CU_ASSERT(l.preemptions > 0);
    CU_ASSERT_EQUAL((uint64_t)preempted, l.preemptions);
    CU_ASSERT_EQUAL(metric(mx, "deltaserve:num_preemptions_total"), (double)l.preemptions);
    CU_ASSERT_EQUAL(metric(mx, "deltaserve:num_total_kv_blocks"), (double)kv_pool_total_blocks(b->kv));
    CU_ASSERT_EQUAL(metric(mx, "deltaserve:num_free_kv_blocks"), (double)kv_pool_total_blocks(b->kv));
    CU_ASSERT(atomic_load(&g_load_checks) > base_checks);
    CU_ASSERT_EQUAL(atomic_load(&g_load_mismatches), 0);
    for (int i = 0; i < g_n_prompts; i++) req_free(&r[i]);
    free_engine(b, e);
    metrics_destroy(mx);
}

static void test_preemption_keeps_greedy_tokens(void) { preemption_run(false); }
static void test_preemption_keeps_penalised_tokens(void) { preemption_run(true); }

static uint32_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* 1,000 requests (the two shortest prompts, up to 16 new tokens) in waves of 24 on 4 slots and
 * a pool of 80 positions (5 blocks of 16: some are preempted too), each cancelled at a random
 * point: by its sink after k tokens (k = 0: while it waits or before its first token), by
 * Worker/Abort from the engine thread after k tokens, or by Worker/Abort from this thread right
 * away or after a random pause. Every request ends once; after every wave every block and every
 * slot is free. */
static void test_cancels_leak_nothing(void)
{
    enum { N = 1000, WAVE = 24, GEN = 16 };
    worker_backend *b;
    engine *e;
    CU_ASSERT_FATAL(make_engine(4, 80, WAVE, 32, NULL, &b, &e) == 0);
    req *r = calloc(WAVE, sizeof *r);
    uint64_t rng = 26;
    int cancelled = 0, preempted = 0, done = 0;
    status st;
    for (int w0 = 0; w0 < N; w0 += WAVE) {
        const int n = N - w0 < WAVE ? N - w0 : WAVE;
        int mode[WAVE];
        for (int i = 0; i < n; i++) {
            char id[32];
            snprintf(id, sizeof id, "c%d", w0 + i);
            req_init(&r[i], id, e, NULL);
            mode[i] = (int)(lcg(&rng) % 3);
            if (mode[i] == 0) r[i].cancel_after = (int)(lcg(&rng) % GEN);
            if (mode[i] == 1) r[i].abort_after = 1 + (int)(lcg(&rng) % (GEN - 1));
            engine_params p = params(id, &g_prompts[(w0 + i) % 2], GEN, false);
            CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &req_sink, &r[i], &st), STATUS_OK);
        }
        for (int i = 0; i < n; i++) {
            if (mode[i] != 2) continue;
            const uint32_t us = lcg(&rng) % 3000;
            if (us > 200) nanosleep(&(struct timespec){0, (long)us * 1000}, NULL);
            engine_abort(e, r[i].id);
        }
        for (int i = 0; i < n; i++) {
            CU_ASSERT_FATAL(req_wait(&r[i]));
            CU_ASSERT(r[i].n_tokens <= GEN);
            if (mode[i] != 2) { /* ended at the step after its k-th token, before its end */
                CU_ASSERT_EQUAL(r[i].finish, FINISH_CANCELLED);
                CU_ASSERT_EQUAL(r[i].n_tokens, mode[i] == 0 ? r[i].cancel_after : r[i].abort_after);
            }
            cancelled += r[i].finish == FINISH_CANCELLED;
            preempted += r[i].finish == FINISH_CANCELLED && r[i].n_preempted > 0;
        }
        CU_ASSERT_FATAL(engine_wait_idle(e, 20000));
        for (int i = 0; i < n; i++) {
            CU_ASSERT_EQUAL(r[i].n_finish, 1);
            req_free(&r[i]);
        }
        done += n;
        check_all_free(e, b);
    }
    engine_load l;
    engine_get_load(e, &l);
    printf("  %d requests, %d cancelled (%d of them after a preemption), %llu preemptions\n", done,
           cancelled, preempted, (unsigned long long)l.preemptions);
    CU_ASSERT_EQUAL(done, N);
    CU_ASSERT(cancelled >= N * 6 / 10);
    CU_ASSERT(preempted > 0);
    CU_ASSERT_EQUAL(l.requests_finished, (uint64_t)N);
    free(r);
    free_engine(b, e);
}

/* ---- suite ---- */

/* Each prompt alone on one slot with a whole context's blocks. */
static int run_alone(void)
{
    worker_backend *b;
    engine *e;
    if (make_engine(1, 0, 1, 64, NULL, &b, &e)) return -1;
    int rc = 0;
    for (int pen = 0; pen < 2 && !rc; pen++)
        for (int i = 0; i < g_n_prompts && !rc; i++) {
            req r;
            req_init(&r, "alone", e, NULL);
            engine_params p = params("alone", &g_prompts[i], MAX_NEW, pen);
            status st;
            if (engine_submit(e, &p, &req_sink, &r, &st) || !req_wait(&r) || r.n_tokens != MAX_NEW)
                rc = -1;
            memcpy(g_alone[pen][i], r.tokens, sizeof g_alone[pen][i]);
            req_free(&r);
        }
    /* the reference's greedy tokens are the first of the plain run's */
    for (int i = 0; i < g_n_prompts && !rc; i++)
        if (memcmp(g_alone[0][i], g_prompts[i].greedy, (size_t)g_prompts[i].n_greedy * sizeof(int32_t))) {
            fprintf(stderr, "prompt %d alone differs from the reference\n", i);
            rc = -1;
        }
    free_engine(b, e);
    return rc;
}

static int suite_init(void)
{
    char path[PATH_MAX];
    status st;
    wt_reference_path(path, sizeof path, "tiny-r2-tied", ".gguf");
    if (qwen35_model_load(&g_model, path, &st)) {
        fprintf(stderr, "%s: %s\n", path, st.msg);
        return -1;
    }
    g_n_prompts = wt_load_prompts("tiny-r2-tied", g_prompts, WT_MAX_PROMPTS);
    if (g_n_prompts != 4) return -1;
    worker_backend *b; /* the block size, to size the pools */
    worker_backend_opts bo = {.n_slots = 1, .n_ctx = N_CTX, .n_threads = 1, .max_prefill_tokens = 16,
                              .kv_block_tokens = KV_BLOCK_TOKENS};
    if (worker_backend_create("cpu", g_model, &bo, &b, &st)) return fprintf(stderr, "%s\n", st.msg), -1;
    g_bt = b->kv ? kv_pool_block_tokens(b->kv) : 0;
    worker_backend_destroy(b);
    if (!g_bt) return fprintf(stderr, "the CPU backend has no KV pool\n"), -1;
    return run_alone();
}

static int suite_clean(void)
{
    qwen35_model_free(g_model);
    return 0;
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("engine_kv", suite_init, suite_clean);
    CU_add_test(s, "admits_on_free_blocks", test_admits_on_free_blocks);
    CU_add_test(s, "preemption_keeps_greedy_tokens", test_preemption_keeps_greedy_tokens);
    CU_add_test(s, "preemption_keeps_penalised_tokens", test_preemption_keeps_penalised_tokens);
    CU_add_test(s, "cancels_leak_nothing", test_cancels_leak_nothing);
    return testutil_cunit_run();
}
