#include "rpc/rpc_client.h"
#include "rpc/rpc_tls.h"

#include <errno.h>
#include <pthread.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "rpc/rpc_auth.h"
#include "rpc/rpc_codec.h"
#include "rpc/rpc_init.h"
#include "rpc/rpc_cq.h"
#include "common/clock.h"

struct rpc_client_channel {
    grpc_channel *ch;   /* owned */
    char target[256];
    int tls;            /* made with TLS credentials */
    rpc_auth *auth;     /* borrowed, or NULL: no authorization metadata */
};

/* The call's initial metadata: "authorization" when the channel has a token. The value slice
 * is owned by the caller (unref after the batch completed); empty without a token. */
static size_t auth_metadata(const rpc_client_channel *c, grpc_metadata *md)
{
    if (!c->auth) return 0;
    char buf[RPC_AUTH_MAX_VALUE];
    size_t n = rpc_auth_bearer(c->auth, buf);
    memset(md, 0, sizeof *md);
    md->key = grpc_slice_from_static_string("authorization");
    md->value = grpc_slice_from_copied_buffer(buf, n);
    return 1;
}

/* The first batch of a server-streaming call: metadata (the token, when set), the request,
 * the half-close and the server's initial metadata. */
static void start_ops(grpc_op ops[4], grpc_metadata *auth, size_t n_auth, grpc_byte_buffer *send,
                      grpc_metadata_array *init_md)
{
    memset(ops, 0, 4 * sizeof *ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n_auth;
    ops[0].data.send_initial_metadata.metadata = n_auth ? auth : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = init_md;
}

/* A streaming call. Tags are the addresses of the tag_* fields. */
struct rpc_client_stream {
    grpc_completion_queue *cq; /* pluck; owned unless borrowed */
    int cq_borrowed;
    grpc_call *call;           /* owned */
    grpc_byte_buffer *send;    /* owned until the start batch completes */
    grpc_byte_buffer *recv;    /* owned, the message of the last RECV_MESSAGE */
    grpc_metadata_array init_md, trailing_md;
    grpc_metadata auth_md;     /* value owned when n_auth_md */
    size_t n_auth_md;
    grpc_status_code code;
    grpc_slice details;
    int start_pending, status_pending; /* batches started and not yet plucked */
    int done;
    int64_t n_received;
    rpc_client_result final;
    char tag_start, tag_msg, tag_status;
};

int rpc_client_channel_create(rpc_client_channel **out, const char *target, status *st)
{
    return rpc_client_channel_create_tls(out, target, NULL, st);
}

int rpc_client_channel_create_tls(rpc_client_channel **out, const char *target,
                                  const rpc_tls_client *tls, status *st)
{
    if (strlen(target) >= sizeof((rpc_client_channel *)0)->target)
        return status_fail(st, STATUS_INVALID, "channel target '%s' is too long", target);
    rpc_client_channel *c = calloc(1, sizeof *c);
    if (!c) return status_fail(st, STATUS_NOMEM, "channel %s: out of memory", target);
    rpc_init_grpc();
    grpc_channel_credentials *creds = NULL;
    if (tls && rpc_tls_client_creds(tls, &creds, st)) {
        free(c);
        grpc_shutdown();
        return st->code;
    }
    strcpy(c->target, target);
    c->tls = creds != NULL;
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, .value.integer = 100},
        /* gRPC core reads this as the minimum time a connection attempt (TCP connect and the
         * HTTP/2 SETTINGS exchange) may take, not as a backoff. At 100 ms a peer on a loaded
         * machine missed it and calls failed UNAVAILABLE "connection attempt timed out before
         * receiving SETTINGS frame" (CI, client_cli_test); 5 s still gives up on a black hole
         * well before gRPC's default of 20 s. A refused connection fails at once either way. */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, .value.integer = 5000},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 1000},
        /* the name the server's certificate is checked against (and the :authority sent) */
        {.type = GRPC_ARG_STRING, .key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
         .value.string = tls && tls->target_name ? (char *)tls->target_name : NULL},
    };
    grpc_channel_args ca = {.num_args = sizeof args / sizeof args[0] - !(creds && tls->target_name),
                            .args = args};
    if (!creds) creds = grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(target, creds, &ca);
    grpc_channel_credentials_release(creds);
    if (!c->ch) {
        free(c);
        grpc_shutdown();
        return status_fail(st, STATUS_UNAVAILABLE, "channel %s: cannot create", target);
    }
    *out = c;
    return 0;
}

