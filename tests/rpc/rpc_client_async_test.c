/* rpc_client_async on a server's own completion-queue threads (rpc_server_opts.cq_threads 3):
 * a stream's messages arrive in order and its END carries OK, every event on the thread of the
 * queue it was started on; a cancel from another thread ends a stream the server never ends
 * (CANCELLED, the server's on_cancel runs); a deadline ends it DEADLINE_EXCEEDED; one struct
 * runs calls one after another, the next started from the END of the last; a server that is
 * held (rpc_server_hold) keeps its threads through a shutdown until it is unheld. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "common/clock.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "rpc/rpc_client.h"
#include "rpc/rpc_server.h"
#include "tests/testutil/testutil.h"

#define PATH "/deltaserve.v1.Worker/Generate"
#define N_CQ 3

static rpc_server *g_srv;
static rpc_client_channel *g_ch;

/* Server side: max_new_tokens messages of one token each (the token = its index) and OK; 0:
 * one message and the call stays open until cancelled. */
static atomic_int g_cancels;     /* on_cancel calls */
static atomic_int g_open_calls;  /* calls the server left open, finished at cancel */

static void on_req(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    (void)user;
    const Deltaserve__V1__WorkerGenerateRequest *req = (const void *)msg;
    uint32_t n = req->stopping ? req->stopping->max_new_tokens : 0;
    Deltaserve__V1__GenerateResponse m = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    int32_t tok;
    m.n_token_ids = 1;
    m.token_ids = &tok;
    if (n == 0) {
        tok = 7;
        rpc_call_send(call, &m.base);
        atomic_fetch_add(&g_open_calls, 1);
        return; /* finished by on_cancel */
    }
    for (uint32_t i = 0; i < n; i++) {
        tok = (int32_t)i;
        rpc_call_send(call, &m.base);
    }
    rpc_call_finish(call, GRPC_STATUS_OK, NULL);
}

static void on_cancel(rpc_call *call, void *user)
{
    (void)user;
    atomic_fetch_add(&g_cancels, 1);
    if (atomic_fetch_sub(&g_open_calls, 1) > 0) rpc_call_finish(call, GRPC_STATUS_CANCELLED, "bye");
    else atomic_fetch_add(&g_open_calls, 1);
}

/* Client side: what one async struct saw. */
typedef struct seen {
    rpc_client_async *a;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_msgs, in_order, ends, first_token;
    pthread_t thread;  /* the thread of the first event */
    int one_thread;    /* every event on it */
    int code;
    char msg[512];
    int again;         /* calls still to start from END (test_calls_one_after_another) */
    int again_n;
    void *cq;
} seen;

