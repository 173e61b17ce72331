/* rpc_server + health + reflection over loopback with a raw gRPC C core client: streams in
 * order, cancellation and deadlines reach the producer, errors always reach the client (with
 * initial metadata), unknown methods are UNIMPLEMENTED, health Check/Watch, reflection v1 and
 * v1alpha, every call released afterwards, shutdown with open streams; graceful shutdown: a
 * stream whose final messages and status are queued but not yet written still ends OK with
 * every message, open-ended streams (Watch) end at once, a stream that outlives the grace is
 * ended UNAVAILABLE; a cork scope sends the messages of many streams on one connection in a few
 * TCP segments, and they arrive (IPv4, and IPv4 and IPv6 clients of a dual-stack server). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <CUnit/Basic.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "proto/grpc/health/v1/health.pb-c.h"
#include "proto/grpc/reflection/v1alpha/reflection.pb-c.h"
#include "proto/proto_descriptors.h"
#include "rpc/rpc_health.h"
#include "rpc/rpc_reflection.h"
#include "rpc/rpc_server.h"
#include "rpc/rpc_status.h"
#include "tests/rpc/rpc_test_client.h"
#include "tests/testutil/testutil.h"

#define STREAM_PATH "/deltaserve.v1.Worker/Generate"
#define UNARY_PATH "/deltaserve.v1.Worker/Abort"

static rpc_server *g_srv;
static rpc_health *g_health;
static rpc_reflection *g_refl;
static grpc_channel *g_ch;

/* What the last streaming producer saw (guarded by g_mu). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_producer_done;      /* producers finished */
static int g_last_send_rc;       /* rc of the producer's last rpc_call_send */
static int g_cancel_callbacks;   /* on_cancel calls */
static int g_releases;           /* on_release calls */

typedef struct producer {
    rpc_call *call;
    int n;
    bool hold; /* send one message, then wait for cancellation */
    bool big;  /* every message carries BIG_TEXT bytes of text */
    bool cancelled; /* set by on_cancel under g_mu */
} producer;

#define BIG_TEXT (64 << 10)
static char g_big_text[BIG_TEXT + 1];