void rpc_client_channel_set_auth(rpc_client_channel *c, rpc_auth *auth) { c->auth = auth; }

void rpc_client_channel_destroy(rpc_client_channel *c)
{
    if (!c) return;
    grpc_channel_destroy(c->ch);
    free(c);
    grpc_shutdown();
}

static gpr_timespec deadline_of(int64_t timeout_ms)
{
    if (timeout_ms <= 0) return gpr_inf_future(GPR_CLOCK_REALTIME);
    return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                        gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

static void pluck(grpc_completion_queue *cq, void *tag)
{
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    DS_ASSERT(ev.type == GRPC_OP_COMPLETE && ev.tag == tag);
}

static void fill_result(rpc_client_result *r, grpc_status_code code, grpc_slice details)
{
    r->code = (int)code;
    size_t n = GRPC_SLICE_LENGTH(details);
    if (n >= sizeof r->message) n = sizeof r->message - 1;
    memcpy(r->message, GRPC_SLICE_START_PTR(details), n);
    r->message[n] = 0;
}

int rpc_client_unary(rpc_client_channel *c, const char *method, const ProtobufCMessage *req,
                     const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                     int64_t timeout_ms, rpc_client_result *r)
{
    *resp = NULL;
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                               deadline_of(timeout_ms), NULL);
    grpc_slice_unref(m);
    grpc_byte_buffer *send = rpc_codec_pack(req), *recv = NULL;
    grpc_metadata_array init_md, trailing_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_metadata auth_md;
    size_t n_auth_md = auth_metadata(c, &auth_md);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n_auth_md;
    ops[0].data.send_initial_metadata.metadata = n_auth_md ? &auth_md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    char tag;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, &tag, NULL);
    DS_ASSERT(e == GRPC_CALL_OK);
    pluck(cq, &tag);
    fill_result(r, code, details);
    if (code == GRPC_STATUS_OK) {
        if (!recv || !(*resp = rpc_codec_unpack(recv, resp_desc, 0))) {
            r->code = GRPC_STATUS_INTERNAL;
            snprintf(r->message, sizeof r->message, "%s: %s response", method,
                     recv ? "unparsable" : "missing");
        }
    }
    if (recv) grpc_byte_buffer_destroy(recv);
    if (n_auth_md) grpc_slice_unref(auth_md.value);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    return r->code;
}

rpc_client_cq *rpc_client_cq_create(void)
{
    rpc_init_grpc();
    return (rpc_client_cq *)grpc_completion_queue_create_for_pluck(NULL);
}

void rpc_client_cq_destroy(rpc_client_cq *cq)
{
    if (!cq) return;
    grpc_completion_queue_shutdown((grpc_completion_queue *)cq);
    grpc_completion_queue_destroy((grpc_completion_queue *)cq);
    grpc_shutdown();
}

int rpc_client_stream_start(rpc_client_stream **out, rpc_client_channel *c, const char *method,
                            const ProtobufCMessage *req, int64_t timeout_ms, void *parent_call,
                            status *st)
{
    return rpc_client_stream_start_on(out, NULL, c, method, req, timeout_ms, parent_call, st);
}

