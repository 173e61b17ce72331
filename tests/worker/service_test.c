/* The deltaserve.v1.Worker service over loopback gRPC with the CPU backend on the tiny
 * reference model: loading state, model info, a stream equal to the reference greedy tokens
 * with a complete final message, validation errors, load, client cancel freeing the slot,
 * Worker/Abort, queue full, and drain; the streaming path, direct or on a feed, allocating per
 * request, not per token (our code's malloc/calloc/realloc counted; gRPC's and protobuf-c's, shared libraries,
 * are not). */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "model/forward.h"
#include "model/kv_pool.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "proto/grpc/health/v1/health.pb-c.h"
#include "tests/rpc/rpc_test_client.h"
#include "tests/worker/worker_test_util.h"
#include "worker/backend.h"
#include "worker/engine.h"
#include "worker/service.h"
#include "tests/testutil/alloc_count.h"
#include "tests/testutil/testutil.h"

#define GEN "/deltaserve.v1.Worker/Generate"

static qwen35_model *g_model;
static worker_backend *g_backend;
static engine *g_engine;
static worker_service *g_ws;
static grpc_channel *g_ch;
static wt_prompt g_prompts[WT_MAX_PROMPTS];

typedef Deltaserve__V1__GenerateResponse gen_resp;

typedef struct gen_req {
    Deltaserve__V1__WorkerGenerateRequest r;
    Deltaserve__V1__StoppingCriteria stop;
} gen_req;

static Deltaserve__V1__WorkerGenerateRequest *make_req(gen_req *g, const char *id, const wt_prompt *p,
                                                      int max_new)
{
    g->r = (Deltaserve__V1__WorkerGenerateRequest)DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    g->stop = (Deltaserve__V1__StoppingCriteria)DELTASERVE__V1__STOPPING_CRITERIA__INIT;
    g->r.request_id = (char *)id;
    g->r.n_prompt_token_ids = (size_t)p->n_ids;
    g->r.prompt_token_ids = (int32_t *)p->ids;
    g->stop.max_new_tokens = (uint32_t)max_new;
    g->stop.ignore_eos = 1;
    g->r.stopping = &g->stop;
    return &g->r;
}

/* A unary call; returns the gRPC code and the reply in *out (caller frees). */
static int unary(const char *path, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *d,
                 ProtobufCMessage **out, char *msg, size_t cap)
{
    tcall t;
    *out = NULL;
    if (!tc_start(&t, g_ch, path, req, 10000, true)) return -1;
    *out = tc_recv(&t, d);
    int code = tc_status(&t);
    if (msg) snprintf(msg, cap, "%s", t.message);
    tc_destroy(&t);
    return code;
}

static Deltaserve__V1__Load *get_load(void)
{
    Deltaserve__V1__GetLoadRequest req = DELTASERVE__V1__GET_LOAD_REQUEST__INIT;
    ProtobufCMessage *m;
    unary("/deltaserve.v1.Worker/GetLoad", &req.base, &deltaserve__v1__load__descriptor, &m, NULL, 0);
    return (Deltaserve__V1__Load *)m;
}

/* Waits (bounded) until every slot and every KV block is free and nothing waits; GetLoad's
 * blocks are the backend's pool's. */
static bool wait_load_idle(void)
{
    for (int64_t end = clock_now_us() + 10000000; clock_now_us() < end;) {
        Deltaserve__V1__Load *l = get_load();
        const uint32_t total = kv_pool_total_blocks(g_backend->kv);
        bool idle = l && l->running == 0 && l->waiting == 0 && l->free_slots == l->total_slots &&
                    l->total_kv_blocks == total && l->free_kv_blocks == total && total > 0;
        if (l) protobuf_c_message_free_unpacked(&l->base, NULL);
        if (idle) return true;
        sched_yield();
    }
    return false;
}

static int health(const char *service)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    ProtobufCMessage *m;
    unary("/grpc.health.v1.Health/Check", &req.base, &grpc__health__v1__health_check_response__descriptor,
          &m, NULL, 0);
    int s = m ? (int)((Grpc__Health__V1__HealthCheckResponse *)m)->status : -1;
    if (m) protobuf_c_message_free_unpacked(m, NULL);
    return s;
}