static void *produce(void *arg)
{
    producer *p = arg;
    int rc = 0;
    for (int i = 0; i < p->n; i++) {
        Deltaserve__V1__GenerateResponse r = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
        int32_t id = i;
        r.n_token_ids = 1;
        r.token_ids = &id;
        if (p->big) r.text = g_big_text;
        if (i == p->n - 1) r.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH;
        rc = rpc_call_send(p->call, &r.base);
        if (p->hold) {
            pthread_mutex_lock(&g_mu);
            while (!p->cancelled) pthread_cond_wait(&g_cv, &g_mu);
            pthread_mutex_unlock(&g_mu);
            CU_ASSERT(rpc_call_cancelled(p->call));
            rc = rpc_call_send(p->call, &r.base); /* after cancel: refused */
            break;
        }
    }
    rpc_call_finish(p->call, GRPC_STATUS_OK, NULL);
    pthread_mutex_lock(&g_mu);
    g_last_send_rc = rc;
    g_producer_done++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

/* Streams with request_id "park": kept here (under g_mu) for the test to send on. */
enum { N_PARK = 32 };
static rpc_call *g_parked[N_PARK];
static int g_n_parked;

static void on_stream(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    const Deltaserve__V1__WorkerGenerateRequest *req = (const void *)msg;
    producer *p = calloc(1, sizeof *p);
    if (!strcmp(req->request_id, "park")) {
        rpc_call_set_data(call, p);
        pthread_mutex_lock(&g_mu);
        if (g_n_parked < N_PARK) g_parked[g_n_parked++] = call;
        pthread_cond_broadcast(&g_cv);
        pthread_mutex_unlock(&g_mu);
        return;
    }
    p->call = call;
    p->n = req->stopping ? (int)req->stopping->max_new_tokens : 1;
    p->hold = strcmp(req->request_id, "hold") == 0;
    p->big = strcmp(req->request_id, "big") == 0;
    rpc_call_set_data(call, p); /* freed in on_release: on_cancel may use it until then */
    pthread_t t;
    pthread_create(&t, NULL, produce, p);
    pthread_detach(t);
}

static void on_stream_cancel(rpc_call *call, void *user)
{
    producer *p = rpc_call_data(call);
    pthread_mutex_lock(&g_mu);
    p->cancelled = true;
    g_cancel_callbacks++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void on_stream_release(rpc_call *call, void *user)
{
    free(rpc_call_data(call));
    pthread_mutex_lock(&g_mu);
    g_releases++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Unary: fails with INVALID naming a field unless request_id is "ok". */
static void on_unary(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    const Deltaserve__V1__AbortRequest *req = (const void *)msg;
    if (strcmp(req->request_id, "ok") != 0) {
        status st;
        status_fail(&st, STATUS_INVALID, "request_id: must be 'ok', got '%s'", req->request_id);
        rpc_call_finish_status(call, &st);
        return;
    }
    Deltaserve__V1__AbortResponse r = DELTASERVE__V1__ABORT_RESPONSE__INIT;
    r.found = 1;
    rpc_call_reply(call, &r.base);
}

static int wait_producers(int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&g_mu);
    int rc = 0;
    while (g_producer_done < n && rc == 0) rc = pthread_cond_timedwait(&g_cv, &g_mu, &ts);
    int done = g_producer_done;
    pthread_mutex_unlock(&g_mu);
    return done;
}

/* Waits (bounded) until the server holds no call. */
static int wait_no_live_calls(void)
{
    int64_t end = clock_now_ms() + 10000;
    while (rpc_server_live_calls(g_srv) != 0 && clock_now_ms() < end) sched_yield();
    return rpc_server_live_calls(g_srv);
}

static int start_server(rpc_server **srv, rpc_health **h, rpc_reflection **r)
{
    status st;
    static const char *ready[] = {"deltaserve.v1.Worker"};
    static const char *services[] = {"deltaserve.v1.Worker", "grpc.health.v1.Health",
                                     "grpc.reflection.v1alpha.ServerReflection"};
    if (rpc_server_create(&(rpc_server_opts){.listen = "127.0.0.1:0", .max_calls = 64}, srv, &st))
        return fprintf(stderr, "%s\n", st.msg), -1;
    rpc_method stream = {STREAM_PATH, &deltaserve__v1__worker_generate_request__descriptor,
                         RPC_METHOD_SERVER_STREAM, on_stream, on_stream_cancel, on_stream_release,
                         NULL, false};
    rpc_method unary = {UNARY_PATH, &deltaserve__v1__abort_request__descriptor, RPC_METHOD_UNARY,
                        on_unary, NULL, NULL, NULL, false};
    if (rpc_server_add_method(*srv, &stream, &st) || rpc_server_add_method(*srv, &unary, &st) ||
        rpc_health_create(ready, 1, h, &st) || rpc_health_add_methods(*h, *srv, &st) ||
        rpc_reflection_create(proto_descriptors_data, proto_descriptors_bytes, services, 3, r, &st) ||
        rpc_reflection_add_methods(*r, *srv, &st) || rpc_server_start(*srv, &st))
        return fprintf(stderr, "%s\n", st.msg), -1;
    return 0;
}

static int suite_init(void)
{
    if (start_server(&g_srv, &g_health, &g_refl)) return -1;
    g_ch = tc_channel(rpc_server_port(g_srv));
    return 0;
}

static int suite_clean(void)
{
    grpc_channel_destroy(g_ch);
    rpc_server_shutdown(g_srv);
    rpc_health_destroy(g_health);
    rpc_reflection_destroy(g_refl);
    rpc_server_destroy(g_srv);
    return 0;
}

static Deltaserve__V1__WorkerGenerateRequest *stream_req(const char *id, int n,
                                                        Deltaserve__V1__StoppingCriteria *stop)
{
    static Deltaserve__V1__WorkerGenerateRequest req;
    req = (Deltaserve__V1__WorkerGenerateRequest)DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    *stop = (Deltaserve__V1__StoppingCriteria)DELTASERVE__V1__STOPPING_CRITERIA__INIT;
    stop->max_new_tokens = (uint32_t)n;
    req.request_id = (char *)id;
    req.stopping = stop;
    return &req;
}

static void test_stream_in_order(void)
{
    Deltaserve__V1__StoppingCriteria stop;
    tcall t;
    int before = wait_producers(0);
    CU_ASSERT_FATAL(tc_start(&t, g_ch, STREAM_PATH, &stream_req("s", 200, &stop)->base, 10000, true));
    int n = 0, in_order = 1, last_finish = -1;
    Deltaserve__V1__GenerateResponse *m;
    while ((m = (void *)tc_recv(&t, &deltaserve__v1__generate_response__descriptor))) {
        if (m->n_token_ids != 1 || m->token_ids[0] != n) in_order = 0;
        last_finish = m->finish_reason;
        n++;
        protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    CU_ASSERT_EQUAL(n, 200);
    CU_ASSERT(in_order);
    CU_ASSERT_EQUAL(last_finish, DELTASERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH);
    CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_OK);
    tc_destroy(&t);
    CU_ASSERT_EQUAL(wait_producers(before + 1), before + 1);
    CU_ASSERT_EQUAL(wait_no_live_calls(), 0);
}

/* n < 0: forgets the parked calls; else waits (10 s at most) until n are parked. */
static int wait_parked(int n)
{
    const int64_t end = clock_now_ms() + 10000;
    pthread_mutex_lock(&g_mu);
    if (n < 0) g_n_parked = 0;
    while (g_n_parked < n && clock_now_ms() < end) {
        pthread_mutex_unlock(&g_mu);
        sched_yield();
        pthread_mutex_lock(&g_mu);
    }
    const int parked = g_n_parked;
    pthread_mutex_unlock(&g_mu);
    return parked;
}

/* The data segments a TCP socket has sent (TCP_INFO), -1 if unknown. */
static long data_segs_out(int fd)
{
    struct tcp_info ti;
    socklen_t n = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &n) != 0) return -1;
    return (long)ti.tcpi_data_segs_out;
}