int rpc_client_stream_start_on(rpc_client_stream **out, rpc_client_cq *cq, rpc_client_channel *c,
                               const char *method, const ProtobufCMessage *req, int64_t timeout_ms,
                               void *parent_call, status *st)
{
    rpc_client_stream *s = calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "%s: out of memory", method);
    s->cq_borrowed = cq != NULL;
    s->cq = cq ? (grpc_completion_queue *)cq : grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice m = grpc_slice_from_copied_string(method);
    s->call = grpc_channel_create_call(c->ch, (grpc_call *)parent_call, GRPC_PROPAGATE_DEFAULTS,
                                       s->cq, m, NULL, deadline_of(timeout_ms), NULL);
    grpc_slice_unref(m);
    if (!s->call) {
        if (!s->cq_borrowed) {
            grpc_completion_queue_shutdown(s->cq);
            grpc_completion_queue_destroy(s->cq);
        }
        free(s);
        return status_fail(st, STATUS_INTERNAL, "%s to %s: cannot create the call", method,
                           c->target);
    }
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->details = grpc_empty_slice();
    s->send = rpc_codec_pack(req);
    s->n_auth_md = auth_metadata(c, &s->auth_md);
    grpc_op ops[4];
    start_ops(ops, &s->auth_md, s->n_auth_md, s->send, &s->init_md);
    grpc_call_error e = grpc_call_start_batch(s->call, ops, 4, &s->tag_start, NULL);
    DS_ASSERT(e == GRPC_CALL_OK);
    s->start_pending = 1;
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    ops[0].data.recv_status_on_client.status = &s->code;
    ops[0].data.recv_status_on_client.status_details = &s->details;
    e = grpc_call_start_batch(s->call, ops, 1, &s->tag_status, NULL);
    DS_ASSERT(e == GRPC_CALL_OK);
    s->status_pending = 1;
    *out = s;
    return 0;
}

static void finish_start(rpc_client_stream *s)
{
    if (!s->start_pending) return;
    pluck(s->cq, &s->tag_start);
    s->start_pending = 0;
    grpc_byte_buffer_destroy(s->send);
    s->send = NULL;
}

/* Ends the stream: waits for the status. */
static void finish_status(rpc_client_stream *s)
{
    finish_start(s);
    if (s->status_pending) {
        pluck(s->cq, &s->tag_status);
        s->status_pending = 0;
        if (!s->done) fill_result(&s->final, s->code, s->details);
    }
    s->done = 1;
}

int rpc_client_stream_next(rpc_client_stream *s, const ProtobufCMessageDescriptor *desc,
                           ProtobufCMessage **msg, rpc_client_result *r)
{
    *msg = NULL;
    if (!s->done) {
        finish_start(s);
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &s->recv;
        grpc_call_error e = grpc_call_start_batch(s->call, &op, 1, &s->tag_msg, NULL);
        DS_ASSERT(e == GRPC_CALL_OK);
        pluck(s->cq, &s->tag_msg);
        if (s->recv) {
            *msg = rpc_codec_unpack(s->recv, desc, 0);
            grpc_byte_buffer_destroy(s->recv);
            s->recv = NULL;
            if (*msg) {
                s->n_received++;
                return 1;
            }
            grpc_call_cancel_with_status(s->call, GRPC_STATUS_INTERNAL, "unparsable message", NULL);
            finish_status(s);
            s->final.code = GRPC_STATUS_INTERNAL;
            snprintf(s->final.message, sizeof s->final.message,
                     "message %lld of the stream does not parse as %s",
                     (long long)s->n_received + 1, desc->name);
        } else {
            finish_status(s);
        }
    }
    *r = s->final;
    return 0;
}

void rpc_client_stream_cancel(rpc_client_stream *s) { grpc_call_cancel(s->call, NULL); }

void rpc_client_stream_destroy(rpc_client_stream *s)
{
    if (!s) return;
    if (!s->done) grpc_call_cancel(s->call, NULL);
    finish_status(s);
    grpc_slice_unref(s->details);
    if (s->n_auth_md) grpc_slice_unref(s->auth_md.value);
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    grpc_call_unref(s->call);
    if (!s->cq_borrowed) {
        grpc_completion_queue_shutdown(s->cq);
        grpc_completion_queue_destroy(s->cq);
    }
    free(s);
}