static void test_loading_state(void)
{
    gen_req g;
    char msg[256];
    ProtobufCMessage *m;
    CU_ASSERT_EQUAL(health(""), 1);                      /* alive */
    CU_ASSERT_EQUAL(health("deltaserve.v1.Worker"), 2);  /* not ready */
    CU_ASSERT_EQUAL(unary(GEN, &make_req(&g, "early", &g_prompts[0], 4)->base,
                          &deltaserve__v1__generate_response__descriptor, &m, msg, sizeof msg),
                    GRPC_STATUS_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "loading"));
    if (m) protobuf_c_message_free_unpacked(m, NULL);
    Deltaserve__V1__GetModelInfoRequest mi = DELTASERVE__V1__GET_MODEL_INFO_REQUEST__INIT;
    CU_ASSERT_EQUAL(unary("/deltaserve.v1.Worker/GetModelInfo", &mi.base,
                          &deltaserve__v1__model_info__descriptor, &m, NULL, 0),
                    GRPC_STATUS_UNAVAILABLE);

    /* now the model is there */
    worker_model_desc desc = {.path = "tiny-r2-tied.gguf", .n_eos_ids = 1, .eos_ids = {1028}, .bos_id = -1};
    worker_service_attach(g_ws, g_model, g_backend, g_engine, &desc);
    CU_ASSERT_EQUAL(health("deltaserve.v1.Worker"), 1);
}

static void test_model_info(void)
{
    Deltaserve__V1__GetModelInfoRequest req = DELTASERVE__V1__GET_MODEL_INFO_REQUEST__INIT;
    ProtobufCMessage *m;
    CU_ASSERT_EQUAL_FATAL(unary("/deltaserve.v1.Worker/GetModelInfo", &req.base,
                                &deltaserve__v1__model_info__descriptor, &m, NULL, 0),
                          GRPC_STATUS_OK);
    Deltaserve__V1__ModelInfo *mi = (Deltaserve__V1__ModelInfo *)m;
    CU_ASSERT_STRING_EQUAL(mi->architecture, "qwen35");
    CU_ASSERT_EQUAL(mi->vocab_size, 1029);
    CU_ASSERT_EQUAL(mi->n_layers, 4);
    CU_ASSERT_EQUAL(mi->n_deltanet_layers, 3);
    CU_ASSERT_EQUAL(mi->n_attention_layers, 1);
    CU_ASSERT_EQUAL(mi->hidden_size, 256);
    CU_ASSERT_EQUAL(mi->max_context, 2048);
    CU_ASSERT_EQUAL(mi->max_running, 2);
    CU_ASSERT_STRING_EQUAL(mi->quantization, "F32");
    CU_ASSERT_EQUAL_FATAL(mi->n_eos_token_ids, 1);
    CU_ASSERT_EQUAL(mi->eos_token_ids[0], 1028);
    CU_ASSERT(strncmp(mi->device, "cpu", 3) == 0);
    CU_ASSERT(mi->n_params > 1000000); /* ~3.7M F32 weights in a 14.8 MB file */
    protobuf_c_message_free_unpacked(m, NULL);
}

