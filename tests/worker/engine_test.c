/* The engine (scheduler) over the CPU backend on the tiny reference model, and over a scripted
 * fake backend for the scheduling rules:
 *   - every reference prompt alone reproduces the reference greedy tokens;
 *   - all prompts at once (continuous batching, chunked prefill next to decodes, waiting for
 *     slots) give exactly the same tokens as each alone;
 *   - stop token ids, eos and max_new_tokens end requests with the right reason;
 *   - a cancelled client frees its slot at the next step; Worker/Abort by id;
 *   - a full queue is STATUS_EXHAUSTED; draining is UNAVAILABLE and cancels after the grace;
 *   - prefill chunks respect the token budget; a device failure fails requests and is fatal. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "model/forward.h"
#include "tests/worker/worker_test_util.h"
#include "worker/backend.h"
#include "worker/engine.h"
#include "tests/testutil/testutil.h"

static qwen35_model *g_model;
static wt_prompt g_prompts[WT_MAX_PROMPTS];
static int g_n_prompts;

/* ---- a collecting sink ---- */

typedef struct collector {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tokens[256];
    int n_tokens;
    bool done;
    finish_reason finish;
    int32_t stop_token;
    status result;
    atomic_bool cancel; /* what sink->cancelled reports */
    int n_logprob_tokens;
} collector;

static void col_init(collector *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

static bool col_cancelled(void *arg) { return atomic_load(&((collector *)arg)->cancel); }

static void col_token(void *arg, const engine_request *r, const worker_batch_item *it)
{
    collector *c = arg;
    pthread_mutex_lock(&c->mu);
    if (c->n_tokens < 256) c->tokens[c->n_tokens++] = it->out.token;
    if (r->p.sampling.n_logprobs > 0 && it->out.n_top == r->p.sampling.n_logprobs &&
        it->out.top_logprob[0] <= 0 && it->out.logprob <= 0)
        c->n_logprob_tokens++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void col_finish(void *arg, const engine_request *r)
{
    collector *c = arg;
    pthread_mutex_lock(&c->mu);
    c->done = true;
    c->finish = r->finish;
    c->stop_token = r->stop_token;
    c->result = r->result;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static const engine_sink col_sink = {col_cancelled, col_token, col_finish, NULL, NULL};

/* Waits (<= 20 s) until c is done, or until it has at least n tokens when n > 0. */
static bool col_wait(collector *c, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    while (!c->done && (n <= 0 || c->n_tokens < n) && rc == 0)
        rc = pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    bool ok = c->done || (n > 0 && c->n_tokens >= n);
    pthread_mutex_unlock(&c->mu);
    return ok;
}

static engine_params greedy_params(const char *id, const wt_prompt *p, int max_new)
{
    engine_params e;
    memset(&e, 0, sizeof e);
    snprintf(e.id, sizeof e.id, "%s", id);
    e.prompt = p->ids;
    e.n_prompt = p->n_ids;
    e.sampling.top_p = 1;
    e.sampling.repetition_penalty = 1;
    e.sampling.penalize_prompt = true; /* as the Worker API does (rpc/rpc_sampling.c) */
    e.max_new_tokens = max_new;
    e.ignore_eos = true;
    return e;
}

static int make_cpu_engine(int slots, int queue, int step_tokens, worker_backend **b, engine **e)
{
    status st;
    worker_backend_opts bo = {.n_slots = slots, .n_ctx = 256, .n_threads = 2,
                              .max_prefill_tokens = step_tokens};
    if (worker_backend_create("cpu", g_model, &bo, b, &st)) return fprintf(stderr, "%s\n", st.msg), -1;
    engine_opts eo = {.queue = queue, .step_tokens = step_tokens};
    if (engine_create(*b, &eo, e, &st)) return fprintf(stderr, "%s\n", st.msg), -1;
    return 0;
}

static void free_engine(worker_backend *b, engine *e)
{
    engine_destroy(e);
    worker_backend_destroy(b);
}

static bool same_tokens(const collector *c, const wt_prompt *p, int n)
{
    if (c->n_tokens != n) return false;
    for (int i = 0; i < n; i++)
        if (c->tokens[i] != p->greedy[i]) {
            printf("\n  token %d: got %d, reference %d\n", i, c->tokens[i], p->greedy[i]);
            return false;
        }
    return true;
}

static void test_each_prompt_alone_matches_reference(void)
{
    worker_backend *b;
    engine *e;
    CU_ASSERT_FATAL(make_cpu_engine(1, 4, 256, &b, &e) == 0);
    for (int i = 0; i < g_n_prompts; i++) {
        collector c;
        col_init(&c);
        engine_params p = greedy_params("alone", &g_prompts[i], g_prompts[i].n_greedy);
        status st;
        CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_OK);
        CU_ASSERT_FATAL(col_wait(&c, 0));
        CU_ASSERT(same_tokens(&c, &g_prompts[i], g_prompts[i].n_greedy));
        CU_ASSERT_EQUAL(c.finish, FINISH_LENGTH);
        CU_ASSERT_EQUAL(c.result.code, STATUS_OK);
    }
    free_engine(b, e);
}

/* slots/step_tokens chosen so that prefill chunks (the 26- and 65-token prompts in chunks of at
 * most 16) run in the same steps as other sequences' decodes, and some requests wait. */
static void concurrent_run(int slots, int step_tokens, int copies)
{
    worker_backend *b;
    engine *e;
    CU_ASSERT_FATAL(make_cpu_engine(slots, 16, step_tokens, &b, &e) == 0);
    int n = g_n_prompts * copies;
    collector *c = calloc((size_t)n, sizeof *c);
    for (int i = 0; i < n; i++) {
        col_init(&c[i]);
        const wt_prompt *pr = &g_prompts[i % g_n_prompts];
        engine_params p = greedy_params("batch", pr, pr->n_greedy);
        status st;
        CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &c[i], &st), STATUS_OK);
    }
    for (int i = 0; i < n; i++) {
        CU_ASSERT_FATAL(col_wait(&c[i], 0));
        const wt_prompt *pr = &g_prompts[i % g_n_prompts];
        CU_ASSERT(same_tokens(&c[i], pr, pr->n_greedy));
    }
    CU_ASSERT(engine_wait_idle(e, 5000));
    engine_load l;
    engine_get_load(e, &l);
    CU_ASSERT_EQUAL(l.free_slots, slots);
    CU_ASSERT_EQUAL(l.outstanding_tokens, 0);
    CU_ASSERT_EQUAL(l.requests_finished, (uint64_t)n);
    free(c);
    free_engine(b, e);
}