int64_t rpc_client_stream_n_received(const rpc_client_stream *s) { return s->n_received; }

/* What the server at host:port answers to the HTTP/2 client preface and an empty SETTINGS
 * frame: 1 a TLS record (it speaks TLS) or a close without a byte (a TLS server drops what is
 * not a ClientHello), 0 an HTTP/2 frame (plaintext gRPC), -1 unknown (no connection, silence). */
static int probe_tls(const char *host, const char *port, int timeout_ms)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) || !ai) return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int verdict = -1;
    if (fd < 0) goto done;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        if (errno != EINPROGRESS) goto done;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len = sizeof err;
        if (poll(&p, 1, timeout_ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) ||
            err)
            goto done;
    }
    static const char hello[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0";
    if (send(fd, hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello) goto done;
    unsigned char b[9];
    size_t got = 0;
    while (got < sizeof b) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, timeout_ms) <= 0) break;
        ssize_t n = recv(fd, b + got, sizeof b - got, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) {
            if (n == 0 && got == 0) verdict = 1; /* closed on the preface */
            break;
        }
        got += (size_t)n;
        if (b[0] >= 0x14 && b[0] <= 0x17) { /* TLS record: alert, handshake, ... */
            verdict = 1;
            break;
        }
    }
    if (got >= 4 && b[3] == 0x04) verdict = 0; /* a SETTINGS frame header */
done:
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return verdict;
}

int rpc_client_explain(const rpc_client_channel *c, rpc_client_result *r, int timeout_ms)
{
    if (r->code != GRPC_STATUS_UNAVAILABLE) return 0;
    /* host and port of "host:port", "[v6]:port", "dns:///host:port", "ipv4:host:port" */
    const char *t = c->target;
    if (!strncmp(t, "dns:///", 7)) t += 7;
    else if (!strncmp(t, "ipv4:", 5) || !strncmp(t, "ipv6:", 5)) t += 5;
    char host[256], port[16];
    const char *colon = strrchr(t, ':');
    if (!colon || strlen(colon + 1) >= sizeof port) return 0;
    size_t hn = (size_t)(colon - t);
    if (hn >= 2 && t[0] == '[' && t[hn - 1] == ']') {
        t++;
        hn -= 2;
    }
    if (hn == 0 || hn >= sizeof host) return 0;
    memcpy(host, t, hn);
    host[hn] = 0;
    strcpy(port, colon + 1);
    int speaks_tls = probe_tls(host, port, timeout_ms);
    if (speaks_tls < 0 || speaks_tls == c->tls) return 0;
    char was[sizeof r->message];
    strcpy(was, r->message);
    if (speaks_tls)
        snprintf(r->message, sizeof r->message,
                 "the server at %.200s speaks TLS: use --tls-ca (%.200s)", c->target, was);
    else
        snprintf(r->message, sizeof r->message,
                 "the server at %.200s is not using TLS: drop --tls-ca (%.200s)", c->target, was);
    return 1;
}

/* ---- asynchronous streams ---- */

typedef enum async_op { ASYNC_START, ASYNC_MSG, ASYNC_STATUS } async_op;

typedef struct async_tag {
    rpc_cq_tag base; /* on_async_event */
    rpc_client_async *a;
    async_op op;
} async_tag;

struct rpc_client_async {
    rpc_client_async_fn fn;
    void *user;
    pthread_mutex_t mu;        /* guards call against a cancel from another thread */
    grpc_call *call;           /* owned while running, else NULL */
    grpc_byte_buffer *send;    /* owned until the start batch completes */
    grpc_byte_buffer *recv;    /* written by gRPC: the RECV_MESSAGE in flight */
    grpc_byte_buffer *msg;     /* owned, the message of the MESSAGE event being handled (recv
                                  may be written by the next read meanwhile) */
    grpc_metadata_array init_md, trailing_md;
    grpc_metadata auth_md;     /* value owned when n_auth_md */
    size_t n_auth_md;
    grpc_status_code code;
    grpc_slice details;
    int n_pending;             /* batches started and not completed (the queue's thread) */
    int unparsable;            /* a message did not parse: the result says so */
    int64_t n_received;
    rpc_client_result result;
    async_tag t_start, t_msg, t_status;
};