static void test_stream_matches_reference(void)
{
    for (int k = 0; k < 4; k++) {
        const wt_prompt *p = &g_prompts[k];
        gen_req g;
        tcall t;
        CU_ASSERT_FATAL(tc_start(&t, g_ch, GEN, &make_req(&g, "ref", p, 24)->base, 20000, true));
        int n = 0, ok = 1, first_usage = 0;
        uint32_t first_cached = 0;
        gen_resp *m, *last = NULL;
        while ((m = (gen_resp *)tc_recv(&t, &deltaserve__v1__generate_response__descriptor))) {
            /* the first token's message says what the prompt cost (prompt and cached tokens) */
            if (n == 0 && m->n_token_ids && m->usage) {
                first_usage = m->usage->prompt_tokens == (uint32_t)p->n_ids &&
                              m->usage->completion_tokens == 0;
                first_cached = m->usage->cached_tokens;
            }
            for (size_t i = 0; i < m->n_token_ids; i++, n++)
                if (n >= 24 || m->token_ids[i] != p->greedy[n]) ok = 0;
            if (last) protobuf_c_message_free_unpacked(&last->base, NULL);
            last = m;
        }
        CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_OK);
        CU_ASSERT_EQUAL(n, 24);
        CU_ASSERT(ok);
        CU_ASSERT_PTR_NOT_NULL_FATAL(last);
        CU_ASSERT_EQUAL(last->finish_reason, DELTASERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH);
        CU_ASSERT_PTR_NOT_NULL_FATAL(last->usage);
        CU_ASSERT_EQUAL(last->usage->prompt_tokens, (uint32_t)p->n_ids);
        CU_ASSERT_EQUAL(last->usage->completion_tokens, 24);
        CU_ASSERT(first_usage);
        CU_ASSERT_EQUAL(last->usage->cached_tokens, first_cached);
        CU_ASSERT(last->usage->cached_tokens < (uint32_t)p->n_ids);
        CU_ASSERT_PTR_NOT_NULL_FATAL(last->timings);
        CU_ASSERT(last->timings->ttft_ms > 0 && last->timings->total_ms >= last->timings->ttft_ms);
        CU_ASSERT(last->timings->decode_ms > 0 && last->timings->mean_itl_ms > 0);
        CU_ASSERT_STRING_EQUAL(last->request_id, "ref");
        CU_ASSERT_NOT_EQUAL(last->seed, 0);
        CU_ASSERT_STRING_EQUAL(last->served_by, worker_service_name(g_ws));
        protobuf_c_message_free_unpacked(&last->base, NULL);
        tc_destroy(&t);
    }
}

/* The end of an allocation-counted call t of max_new tokens (n received), begun when the count
 * was a0: its status OK, the engine idle; the allocations since a0. */
static long call_allocs(tcall *t, long a0, int n, int max_new)
{
    CU_ASSERT_EQUAL(tc_status(t), GRPC_STATUS_OK);
    tc_destroy(t);
    CU_ASSERT(engine_wait_idle(g_engine, 10000));
    const long a1 = testutil_allocs();
    CU_ASSERT_EQUAL(n, max_new);
    return a1 - a0;
}

/* Heap allocations (of the code linked into this binary) over one whole Generate call of
 * max_new tokens with n_logprobs, until the engine is idle again. */
