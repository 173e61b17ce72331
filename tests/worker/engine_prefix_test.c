/* The engine's prefix cache (worker/engine.c over model/prefix_cache.h) on the CPU backend with
 * the demo model (models/demo-en-17m.gguf), cache on against cache off on the same workloads:
 *   - multi-turn conversations (a shared system prompt, every turn the history plus new user
 *     tokens): at least 90% of the reusable prompt tokens are served from the cache and every
 *     request yields the greedy tokens it yields cold;
 *   - requests sharing a long prefix with distinct suffixes, one at a time and all at once:
 *     tokens computed at most 1.2x the unique tokens, the same tokens as cold;
 *   - cancels mid-prefill and a drain leave no block held but by the cache, and the next request
 *     still matches its cold tokens;
 *   - a pool too small for every prefix: the cache evicts, running sequences never fail, every
 *     token matches cold, and a prefix evicted and made again is resumed from;
 *   - GetLoad and /metrics say what the cache did.
 * "Reusable" tokens of a request: the longest prefix its prompt shares with what an earlier
 * request fed (its prompt and all but its last generated token), at most its prompt less one. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <CUnit/Basic.h>

#include "common/metrics.h"
#include "model/kv_pool.h"
#include "model/qwen35.h"
#include "tests/testutil/testutil.h"
#include "worker/backend.h"
#include "worker/engine.h"

#define DEMO "models/demo-en-17m.gguf"
#define N_CTX 1024
#define BLOCK_TOKENS 16
#define STEP_TOKENS 64
#define MAX_SEQ 1024  /* tokens of one request: prompt + generated */
#define MAX_REQS 64

static qwen35_model *g_model;

/* ---- a sink ---- */

typedef struct req {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char id[32];
    int32_t prompt[MAX_SEQ];
    int n_prompt;
    int32_t out[MAX_SEQ];
    int n_out;
    bool done;
    finish_reason finish;
    status result;
    int n_cached;
    int cancel_on_poll; /* > 0: the sink reports the client gone at this cancelled() call */
    int polls;
} req;

static bool req_cancelled(void *arg)
{
    req *r = arg;
    pthread_mutex_lock(&r->mu);
    const bool gone = r->cancel_on_poll > 0 && ++r->polls >= r->cancel_on_poll;
    pthread_mutex_unlock(&r->mu);
    return gone;
}

static void req_token(void *arg, const engine_request *er, const worker_batch_item *it)
{
    (void)er;
    req *r = arg;
    pthread_mutex_lock(&r->mu);
    if (r->n_out < MAX_SEQ) r->out[r->n_out++] = it->out.token;
    pthread_mutex_unlock(&r->mu);
}

static void req_finish(void *arg, const engine_request *er)
{
    req *r = arg;
    pthread_mutex_lock(&r->mu);
    r->done = true;
    r->finish = er->finish;
    r->result = er->result;
    r->n_cached = er->n_cached;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static const engine_sink sink = {req_cancelled, req_token, req_finish, NULL, NULL};

static void req_init(req *r, const char *id, const int32_t *prompt, int n)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    snprintf(r->id, sizeof r->id, "%s", id);
    memcpy(r->prompt, prompt, (size_t)n * sizeof *prompt);
    r->n_prompt = n;
}

static bool req_wait(req *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 120;
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    while (!r->done && rc == 0) rc = pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    const bool ok = r->done;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    return ok;
}

static int submit(engine *e, req *r, int max_new)
{
    engine_params p;
    memset(&p, 0, sizeof p);
    snprintf(p.id, sizeof p.id, "%s", r->id);
    p.prompt = r->prompt;
    p.n_prompt = r->n_prompt;
    p.sampling.top_p = 1;
    p.sampling.repetition_penalty = 1;
    p.max_new_tokens = max_new;
    p.ignore_eos = true;
    status st;
    const int rc = engine_submit(e, &p, &sink, r, &st);
    if (rc) fprintf(stderr, "submit %s: %s\n", r->id, st.msg);
    return rc;
}