static void test_batching_does_not_change_tokens(void) { concurrent_run(4, 16, 1); }
static void test_batching_with_waiting_requests(void) { concurrent_run(3, 24, 2); }

/* Sampled (temperature 0.9, top-k 50, top-p 0.95, penalties), seeded: each request's tokens
 * are the same alone and in a batch; another seed gives other tokens. */
static void run_sampled(engine *e, const int *which, int n, uint64_t seed0, collector *c)
{
    status st;
    for (int i = 0; i < n; i++) {
        col_init(&c[i]);
        const wt_prompt *pr = &g_prompts[which[i]];
        engine_params p = greedy_params("sampled", pr, 24);
        p.sampling.temperature = 0.9f;
        p.sampling.top_k = 50;
        p.sampling.top_p = 0.95f;
        p.sampling.repetition_penalty = 1.1f;
        p.sampling.presence_penalty = 0.2f;
        p.sampling.seed = seed0 + (uint64_t)which[i];
        CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &c[i], &st), STATUS_OK);
    }
    for (int i = 0; i < n; i++) CU_ASSERT_FATAL(col_wait(&c[i], 0));
}

static void test_sampling_is_batch_invariant(void)
{
    worker_backend *b;
    engine *e;
    CU_ASSERT_FATAL(make_cpu_engine(4, 4, 16, &b, &e) == 0);
    collector alone[4], batch[4], other[1];
    for (int i = 0; i < g_n_prompts; i++) run_sampled(e, &i, 1, 1000, &alone[i]);
    int all[4] = {0, 1, 2, 3};
    run_sampled(e, all, g_n_prompts, 1000, batch);
    for (int i = 0; i < g_n_prompts; i++) {
        CU_ASSERT_EQUAL(batch[i].n_tokens, 24);
        CU_ASSERT(memcmp(batch[i].tokens, alone[i].tokens, 24 * sizeof(int32_t)) == 0);
    }
    run_sampled(e, all, 1, 7777, other);
    CU_ASSERT(memcmp(other[0].tokens, alone[0].tokens, 24 * sizeof(int32_t)) != 0);
    /* and sampling is not greedy: the seeded run differs from the reference greedy */
    CU_ASSERT(memcmp(alone[0].tokens, g_prompts[0].greedy, 24 * sizeof(int32_t)) != 0);
    free_engine(b, e);
}