static void async_end(rpc_client_async *a)
{
    if (!a->unparsable) fill_result(&a->result, a->code, a->details);
    grpc_slice_unref(a->details);
    a->details = grpc_empty_slice();
    if (a->n_auth_md) grpc_slice_unref(a->auth_md.value);
    a->n_auth_md = 0;
    grpc_metadata_array_destroy(&a->init_md);
    grpc_metadata_array_destroy(&a->trailing_md);
    pthread_mutex_lock(&a->mu);
    grpc_call *call = a->call;
    a->call = NULL;
    pthread_mutex_unlock(&a->mu);
    grpc_call_unref(call);
    a->fn(a->user, RPC_CLIENT_ASYNC_END);
}

static void on_async_event(rpc_cq_tag *t, bool ok)
{
    async_tag *tag = (async_tag *)t;
    rpc_client_async *a = tag->a;
    (void)ok; /* a failed batch shows in the status, which always completes */
    a->n_pending--;
    switch (tag->op) {
    case ASYNC_START: /* the start batch also read the first message */
        grpc_byte_buffer_destroy(a->send);
        a->send = NULL;
        /* fall through */
    case ASYNC_MSG:
        if (a->recv) {
            a->msg = a->recv;
            a->recv = NULL;
            a->fn(a->user, RPC_CLIENT_ASYNC_MESSAGE);
            if (a->msg) { /* not taken: dropped */
                grpc_byte_buffer_destroy(a->msg);
                a->msg = NULL;
            }
        }
        break;
    case ASYNC_STATUS: break;
    }
    if (a->n_pending == 0) async_end(a);
}

int rpc_client_async_create(rpc_client_async **out, rpc_client_async_fn fn, void *user,
                            status *st)
{
    rpc_client_async *a = calloc(1, sizeof *a);
    if (!a) return status_fail(st, STATUS_NOMEM, "async call: out of memory");
    a->fn = fn;
    a->user = user;
    pthread_mutex_init(&a->mu, NULL);
    a->details = grpc_empty_slice();
    a->t_start = (async_tag){{on_async_event}, a, ASYNC_START};
    a->t_msg = (async_tag){{on_async_event}, a, ASYNC_MSG};
    a->t_status = (async_tag){{on_async_event}, a, ASYNC_STATUS};
    *out = a;
    return STATUS_OK;
}

void rpc_client_async_destroy(rpc_client_async *a)
{
    if (!a) return;
    DS_ASSERT(!a->call && a->n_pending == 0);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

static gpr_timespec deadline_at(int64_t deadline_ms)
{
    if (deadline_ms == CLOCK_NO_DEADLINE) return gpr_inf_future(GPR_CLOCK_REALTIME);
    int64_t left = clock_left_ms(deadline_ms);
    return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                        gpr_time_from_millis(left > 0 ? left : 0, GPR_TIMESPAN));
}