/* ---- engines ---- */

typedef struct rig {
    worker_backend *b;
    engine *e;
    metrics *mx;
} rig;

/* A CPU backend (slots, a pool of kv_blocks blocks: 0 its default) and an engine, with the
 * prefix cache (the forward's default snapshots) or without. */
static int rig_make(rig *g, bool cache, int slots, int kv_blocks, int snap_every)
{
    status st;
    memset(g, 0, sizeof *g);
    if (metrics_create(128, &g->mx, &st)) return -1;
    worker_backend_opts bo = {.n_slots = slots, .n_ctx = N_CTX, .n_threads = 2,
                              .max_prefill_tokens = STEP_TOKENS, .kv_blocks = kv_blocks,
                              .kv_block_tokens = BLOCK_TOKENS, .snap_budget = cache ? -1 : 0};
    if (worker_backend_create("cpu", g_model, &bo, &g->b, &st))
        return fprintf(stderr, "%s\n", st.msg), -1;
    if (cache && g->b->f->n_snaps < 1) return fprintf(stderr, "no snapshots\n"), -1;
    engine_opts eo = {.queue = MAX_REQS, .step_tokens = STEP_TOKENS, .metrics = g->mx,
                      .prefix_snap_every = snap_every};
    if (engine_create(g->b, &eo, &g->e, &st)) return fprintf(stderr, "%s\n", st.msg), -1;
    return 0;
}

static void rig_free(rig *g)
{
    engine_destroy(g->e);
    worker_backend_destroy(g->b);
    metrics_destroy(g->mx);
}

/* Idle: no slot holds a block; every block not free is held by the cache alone. */
static void check_idle(const rig *g)
{
    CU_ASSERT_FATAL(engine_wait_idle(g->e, 60000));
    engine_load l;
    engine_get_load(g->e, &l);
    CU_ASSERT_EQUAL(l.running, 0);
    CU_ASSERT_EQUAL(l.waiting, 0);
    for (int s = 0; s < g->b->n_slots; s++) CU_ASSERT_EQUAL(kv_pool_held(g->b->kv, s), 0);
    const uint32_t total = kv_pool_total_blocks(g->b->kv), free = kv_pool_free_blocks(g->b->kv);
    CU_ASSERT_EQUAL(free + l.prefix_blocks, total);
    if (free + l.prefix_blocks != total)
        printf("\n  idle: %u free + %u cached of %u blocks\n", free, l.prefix_blocks, total);
    CU_ASSERT(l.prefix_snapshots <= (uint32_t)g->b->f->n_snaps);
    CU_ASSERT_EQUAL(l.prefix_snapshot_bytes, (uint64_t)l.prefix_snapshots * g->b->f->snap_bytes);
}

/* ---- workloads ---- */

static uint64_t g_rng;