static long stream_allocs(int max_new, int n_logprobs)
{
    gen_req g;
    tcall t;
    make_req(&g, "alloc", &g_prompts[1], max_new);
    g.r.logprobs = (uint32_t)n_logprobs;
    const long a0 = testutil_allocs();
    CU_ASSERT_FATAL(tc_start(&t, g_ch, GEN, &g.r.base, 20000, true));
    int n = 0;
    gen_resp *m;
    while ((m = (gen_resp *)tc_recv(&t, &deltaserve__v1__generate_response__descriptor))) {
        n += (int)m->n_token_ids;
        CU_ASSERT(n_logprobs == 0 || m->n_logprobs == m->n_token_ids);
        protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    return call_allocs(&t, a0, n, max_new);
}

/* The engine's token hand-off and the stream's writer allocate per request (the request's
 * tokens, the stream's arrays), never per token or per message: a 64-token stream allocates as
 * often as a 4-token one, with logprobs too. */
static void test_stream_allocates_per_request(void)
{
    const long before = testutil_allocs();
    void *volatile probe = malloc(16); /* the counter counts (volatile: not optimised out) */
    free(probe);
    CU_ASSERT_EQUAL(testutil_allocs(), before + 1);
    for (int lp = 0; lp <= 5; lp += 5) {
        stream_allocs(4, lp); /* warm: rings and pools reach their size */
        const long few = stream_allocs(4, lp), many = stream_allocs(64, lp);
        CU_ASSERT_EQUAL(many, few);
        CU_ASSERT(few <= 4);
        if (many != few || few > 4)
            fprintf(stderr, "logprobs %d: %ld allocations for 4 tokens, %ld for 64\n", lp, few, many);
    }
}

/* The same over a feed (Worker/Feed): the call's messages as the feed's items, the Generate
 * call carrying the status alone; allocations over the call until the engine is idle. */
static long feed_allocs(tcall *feed, uint64_t feed_id, int max_new)
{
    gen_req g;
    tcall t;
    make_req(&g, "feed", &g_prompts[1], max_new);
    g.r.feed_id = feed_id;
    g.r.feed_tag = 9;
    const long a0 = testutil_allocs();
    CU_ASSERT_FATAL(tc_start(&t, g_ch, GEN, &g.r.base, 20000, true));
    int n = 0, fin = 0;
    while (!fin) {
        Deltaserve__V1__FeedBatch *b =
            (Deltaserve__V1__FeedBatch *)tc_recv(feed, &deltaserve__v1__feed_batch__descriptor);
        CU_ASSERT_PTR_NOT_NULL_FATAL(b);
        for (size_t i = 0; i < b->n_items; i++) {
            CU_ASSERT_EQUAL(b->items[i]->tag, 9);
            const gen_resp *m = b->items[i]->response;
            CU_ASSERT_PTR_NOT_NULL_FATAL(m);
            for (size_t j = 0; j < m->n_token_ids; j++, n++)
                CU_ASSERT(n < max_new && m->token_ids[j] == g_prompts[1].greedy[n]);
            fin |= m->finish_reason != 0;
        }
        protobuf_c_message_free_unpacked(&b->base, NULL);
    }
    CU_ASSERT_PTR_NULL(tc_recv(&t, &deltaserve__v1__generate_response__descriptor)); /* none */
    return call_allocs(&t, a0, n, max_new);
}

/* A stream on a feed allocates per request too, never per token or batch. */
static void test_feed_allocates_per_request(void)
{
    Deltaserve__V1__FeedRequest fr = DELTASERVE__V1__FEED_REQUEST__INIT;
    fr.feed_id = 4242;
    tcall feed;
    CU_ASSERT_FATAL(tc_start(&feed, g_ch, "/deltaserve.v1.Worker/Feed", &fr.base, 60000, true));
    ProtobufCMessage *first = tc_recv(&feed, &deltaserve__v1__feed_batch__descriptor);
    CU_ASSERT_PTR_NOT_NULL_FATAL(first); /* registered */
    CU_ASSERT_EQUAL(((Deltaserve__V1__FeedBatch *)first)->n_items, 0);
    protobuf_c_message_free_unpacked(first, NULL);
    feed_allocs(&feed, fr.feed_id, 4); /* warm */
    const long few = feed_allocs(&feed, fr.feed_id, 4), many = feed_allocs(&feed, fr.feed_id, 24);
    CU_ASSERT_EQUAL(many, few);
    CU_ASSERT(few <= 4);
    if (many != few || few > 4)
        fprintf(stderr, "feed: %ld allocations for 4 tokens, %ld for 24\n", few, many);
    tc_cancel(&feed);
    tc_destroy(&feed);
}

static void test_stop_token_final_message(void)
{
    const wt_prompt *p = &g_prompts[0];
    gen_req g;
    tcall t;
    make_req(&g, "", p, 24);
    int32_t stop = p->greedy[2];
    g.stop.n_stop_token_ids = 1;
    g.stop.stop_token_ids = &stop;
    CU_ASSERT_FATAL(tc_start(&t, g_ch, GEN, &g.r.base, 20000, true));
    gen_resp *m, *last = NULL;
    while ((m = (gen_resp *)tc_recv(&t, &deltaserve__v1__generate_response__descriptor))) {
        if (last) protobuf_c_message_free_unpacked(&last->base, NULL);
        last = m;
    }
    CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(last);
    CU_ASSERT_EQUAL(last->finish_reason, DELTASERVE__V1__FINISH_REASON__FINISH_REASON_STOP);
    CU_ASSERT_EQUAL(last->matched_stop_case, DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_TOKEN_ID);
    CU_ASSERT_EQUAL(last->stop_token_id, stop);
    CU_ASSERT_EQUAL(last->usage->completion_tokens, 3);
    CU_ASSERT_EQUAL(last->request_id[0], 'w'); /* made up by the worker */
    protobuf_c_message_free_unpacked(&last->base, NULL);
    tc_destroy(&t);
}

static void test_invalid_request(void)
{
    gen_req g;
    char msg[256];
    ProtobufCMessage *m;
    make_req(&g, "bad", &g_prompts[0], 24);
    Deltaserve__V1__SamplingParams s = DELTASERVE__V1__SAMPLING_PARAMS__INIT;
    s.top_p = 2;
    g.r.sampling = &s;
    CU_ASSERT_EQUAL(unary(GEN, &g.r.base, &deltaserve__v1__generate_response__descriptor, &m, msg,
                          sizeof msg),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "sampling.top_p"));
    CU_ASSERT_PTR_NULL(m);
    make_req(&g, "bad2", &g_prompts[0], 5000);
    CU_ASSERT_EQUAL(unary(GEN, &g.r.base, &deltaserve__v1__generate_response__descriptor, &m, msg,
                          sizeof msg),
                    GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "stopping.max_new_tokens"));
}