static void test_stop_token_and_length(void)
{
    worker_backend *b;
    engine *e;
    CU_ASSERT_FATAL(make_cpu_engine(2, 4, 256, &b, &e) == 0);
    const wt_prompt *pr = &g_prompts[0];
    collector c;
    status st;
    /* a stop id that greedy produces at index 5 (and not before) */
    int k = 5;
    for (int j = 0; j < k; j++) CU_ASSERT_NOT_EQUAL_FATAL(pr->greedy[j], pr->greedy[k]);
    col_init(&c);
    engine_params p = greedy_params("stop", pr, 20);
    p.stop_ids[0] = 9999; /* not produced */
    p.stop_ids[1] = pr->greedy[k];
    p.n_stop_ids = 2;
    CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&c, 0));
    CU_ASSERT_EQUAL(c.finish, FINISH_STOP);
    CU_ASSERT_EQUAL(c.stop_token, pr->greedy[k]);
    CU_ASSERT(same_tokens(&c, pr, k + 1)); /* the stop token is returned */

    col_init(&c);
    p = greedy_params("len", pr, 3);
    CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&c, 0));
    CU_ASSERT_EQUAL(c.finish, FINISH_LENGTH);
    CU_ASSERT_EQUAL(c.stop_token, -1);
    CU_ASSERT_EQUAL(c.n_tokens, 3);

    /* logprobs: every token carries the asked number of alternatives */
    col_init(&c);
    p = greedy_params("lp", pr, 4);
    p.sampling.n_logprobs = 3;
    CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&c, 0));
    CU_ASSERT_EQUAL(c.n_logprob_tokens, 4);
    free_engine(b, e);

    /* eos from the engine options ends generation unless ignore_eos */
    worker_backend_opts bo = {.n_slots = 1, .n_ctx = 256, .n_threads = 2, .max_prefill_tokens = 64};
    CU_ASSERT_EQUAL_FATAL(worker_backend_create("cpu", g_model, &bo, &b, &st), STATUS_OK);
    engine_opts eo = {.queue = 2, .step_tokens = 64, .n_eos_ids = 1};
    eo.eos_ids[0] = pr->greedy[k];
    CU_ASSERT_EQUAL_FATAL(engine_create(b, &eo, &e, &st), STATUS_OK);
    col_init(&c);
    p = greedy_params("eos", pr, 20);
    p.ignore_eos = false;
    CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&c, 0));
    CU_ASSERT_EQUAL(c.finish, FINISH_STOP);
    CU_ASSERT_EQUAL(c.n_tokens, k + 1);
    col_init(&c);
    p.ignore_eos = true;
    CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&c, 0));
    CU_ASSERT_EQUAL(c.finish, FINISH_LENGTH);
    CU_ASSERT_EQUAL(c.n_tokens, 20);
    free_engine(b, e);
}

static void test_cancel_frees_slot(void)
{
    worker_backend *b;
    engine *e;
    CU_ASSERT_FATAL(make_cpu_engine(1, 1, 256, &b, &e) == 0);
    collector c, d;
    status st;
    col_init(&c);
    col_init(&d);
    engine_params p = greedy_params("long", &g_prompts[0], 200);
    CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&c, 2)); /* running */
    atomic_store(&c.cancel, true);    /* the client goes away */
    CU_ASSERT_FATAL(col_wait(&c, 0));
    CU_ASSERT_EQUAL(c.finish, FINISH_CANCELLED);
    CU_ASSERT_EQUAL(c.result.code, STATUS_CANCELLED);
    CU_ASSERT(c.n_tokens < 200);
    CU_ASSERT(engine_wait_idle(e, 5000));
    engine_load l;
    engine_get_load(e, &l);
    CU_ASSERT_EQUAL(l.free_slots, 1);
    CU_ASSERT_EQUAL(l.running, 0);
    /* the freed slot serves the next request, which is unaffected */
    p = greedy_params("next", &g_prompts[1], g_prompts[1].n_greedy);
    CU_ASSERT_EQUAL_FATAL(engine_submit(e, &p, &col_sink, &d, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&d, 0));
    CU_ASSERT(same_tokens(&d, &g_prompts[1], g_prompts[1].n_greedy));
    free_engine(b, e);
}

/* ---- a scripted fake forward behind the real adapter: token = slot's fed-token count; step
 * can be held ---- */

typedef struct fake_backend {
    fwd base;          /* the fake forward (model/fwd.h) */
    worker_backend *wb; /* the adapter over it, what the engine drives */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool hold;       /* steps wait for permits while true */
    int permits;     /* steps allowed while held */
    int in_step;     /* a step is waiting at the gate */
    int fed[16];     /* tokens fed per slot */
    int chunk_log[64]; /* rows of every prompt run (more than one row, or no sample), in order */
    int n_chunks;
    int max_items;   /* most runs (items) of one step */
    status_code fail_with; /* non-OK: the next step fails with it */
    int n_seq_end;   /* seq_end calls */
    int kv_held_max; /* most KV blocks held at once */
    bool kv_over;    /* a step found the pool short */
} fake_backend;