static void random_tokens(int32_t *out, int n)
{
    for (int i = 0; i < n; i++) out[i] = 100 + (int32_t)(testutil_rng_next(&g_rng) % 4000);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* what the workload did: tokens sent, served from the cache, reusable, computed */
typedef struct tally {
    long prompt, cached, reusable;
    int requests;
} tally;

/* the sequences fed so far (prompt + generated less the last), for the reusable count */
typedef struct history {
    int32_t seq[MAX_REQS * 4][MAX_SEQ];
    int n[MAX_REQS * 4];
    int count;
} history;

static int reusable(const history *h, const int32_t *prompt, int n_prompt)
{
    int best = 0;
    for (int i = 0; i < h->count; i++) {
        const int d = common_prefix(h->seq[i], h->n[i], prompt, n_prompt);
        if (d > best) best = d;
    }
    return best < n_prompt - 1 ? best : n_prompt - 1;
}

static void history_add(history *h, const req *r)
{
    if (h->count >= MAX_REQS * 4) return;
    int32_t *s = h->seq[h->count];
    memcpy(s, r->prompt, (size_t)r->n_prompt * sizeof *s);
    memcpy(s + r->n_prompt, r->out, (size_t)r->n_out * sizeof *s);
    h->n[h->count++] = r->n_prompt + r->n_out - 1;
}

static history g_hist;
static req g_reqs[MAX_REQS];

/* Runs `wave` requests at once from prompts[i] (lengths n[i]), gen new tokens each; returns
 * their generated tokens in outs. Counts them in t (reusable: against what was sent before
 * each wave, the wave's own earlier requests included). */
static int run_wave(rig *g, int32_t (*prompts)[MAX_SEQ], const int *n, int wave, int gen,
                    int32_t (*outs)[MAX_SEQ], tally *t, const char *tag)
{
    history *h = &g_hist;
    const int base = h->count;
    for (int i = 0; i < wave; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s%d", tag, i);
        req_init(&g_reqs[i], id, prompts[i], n[i]);
        t->reusable += reusable(h, prompts[i], n[i]);
        if (h->count < MAX_REQS * 4) { /* what it will have fed once its prompt is in */
            memcpy(h->seq[h->count], prompts[i], (size_t)n[i] * sizeof(int32_t));
            h->n[h->count++] = n[i];
        }
        if (submit(g->e, &g_reqs[i], gen)) return -1;
    }
    h->count = base;
    for (int i = 0; i < wave; i++) {
        if (!req_wait(&g_reqs[i])) return fprintf(stderr, "%s: no end\n", g_reqs[i].id), -1;
        if (g_reqs[i].finish != FINISH_LENGTH || g_reqs[i].n_out != gen)
            return fprintf(stderr, "%s: finish %d, %d tokens: %s\n", g_reqs[i].id,
                           g_reqs[i].finish, g_reqs[i].n_out, g_reqs[i].result.msg), -1;
        memcpy(outs[i], g_reqs[i].out, (size_t)gen * sizeof(int32_t));
        t->prompt += n[i];
        t->cached += g_reqs[i].n_cached;
        t->requests++;
        history_add(h, &g_reqs[i]);
    }
    return 0;
}

/* multi-turn: users conversations of turns turns, each user's turns one after the other and
 * the users at once: turn 1 is the system prompt and user tokens, turn k the previous turn's
 * prompt, its generated tokens and new user tokens. outs[turn][user]. */
enum { USERS = 4, TURNS = 4, SYSTEM = 96, USER = 24, GEN = 16 };
static int32_t g_prompts[USERS][MAX_SEQ];
static int32_t g_outs[2][TURNS][USERS][MAX_SEQ];

static int multi_turn(rig *g, int32_t (*outs)[USERS][MAX_SEQ], tally *t)
{
    g_rng = 7;
    g_hist.count = 0;
    int n[USERS];
    int32_t system[SYSTEM];
    random_tokens(system, SYSTEM);
    for (int u = 0; u < USERS; u++) {
        memcpy(g_prompts[u], system, sizeof system);
        random_tokens(g_prompts[u] + SYSTEM, USER);
        n[u] = SYSTEM + USER;
    }
    for (int k = 0; k < TURNS; k++) {
        char tag[16];
        snprintf(tag, sizeof tag, "t%d.u", k);
        if (run_wave(g, g_prompts, n, USERS, GEN, outs[k], t, tag)) return -1;
        for (int u = 0; u < USERS; u++) {
            memcpy(g_prompts[u] + n[u], outs[k][u], GEN * sizeof(int32_t));
            random_tokens(g_prompts[u] + n[u] + GEN, USER);
            n[u] += GEN + USER;
        }
    }
    return 0;
}

/* ---- tests ---- */

static void test_multi_turn_served_from_cache(void)
{
    rig cold, hot;
    tally tc = {0}, th = {0};
    CU_ASSERT_FATAL(rig_make(&cold, false, USERS, 0, 0) == 0);
    CU_ASSERT_FATAL(multi_turn(&cold, g_outs[0], &tc) == 0);
    rig_free(&cold);
    CU_ASSERT_FATAL(rig_make(&hot, true, USERS, 0, 1024) == 0);
    CU_ASSERT_FATAL(multi_turn(&hot, g_outs[1], &th) == 0);
    printf("\n  %d requests, %ld prompt tokens, %ld reusable, %ld from the cache (%.1f%%); cold "
           "%ld\n", th.requests, th.prompt, th.reusable, th.cached,
           100.0 * (double)th.cached / (double)th.reusable, tc.cached);
    CU_ASSERT_EQUAL(tc.cached, 0);
    CU_ASSERT(th.cached >= 0.9 * (double)th.reusable);
    CU_ASSERT(th.cached <= th.reusable);
    CU_ASSERT(memcmp(g_outs[0], g_outs[1], sizeof g_outs[0]) == 0);
    engine_load l;
    engine_get_load(hot.e, &l);
    CU_ASSERT(l.prefix_cache);
    CU_ASSERT_EQUAL(l.prefix_cached_tokens, (uint64_t)th.cached);
    CU_ASSERT_EQUAL(l.prefix_queries, (uint64_t)th.requests);
    CU_ASSERT(l.prefix_hits >= (uint64_t)(th.requests - 1));
    check_idle(&hot);
    rig_free(&hot);
}

/* shared prefix: R requests, one P-token prefix, distinct S-token suffixes */
enum { R = 12, P = 200, S = 16, SGEN = 4 };
static int32_t g_shared[R][MAX_SEQ];
static int32_t g_sh_outs[3][R][MAX_SEQ];

static int shared_prefix(rig *g, bool at_once, int32_t (*outs)[MAX_SEQ], tally *t)
{
    g_rng = 11;
    g_hist.count = 0;
    int n[R];
    random_tokens(g_shared[0], P);
    for (int i = 0; i < R; i++) {
        memcpy(g_shared[i], g_shared[0], P * sizeof(int32_t));
        random_tokens(g_shared[i] + P, S);
        n[i] = P + S;
    }
    if (at_once) return run_wave(g, g_shared, n, R, SGEN, outs, t, "s");
    for (int i = 0; i < R; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "s%d.", i);
        if (run_wave(g, g_shared + i, n + i, 1, SGEN, outs + i, t, tag)) return -1;
    }
    return 0;
}