static void on_event(void *user, rpc_client_async_event ev)
{
    seen *s = user;
    pthread_mutex_lock(&s->mu);
    if (s->n_msgs == 0 && s->ends == 0) s->thread = pthread_self();
    else if (!pthread_equal(s->thread, pthread_self())) s->one_thread = 0;
    if (ev == RPC_CLIENT_ASYNC_MESSAGE) {
        ProtobufCMessage *pm = rpc_client_async_take(s->a, &deltaserve__v1__generate_response__descriptor);
        if (pm) {
            const Deltaserve__V1__GenerateResponse *m = (const void *)pm;
            if (m->n_token_ids != 1 || (s->first_token < 0 && m->token_ids[0] != s->n_msgs))
                s->in_order = 0;
            s->n_msgs++;
            protobuf_c_message_free_unpacked(pm, NULL);
            rpc_client_async_read(s->a);
        }
    } else {
        s->ends++;
        const rpc_client_result *r = rpc_client_async_result(s->a);
        s->code = r->code;
        snprintf(s->msg, sizeof s->msg, "%s", r->message);
        if (s->again > 0) {
            s->again--;
            Deltaserve__V1__WorkerGenerateRequest req = DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
            Deltaserve__V1__StoppingCriteria stop = DELTASERVE__V1__STOPPING_CRITERIA__INIT;
            stop.max_new_tokens = (uint32_t)s->again_n;
            req.stopping = &stop;
            status st;
            if (rpc_client_async_start(s->a, s->cq, g_ch, PATH, &req.base, CLOCK_NO_DEADLINE, &st))
                s->again = -1;
        }
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void seen_init(seen *s, void *cq)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->in_order = 1;
    s->one_thread = 1;
    s->first_token = -1;
    s->cq = cq;
    status st;
    CU_ASSERT_FATAL(rpc_client_async_create(&s->a, on_event, s, &st) == 0);
}

static void seen_free(seen *s)
{
    rpc_client_async_destroy(s->a);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

static int start(seen *s, int n, int64_t deadline_ms)
{
    Deltaserve__V1__WorkerGenerateRequest req = DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    Deltaserve__V1__StoppingCriteria stop = DELTASERVE__V1__STOPPING_CRITERIA__INIT;
    stop.max_new_tokens = (uint32_t)n;
    req.stopping = &stop;
    status st;
    pthread_mutex_lock(&s->mu);
    int rc = rpc_client_async_start(s->a, s->cq, g_ch, PATH, &req.base, deadline_ms, &st);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Waits (10 s at most) until s saw `ends` ENDs and `msgs` messages; 0 when it did. */
static int wait_for(seen *s, int ends, int msgs)
{
    int64_t end = clock_deadline_ms(10000);
    struct timespec ts = clock_timespec_ms(end);
    pthread_mutex_lock(&s->mu);
    while ((s->ends < ends || s->n_msgs < msgs) && !clock_expired(end))
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    int ok = s->ends >= ends && s->n_msgs >= msgs;
    pthread_mutex_unlock(&s->mu);
    return ok ? 0 : -1;
}

static void test_stream_in_order_on_its_queue(void)
{
    for (int q = 0; q < N_CQ; q++) {
        seen s;
        seen_init(&s, rpc_server_cq(g_srv, q));
        CU_ASSERT_FATAL(start(&s, 200, CLOCK_NO_DEADLINE) == 0);
        CU_ASSERT_FATAL(wait_for(&s, 1, 0) == 0);
        CU_ASSERT_EQUAL(s.n_msgs, 200);
        CU_ASSERT(s.in_order);
        CU_ASSERT(s.one_thread);
        CU_ASSERT_EQUAL(s.ends, 1);
        CU_ASSERT_EQUAL(s.code, GRPC_STATUS_OK);
        CU_ASSERT_EQUAL(rpc_client_async_n_received(s.a), 200);
        seen_free(&s);
    }
}

static void test_cancel_from_another_thread(void)
{
    seen s;
    seen_init(&s, rpc_server_cq(g_srv, 1));
    int cancels = atomic_load(&g_cancels);
    CU_ASSERT_FATAL(start(&s, 0, CLOCK_NO_DEADLINE) == 0);
    CU_ASSERT_FATAL(wait_for(&s, 0, 1) == 0); /* the server's one message */
    CU_ASSERT_EQUAL(s.ends, 0);                /* the call stays open */
    rpc_client_async_cancel(s.a);
    CU_ASSERT_FATAL(wait_for(&s, 1, 1) == 0);
    CU_ASSERT_EQUAL(s.code, GRPC_STATUS_CANCELLED);
    int64_t end = clock_deadline_ms(10000);
    while (atomic_load(&g_cancels) == cancels && !clock_expired(end)) sched_yield();
    CU_ASSERT_EQUAL(atomic_load(&g_cancels), cancels + 1); /* the server heard it */
    rpc_client_async_cancel(s.a); /* after END: no call, nothing happens */
    seen_free(&s);
}

static void test_deadline(void)
{
    seen s;
    seen_init(&s, rpc_server_cq(g_srv, 2));
    int64_t t0 = clock_now_ms();
    CU_ASSERT_FATAL(start(&s, 0, clock_deadline_ms(200)) == 0);
    CU_ASSERT_FATAL(wait_for(&s, 1, 0) == 0);
    CU_ASSERT_EQUAL(s.code, GRPC_STATUS_DEADLINE_EXCEEDED);
    CU_ASSERT(clock_now_ms() - t0 >= 150);
    seen_free(&s);
}

static void test_calls_one_after_another(void)
{
    seen s;
    seen_init(&s, rpc_server_cq(g_srv, 0));
    s.again = 4; /* four more, each started from the END of the one before */
    s.again_n = 10;
    s.first_token = 0; /* tokens restart at 0 per call: not checked against the running count */
    CU_ASSERT_FATAL(start(&s, 10, CLOCK_NO_DEADLINE) == 0);
    CU_ASSERT_FATAL(wait_for(&s, 5, 50) == 0);
    CU_ASSERT_EQUAL(s.again, 0);
    CU_ASSERT_EQUAL(s.n_msgs, 50);
    CU_ASSERT_EQUAL(s.code, GRPC_STATUS_OK);
    CU_ASSERT(s.one_thread);
    seen_free(&s);
}

/* Last: the shutdown waits for the hold. A call started on the queue after the server's own
 * calls all ended still gets its END (the threads run until unheld). */
static void test_hold_keeps_threads_through_shutdown(void)
{
    rpc_server_hold(g_srv);
    seen s;
    seen_init(&s, rpc_server_cq(g_srv, 1));
    CU_ASSERT_FATAL(start(&s, 0, CLOCK_NO_DEADLINE) == 0);
    CU_ASSERT_FATAL(wait_for(&s, 0, 1) == 0);
    pthread_t th;
    CU_ASSERT_FATAL(pthread_create(&th, NULL, (void *(*)(void *))rpc_server_shutdown, g_srv) == 0);
    /* the server cancels its side at shutdown: the client's call ends, on a live thread */
    CU_ASSERT(wait_for(&s, 1, 1) == 0);
    CU_ASSERT_NOT_EQUAL(s.code, GRPC_STATUS_OK);
    seen_free(&s);
    rpc_server_unhold(g_srv);
    pthread_join(th, NULL);
}

static int suite_init(void)
{
    status st;
    rpc_method m = {.path = PATH, .request_desc = &deltaserve__v1__worker_generate_request__descriptor,
                    .kind = RPC_METHOD_SERVER_STREAM, .on_request = on_req, .on_cancel = on_cancel};
    if (rpc_server_create(&(rpc_server_opts){.listen = "127.0.0.1:0", .max_calls = 64,
                                             .cq_threads = N_CQ},
                          &g_srv, &st) ||
        rpc_server_add_method(g_srv, &m, &st) || rpc_server_start(g_srv, &st))
        return fprintf(stderr, "%s\n", st.msg), -1;
    if (rpc_server_n_cqs(g_srv) != N_CQ) return fprintf(stderr, "queues\n"), -1;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", rpc_server_port(g_srv));
    if (rpc_client_channel_create(&g_ch, addr, &st)) return fprintf(stderr, "%s\n", st.msg), -1;
    return 0;
}

static int suite_clean(void)
{
    rpc_client_channel_destroy(g_ch);
    rpc_server_destroy(g_srv);
    return 0;
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("rpc_client_async", suite_init, suite_clean);
    CU_add_test(s, "stream_in_order_on_its_queue", test_stream_in_order_on_its_queue);
    CU_add_test(s, "cancel_from_another_thread", test_cancel_from_another_thread);
    CU_add_test(s, "deadline", test_deadline);
    CU_add_test(s, "calls_one_after_another", test_calls_one_after_another);
    CU_add_test(s, "hold_keeps_threads_through_shutdown", test_hold_keeps_threads_through_shutdown);
    return testutil_cunit_run();
}