static int fake_seq_start(fwd *b, int slot, const sampling_params *s, status *st)
{
    fake_backend *f = (fake_backend *)b;
    f->fed[slot] = 0;
    b->n_past[slot] = 0;
    kv_pool_release(b->kv, slot);
    return STATUS_OK;
}

static int fake_step(fwd *b, fwd_row *rows, int n, status *st)
{
    fake_backend *f = (fake_backend *)b;
    pthread_mutex_lock(&f->mu);
    f->in_step++;
    pthread_cond_broadcast(&f->cv);
    while (f->hold && f->permits == 0) pthread_cond_wait(&f->cv, &f->mu);
    if (f->hold) f->permits--;
    f->in_step--;
    status_code fail = f->fail_with;
    int runs = 0;
    for (int i = 0; i < n;) {
        int e = i + 1;
        while (e < n && rows[e].slot == rows[i].slot) e++;
        const int slot = rows[i].slot, len = e - i;
        runs++;
        if ((len > 1 || !rows[e - 1].sample) && f->n_chunks < 64) f->chunk_log[f->n_chunks++] = len;
        if (kv_pool_need(b->kv, slot, (int64_t)f->fed[slot] + len) > 0) { /* the engine takes them */
            f->kv_over = true;
            if (fail == STATUS_OK) fail = STATUS_EXHAUSTED;
        }
        f->fed[slot] += len;
        b->n_past[slot] = f->fed[slot];
        if (rows[e - 1].sample) rows[e - 1].out.token = f->fed[slot] % 50 + 100;
        i = e;
    }
    if (runs > f->max_items) f->max_items = runs;
    const int held = (int)(kv_pool_total_blocks(b->kv) - kv_pool_free_blocks(b->kv));
    if (held > f->kv_held_max) f->kv_held_max = held;
    pthread_mutex_unlock(&f->mu);
    if (fail) return status_fail(st, fail, "fake device failure");
    return STATUS_OK;
}

static void fake_destroy(fwd *b)
{
    kv_pool_destroy(b->kv);
    free(b->n_past);
}

static void fake_seq_end(fwd *b, int slot)
{
    fake_backend *f = (fake_backend *)b;
    pthread_mutex_lock(&f->mu);
    f->fed[slot] = 0;
    b->n_past[slot] = 0;
    kv_pool_release(b->kv, slot);
    f->n_seq_end++;
    pthread_mutex_unlock(&f->mu);
}

static const fwd_vt fake_vt = {.seq_start = fake_seq_start, .step = fake_step,
                               .destroy = fake_destroy, .seq_end = fake_seq_end};

/* slots slots, a KV pool of n_blocks blocks of block_tokens positions */
/* A fake forward of `slots` slots over a real KV pool of n_blocks blocks of block_tokens
 * positions, tables of per_seq blocks, for the slots and `extra` sequences more (held by the
 * test, not the engine). */
static void fake_init_kv(fake_backend *f, int slots, int block_tokens, int n_blocks, int per_seq,
                         int extra)
{
    memset(f, 0, sizeof *f);
    f->base.vt = &fake_vt;
    f->base.n_slots = slots;
    f->base.n_ctx = 1 << 20;
    f->base.vocab = 1000;
    f->base.max_rows = 1024;
    f->base.pass_rows = 1024;
    f->base.n_past = calloc((size_t)slots, sizeof *f->base.n_past);
    status st;
    CU_ASSERT_FATAL(kv_pool_create(&(kv_pool_opts){.n_seqs = slots + extra,
                                                   .block_tokens = block_tokens,
                                                   .n_blocks = n_blocks, .max_blocks_per_seq = per_seq},
                                   &f->base.kv, &st) == 0);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    CU_ASSERT_FATAL(worker_backend_wrap(&f->base, &f->wb, &st) == 0);
}

static void fake_init(fake_backend *f, int slots) { fake_init_kv(f, slots, 1024, slots * 1024, 1024, 0); }

static void fake_free(fake_backend *f) { worker_backend_destroy(f->wb); }