static void test_shared_prefix_computes_unique_tokens(void)
{
    rig cold;
    tally tc = {0};
    CU_ASSERT_FATAL(rig_make(&cold, false, 4, 0, 0) == 0);
    CU_ASSERT_FATAL(shared_prefix(&cold, false, g_sh_outs[0], &tc) == 0);
    rig_free(&cold);
    const double unique = P + R * S;
    for (int at_once = 0; at_once < 2; at_once++) {
        rig hot;
        tally th = {0};
        CU_ASSERT_FATAL(rig_make(&hot, true, 4, 0, 64) == 0);
        CU_ASSERT_FATAL(shared_prefix(&hot, at_once, g_sh_outs[1 + at_once], &th) == 0);
        const double computed = (double)(th.prompt - th.cached);
        printf("\n  %s: %ld prompt tokens, %ld from the cache, %.0f computed for %.0f unique "
               "(%.2fx)", at_once ? "all at once" : "one at a time", th.prompt, th.cached,
               computed, unique, computed / unique);
        CU_ASSERT(computed <= 1.2 * unique);
        CU_ASSERT(memcmp(g_sh_outs[0], g_sh_outs[1 + at_once], sizeof g_sh_outs[0]) == 0);
        check_idle(&hot);
        rig_free(&hot);
    }
    printf("\n");
}

/* Requests with a long prompt cancelled at random steps (most during their prefill), then a
 * drain with requests running: no block is held but by the cache, the cache's snapshots are
 * its own; a request after the cancels still yields its cold tokens. */