static void send_token(rpc_call *call, int32_t id)
{
    Deltaserve__V1__GenerateResponse r = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    r.n_token_ids = 1;
    r.token_ids = &id;
    CU_ASSERT_EQUAL(rpc_call_send(call, &r.base), STATUS_OK);
}

/* every stream's next message carries token base + its index */
static bool recv_tokens(tcall *t, int base)
{
    bool ok = true;
    for (int i = 0; i < N_PARK; i++) {
        Deltaserve__V1__GenerateResponse *m =
            (void *)tc_recv(&t[i], &deltaserve__v1__generate_response__descriptor);
        ok = ok && m && m->n_token_ids == 1 && m->token_ids[0] == base + i;
        if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    return ok;
}

/* N_PARK streams on one connection: a lone message in a cork scope leaves at once; one message
 * each inside a scope leaves in a few TCP segments, right at the scope's end; the same sends without the scope take many more (about
 * one each, fewer where the kernel merges a few); every message arrives, in order. */
static void test_cork_coalesces_writes(void)
{
    Deltaserve__V1__StoppingCriteria stop;
    tcall t[N_PARK];
    wait_parked(-1);
    for (int i = 0; i < N_PARK; i++)
        CU_ASSERT_FATAL(tc_start(&t[i], g_ch, STREAM_PATH, &stream_req("park", 1, &stop)->base,
                                 10000, true));
    CU_ASSERT_FATAL(wait_parked(N_PARK) == N_PARK);
    const int fd = rpc_call_socket(g_parked[0]);
    CU_ASSERT_FATAL(fd >= 0);
    for (int i = 1; i < N_PARK; i++) CU_ASSERT_EQUAL(rpc_call_socket(g_parked[i]), fd);

    long s0 = data_segs_out(fd);
    rpc_cork_begin();
    send_token(g_parked[0], -1);
    const long lone = data_segs_out(fd) - s0;
    rpc_cork_end();
    CU_ASSERT_EQUAL(lone, 1);
    Deltaserve__V1__GenerateResponse *m =
        (void *)tc_recv(&t[0], &deltaserve__v1__generate_response__descriptor);
    CU_ASSERT(m && m->n_token_ids == 1 && m->token_ids[0] == -1);
    if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
    nanosleep(&(struct timespec){0, 50 * 1000000}, NULL); /* its send's completion is in */

    s0 = data_segs_out(fd);
    rpc_cork_begin();
    for (int i = 0; i < N_PARK; i++) send_token(g_parked[i], i);
    rpc_cork_end();
    const long s1 = data_segs_out(fd);
    printf("\n  %d messages: %ld segments in a cork scope", N_PARK, s1 - s0);
    CU_ASSERT(s0 >= 0 && s1 - s0 >= 1 && s1 - s0 <= 4);
    CU_ASSERT(recv_tokens(t, 0));

    nanosleep(&(struct timespec){0, 50 * 1000000}, NULL); /* the sends' completions are in */
    const long s2 = data_segs_out(fd);
    for (int i = 0; i < N_PARK; i++) send_token(g_parked[i], 100 + i);
    const long s3 = data_segs_out(fd);
    printf(", %ld without", s3 - s2);
    CU_ASSERT(s3 - s2 >= N_PARK / 4);
    CU_ASSERT(recv_tokens(t, 100));

    for (int i = 0; i < N_PARK; i++) rpc_call_finish(g_parked[i], GRPC_STATUS_OK, NULL);
    for (int i = 0; i < N_PARK; i++) {
        CU_ASSERT_EQUAL(tc_status(&t[i]), GRPC_STATUS_OK);
        tc_destroy(&t[i]);
    }
    CU_ASSERT_EQUAL(wait_no_live_calls(), 0);
}

/* A server on the IPv6 wildcard (dual stack): the socket of a call from an IPv4 client (an
 * IPv4-mapped peer) and of one from ::1 is found, and a cork scope's messages to both arrive. */
static void test_cork_dual_stack(void)
{
    rpc_server *srv;
    status st;
    if (rpc_server_create(&(rpc_server_opts){.listen = "[::]:0", .max_calls = 8}, &srv, &st)) {
        printf("\n  no IPv6 here (%s): skipped", st.msg); /* a host without it */
        return;
    }
    rpc_method stream = {STREAM_PATH, &deltaserve__v1__worker_generate_request__descriptor,
                         RPC_METHOD_SERVER_STREAM, on_stream, on_stream_cancel, on_stream_release,
                         NULL, false};
    CU_ASSERT_FATAL(!rpc_server_add_method(srv, &stream, &st) && !rpc_server_start(srv, &st));
    char target[64];
    snprintf(target, sizeof target, "[::1]:%d", rpc_server_port(srv));
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch[2] = {tc_channel(rpc_server_port(srv)), grpc_channel_create(target, cr, NULL)};
    grpc_channel_credentials_release(cr);
    Deltaserve__V1__StoppingCriteria stop;
    tcall t[2];
    wait_parked(-1);
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_FATAL(tc_start(&t[i], ch[i], STREAM_PATH, &stream_req("park", 1, &stop)->base,
                                 10000, true));
        CU_ASSERT_FATAL(wait_parked(i + 1) == i + 1);
    }
    const int fd0 = rpc_call_socket(g_parked[0]), fd1 = rpc_call_socket(g_parked[1]);
    CU_ASSERT(fd0 >= 0 && fd1 >= 0 && fd0 != fd1);
    rpc_cork_begin();
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 2; i++) send_token(g_parked[i], 10 * i + k);
    rpc_cork_end();
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 2; k++) {
            Deltaserve__V1__GenerateResponse *m =
                (void *)tc_recv(&t[i], &deltaserve__v1__generate_response__descriptor);
            CU_ASSERT(m && m->n_token_ids == 1 && m->token_ids[0] == 10 * i + k);
            if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
        }
        rpc_call_finish(g_parked[i], GRPC_STATUS_OK, NULL);
    }
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_EQUAL(tc_status(&t[i]), GRPC_STATUS_OK);
        tc_destroy(&t[i]);
        grpc_channel_destroy(ch[i]);
    }
    rpc_server_shutdown(srv);
    rpc_server_destroy(srv);
}