static void fake_hold(fake_backend *f, bool hold)
{
    pthread_mutex_lock(&f->mu);
    f->hold = hold;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static void fake_permit(fake_backend *f, int n)
{
    pthread_mutex_lock(&f->mu);
    f->permits += n;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* Waits until the engine thread sits at the held gate. */
static bool fake_wait_in_step(fake_backend *f)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&f->mu);
    int rc = 0;
    while (f->in_step == 0 && rc == 0) rc = pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    bool ok = f->in_step > 0;
    pthread_mutex_unlock(&f->mu);
    return ok;
}

static int32_t g_ids[100];

static engine_params fake_params(const char *id, int n_prompt, int max_new)
{
    engine_params p;
    memset(&p, 0, sizeof p);
    snprintf(p.id, sizeof p.id, "%s", id);
    p.prompt = g_ids;
    p.n_prompt = n_prompt;
    p.max_new_tokens = max_new;
    return p;
}

static void test_queue_full_is_exhausted(void)
{
    fake_backend f;
    fake_init(&f, 1);
    engine *e;
    status st;
    CU_ASSERT_EQUAL_FATAL(engine_create(f.wb, &(engine_opts){.queue = 1}, &e, &st), STATUS_OK);
    fake_hold(&f, true);
    collector a, b, c;
    col_init(&a);
    col_init(&b);
    col_init(&c);
    engine_params p = fake_params("a", 3, 5);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &a, &st), STATUS_OK); /* takes the slot */
    CU_ASSERT_FATAL(fake_wait_in_step(&f));
    p = fake_params("b", 3, 5);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &b, &st), STATUS_OK); /* waits */
    p = fake_params("c", 3, 5);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_EXHAUSTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "queue full"));
    engine_load l;
    engine_get_load(e, &l);
    CU_ASSERT_EQUAL(l.running, 1);
    CU_ASSERT_EQUAL(l.waiting, 1);
    CU_ASSERT_EQUAL(l.free_slots, 0);
    CU_ASSERT_EQUAL(l.outstanding_tokens, 16); /* (3 + 5) * 2 */
    fake_hold(&f, false);
    CU_ASSERT(col_wait(&a, 0) && col_wait(&b, 0));
    CU_ASSERT_EQUAL(a.n_tokens, 5);
    CU_ASSERT_EQUAL(b.n_tokens, 5);
    CU_ASSERT(!c.done); /* a refused request never reaches its sink */
    engine_destroy(e);
    fake_free(&f);
}

/* The fake's tokens are its slot's fed count: a request of n_prompt tokens generates
 * (n_prompt + j) % 50 + 100 as its token j, however it was batched or preempted. */
static bool fake_tokens_right(const collector *c, int n_prompt, int n)
{
    if (c->n_tokens != n) return false;
    for (int j = 0; j < n; j++)
        if (c->tokens[j] != (n_prompt + j) % 50 + 100) return false;
    return true;
}

/* KV pool: 4 slots, 10 blocks of 16 positions; requests of 20 + 44 tokens need up to 4 blocks,
 * so worst-case reservation would run 2 at once. Admission counts blocks free (2 for a prompt
 * and its next token, plus the 1-block watermark): all 4 run; as they grow the pool runs dry
 * and the last admitted are preempted and recomputed: every request still gets exactly its
 * tokens, each step's positions had their blocks, and every block is free at the end. A request
 * that could never fit (the pool, or a table) is refused at once. */
static void test_kv_blocks_admission(void)
{
    fake_backend f;
    fake_init_kv(&f, 4, 16, 10, 8, 0);
    engine *e;
    status st;
    CU_ASSERT_EQUAL_FATAL(engine_create(f.wb, &(engine_opts){.queue = 8}, &e, &st), STATUS_OK);
    fake_hold(&f, true);
    collector c[4];
    for (int i = 0; i < 4; i++) {
        col_init(&c[i]);
        char id[8];
        snprintf(id, sizeof id, "r%d", i);
        engine_params p = fake_params(id, 20, 44);
        CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &c[i], &st), STATUS_OK);
    }
    CU_ASSERT_FATAL(fake_wait_in_step(&f));
    engine_load l;
    engine_get_load(e, &l);
    CU_ASSERT_EQUAL(l.running, 4); /* > 10 / 4 */
    CU_ASSERT_EQUAL(l.waiting, 0);
    CU_ASSERT_EQUAL(l.total_kv_blocks, 10);
    CU_ASSERT(l.free_kv_blocks >= 2 && l.free_kv_blocks <= 8); /* r0's prompt taken, maybe more */
    collector big;
    col_init(&big);
    engine_params p = fake_params("big", 100, 100); /* 13 blocks > 10 */
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &big, &st), STATUS_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "KV blocks"));
    p = fake_params("long", 100, 30); /* 9 blocks: fits the pool, not a table of 8 */
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &big, &st), STATUS_RANGE);
    fake_hold(&f, false);
    for (int i = 0; i < 4; i++) {
        CU_ASSERT(col_wait(&c[i], 0));
        CU_ASSERT(fake_tokens_right(&c[i], 20, 44));
        CU_ASSERT_EQUAL(c[i].finish, FINISH_LENGTH);
        CU_ASSERT_EQUAL(c[i].result.code, STATUS_OK);
    }
    CU_ASSERT(engine_wait_idle(e, 5000));
    engine_get_load(e, &l);
    CU_ASSERT_EQUAL(l.free_kv_blocks, 10);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f.base.kv), 10);
    CU_ASSERT(l.preemptions > 0);
    CU_ASSERT_EQUAL(f.n_seq_end, 4 + (int)l.preemptions);
    CU_ASSERT(!f.kv_over);
    CU_ASSERT(f.kv_held_max <= 10 && f.kv_held_max >= 8);
    printf("  KV blocks: at most %d of 10 held, %llu preemptions\n", f.kv_held_max,
           (unsigned long long)l.preemptions);
    CU_ASSERT(!big.done);
    engine_destroy(e);
    fake_free(&f);
}