static void test_cancel_and_drain_leave_no_block(void)
{
    enum { LONG = 300, N = 16 };
    int32_t prompts[N][MAX_SEQ];
    int n[N];
    g_rng = 23;
    for (int i = 0; i < N; i++) { /* pairs share their first half */
        if (i % 2) memcpy(prompts[i], prompts[i - 1], LONG / 2 * sizeof(int32_t));
        else random_tokens(prompts[i], LONG / 2);
        random_tokens(prompts[i] + LONG / 2, LONG - LONG / 2);
        n[i] = LONG;
    }
    rig cold, hot;
    tally t = {0};
    int32_t want[1][MAX_SEQ], got[1][MAX_SEQ];
    CU_ASSERT_FATAL(rig_make(&cold, false, 4, 0, 0) == 0);
    g_hist.count = 0;
    CU_ASSERT_FATAL(run_wave(&cold, prompts + 1, n + 1, 1, 8, want, &t, "cold") == 0);
    rig_free(&cold);

    CU_ASSERT_FATAL(rig_make(&hot, true, 4, 0, 64) == 0);
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "c%d", i);
        req_init(&g_reqs[i], id, prompts[i], n[i]);
        g_reqs[i].cancel_on_poll = 1 + (int)(testutil_rng_next(&g_rng) % 7);
        CU_ASSERT_FATAL(submit(hot.e, &g_reqs[i], 8) == 0);
    }
    int cancelled = 0;
    for (int i = 0; i < N; i++) {
        CU_ASSERT_FATAL(req_wait(&g_reqs[i]));
        cancelled += g_reqs[i].finish == FINISH_CANCELLED;
    }
    printf("\n  %d of %d cancelled", cancelled, N);
    CU_ASSERT(cancelled > N / 2);
    check_idle(&hot);
    g_hist.count = 0;
    CU_ASSERT_FATAL(run_wave(&hot, prompts + 1, n + 1, 1, 8, got, &t, "after") == 0);
    CU_ASSERT(memcmp(want[0], got[0], 8 * sizeof(int32_t)) == 0);
    check_idle(&hot);

    for (int i = 0; i < 8; i++) { /* a drain with work running and waiting */
        char id[32];
        snprintf(id, sizeof id, "d%d", i);
        req_init(&g_reqs[i], id, prompts[i], n[i]);
        CU_ASSERT_FATAL(submit(hot.e, &g_reqs[i], 64) == 0);
    }
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    engine_drain(hot.e, 0);
    for (int i = 0; i < 8; i++) CU_ASSERT_FATAL(req_wait(&g_reqs[i]));
    check_idle(&hot);
    printf("\n");
    rig_free(&hot);
}

/* A pool of 48 blocks of 16 and two slots: 10 distinct 120-token prompts (the cache evicts),
 * then the first one three times in a row: the first of those finds what survived, the second
 * resumes at least from the snapshot its prefill kept at 64 tokens, and snapshots where its
 * prompt leaves the cached KV (its last token), the third resumes from there. No request fails,
 * every request yields its cold tokens. */