static void test_cancel_reaches_producer(void)
{
    Deltaserve__V1__StoppingCriteria stop;
    tcall t;
    int before = wait_producers(0);
    pthread_mutex_lock(&g_mu);
    int cb_before = g_cancel_callbacks, rel_before = g_releases;
    pthread_mutex_unlock(&g_mu);
    CU_ASSERT_FATAL(tc_start(&t, g_ch, STREAM_PATH, &stream_req("hold", 5, &stop)->base, 10000, true));
    Deltaserve__V1__GenerateResponse *m = (void *)tc_recv(&t, &deltaserve__v1__generate_response__descriptor);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    tc_cancel(&t);
    CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_CANCELLED);
    tc_destroy(&t);
    CU_ASSERT_EQUAL(wait_producers(before + 1), before + 1);
    CU_ASSERT_EQUAL(wait_no_live_calls(), 0);
    pthread_mutex_lock(&g_mu);
    CU_ASSERT_EQUAL(g_cancel_callbacks, cb_before + 1);
    CU_ASSERT_EQUAL(g_releases, rel_before + 1);
    CU_ASSERT_EQUAL(g_last_send_rc, STATUS_CANCELLED);
    pthread_mutex_unlock(&g_mu);
}

static void test_deadline_reaches_producer(void)
{
    Deltaserve__V1__StoppingCriteria stop;
    tcall t;
    int before = wait_producers(0);
    CU_ASSERT_FATAL(tc_start(&t, g_ch, STREAM_PATH, &stream_req("hold", 5, &stop)->base, 300, true));
    CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_DEADLINE_EXCEEDED);
    tc_destroy(&t);
    CU_ASSERT_EQUAL(wait_producers(before + 1), before + 1);
    CU_ASSERT_EQUAL(g_last_send_rc, STATUS_CANCELLED);
    CU_ASSERT_EQUAL(wait_no_live_calls(), 0);
}