/* A request the pool cannot grow even when it runs alone (the test holds 6 of 8 blocks in a
 * sequence the engine does not know) fails with STATUS_EXHAUSTED instead of looping; the next
 * request that fits runs. */
static void test_kv_too_small_alone_fails(void)
{
    fake_backend f;
    fake_init_kv(&f, 2, 16, 8, 8, 1);
    status st;
    CU_ASSERT_EQUAL_FATAL(kv_pool_ensure(f.base.kv, 2, 6 * 16, &st), STATUS_OK);
    engine *e;
    CU_ASSERT_EQUAL_FATAL(engine_create(f.wb, &(engine_opts){.queue = 4}, &e, &st), STATUS_OK);
    collector a, b;
    col_init(&a);
    col_init(&b);
    engine_params p = fake_params("a", 20, 40); /* 4 blocks at the end, 2 free */
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &a, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&a, 0));
    CU_ASSERT_EQUAL(a.finish, FINISH_ERROR);
    CU_ASSERT_EQUAL(a.result.code, STATUS_EXHAUSTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(a.result.msg, "no other sequence running"));
    CU_ASSERT_EQUAL(a.n_tokens, 13); /* positions 0 .. 31 fitted: 20 fed, 12 decodes */
    p = fake_params("b", 10, 5);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &b, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&b, 0));
    CU_ASSERT(fake_tokens_right(&b, 10, 5));
    CU_ASSERT(engine_wait_idle(e, 5000));
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f.base.kv), 2);
    engine_destroy(e);
    fake_free(&f);
}

static void test_abort_by_id(void)
{
    fake_backend f;
    fake_init(&f, 1);
    engine *e;
    status st;
    CU_ASSERT_EQUAL_FATAL(engine_create(f.wb, &(engine_opts){.queue = 2}, &e, &st), STATUS_OK);
    fake_hold(&f, true);
    collector a, b;
    col_init(&a);
    col_init(&b);
    engine_params p = fake_params("run-1", 3, 500);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &a, &st), STATUS_OK);
    CU_ASSERT_FATAL(fake_wait_in_step(&f));
    p = fake_params("wait-2", 3, 500);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &b, &st), STATUS_OK);
    CU_ASSERT(engine_abort(e, "wait-2")); /* a waiting one */
    CU_ASSERT(engine_abort(e, "run-1"));  /* a running one */
    CU_ASSERT(!engine_abort(e, "nope"));
    fake_hold(&f, false);
    CU_ASSERT(col_wait(&a, 0) && col_wait(&b, 0));
    CU_ASSERT_EQUAL(a.finish, FINISH_CANCELLED);
    CU_ASSERT_EQUAL(a.result.code, STATUS_OK); /* an abort is not an error */
    CU_ASSERT_EQUAL(b.finish, FINISH_CANCELLED);
    CU_ASSERT_EQUAL(b.n_tokens, 0);
    CU_ASSERT(engine_wait_idle(e, 5000));
    engine_destroy(e);
    fake_free(&f);
}