int rpc_client_async_start(rpc_client_async *a, void *cq, rpc_client_channel *c,
                           const char *method, const ProtobufCMessage *req, int64_t deadline_ms,
                           status *st)
{
    DS_ASSERT(!a->call && a->n_pending == 0);
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS,
                                               (grpc_completion_queue *)cq, m, NULL,
                                               deadline_at(deadline_ms), NULL);
    grpc_slice_unref(m);
    if (!call)
        return status_fail(st, STATUS_INTERNAL, "%s to %s: cannot create the call", method,
                           c->target);
    a->unparsable = 0;
    a->n_received = 0;
    a->code = GRPC_STATUS_UNKNOWN;
    grpc_metadata_array_init(&a->init_md);
    grpc_metadata_array_init(&a->trailing_md);
    a->send = rpc_codec_pack(req);
    a->n_auth_md = auth_metadata(c, &a->auth_md);
    pthread_mutex_lock(&a->mu);
    a->call = call;
    pthread_mutex_unlock(&a->mu);
    /* two batches: the start with the first RECV_MESSAGE (its completion is the first
     * message's event), and the status */
    grpc_op ops[5];
    start_ops(ops, &a->auth_md, a->n_auth_md, a->send, &a->init_md);
    ops[4] = (grpc_op){.op = GRPC_OP_RECV_MESSAGE};
    ops[4].data.recv_message.recv_message = &a->recv;
    /* every batch counted before the first can complete on the queue's thread */
    a->n_pending = 2;
    grpc_call_error e = grpc_call_start_batch(call, ops, 5, &a->t_start, NULL);
    DS_ASSERT(e == GRPC_CALL_OK);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &a->trailing_md;
    ops[0].data.recv_status_on_client.status = &a->code;
    ops[0].data.recv_status_on_client.status_details = &a->details;
    e = grpc_call_start_batch(call, ops, 1, &a->t_status, NULL);
    DS_ASSERT(e == GRPC_CALL_OK);
    return STATUS_OK;
}

ProtobufCMessage *rpc_client_async_take(rpc_client_async *a, const ProtobufCMessageDescriptor *desc)
{
    return rpc_client_async_take_with(a, desc, NULL);
}

ProtobufCMessage *rpc_client_async_take_with(rpc_client_async *a,
                                             const ProtobufCMessageDescriptor *desc,
                                             ProtobufCAllocator *alloc)
{
    DS_ASSERT(a->msg);
    ProtobufCMessage *m = rpc_codec_unpack_with(a->msg, desc, 0, alloc);
    grpc_byte_buffer_destroy(a->msg);
    a->msg = NULL;
    if (m) {
        a->n_received++;
        return m;
    }
    a->unparsable = 1;
    a->result.code = GRPC_STATUS_INTERNAL;
    snprintf(a->result.message, sizeof a->result.message,
             "message %lld of the stream does not parse as %s", (long long)a->n_received + 1,
             desc->name);
    grpc_call_cancel_with_status(a->call, GRPC_STATUS_INTERNAL, "unparsable message", NULL);
    return NULL;
}

const uint8_t *rpc_client_async_peek(const rpc_client_async *a, size_t *n)
{
    const grpc_byte_buffer *bb = a->msg;
    DS_ASSERT(bb);
    if (bb->type != GRPC_BB_RAW || bb->data.raw.compression != GRPC_COMPRESS_NONE ||
        bb->data.raw.slice_buffer.count != 1)
        return NULL;
    *n = GRPC_SLICE_LENGTH(bb->data.raw.slice_buffer.slices[0]);
    return GRPC_SLICE_START_PTR(bb->data.raw.slice_buffer.slices[0]);
}

void rpc_client_async_consume(rpc_client_async *a)
{
    DS_ASSERT(a->msg);
    grpc_byte_buffer_destroy(a->msg);
    a->msg = NULL;
    a->n_received++;
}

void rpc_client_async_read(rpc_client_async *a)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &a->recv;
    a->n_pending++;
    grpc_call_error e = grpc_call_start_batch(a->call, &op, 1, &a->t_msg, NULL);
    DS_ASSERT(e == GRPC_CALL_OK);
}

void rpc_client_async_cancel(rpc_client_async *a)
{
    pthread_mutex_lock(&a->mu);
    if (a->call) grpc_call_cancel(a->call, NULL);
    pthread_mutex_unlock(&a->mu);
}

const rpc_client_result *rpc_client_async_result(const rpc_client_async *a) { return &a->result; }

int64_t rpc_client_async_n_received(const rpc_client_async *a) { return a->n_received; }