static void test_unknown_method_is_unimplemented(void)
{
    tcall t;
    Deltaserve__V1__AbortRequest req = DELTASERVE__V1__ABORT_REQUEST__INIT;
    CU_ASSERT_FATAL(tc_start(&t, g_ch, "/deltaserve.v1.Nope/Nothing", &req.base, 5000, true));
    CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_UNIMPLEMENTED); /* not DEADLINE_EXCEEDED */
    CU_ASSERT_PTR_NOT_NULL(strstr(t.message, "/deltaserve.v1.Nope/Nothing"));
    tc_destroy(&t);
}

static void test_unary_reply_and_error_status(void)
{
    tcall t;
    Deltaserve__V1__AbortRequest req = DELTASERVE__V1__ABORT_REQUEST__INIT;
    req.request_id = "ok";
    CU_ASSERT_FATAL(tc_start(&t, g_ch, UNARY_PATH, &req.base, 5000, true));
    Deltaserve__V1__AbortResponse *r = (void *)tc_recv(&t, &deltaserve__v1__abort_response__descriptor);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT(r->found);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_OK);
    tc_destroy(&t);

    req.request_id = "bad";
    CU_ASSERT_FATAL(tc_start(&t, g_ch, UNARY_PATH, &req.base, 5000, true));
    CU_ASSERT_PTR_NULL(tc_recv(&t, &deltaserve__v1__abort_response__descriptor));
    CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_STRING_EQUAL(t.message, "request_id: must be 'ok', got 'bad'");
    tc_destroy(&t);
}

static void test_unparsable_request(void)
{
    /* A message whose bytes are not a valid WorkerGenerateRequest: field 1 (string) with a
     * length running past the end. Sent as raw bytes through a HealthCheckRequest-shaped
     * buffer is not possible, so build the byte buffer by hand. */
    tcall t;
    memset(&t, 0, sizeof t);
    t.cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice m = grpc_slice_from_static_string(STREAM_PATH);
    t.call = grpc_channel_create_call(g_ch, NULL, GRPC_PROPAGATE_DEFAULTS, t.cq, m, NULL,
                                      tc_in_ms(5000), NULL);
    grpc_metadata_array_init(&t.md_init);
    grpc_metadata_array_init(&t.md_trail);
    static const uint8_t bad[] = {0x0a, 0x7f, 'x'};
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)bad, sizeof bad);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &t.md_init;
    CU_ASSERT(tc_batch(&t, ops, 4));
    grpc_byte_buffer_destroy(bb);
    int code = tc_status(&t);
    CU_ASSERT_EQUAL(code, GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_PTR_NOT_NULL(strstr(t.message, "WorkerGenerateRequest"));
    if (code != GRPC_STATUS_INVALID_ARGUMENT) printf("status %d '%s'\n", code, t.message);
    tc_destroy(&t);
}

static int health_check(const char *service, int *serving_status)
{
    tcall t;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    if (!tc_start(&t, g_ch, "/grpc.health.v1.Health/Check", &req.base, 5000, true)) return -1;
    Grpc__Health__V1__HealthCheckResponse *r =
        (void *)tc_recv(&t, &grpc__health__v1__health_check_response__descriptor);
    *serving_status = r ? (int)r->status : -1;
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    int code = tc_status(&t);
    tc_destroy(&t);
    return code;
}

static int watch_next(tcall *t)
{
    Grpc__Health__V1__HealthCheckResponse *r =
        (void *)tc_recv(t, &grpc__health__v1__health_check_response__descriptor);
    int s = r ? (int)r->status : -1;
    if (r) protobuf_c_message_free_unpacked(&r->base, NULL);
    return s;
}