static void test_prefill_chunks_within_budget(void)
{
    fake_backend f;
    fake_init(&f, 2);
    engine *e;
    status st;
    CU_ASSERT_EQUAL_FATAL(engine_create(f.wb, &(engine_opts){.queue = 2, .step_tokens = 20}, &e, &st),
                          STATUS_OK);
    collector a, b;
    col_init(&a);
    col_init(&b);
    fake_hold(&f, true);
    engine_params p = fake_params("a", 50, 30); /* alone at first: chunks of 20, 20, 10 */
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &a, &st), STATUS_OK);
    fake_permit(&f, 4); /* 20, 20, 10 + first token, one decode */
    CU_ASSERT_FATAL(col_wait(&a, 2)); /* decoding now, the engine held at the next step */
    p = fake_params("b", 60, 3); /* next to a's decode: chunks of 19 */
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &b, &st), STATUS_OK);
    fake_hold(&f, false);
    CU_ASSERT(col_wait(&a, 0) && col_wait(&b, 0));
    /* a: 20, 20, 10; b: 19, 19, 19, 3 (a still decoding) */
    int want[] = {20, 20, 10, 19, 19, 19, 3};
    CU_ASSERT_EQUAL(f.n_chunks, 7);
    for (int i = 0; i < 7 && i < f.n_chunks; i++) CU_ASSERT_EQUAL(f.chunk_log[i], want[i]);
    CU_ASSERT_EQUAL(f.max_items, 2); /* b's chunks ran in the same steps as a's decodes */
    CU_ASSERT_EQUAL(a.n_tokens, 30);
    CU_ASSERT_EQUAL(b.n_tokens, 3);
    /* fake tokens are the slot's fed count: a's first = 50 % 50 + 100 */
    CU_ASSERT_EQUAL(a.tokens[0], 100);
    engine_destroy(e);
    fake_free(&f);
}

/* Two sequences decode in a budget of 4 rows; a third's 8-token prompt then runs in chunks of
 * the budget left (2) or of prefill_min_tokens when that is more; want: its chunks. */
static void prefill_min_run(int prefill_min, const int *want, int n_want)
{
    fake_backend f;
    fake_init(&f, 3);
    engine *e;
    status st;
    CU_ASSERT_EQUAL_FATAL(engine_create(f.wb,
                                        &(engine_opts){.queue = 4, .step_tokens = 4,
                                                       .prefill_min_tokens = prefill_min},
                                        &e, &st),
                          STATUS_OK);
    collector a, b, c;
    col_init(&a);
    col_init(&b);
    col_init(&c);
    fake_hold(&f, true);
    engine_params p = fake_params("a", 2, 40);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &a, &st), STATUS_OK);
    p = fake_params("b", 2, 40);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &b, &st), STATUS_OK);
    fake_permit(&f, 2); /* both prompts in one step (2 + 2 rows), then one decode step */
    CU_ASSERT_FATAL(col_wait(&a, 2) && col_wait(&b, 2));
    p = fake_params("c", 8, 1);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_OK);
    fake_hold(&f, false);
    CU_ASSERT(col_wait(&c, 0) && col_wait(&a, 0) && col_wait(&b, 0));
    CU_ASSERT_EQUAL(c.n_tokens, 1);
    CU_ASSERT_EQUAL(f.n_chunks, 2 + n_want);
    CU_ASSERT(f.n_chunks >= 2 && f.chunk_log[0] == 2 && f.chunk_log[1] == 2);
    for (int i = 0; i < n_want && 2 + i < f.n_chunks; i++) CU_ASSERT_EQUAL(f.chunk_log[2 + i], want[i]);
    engine_destroy(e);
    fake_free(&f);
}

static void test_prefill_min_tokens(void)
{
    prefill_min_run(1, (int[]){2, 2, 2, 2}, 4); /* the budget left by the decodes */
    prefill_min_run(3, (int[]){3, 3, 2}, 3);    /* at least 3 prompt rows a step */
    prefill_min_run(9, (int[]){4, 4}, 2);       /* never more than the step budget */
}

typedef struct drain_arg {
    engine *e;
    int64_t grace_ms;
    int cancelled;
} drain_arg;

static void *drain_thread(void *arg)
{
    drain_arg *d = arg;
    d->cancelled = engine_drain(d->e, d->grace_ms);
    return NULL;
}