static void test_cancel_frees_slot_and_abort(void)
{
    const wt_prompt *p = &g_prompts[0];
    gen_req g;
    tcall t, u;
    /* client cancel after two tokens */
    CU_ASSERT_FATAL(tc_start(&t, g_ch, GEN, &make_req(&g, "cancel-me", p, 2000)->base, 20000, true));
    for (int i = 0; i < 2; i++) {
        gen_resp *m = (gen_resp *)tc_recv(&t, &deltaserve__v1__generate_response__descriptor);
        CU_ASSERT_PTR_NOT_NULL_FATAL(m);
        protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    tc_cancel(&t);
    CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_CANCELLED);
    tc_destroy(&t);
    CU_ASSERT(wait_load_idle());

    /* Worker/Abort by id: the stream ends with FINISH_REASON_CANCELLED and status OK */
    CU_ASSERT_FATAL(tc_start(&u, g_ch, GEN, &make_req(&g, "abort-me", p, 2000)->base, 20000, true));
    gen_resp *m = (gen_resp *)tc_recv(&u, &deltaserve__v1__generate_response__descriptor);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    Deltaserve__V1__AbortRequest ar = DELTASERVE__V1__ABORT_REQUEST__INIT;
    ar.request_id = "abort-me";
    ProtobufCMessage *reply;
    CU_ASSERT_EQUAL(unary("/deltaserve.v1.Worker/Abort", &ar.base, &deltaserve__v1__abort_response__descriptor,
                          &reply, NULL, 0), GRPC_STATUS_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(reply);
    CU_ASSERT(((Deltaserve__V1__AbortResponse *)reply)->found);
    protobuf_c_message_free_unpacked(reply, NULL);
    gen_resp *last = NULL;
    while ((m = (gen_resp *)tc_recv(&u, &deltaserve__v1__generate_response__descriptor))) {
        if (last) protobuf_c_message_free_unpacked(&last->base, NULL);
        last = m;
    }
    CU_ASSERT_EQUAL(tc_status(&u), GRPC_STATUS_OK);
    CU_ASSERT_PTR_NOT_NULL_FATAL(last);
    CU_ASSERT_EQUAL(last->finish_reason, DELTASERVE__V1__FINISH_REASON__FINISH_REASON_CANCELLED);
    CU_ASSERT(last->usage->completion_tokens < 2000);
    protobuf_c_message_free_unpacked(&last->base, NULL);
    tc_destroy(&u);
    ar.request_id = "abort-me"; /* gone now */
    CU_ASSERT_EQUAL(unary("/deltaserve.v1.Worker/Abort", &ar.base, &deltaserve__v1__abort_response__descriptor,
                          &reply, NULL, 0), GRPC_STATUS_OK);
    CU_ASSERT(reply && !((Deltaserve__V1__AbortResponse *)reply)->found);
    if (reply) protobuf_c_message_free_unpacked(reply, NULL);
    CU_ASSERT(wait_load_idle());
}

/* 2 slots + 1 queue entry: a 4th long request is RESOURCE_EXHAUSTED; then drain ends the rest
 * with UNAVAILABLE and readiness goes NOT_SERVING. */
static void test_queue_full_then_drain(void)
{
    const wt_prompt *p = &g_prompts[0];
    gen_req g[4];
    tcall t[4];
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_FATAL(tc_start(&t[i], g_ch, GEN, &make_req(&g[i], "long", p, 2000)->base, 30000, true));
    }
    /* the first two stream; wait until the third is queued */
    for (int i = 0; i < 2; i++) {
        gen_resp *m = (gen_resp *)tc_recv(&t[i], &deltaserve__v1__generate_response__descriptor);
        CU_ASSERT_PTR_NOT_NULL(m);
        if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    bool queued = false;
    for (int64_t end = clock_now_us() + 10000000; !queued && clock_now_us() < end;) {
        Deltaserve__V1__Load *l = get_load();
        queued = l && l->waiting == 1 && l->running == 2 && l->free_slots == 0;
        /* the two streams hold blocks of the pool */
        if (queued) {
            CU_ASSERT_EQUAL(l->total_kv_blocks, kv_pool_total_blocks(g_backend->kv));
            CU_ASSERT(l->free_kv_blocks < l->total_kv_blocks);
        }
        if (l) protobuf_c_message_free_unpacked(&l->base, NULL);
    }
    CU_ASSERT_FATAL(queued);
    char msg[256];
    ProtobufCMessage *m;
    CU_ASSERT_EQUAL(unary(GEN, &make_req(&g[3], "one-too-many", p, 10)->base,
                          &deltaserve__v1__generate_response__descriptor, &m, msg, sizeof msg),
                    GRPC_STATUS_RESOURCE_EXHAUSTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "queue full"));

    CU_ASSERT_EQUAL(worker_service_drain(g_ws, 0), 3);
    for (int i = 0; i < 3; i++) {
        gen_resp *r;
        while ((r = (gen_resp *)tc_recv(&t[i], &deltaserve__v1__generate_response__descriptor)))
            protobuf_c_message_free_unpacked(&r->base, NULL);
        CU_ASSERT_EQUAL(tc_status(&t[i]), GRPC_STATUS_UNAVAILABLE);
        tc_destroy(&t[i]);
    }
    CU_ASSERT_EQUAL(health("deltaserve.v1.Worker"), 2);
    CU_ASSERT_EQUAL(unary(GEN, &make_req(&g[3], "late", p, 10)->base,
                          &deltaserve__v1__generate_response__descriptor, &m, msg, sizeof msg),
                    GRPC_STATUS_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(msg, "draining"));
    Deltaserve__V1__Load *l = get_load();
    CU_ASSERT(l && l->draining);
    if (l) protobuf_c_message_free_unpacked(&l->base, NULL);
}