static void test_health_check_and_watch(void)
{
    enum { SERVING = 1, NOT_SERVING = 2, SERVICE_UNKNOWN = 3 };
    int s;
    CU_ASSERT_EQUAL(health_check("", &s), GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(s, SERVING);
    CU_ASSERT_EQUAL(health_check("deltaserve.v1.Worker", &s), GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(s, NOT_SERVING);
    CU_ASSERT_EQUAL(health_check("no.such.Service", &s), GRPC_STATUS_NOT_FOUND);

    tcall w;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "deltaserve.v1.Worker";
    CU_ASSERT_FATAL(tc_start(&w, g_ch, "/grpc.health.v1.Health/Watch", &req.base, 10000, true));
    CU_ASSERT_EQUAL(watch_next(&w), NOT_SERVING);
    rpc_health_set_ready(g_health, true);
    CU_ASSERT_EQUAL(watch_next(&w), SERVING);
    CU_ASSERT_EQUAL(health_check("deltaserve.v1.Worker", &s), GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(s, SERVING);
    rpc_health_set(g_health, "deltaserve.v1.Worker", false);
    CU_ASSERT_EQUAL(watch_next(&w), NOT_SERVING);

    tcall u; /* unknown service: SERVICE_UNKNOWN, stream stays open */
    req.service = "no.such.Service";
    CU_ASSERT_FATAL(tc_start(&u, g_ch, "/grpc.health.v1.Health/Watch", &req.base, 10000, true));
    CU_ASSERT_EQUAL(watch_next(&u), SERVICE_UNKNOWN);
    CU_ASSERT_EQUAL(rpc_health_n_watchers(g_health), 2);
    tc_cancel(&u);
    tc_cancel(&w);
    CU_ASSERT_EQUAL(tc_status(&u), GRPC_STATUS_CANCELLED);
    CU_ASSERT_EQUAL(tc_status(&w), GRPC_STATUS_CANCELLED);
    tc_destroy(&u);
    tc_destroy(&w);
    CU_ASSERT_EQUAL(wait_no_live_calls(), 0);
    CU_ASSERT_EQUAL(rpc_health_n_watchers(g_health), 0);
}

typedef Grpc__Reflection__V1alpha__ServerReflectionRequest refl_req;
typedef Grpc__Reflection__V1alpha__ServerReflectionResponse refl_resp;

static refl_resp *refl_ask(tcall *t, refl_req *req)
{
    if (!tc_send(t, &req->base)) return NULL;
    return (void *)tc_recv(t, &grpc__reflection__v1alpha__server_reflection_response__descriptor);
}

static void reflection_on(const char *path)
{
    tcall t;
    refl_req req = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__INIT;
    CU_ASSERT_FATAL(tc_start(&t, g_ch, path, NULL, 10000, false));

    req.message_request_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES;
    req.list_services = "*";
    refl_resp *r = refl_ask(&t, &req);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL_FATAL(r->message_response_case,
                          GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE);
    CU_ASSERT_EQUAL(r->list_services_response->n_service, 3);
    CU_ASSERT_STRING_EQUAL(r->list_services_response->service[0]->name, "deltaserve.v1.Worker");
    protobuf_c_message_free_unpacked(&r->base, NULL);

    req.message_request_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL;
    req.file_containing_symbol = "deltaserve.v1.Worker";
    r = refl_ask(&t, &req);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL_FATAL(r->message_response_case,
                          GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE);
    CU_ASSERT_EQUAL(r->file_descriptor_response->n_file_descriptor_proto, 1);
    /* the FileDescriptorProto starts with field 1 = its name */
    ProtobufCBinaryData fd = r->file_descriptor_response->file_descriptor_proto[0];
    const char want[] = "deltaserve/v1/deltaserve.proto";
    CU_ASSERT(fd.len > sizeof want && fd.data[0] == 0x0a && fd.data[1] == sizeof want - 1 &&
              memcmp(fd.data + 2, want, sizeof want - 1) == 0);
    protobuf_c_message_free_unpacked(&r->base, NULL);

    req.message_request_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME;
    req.file_by_filename = "grpc/health/v1/health.proto";
    r = refl_ask(&t, &req);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL(r->message_response_case,
                    GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE);
    protobuf_c_message_free_unpacked(&r->base, NULL);

    req.file_by_filename = "nope.proto";
    r = refl_ask(&t, &req);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL_FATAL(r->message_response_case,
                          GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE);
    CU_ASSERT_EQUAL(r->error_response->error_code, GRPC_STATUS_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(r->original_request);
    protobuf_c_message_free_unpacked(&r->base, NULL);

    CU_ASSERT(tc_close_send(&t));
    CU_ASSERT_EQUAL(tc_status(&t), GRPC_STATUS_OK);
    tc_destroy(&t);
}

static void test_reflection_v1alpha(void)
{
    reflection_on("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo");
}

static void test_reflection_v1(void)
{
    reflection_on("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo");
    CU_ASSERT_EQUAL(wait_no_live_calls(), 0);
}

/* A second server: shutting down with a Watch and a held stream open must end both and
 * return; the held stream's producer sees the cancellation. */
static void test_shutdown_with_open_streams(void)
{
    rpc_server *srv;
    rpc_health *h;
    rpc_reflection *r;
    CU_ASSERT_FATAL(start_server(&srv, &h, &r) == 0);
    grpc_channel *ch = tc_channel(rpc_server_port(srv));
    tcall w, s;
    Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    CU_ASSERT_FATAL(tc_start(&w, ch, "/grpc.health.v1.Health/Watch", &hreq.base, 60000, true));
    CU_ASSERT_EQUAL(watch_next(&w), 1);
    Deltaserve__V1__StoppingCriteria stop;
    int before = wait_producers(0);
    CU_ASSERT_FATAL(tc_start(&s, ch, STREAM_PATH, &stream_req("hold", 3, &stop)->base, 60000, true));
    Deltaserve__V1__GenerateResponse *m = (void *)tc_recv(&s, &deltaserve__v1__generate_response__descriptor);
    CU_ASSERT_PTR_NOT_NULL(m);
    if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
    int64_t t0 = clock_now_ms();
    rpc_server_shutdown(srv); /* returns only when every call is released */
    CU_ASSERT(clock_now_ms() - t0 < 30000); /* it did not wait for the calls' 60 s deadlines */
    CU_ASSERT_EQUAL(rpc_server_live_calls(srv), 0);
    CU_ASSERT_EQUAL(wait_producers(before + 1), before + 1);
    /* both end UNAVAILABLE with the server's reason (before any GOAWAY: the trailers go out) */
    CU_ASSERT_EQUAL(tc_status(&w), GRPC_STATUS_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(w.message, "server shutting down"));
    CU_ASSERT_EQUAL(tc_status(&s), GRPC_STATUS_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(s.message, "grace period over"));
    tc_destroy(&w);
    tc_destroy(&s);
    grpc_channel_destroy(ch);
    rpc_health_destroy(h);
    rpc_reflection_destroy(r);
    rpc_server_destroy(srv);
}

typedef struct shutdown_job {
    rpc_server *srv;
    int64_t grace_ms;
    bool clean;        /* what rpc_server_shutdown_grace returned */
    int64_t took_ms;
} shutdown_job;

static void *shutdown_thread(void *arg)
{
    shutdown_job *j = arg;
    int64_t t0 = clock_now_ms();
    j->clean = rpc_server_shutdown_grace(j->srv, j->grace_ms);
    j->took_ms = clock_now_ms() - t0;
    return NULL;
}

/* The drain race: the producer has queued every message and finished the call, but the client
 * has not read them yet (200 x 64 KiB: far more than the flow-control window, so most are still
 * in the server's queue). A graceful shutdown started now must let the client read every
 * message and the OK status (cancelling at once gave "Cancelling all calls"), and return true
 * only after the call is released. */
static void test_graceful_shutdown_delivers_queued_status(void)
{
    rpc_server *srv;
    rpc_health *h;
    rpc_reflection *r;
    CU_ASSERT_FATAL(start_server(&srv, &h, &r) == 0);
    grpc_channel *ch = tc_channel(rpc_server_port(srv));
    Deltaserve__V1__StoppingCriteria stop;
    tcall s;
    int before = wait_producers(0);
    CU_ASSERT_FATAL(tc_start(&s, ch, STREAM_PATH, &stream_req("big", 200, &stop)->base, 60000, true));
    CU_ASSERT_EQUAL_FATAL(wait_producers(before + 1), before + 1); /* finished: all queued */
    CU_ASSERT(rpc_server_live_calls(srv) == 1);

    shutdown_job j = {srv, 30000, false, 0};
    pthread_t t;
    pthread_create(&t, NULL, shutdown_thread, &j);
    int n = 0, last_finish = -1, in_order = 1;
    Deltaserve__V1__GenerateResponse *m;
    while ((m = (void *)tc_recv(&s, &deltaserve__v1__generate_response__descriptor))) {
        if (m->n_token_ids != 1 || m->token_ids[0] != n || strlen(m->text) != BIG_TEXT) in_order = 0;
        last_finish = m->finish_reason;
        n++;
        protobuf_c_message_free_unpacked(&m->base, NULL);
    }
    int code = tc_status(&s);
    CU_ASSERT_EQUAL(n, 200);
    CU_ASSERT(in_order);
    CU_ASSERT_EQUAL(last_finish, DELTASERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH);
    CU_ASSERT_EQUAL(code, GRPC_STATUS_OK);
    if (code != GRPC_STATUS_OK) printf("status %d '%s' after %d messages\n", code, s.message, n);
    pthread_join(t, NULL);
    CU_ASSERT(j.clean);
    CU_ASSERT(j.took_ms < 20000);
    CU_ASSERT_EQUAL(rpc_server_live_calls(srv), 0);
    tc_destroy(&s);
    grpc_channel_destroy(ch);
    rpc_health_destroy(h);
    rpc_reflection_destroy(r);
    rpc_server_destroy(srv);
}

/* A health Watch has no end: a graceful shutdown ends it at once with UNAVAILABLE instead of
 * waiting the whole grace period for it; a stream that does not end within the grace is then
 * cancelled with UNAVAILABLE (its producer sees it) and the shutdown says so. */
static void test_graceful_shutdown_ends_watch_and_cancels_after_grace(void)
{
    rpc_server *srv;
    rpc_health *h;
    rpc_reflection *r;
    CU_ASSERT_FATAL(start_server(&srv, &h, &r) == 0);
    grpc_channel *ch = tc_channel(rpc_server_port(srv));
    tcall w, s;
    Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    CU_ASSERT_FATAL(tc_start(&w, ch, "/grpc.health.v1.Health/Watch", &hreq.base, 60000, true));
    CU_ASSERT_EQUAL(watch_next(&w), 1);

    /* only the Watch open: a long grace, but the shutdown returns as soon as the Watch ended */
    shutdown_job j = {srv, 60000, false, 0};
    pthread_t t;
    pthread_create(&t, NULL, shutdown_thread, &j);
    CU_ASSERT_EQUAL(tc_status(&w), GRPC_STATUS_UNAVAILABLE);
    pthread_join(t, NULL);
    CU_ASSERT(j.clean);
    CU_ASSERT(j.took_ms < 30000); /* the 60 s grace was not waited for */
    tc_destroy(&w);
    grpc_channel_destroy(ch);
    rpc_health_destroy(h);
    rpc_reflection_destroy(r);
    rpc_server_destroy(srv);

    /* a held stream outlives a short grace */
    CU_ASSERT_FATAL(start_server(&srv, &h, &r) == 0);
    ch = tc_channel(rpc_server_port(srv));
    Deltaserve__V1__StoppingCriteria stop;
    int before = wait_producers(0);
    CU_ASSERT_FATAL(tc_start(&s, ch, STREAM_PATH, &stream_req("hold", 3, &stop)->base, 60000, true));
    Deltaserve__V1__GenerateResponse *m = (void *)tc_recv(&s, &deltaserve__v1__generate_response__descriptor);
    CU_ASSERT_PTR_NOT_NULL(m);
    if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
    j = (shutdown_job){srv, 200, true, 0};
    pthread_create(&t, NULL, shutdown_thread, &j);
    CU_ASSERT_PTR_NULL(tc_recv(&s, &deltaserve__v1__generate_response__descriptor));
    int code = tc_status(&s);
    CU_ASSERT_EQUAL(code, GRPC_STATUS_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(s.message, "grace period over"));
    if (code != GRPC_STATUS_UNAVAILABLE || !strstr(s.message, "grace period over"))
        printf("status %d '%s'\n", code, s.message);
    pthread_join(t, NULL);
    CU_ASSERT(!j.clean);
    CU_ASSERT(j.took_ms >= 200);
    CU_ASSERT_EQUAL(wait_producers(before + 1), before + 1);
    CU_ASSERT_EQUAL(rpc_server_live_calls(srv), 0);
    tc_destroy(&s);
    grpc_channel_destroy(ch);
    rpc_health_destroy(h);
    rpc_reflection_destroy(r);
    rpc_server_destroy(srv);
}

static void test_bind_failure_names_address(void)
{
    rpc_server *srv = NULL;
    status st;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", rpc_server_port(g_srv)); /* in use */
    CU_ASSERT_EQUAL(rpc_server_create(&(rpc_server_opts){.listen = addr}, &srv, &st), STATUS_IO);
    CU_ASSERT_PTR_NULL(srv);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, addr));
}

int main(void)
{
    memset(g_big_text, 'x', BIG_TEXT);
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("rpc_server", suite_init, suite_clean);
    CU_add_test(s, "stream_in_order", test_stream_in_order);
    CU_add_test(s, "cork_coalesces_writes", test_cork_coalesces_writes);
    CU_add_test(s, "cork_dual_stack", test_cork_dual_stack);
    CU_add_test(s, "cancel_reaches_producer", test_cancel_reaches_producer);
    CU_add_test(s, "deadline_reaches_producer", test_deadline_reaches_producer);
    CU_add_test(s, "unknown_method_is_unimplemented", test_unknown_method_is_unimplemented);
    CU_add_test(s, "unary_reply_and_error_status", test_unary_reply_and_error_status);
    CU_add_test(s, "unparsable_request", test_unparsable_request);
    CU_add_test(s, "health_check_and_watch", test_health_check_and_watch);
    CU_add_test(s, "reflection_v1alpha", test_reflection_v1alpha);
    CU_add_test(s, "reflection_v1", test_reflection_v1);
    CU_add_test(s, "shutdown_with_open_streams", test_shutdown_with_open_streams);
    CU_add_test(s, "graceful_shutdown_delivers_queued_status",
                test_graceful_shutdown_delivers_queued_status);
    CU_add_test(s, "graceful_shutdown_ends_watch_and_cancels_after_grace",
                test_graceful_shutdown_ends_watch_and_cancels_after_grace);
    CU_add_test(s, "bind_failure_names_address", test_bind_failure_names_address);
    return testutil_cunit_run();
}