static void test_drain(void)
{
    fake_backend f;
    fake_init(&f, 1);
    engine *e;
    status st;
    CU_ASSERT_EQUAL_FATAL(engine_create(f.wb, &(engine_opts){.queue = 2}, &e, &st), STATUS_OK);
    fake_hold(&f, true);
    collector a, b, c;
    col_init(&a);
    col_init(&b);
    col_init(&c);
    engine_params p = fake_params("a", 3, 500000);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &a, &st), STATUS_OK);
    CU_ASSERT_FATAL(fake_wait_in_step(&f));
    p = fake_params("b", 3, 500000);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &b, &st), STATUS_OK);
    /* grace 0: both are cancelled with UNAVAILABLE; drain returns when they have ended */
    pthread_t t;
    drain_arg da = {e, 0, -1};
    pthread_create(&t, NULL, drain_thread, &da);
    fake_hold(&f, false);
    pthread_join(t, NULL);
    CU_ASSERT_EQUAL(da.cancelled, 2);
    CU_ASSERT(a.done && b.done);
    CU_ASSERT_EQUAL(a.result.code, STATUS_UNAVAILABLE);
    CU_ASSERT_EQUAL(b.result.code, STATUS_UNAVAILABLE);
    CU_ASSERT_EQUAL(a.finish, FINISH_CANCELLED);
    CU_ASSERT(a.n_tokens < 500000);
    p = fake_params("c", 3, 5);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &c, &st), STATUS_UNAVAILABLE);
    engine_load l;
    engine_get_load(e, &l);
    CU_ASSERT(l.draining);
    engine_destroy(e);
    fake_free(&f);

    /* with enough grace, in-flight requests finish normally */
    fake_init(&f, 1);
    CU_ASSERT_EQUAL_FATAL(engine_create(f.wb, &(engine_opts){.queue = 2}, &e, &st), STATUS_OK);
    col_init(&a);
    p = fake_params("a", 3, 50);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &a, &st), STATUS_OK);
    CU_ASSERT_EQUAL(engine_drain(e, 20000), 0);
    CU_ASSERT(a.done);
    CU_ASSERT_EQUAL(a.finish, FINISH_LENGTH);
    CU_ASSERT_EQUAL(a.n_tokens, 50);
    engine_destroy(e);
    fake_free(&f);
}

static atomic_int g_fatal_calls;
static void on_fatal(void *arg) { atomic_fetch_add(&g_fatal_calls, 1); }

static void test_device_failure_is_fatal(void)
{
    fake_backend f;
    fake_init(&f, 2);
    f.fail_with = STATUS_DEVICE;
    engine *e;
    status st;
    CU_ASSERT_EQUAL_FATAL(engine_create(f.wb, &(engine_opts){.queue = 2, .on_fatal = on_fatal},
                                        &e, &st), STATUS_OK);
    collector a, b;
    col_init(&a);
    col_init(&b);
    engine_params p = fake_params("a", 3, 5);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &a, &st), STATUS_OK);
    CU_ASSERT_FATAL(col_wait(&a, 0));
    CU_ASSERT_EQUAL(a.finish, FINISH_ERROR);
    CU_ASSERT_EQUAL(a.result.code, STATUS_INTERNAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(a.result.msg, "fake device failure"));
    CU_ASSERT(engine_failed(e));
    CU_ASSERT_EQUAL(atomic_load(&g_fatal_calls), 1);
    p = fake_params("b", 3, 5);
    CU_ASSERT_EQUAL(engine_submit(e, &p, &col_sink, &b, &st), STATUS_UNAVAILABLE);
    engine_destroy(e);
    fake_free(&f);
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
    for (int i = 0; i < 100; i++) g_ids[i] = i;
    return g_n_prompts == 4 ? 0 : -1;
}

static int suite_clean(void)
{
    qwen35_model_free(g_model);
    return 0;
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("engine", suite_init, suite_clean);
    CU_add_test(s, "each_prompt_alone_matches_reference", test_each_prompt_alone_matches_reference);
    CU_add_test(s, "batching_does_not_change_tokens", test_batching_does_not_change_tokens);
    CU_add_test(s, "batching_with_waiting_requests", test_batching_with_waiting_requests);
    CU_add_test(s, "sampling_is_batch_invariant", test_sampling_is_batch_invariant);
    CU_add_test(s, "stop_token_and_length", test_stop_token_and_length);
    CU_add_test(s, "cancel_frees_slot", test_cancel_frees_slot);
    CU_add_test(s, "queue_full_is_exhausted", test_queue_full_is_exhausted);
    CU_add_test(s, "abort_by_id", test_abort_by_id);
    CU_add_test(s, "kv_blocks_admission", test_kv_blocks_admission);
    CU_add_test(s, "kv_too_small_alone_fails", test_kv_too_small_alone_fails);
    CU_add_test(s, "prefill_chunks_within_budget", test_prefill_chunks_within_budget);
    CU_add_test(s, "prefill_min_tokens", test_prefill_min_tokens);
    CU_add_test(s, "drain", test_drain);
    CU_add_test(s, "device_failure_is_fatal", test_device_failure_is_fatal);
    return testutil_cunit_run();
}