static void test_eviction_under_pressure(void)
{
    enum { N = 10, LEN = 120, GEN2 = 8, KV_BLOCKS = 48 };
    int32_t prompts[N + 3][MAX_SEQ];
    int n[N + 3];
    g_rng = 31;
    for (int i = 0; i < N + 3; i++) {
        if (i < N) random_tokens(prompts[i], LEN);
        else memcpy(prompts[i], prompts[0], LEN * sizeof(int32_t));
        n[i] = LEN;
    }
    static int32_t outs[2][N + 3][MAX_SEQ];
    int again[3] = {0};
    for (int hot = 0; hot < 2; hot++) {
        rig g;
        tally t = {0};
        CU_ASSERT_FATAL(rig_make(&g, hot, 2, KV_BLOCKS, 64) == 0);
        g_hist.count = 0;
        for (int i = 0; i < N + 3; i++) {
            char tag[16];
            snprintf(tag, sizeof tag, "e%d.", i);
            CU_ASSERT_FATAL(run_wave(&g, prompts + i, n + i, 1, GEN2, outs[hot] + i, &t, tag) == 0);
            if (hot && i >= N) again[i - N] = g_reqs[0].n_cached;
        }
        if (hot) {
            engine_load l;
            engine_get_load(g.e, &l);
            printf("\n  %llu evictions, %llu hits; the first prompt again resumed %d, %d, %d "
                   "tokens\n", (unsigned long long)l.prefix_evictions,
                   (unsigned long long)l.prefix_hits, again[0], again[1], again[2]);
            CU_ASSERT(l.prefix_evictions > 0);
            CU_ASSERT(again[1] >= 64);
            CU_ASSERT_EQUAL(again[2], LEN - 1);
            check_idle(&g);
        }
        rig_free(&g);
    }
    CU_ASSERT(memcmp(outs[0], outs[1], sizeof outs[0]) == 0);
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

static void test_load_and_metrics(void)
{
    rig g;
    tally t = {0};
    static int32_t outs[TURNS][USERS][MAX_SEQ];
    CU_ASSERT_FATAL(rig_make(&g, true, USERS, 0, 1024) == 0);
    CU_ASSERT_FATAL(multi_turn(&g, outs, &t) == 0);
    CU_ASSERT_FATAL(engine_wait_idle(g.e, 60000));
    engine_load l;
    engine_get_load(g.e, &l);
    CU_ASSERT_EQUAL(metric(g.mx, "deltaserve:prefix_cache_queries_total"), (double)l.prefix_queries);
    CU_ASSERT_EQUAL(metric(g.mx, "deltaserve:prefix_cache_hits_total"), (double)l.prefix_hits);
    CU_ASSERT_EQUAL(metric(g.mx, "deltaserve:prefix_cache_queried_tokens_total"),
                    (double)l.prefix_queried_tokens);
    CU_ASSERT_EQUAL(metric(g.mx, "deltaserve:prefix_cache_cached_tokens_total"), (double)t.cached);
    CU_ASSERT_EQUAL(metric(g.mx, "deltaserve:prefix_cache_snapshots"), (double)l.prefix_snapshots);
    CU_ASSERT_EQUAL(metric(g.mx, "deltaserve:prefix_cache_snapshot_bytes"),
                    (double)l.prefix_snapshot_bytes);
    CU_ASSERT_EQUAL(metric(g.mx, "deltaserve:prefix_cache_blocks"), (double)l.prefix_blocks);
    CU_ASSERT(metric(g.mx, "deltaserve:prefix_cache_evictions_total") >= 0);
    CU_ASSERT(l.prefix_snapshots > 0 && l.prefix_blocks > 0);
    uint64_t heads[16];
    const int nh = engine_prefix_heads(g.e, 32, heads, 16);
    CU_ASSERT(nh >= 1); /* every conversation starts with the same system prompt */
    rig_free(&g);
}

static int suite_init(void)
{
    status st;
    if (qwen35_model_load(&g_model, DEMO, &st)) return fprintf(stderr, "%s: %s\n", DEMO, st.msg), -1;
    return 0;
}

static int suite_clean(void)
{
    qwen35_model_free(g_model);
    return 0;
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("engine_prefix", suite_init, suite_clean);
    CU_add_test(s, "multi_turn_served_from_cache", test_multi_turn_served_from_cache);
    CU_add_test(s, "shared_prefix_computes_unique_tokens", test_shared_prefix_computes_unique_tokens);
    CU_add_test(s, "cancel_and_drain_leave_no_block", test_cancel_and_drain_leave_no_block);
    CU_add_test(s, "eviction_under_pressure", test_eviction_under_pressure);
    CU_add_test(s, "load_and_metrics", test_load_and_metrics);
    return testutil_cunit_run();
}