static int suite_init(void)
{
    char path[PATH_MAX];
    status st;
    wt_reference_path(path, sizeof path, "tiny-r2-tied", ".gguf");
    if (wt_load_prompts("tiny-r2-tied", g_prompts, WT_MAX_PROMPTS) != 4) return -1;
    if (worker_service_create(&(worker_service_opts){.listen = "127.0.0.1:0", .name = "test-worker"},
                              &g_ws, &st) ||
        qwen35_model_load(&g_model, path, &st))
        return fprintf(stderr, "%s\n", st.msg), -1;
    worker_backend_opts bo = {.n_slots = 2, .n_ctx = 2048, .n_threads = 2, .max_prefill_tokens = 64};
    if (worker_backend_create("cpu", g_model, &bo, &g_backend, &st) ||
        engine_create(g_backend, &(engine_opts){.queue = 1, .step_tokens = 64}, &g_engine, &st))
        return fprintf(stderr, "%s\n", st.msg), -1;
    g_ch = tc_channel(worker_service_port(g_ws));
    return 0;
}

static int suite_clean(void)
{
    grpc_channel_destroy(g_ch);
    worker_service_destroy(g_ws);
    engine_destroy(g_engine);
    worker_backend_destroy(g_backend);
    qwen35_model_free(g_model);
    return 0;
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("worker_service", suite_init, suite_clean);
    CU_add_test(s, "loading_state", test_loading_state);
    CU_add_test(s, "model_info", test_model_info);
    CU_add_test(s, "stream_matches_reference", test_stream_matches_reference);
    CU_add_test(s, "stream_allocates_per_request", test_stream_allocates_per_request);
    CU_add_test(s, "feed_allocates_per_request", test_feed_allocates_per_request);
    CU_add_test(s, "stop_token_final_message", test_stop_token_final_message);
    CU_add_test(s, "invalid_request", test_invalid_request);
    CU_add_test(s, "cancel_frees_slot_and_abort", test_cancel_frees_slot_and_abort);
    CU_add_test(s, "queue_full_then_drain", test_queue_full_then_drain);
    return testutil_cunit_run();
}
