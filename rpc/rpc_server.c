/* gRPC C core server loop: see rpc_server.h for the contract, docs/TOOLCHAIN.md §5 for the call
 * sequence this follows.
 *
 * Per call, four kinds of batch can be in flight, each with its own tag embedded in the call:
 *   close  {RECV_CLOSE_ON_SERVER}                started at accept; completes when the call
 *                                                ends (cancelled = 1 on cancel/deadline/drop)
 *   recv   {SEND_INITIAL_METADATA, RECV_MESSAGE} at accept; later {RECV_MESSAGE} (bidi only)
 *   send   {SEND_MESSAGE}                        one at a time; later messages wait in a ring
 *   status {SEND_STATUS_FROM_SERVER}             once the owner finished and sends drained
 * The call is released (grpc_call_unref, back to the pool) on its queue's CQ thread once the
 * status batch completed and nothing else is in flight. Every batch of a call completes on the
 * queue it was requested on, so its events never run on two threads at once; the pool's free
 * list and the request_call counts are shared by the threads under pool_mu.
 *
 * Graceful shutdown (rpc_server_shutdown_grace), in this order, and why:
 *  1. wait (grace) until every call is finished by its owner, its status batch completed and
 *     the call released. Cancelling earlier (grpc_server_cancel_all_calls at once, the old
 *     rpc_server_shutdown) kills calls whose final message and status are queued but not yet
 *     written: the client sees "Cancelling all calls" instead of its status.
 *  2. wait until the clients' kernels have acknowledged every byte written to them (SIOCOUTQ
 *     of each accepted socket is 0). A completed status batch only means the frames are in our
 *     socket's send buffer. gRPC closes a connection as soon as its last stream is written
 *     after a GOAWAY, and a close() with unread input (the client's WINDOW_UPDATEs) sends a
 *     RST that throws away whatever the send buffer still held: a slow client then loses the
 *     tail of its stream ("recvmsg: Connection reset by peer" after 194 of 200 messages, seen
 *     under load when grpc_server_shutdown_and_notify came first). Bytes already acknowledged
 *     stay readable on the client after a RST.
 *  3. only then grpc_server_shutdown_and_notify (GOAWAY; idle connections close) and wait for
 *     the notification, RPC_SERVER_CLOSE_MS at most: gRPC's graceful GOAWAY waits for the
 *     client to answer a ping, which an idle client (grpcio polls an idle channel every few
 *     seconds) answers late; everything it was sent is acknowledged by then, so its connection
 *     is closed anyway (grpc_server_cancel_all_calls).
 * During 1 and 2 new calls are still accepted and handed to their owners (who refuse them
 * while draining: "worker is draining"); open-ended streams (end_at_shutdown) are ended at
 * once. After the grace, calls still open are cancelled with UNAVAILABLE. */
#include "rpc/rpc_server.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dirent.h>
#include <linux/sockios.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/slice_buffer.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "common/clock.h"
#include "common/log.h"
#include "rpc/rpc_codec.h"
#include "rpc/rpc_init.h"
#include "rpc/rpc_cq.h"
#include "rpc/rpc_auth.h"
#include "rpc/rpc_status.h"
#include "rpc/rpc_tls.h"
#include "rpc/rpc_wire.h"

#define RPC_MAX_METHODS 32
#define RPC_N_LISTEN 16 /* grpc_server_request_call kept outstanding */

enum rpc_tag_op { TAG_NEW, TAG_RECV, TAG_SEND, TAG_CLOSE, TAG_STATUS, TAG_SHUTDOWN };

typedef struct rpc_tag {
    rpc_cq_tag base; /* on_call_event, or on_shutdown_event for the server shutdown tag */
    rpc_call *call;  /* NULL for the server shutdown tag */
    int op;          /* rpc_tag_op */
    rpc_server *srv_of_shutdown; /* the server shutdown tag's server */
} rpc_tag;

/* How often a CQ thread looks whether the server's shutdown is complete once it began. */
#define RPC_SERVER_CQ_POLL_MS 20

/* The life of a call on our side; one state at a time, under mu (FREE <-> ACCEPTED on the CQ
 * thread). The owner's path and the server's own (a refusal) end in different states because
 * only calls that reached an owner get on_release.
 *
 *   FREE -> ACCEPTED -> OPEN -> [FINISHING] -> STATUS_SENT -> DONE -> FREE
 *                    \-> REFUSED -> REFUSED_DONE -> FREE
 */
typedef enum rpc_call_state {
    RPC_CALL_FREE,         /* in the pool or waiting in grpc_server_request_call: gcall not ours */
    RPC_CALL_ACCEPTED,     /* gcall ours, close and recv batches started; no owner yet */
    RPC_CALL_OPEN,         /* the owner has it (on_request ran): it sends, then finishes */
    RPC_CALL_FINISHING,    /* the owner finished; the status waits for the queued messages */
    RPC_CALL_STATUS_SENT,  /* the owner finished; the status batch is in flight */
    RPC_CALL_DONE,         /* ... and completed: released once no batch is in flight */
    RPC_CALL_REFUSED,      /* the server finished it before any owner had it: status in flight
                              (unknown method, unparsable request, gone before handing) */
    RPC_CALL_REFUSED_DONE, /* ... and completed: released once no batch is in flight */
} rpc_call_state;

struct rpc_call {
    rpc_server *srv;
    const rpc_method *method; /* NULL: unknown path */
    grpc_call *gcall;         /* owned ref until release */
    grpc_call_details details;
    grpc_metadata_array req_md;
    rpc_tag t_new, t_recv, t_send, t_close, t_status;
    grpc_byte_buffer *recv_buf; /* owned, written by gRPC on recv */
    int close_cancelled;        /* written by gRPC on close */
    atomic_bool cancelled;      /* over on the wire: client cancel, deadline, drop, a failed
                                   batch, shutdown; read without the lock */
    int64_t deadline_ms;
    bool unauthenticated; /* a method needing the token, and the call has not the right one */
    char path[160];
    char peer[80];
    uint64_t peer_hash; /* of peer (FNV-1a): its connection within a cork scope */
    int sock;   /* its connection's socket (rpc_call_socket): RPC_SOCK_UNKNOWN until looked up */
    void *data; /* borrowed, the owner's */
    int cq;     /* index of the queue its batches complete on (set when requested) */

    pthread_mutex_t mu; /* guards the fields below */
    rpc_call_state state;
    grpc_byte_buffer **ring; /* owned, [ring_cap] queued packed messages; kept across reuse */
    int ring_cap, ring_head, ring_n;
    grpc_byte_buffer *send_buf; /* owned, the message on the wire, NULL if none */
    grpc_byte_buffer *spare;    /* owned, or NULL: an empty raw byte buffer whose send has
                                   completed, filled by the next rpc_call_send (kept across
                                   reuse: the calls' messages cost gRPC no buffer struct each) */
    int n_inflight;             /* batches started and not completed */
    grpc_status_code fin_code;
    grpc_slice fin_details; /* owned until the status batch completes */

    rpc_call *next_free; /* under srv->pool_mu */
};

/* The status batch has completed. */
static bool call_status_done(rpc_call_state s)
{
    return s == RPC_CALL_DONE || s == RPC_CALL_REFUSED_DONE;
}

enum { RPC_SOCK_UNKNOWN = -2, RPC_SOCK_CACHE = 1024, RPC_CORK_MAX = 64 };

typedef struct rpc_sock {
    struct sockaddr_storage peer; /* IPv4-mapped IPv6 peers as IPv4 */
    int fd;
} rpc_sock;

typedef struct rpc_cq_thread {
    rpc_server *srv;
    int i;               /* index in srv->cqs */
    grpc_completion_queue *cq; /* owned */
    pthread_t thread;
    int n_requested;     /* under srv->pool_mu: request_call outstanding on this queue */
} rpc_cq_thread;

struct rpc_server {
    grpc_server *server;
    rpc_cq_thread cqs[RPC_SERVER_MAX_CQ_THREADS];
    int n_cqs;
    int port;
    int max_recv_bytes;
    rpc_method methods[RPC_MAX_METHODS];
    bool method_auth[RPC_MAX_METHODS]; /* needs the bearer token (rpc_server_require_auth) */
    int n_methods;
    rpc_auth *auth;         /* borrowed, or NULL */
    rpc_server *health_srv; /* owned, or NULL: the plaintext health-only port */
    rpc_call *calls; /* owned, [n_calls] */
    int n_calls;
    pthread_mutex_t sock_mu; /* guards socks and n_socks */
    rpc_sock socks[RPC_SOCK_CACHE]; /* the accepted sockets by peer, as of the last scan */
    int n_socks;
    pthread_mutex_t pool_mu; /* guards free_list and the queues' n_requested */
    rpc_call *free_list;
    atomic_int held;     /* rpc_server_hold: batches of others on the queues */
    atomic_int live;     /* accepted and not released */
    atomic_bool draining;      /* a graceful shutdown runs (calls are still accepted) */
    atomic_bool cancelling;    /* its grace ran out: calls accepted from now on are cancelled */
    atomic_bool shutting_down; /* grpc_server_shutdown_and_notify was called */
    atomic_bool shutdown_seen; /* the shutdown notification came */
    bool started, stopped;
    rpc_tag t_shutdown;
    pthread_mutex_t done_mu; /* guards cq_done */
    pthread_cond_t done_cv;  /* CLOCK_MONOTONIC */
    int n_cq_done;           /* CQ threads that saw the shutdown and every call released */
    bool cq_done;            /* ... all of them */
};

/* ---- batches (called with call->mu held) ---- */

static void start_batch(rpc_call *c, const grpc_op *ops, size_t n, rpc_tag *tag)
{
    grpc_call_error e = grpc_call_start_batch(c->gcall, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        /* Only misuse (two batches of one op type) makes this fail: a bug here. */
        fprintf(stderr, "deltaserve: grpc_call_start_batch(%s, op %d) = %d\n", c->path, tag->op,
                (int)e);
        DS_ASSERT(e == GRPC_CALL_OK);
    }
    c->n_inflight++;
}

static void cork_call(rpc_call *c);

static void start_send(rpc_call *c, grpc_byte_buffer *bb)
{
    cork_call(c); /* inside rpc_cork_begin .. rpc_cork_end on this thread */
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    c->send_buf = bb;
    start_batch(c, &op, 1, &c->t_send);
}

static void start_status(rpc_call *c)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    op.data.send_status_from_server.trailing_metadata_count = 0;
    op.data.send_status_from_server.status = c->fin_code;
    op.data.send_status_from_server.status_details = &c->fin_details;
    if (c->state == RPC_CALL_FINISHING) c->state = RPC_CALL_STATUS_SENT;
    DS_ASSERT(c->state == RPC_CALL_STATUS_SENT || c->state == RPC_CALL_REFUSED);
    start_batch(c, &op, 1, &c->t_status);
}

static void start_recv(rpc_call *c, bool with_initial_metadata)
{
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (with_initial_metadata) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = 0;
        n++;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &c->recv_buf;
    n++;
    start_batch(c, ops, n, &c->t_recv);
}

static void drop_queue(rpc_call *c)
{
    while (c->ring_n > 0) {
        grpc_byte_buffer_destroy(c->ring[c->ring_head]);
        c->ring_head = (c->ring_head + 1) % c->ring_cap;
        c->ring_n--;
    }
    c->ring_head = 0;
}

/* Finish bookkeeping shared by the owner's rpc_call_finish (OPEN) and the server's own finishes
 * (a refusal of an ACCEPTED call, which has sent nothing; or a bidi call's bad message). */
static void finish_locked(rpc_call *c, grpc_status_code code, const char *msg)
{
    DS_ASSERT(c->state == RPC_CALL_ACCEPTED || c->state == RPC_CALL_OPEN);
    DS_ASSERT(c->state == RPC_CALL_OPEN || (!c->send_buf && c->ring_n == 0)); /* no owner: no sends */
    c->state = c->state == RPC_CALL_OPEN ? RPC_CALL_FINISHING : RPC_CALL_REFUSED;
    c->fin_code = code;
    c->fin_details = grpc_slice_from_copied_string(msg ? msg : "");
    if (atomic_load(&c->cancelled)) drop_queue(c);
    if (!c->send_buf && c->ring_n == 0) start_status(c);
}

/* ---- the pool and accepting calls (CQ thread) ---- */

/* Keeps RPC_N_LISTEN calls requested on queue qi (its thread, or rpc_server_start). */
static void request_calls(rpc_server *s, int qi)
{
    rpc_cq_thread *q = &s->cqs[qi];
    pthread_mutex_lock(&s->pool_mu);
    while (!atomic_load(&s->shutting_down) && q->n_requested < RPC_N_LISTEN && s->free_list) {
        rpc_call *c = s->free_list;
        s->free_list = c->next_free;
        c->gcall = NULL;
        c->cq = qi;
        grpc_call_details_init(&c->details);
        grpc_metadata_array_init(&c->req_md);
        grpc_call_error e = grpc_server_request_call(s->server, &c->gcall, &c->details, &c->req_md,
                                                     q->cq, q->cq, &c->t_new);
        DS_ASSERT(e == GRPC_CALL_OK);
        q->n_requested++;
    }
    pthread_mutex_unlock(&s->pool_mu);
}

static void return_to_pool(rpc_server *s, rpc_call *c)
{
    pthread_mutex_lock(&s->pool_mu);
    c->next_free = s->free_list;
    s->free_list = c;
    pthread_mutex_unlock(&s->pool_mu);
}

static void release_call(rpc_call *c)
{
    rpc_server *s = c->srv;
    /* the state is DONE or REFUSED_DONE and nothing is in flight: no other thread changes it */
    if (c->state == RPC_CALL_DONE && c->method && c->method->on_release)
        c->method->on_release(c, c->method->user);
    pthread_mutex_lock(&c->mu);
    c->state = RPC_CALL_FREE; /* cancel_calls no longer touches gcall */
    pthread_mutex_unlock(&c->mu);
    grpc_call_unref(c->gcall);
    c->gcall = NULL;
    if (c->recv_buf) grpc_byte_buffer_destroy(c->recv_buf);
    c->recv_buf = NULL;
    if (atomic_fetch_sub(&s->live, 1) == 1 && atomic_load(&s->draining)) {
        pthread_mutex_lock(&s->done_mu); /* wake rpc_server_shutdown_grace */
        pthread_cond_broadcast(&s->done_cv);
        pthread_mutex_unlock(&s->done_mu);
    }
    const int qi = c->cq; /* c may be requested on another queue once back in the pool */
    return_to_pool(s, c);
    request_calls(s, qi);
}

static const rpc_method *find_method(rpc_server *s, const char *path)
{
    for (int i = 0; i < s->n_methods; i++)
        if (strcmp(s->methods[i].path, path) == 0) return &s->methods[i];
    return NULL;
}

static void slice_to_buf(grpc_slice sl, char *buf, size_t cap)
{
    size_t n = GRPC_SLICE_LENGTH(sl);
    if (n >= cap) n = cap - 1;
    memcpy(buf, GRPC_SLICE_START_PTR(sl), n);
    buf[n] = '\0';
}

/* The "authorization" metadata checked against the token (CQ thread; no allocation). */
static bool call_has_token(rpc_auth *auth, const grpc_metadata_array *md)
{
    for (size_t i = 0; i < md->count; i++) {
        const grpc_slice k = md->metadata[i].key;
        if (GRPC_SLICE_LENGTH(k) == 13 && memcmp(GRPC_SLICE_START_PTR(k), "authorization", 13) == 0)
            return rpc_auth_check(auth, (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value),
                                  GRPC_SLICE_LENGTH(md->metadata[i].value));
    }
    return rpc_auth_check(auth, NULL, 0);
}

static void on_new_call(rpc_server *s, rpc_call *c, bool ok)
{
    pthread_mutex_lock(&s->pool_mu);
    s->cqs[c->cq].n_requested--;
    pthread_mutex_unlock(&s->pool_mu);
    if (!ok) { /* shutting down: the request was never matched */
        grpc_call_details_destroy(&c->details);
        grpc_metadata_array_destroy(&c->req_md);
        return_to_pool(s, c);
        return;
    }
    atomic_fetch_add(&s->live, 1);
    slice_to_buf(c->details.method, c->path, sizeof c->path);
    c->method = find_method(s, c->path);
    gpr_timespec dl = c->details.deadline;
    if (gpr_time_cmp(dl, gpr_inf_future(dl.clock_type)) == 0) {
        c->deadline_ms = CLOCK_NO_DEADLINE;
    } else {
        gpr_timespec left = gpr_time_sub(gpr_convert_clock_type(dl, GPR_CLOCK_MONOTONIC),
                                         gpr_now(GPR_CLOCK_MONOTONIC));
        c->deadline_ms = clock_deadline_ms(gpr_time_to_millis(left));
    }
    grpc_call_details_destroy(&c->details);
    c->unauthenticated = c->method && s->method_auth[c->method - s->methods] &&
                         !call_has_token(s->auth, &c->req_md);
    grpc_metadata_array_destroy(&c->req_md);
    char *peer = grpc_call_get_peer(c->gcall);
    snprintf(c->peer, sizeof c->peer, "%s", peer ? peer : "");
    c->peer_hash = 1469598103934665603ull;
    for (const char *q = c->peer; *q; q++) c->peer_hash = (c->peer_hash ^ (uint8_t)*q) * 1099511628211ull;
    gpr_free(peer);
    c->sock = RPC_SOCK_UNKNOWN;

    c->recv_buf = NULL;
    c->close_cancelled = 0;
    atomic_store(&c->cancelled, false);
    c->data = NULL;
    c->send_buf = NULL;
    c->ring_head = c->ring_n = 0;
    c->n_inflight = 0;

    pthread_mutex_lock(&c->mu);
    DS_ASSERT(c->state == RPC_CALL_FREE);
    c->state = RPC_CALL_ACCEPTED;
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    start_batch(c, &close_op, 1, &c->t_close);
    start_recv(c, true);
    pthread_mutex_unlock(&c->mu);
    /* Accepted while a graceful shutdown runs: it is served like the others (its owner refuses
     * it, e.g. "draining"), unless it is open-ended or the grace is over. cancel_calls sets the
     * flags first and then looks at the state under mu; here the state was set under mu before
     * the flags are read: one of the two sees the other. */
    if (atomic_load(&s->cancelling) ||
        (atomic_load(&s->draining) && c->method && c->method->end_at_shutdown))
        grpc_call_cancel_with_status(c->gcall, GRPC_STATUS_UNAVAILABLE, "server shutting down",
                                     NULL);
    request_calls(s, c->cq);
}

/* The server answers by itself (unknown method, bad request, cancelled before the owner had
 * the call). */
static void server_finish(rpc_call *c, grpc_status_code code, const char *msg)
{
    pthread_mutex_lock(&c->mu);
    finish_locked(c, code, msg);
    pthread_mutex_unlock(&c->mu);
}

static void on_recv(rpc_call *c, bool ok)
{
    pthread_mutex_lock(&c->mu);
    c->n_inflight--;
    grpc_byte_buffer *bb = c->recv_buf;
    c->recv_buf = NULL;
    if (!ok) atomic_store(&c->cancelled, true); /* the call is over on the wire */
    bool handed = c->state != RPC_CALL_ACCEPTED;
    pthread_mutex_unlock(&c->mu);

    const rpc_method *m = c->method;
    if (!ok) { /* the call is over on the wire; a bidi owner hears it through on_cancel */
        if (bb) grpc_byte_buffer_destroy(bb);
        if (!handed) server_finish(c, GRPC_STATUS_CANCELLED, "cancelled");
        return;
    }
    if (!m) {
        if (bb) grpc_byte_buffer_destroy(bb);
        char msg[224];
        snprintf(msg, sizeof msg, "unknown method %s", c->path);
        server_finish(c, GRPC_STATUS_UNIMPLEMENTED, msg);
        return;
    }
    if (!handed && c->unauthenticated) {
        if (bb) grpc_byte_buffer_destroy(bb);
        server_finish(c, GRPC_STATUS_UNAUTHENTICATED,
                      "missing or wrong token: send metadata 'authorization: Bearer <token>'");
        return;
    }
    ProtobufCMessage *req = NULL;
    if (bb) {
        char msg[RPC_WIRE_PATH_MAX + 64];
        req = rpc_codec_unpack_request(bb, m->request_desc, (size_t)c->srv->max_recv_bytes, msg,
                                       sizeof msg);
        grpc_byte_buffer_destroy(bb);
        if (!req) {
            if (!msg[0]) /* else a NUL in a string field, named (rpc_codec_unpack_request) */
                snprintf(msg, sizeof msg, "%s: cannot parse the request as %s", c->path,
                         m->request_desc->name);
            if (handed) { /* bidi: the owner finishes it */
                DS_ASSERT(m->kind == RPC_METHOD_BIDI_STREAM);
                pthread_mutex_lock(&c->mu);
                if (c->state == RPC_CALL_OPEN) finish_locked(c, GRPC_STATUS_INVALID_ARGUMENT, msg);
                pthread_mutex_unlock(&c->mu);
            } else {
                server_finish(c, GRPC_STATUS_INVALID_ARGUMENT, msg);
            }
            return;
        }
    } else if (m->kind != RPC_METHOD_BIDI_STREAM) {
        server_finish(c, GRPC_STATUS_INVALID_ARGUMENT, "no request message");
        return;
    }

    /* A cancel seen before the first hand-over (on_close ran while ACCEPTED and told nobody)
     * is told once the owner has the call. Completions run on this thread only, so nothing
     * sets cancelled between here and on_request. */
    pthread_mutex_lock(&c->mu);
    if (!handed) c->state = RPC_CALL_OPEN;
    const bool tell_cancel = !handed && atomic_load(&c->cancelled);
    pthread_mutex_unlock(&c->mu);
    m->on_request(c, req, m->user);
    if (req && !m->owns_request) protobuf_c_message_free_unpacked(req, NULL);

    pthread_mutex_lock(&c->mu);
    if (m->kind == RPC_METHOD_BIDI_STREAM && req && c->state == RPC_CALL_OPEN &&
        !atomic_load(&c->cancelled))
        start_recv(c, false);
    pthread_mutex_unlock(&c->mu);
    if (tell_cancel && m->on_cancel) m->on_cancel(c, m->user);
}

static void on_send(rpc_call *c, bool ok)
{
    pthread_mutex_lock(&c->mu);
    c->n_inflight--;
    /* gRPC is done with the buffer once the send completed: it is kept, emptied, for the next */
    grpc_byte_buffer *bb = c->send_buf;
    c->send_buf = NULL;
    if (!c->spare && bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE) {
        grpc_slice_buffer_reset_and_unref(&bb->data.raw.slice_buffer);
        c->spare = bb;
    } else {
        grpc_byte_buffer_destroy(bb);
    }
    if (!ok) {
        atomic_store(&c->cancelled, true); /* the call is over on the wire */
        drop_queue(c);
    }
    bool writable = false;
    if (c->ring_n > 0) {
        grpc_byte_buffer *bb = c->ring[c->ring_head];
        c->ring_head = (c->ring_head + 1) % c->ring_cap;
        c->ring_n--;
        start_send(c, bb);
    } else if (c->state == RPC_CALL_FINISHING) {
        start_status(c);
    } else {
        writable = c->state == RPC_CALL_OPEN;
    }
    pthread_mutex_unlock(&c->mu);
    /* the owner still has the call (only it finishes it, and it waits for this to send more) */
    if (writable && c->method && c->method->on_writable) c->method->on_writable(c, c->method->user);
}

static void on_close(rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    c->n_inflight--;
    bool cancelled = c->close_cancelled != 0;
    bool tell = false;
    if (cancelled) {
        atomic_store(&c->cancelled, true);
        drop_queue(c);
        tell = c->state == RPC_CALL_OPEN; /* ACCEPTED: on_recv tells once it hands the call */
    }
    pthread_mutex_unlock(&c->mu);
    if (tell && c->method && c->method->on_cancel) c->method->on_cancel(c, c->method->user);
}

static void on_status(rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    c->n_inflight--;
    DS_ASSERT(c->state == RPC_CALL_STATUS_SENT || c->state == RPC_CALL_REFUSED);
    c->state = c->state == RPC_CALL_REFUSED ? RPC_CALL_REFUSED_DONE : RPC_CALL_DONE;
    grpc_slice_unref(c->fin_details);
    pthread_mutex_unlock(&c->mu);
}

static void maybe_release(rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    bool done = call_status_done(c->state) && c->n_inflight == 0;
    pthread_mutex_unlock(&c->mu);
    if (done) release_call(c);
}

/* A batch of one of the server's calls completed. */
static void on_call_event(rpc_cq_tag *t, bool ok)
{
    rpc_tag *tag = (rpc_tag *)t;
    rpc_call *c = tag->call;
    switch (tag->op) {
    case TAG_NEW: on_new_call(c->srv, c, ok); return;
    case TAG_RECV: on_recv(c, ok); break;
    case TAG_SEND: on_send(c, ok); break;
    case TAG_CLOSE: on_close(c); break;
    case TAG_STATUS: on_status(c); break;
    default: DS_ASSERT(!"unknown tag");
    }
    maybe_release(c);
}

static void on_shutdown_event(rpc_cq_tag *t, bool ok)
{
    (void)ok;
    rpc_server *s = ((rpc_tag *)t)->srv_of_shutdown;
    atomic_store(&s->shutdown_seen, true);
}

/* Whether queue q's thread may stop: the shutdown notified, no call alive, no batch of others
 * held, nothing requested on it. */
static bool cq_finished(rpc_cq_thread *q)
{
    rpc_server *s = q->srv;
    if (!atomic_load(&s->shutdown_seen) || atomic_load(&s->live) || atomic_load(&s->held))
        return false;
    pthread_mutex_lock(&s->pool_mu);
    bool idle = q->n_requested == 0;
    pthread_mutex_unlock(&s->pool_mu);
    return idle;
}

static void *cq_thread(void *arg)
{
    rpc_cq_thread *q = arg;
    rpc_server *s = q->srv;
    pthread_setname_np(pthread_self(), "ds-rpc-cq"); /* per-thread CPU in /proc (benches) */
    for (;;) {
        if (cq_finished(q)) {
            pthread_mutex_lock(&s->done_mu);
            if (++s->n_cq_done == s->n_cqs) s->cq_done = true;
            pthread_cond_broadcast(&s->done_cv);
            pthread_mutex_unlock(&s->done_mu);
            break;
        }
        /* Once shutting down, the last release may happen on another queue's thread: look
         * again every RPC_SERVER_CQ_POLL_MS instead of waiting for an event of this queue. */
        gpr_timespec until = atomic_load(&s->shutting_down)
                                 ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                gpr_time_from_millis(RPC_SERVER_CQ_POLL_MS,
                                                                     GPR_TIMESPAN))
                                 : gpr_inf_future(GPR_CLOCK_MONOTONIC);
        grpc_event ev = grpc_completion_queue_next(q->cq, until, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        rpc_cq_tag *tag = ev.tag;
        tag->on_event(tag, ev.success != 0);
    }
    return NULL;
}

/* ---- server ---- */

int rpc_server_create(const rpc_server_opts *opts, rpc_server **out, status *st)
{
    *out = NULL;
    rpc_server *s = calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "rpc server: out of memory");
    s->n_calls = opts->max_calls > 0 ? opts->max_calls : 4096;
    s->max_recv_bytes = opts->max_recv_bytes > 0 ? opts->max_recv_bytes : 16 << 20;
    s->calls = calloc((size_t)s->n_calls, sizeof *s->calls);
    if (!s->calls) {
        int n = s->n_calls;
        free(s);
        return status_fail(st, STATUS_NOMEM, "rpc server: out of memory for %d calls", n);
    }
    for (int i = s->n_calls - 1; i >= 0; i--) {
        rpc_call *c = &s->calls[i];
        c->srv = s;
        pthread_mutex_init(&c->mu, NULL);
        c->t_new = (rpc_tag){{on_call_event}, c, TAG_NEW, NULL};
        c->t_recv = (rpc_tag){{on_call_event}, c, TAG_RECV, NULL};
        c->t_send = (rpc_tag){{on_call_event}, c, TAG_SEND, NULL};
        c->t_close = (rpc_tag){{on_call_event}, c, TAG_CLOSE, NULL};
        c->t_status = (rpc_tag){{on_call_event}, c, TAG_STATUS, NULL};
        c->next_free = s->free_list;
        s->free_list = c;
    }
    s->t_shutdown = (rpc_tag){{on_shutdown_event}, NULL, TAG_SHUTDOWN, s};
    pthread_mutex_init(&s->pool_mu, NULL);
    pthread_mutex_init(&s->sock_mu, NULL);
    pthread_mutex_init(&s->done_mu, NULL);
    clock_cond_init(&s->done_cv);

    rpc_init_grpc();
    grpc_arg args[2];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = s->max_recv_bytes;
    /* no SO_REUSEPORT: a second process on the same port must fail, not share it */
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[1].value.integer = 0;
    grpc_channel_args cargs = {2, args};
    s->n_cqs = opts->cq_threads > 0 ? opts->cq_threads : 1;
    if (s->n_cqs > RPC_SERVER_MAX_CQ_THREADS) s->n_cqs = RPC_SERVER_MAX_CQ_THREADS;
    s->server = grpc_server_create(&cargs, NULL);
    for (int i = 0; i < s->n_cqs; i++) {
        s->cqs[i] = (rpc_cq_thread){.srv = s, .i = i,
                                    .cq = grpc_completion_queue_create_for_next(NULL)};
        grpc_server_register_completion_queue(s->server, s->cqs[i].cq, NULL);
    }
    s->auth = opts->auth;
    grpc_server_credentials *creds = NULL;
    if (opts->tls) {
        if (rpc_tls_server_creds(opts->tls, &creds, st)) {
            rpc_server_destroy(s);
            return st->code;
        }
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    s->port = grpc_server_add_http2_port(s->server, opts->listen, creds);
    grpc_server_credentials_release(creds);
    if (s->port <= 0) {
        status_fail(st, STATUS_IO, "cannot listen on %s (bad address or port in use)",
                    opts->listen);
        rpc_server_destroy(s);
        return st ? st->code : STATUS_IO;
    }
    if (opts->health_listen) {
        rpc_server_opts ho = {.listen = opts->health_listen, .max_calls = 64};
        if (rpc_server_create(&ho, &s->health_srv, st)) {
            rpc_server_destroy(s);
            return st->code;
        }
    }
    *out = s;
    return STATUS_OK;
}

int rpc_server_port(const rpc_server *srv) { return srv->port; }
int rpc_server_health_port(const rpc_server *srv)
{
    return srv->health_srv ? srv->health_srv->port : 0;
}

void rpc_server_require_auth(rpc_server *srv, const char *prefix)
{
    DS_ASSERT(!srv->started);
    if (!srv->auth) return;
    for (int i = 0; i < srv->n_methods; i++)
        if (strncmp(srv->methods[i].path, prefix, strlen(prefix)) == 0) srv->method_auth[i] = true;
}

int rpc_server_add_method(rpc_server *srv, const rpc_method *m, status *st)
{
    DS_ASSERT(!srv->started);
    DS_ASSERT(m->path && m->request_desc && m->on_request);
    if (srv->n_methods >= RPC_MAX_METHODS)
        return status_fail(st, STATUS_EXHAUSTED, "rpc server: more than %d methods", RPC_MAX_METHODS);
    if (find_method(srv, m->path))
        return status_fail(st, STATUS_INVALID, "rpc server: method %s added twice", m->path);
    srv->methods[srv->n_methods++] = *m;
    static const char health[] = "/grpc.health.v1.Health/";
    if (srv->health_srv && strncmp(m->path, health, sizeof health - 1) == 0)
        return rpc_server_add_method(srv->health_srv, m, st);
    return STATUS_OK;
}

int rpc_server_start(rpc_server *srv, status *st)
{
    DS_ASSERT(!srv->started);
    grpc_server_start(srv->server);
    for (int i = 0; i < srv->n_cqs; i++) request_calls(srv, i);
    for (int i = 0; i < srv->n_cqs; i++) {
        if (pthread_create(&srv->cqs[i].thread, NULL, cq_thread, &srv->cqs[i]) != 0) {
            /* the threads started run until a shutdown; the others' queues have no thread */
            srv->n_cqs = i;
            srv->started = i > 0;
            return status_fail(st, STATUS_INTERNAL, "rpc server: cannot start CQ thread %d", i);
        }
    }
    srv->started = true;
    return srv->health_srv ? rpc_server_start(srv->health_srv, st) : STATUS_OK;
}

static void drain_cq(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    }
}

/* Cancels calls in use with UNAVAILABLE msg (their owners hear it through on_cancel): the
 * open-ended ones only, or all. */
static int cancel_calls(rpc_server *srv, bool open_ended_only, const char *msg)
{
    int n = 0;
    for (int i = 0; i < srv->n_calls; i++) {
        rpc_call *c = &srv->calls[i];
        pthread_mutex_lock(&c->mu);
        if (c->state != RPC_CALL_FREE && !call_status_done(c->state) &&
            (!open_ended_only || (c->method && c->method->end_at_shutdown))) {
            grpc_call_cancel_with_status(c->gcall, GRPC_STATUS_UNAVAILABLE, msg, NULL);
            n++;
        }
        pthread_mutex_unlock(&c->mu);
    }
    return n;
}

#define WAIT_FOREVER CLOCK_NO_DEADLINE

/* Waits at most timeout_ms (<= 0: just look; WAIT_FOREVER: no limit) until every call is
 * released (calls_only) or the CQ threads are done (the shutdown notified too: every connection
 * closed). */
static bool wait_done(rpc_server *srv, bool calls_only, int64_t timeout_ms)
{
    const int64_t end = clock_deadline_ms(timeout_ms);
    const struct timespec ts = clock_timespec_ms(end);
    pthread_mutex_lock(&srv->done_mu);
    for (;;) {
        if (srv->cq_done || (calls_only && atomic_load(&srv->live) == 0)) break;
        if (end == CLOCK_NO_DEADLINE) {
            pthread_cond_wait(&srv->done_cv, &srv->done_mu);
            continue;
        }
        if (clock_expired(end)) break;
        pthread_cond_timedwait(&srv->done_cv, &srv->done_mu, &ts);
    }
    bool done = srv->cq_done || (calls_only && atomic_load(&srv->live) == 0);
    pthread_mutex_unlock(&srv->done_mu);
    return done;
}

/* A socket address with an IPv4-mapped IPv6 address turned into IPv4 (as gRPC names peers). */
static void sock_plain(struct sockaddr_storage *a)
{
    const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)a;
    if (a->ss_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) return;
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = a6->sin6_port};
    memcpy(&a4.sin_addr, a6->sin6_addr.s6_addr + 12, 4);
    memset(a, 0, sizeof *a);
    memcpy(a, &a4, sizeof a4);
}

static bool sock_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
    return a->ss_family == AF_INET6 && x->sin6_port == y->sin6_port &&
           !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr);
}

/* fd is a TCP socket this server accepted (its local port is the server's; it has a peer):
 * its peer in *peer. */
static bool sock_accepted(const rpc_server *srv, int fd, struct sockaddr_storage *peer)
{
    struct sockaddr_storage a;
    socklen_t n = sizeof a;
    int type = 0;
    socklen_t tn = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tn) != 0 || type != SOCK_STREAM ||
        getsockname(fd, (struct sockaddr *)&a, &n) != 0)
        return false; /* not a stream socket */
    int port = a.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&a)->sin_port)
               : a.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&a)->sin6_port)
                                         : -1;
    n = sizeof *peer;
    memset(peer, 0, sizeof *peer);
    if (port != srv->port || getpeername(fd, (struct sockaddr *)peer, &n) != 0)
        return false; /* another socket, or the listener */
    sock_plain(peer);
    return true;
}

/* Calls fn(fd, peer, u) for each socket this server accepted that is open now (from
 * /proc/self/fd); -1 if that is unreadable. */
static int for_accepted(const rpc_server *srv,
                        void (*fn)(int fd, const struct sockaddr_storage *peer, void *u), void *u)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        struct sockaddr_storage peer;
        if (end == e->d_name || *end || fd == dirfd(d) || !sock_accepted(srv, (int)fd, &peer))
            continue;
        fn((int)fd, &peer, u);
    }
    closedir(d);
    return 0;
}

static void add_unacked(int fd, const struct sockaddr_storage *peer, void *u)
{
    (void)peer;
    int q = 0;
    if (ioctl(fd, SIOCOUTQ, &q) == 0 && q > 0) *(long *)u += q;
}

/* ---- connections' sockets and coalesced writes (rpc_call_socket, rpc_cork_begin) ---- */

/* gRPC's name of a TCP peer ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", the brackets maybe
 * escaped as %5B and %5D) as an address; false for another kind (unix:...). */
static bool peer_addr(const char *peer, struct sockaddr_storage *a)
{
    char buf[80];
    size_t n = 0;
    for (const char *p = peer; *p && n + 1 < sizeof buf; p++) { /* unescaped, brackets dropped */
        if (p[0] == '%' && p[1] == '5' && (p[2] == 'B' || p[2] == 'D')) p += 2;
        else if (*p != '[' && *p != ']') buf[n++] = *p;
    }
    buf[n] = 0;
    const bool v4 = !strncmp(buf, "ipv4:", 5), v6 = !strncmp(buf, "ipv6:", 5);
    char *colon = strrchr(buf, ':');
    if ((!v4 && !v6) || colon <= buf + 4) return false;
    *colon = 0;
    char *end;
    const long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || port < 0 || port > 65535) return false;
    memset(a, 0, sizeof *a);
    if (v4) {
        struct sockaddr_in *x = (struct sockaddr_in *)a;
        x->sin_family = AF_INET;
        x->sin_port = htons((uint16_t)port);
        return inet_pton(AF_INET, buf + 5, &x->sin_addr) == 1;
    }
    struct sockaddr_in6 *x = (struct sockaddr_in6 *)a;
    x->sin6_family = AF_INET6;
    x->sin6_port = htons((uint16_t)port);
    if (inet_pton(AF_INET6, buf + 5, &x->sin6_addr) != 1) return false;
    sock_plain(a);
    return true;
}

static void add_sock(int fd, const struct sockaddr_storage *peer, void *u)
{
    rpc_server *srv = u;
    if (srv->n_socks < RPC_SOCK_CACHE) srv->socks[srv->n_socks++] = (rpc_sock){*peer, fd};
}

/* The socket of the connection whose peer is *peer, under sock_mu: from the last scan while
 * that socket still has this peer, else from a new scan; -1 if none has. */
static int find_sock(rpc_server *srv, const struct sockaddr_storage *peer)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < srv->n_socks; i++) {
            struct sockaddr_storage now;
            if (sock_same(&srv->socks[i].peer, peer) &&
                sock_accepted(srv, srv->socks[i].fd, &now) && sock_same(&now, peer))
                return srv->socks[i].fd;
        }
        if (pass == 0) {
            srv->n_socks = 0;
            if (for_accepted(srv, add_sock, srv)) return -1;
        }
    }
    return -1;
}

/* c's socket, looked up once (call->mu held) */
static int call_sock(rpc_call *c)
{
    if (c->sock == RPC_SOCK_UNKNOWN) {
        struct sockaddr_storage a;
        c->sock = -1;
        if (peer_addr(c->peer, &a)) {
            pthread_mutex_lock(&c->srv->sock_mu);
            c->sock = find_sock(c->srv, &a);
            pthread_mutex_unlock(&c->srv->sock_mu);
        }
    }
    return c->sock;
}

int rpc_call_socket(rpc_call *call)
{
    pthread_mutex_lock(&call->mu);
    const int fd = call_sock(call);
    pthread_mutex_unlock(&call->mu);
    return fd;
}

/* The thread's cork scope: the connections written to in it (by their peers' hashes), each
 * corked from its second message (its socket then looked up). */
typedef struct rpc_cork {
    bool on;
    int n;
    uint64_t peer[RPC_CORK_MAX];
    int fd[RPC_CORK_MAX]; /* corked, or -1 */
} rpc_cork;

static _Thread_local rpc_cork tl_cork;

void rpc_cork_begin(void)
{
    DS_ASSERT(!tl_cork.on);
    tl_cork.on = true;
    tl_cork.n = 0;
}

void rpc_cork_end(void)
{
    DS_ASSERT(tl_cork.on);
    const int off = 0;
    for (int i = 0; i < tl_cork.n; i++) /* what they hold leaves now */
        if (tl_cork.fd[i] >= 0) setsockopt(tl_cork.fd[i], IPPROTO_TCP, TCP_CORK, &off, sizeof off);
    tl_cork.on = false;
    tl_cork.n = 0;
}

/* In a cork scope, with call->mu held: c's connection noted at its first message of the scope
 * (which leaves at once, and no socket is looked up: a lone stream costs nothing) and its
 * socket corked at its second. A call whose socket is not known, or a connection past
 * RPC_CORK_MAX a scope, writes as without. */
static void cork_call(rpc_call *c)
{
    if (!tl_cork.on) return;
    int i = 0;
    while (i < tl_cork.n && tl_cork.peer[i] != c->peer_hash) i++;
    if (i == tl_cork.n) {
        if (i < RPC_CORK_MAX) tl_cork.peer[tl_cork.n] = c->peer_hash, tl_cork.fd[tl_cork.n++] = -1;
        return;
    }
    const int on = 1;
    if (tl_cork.fd[i] < 0 && call_sock(c) >= 0 &&
        setsockopt(c->sock, IPPROTO_TCP, TCP_CORK, &on, sizeof on) == 0)
        tl_cork.fd[i] = c->sock;
}

/* Bytes written to this server's connections and not yet acknowledged by the clients' kernels
 * (unsent + unacked, SIOCOUTQ), summed over the accepted sockets. -1 if /proc/self/fd is
 * unreadable. */
static long unacked_bytes(const rpc_server *srv)
{
    long total = 0;
    return for_accepted(srv, add_unacked, &total) ? -1 : total;
}

/* Waits at most timeout_ms until every byte written to the clients is acknowledged (true at
 * once when that cannot be known). There is no event for it: the condition is polled every
 * 2 ms. */
static bool wait_acknowledged(const rpc_server *srv, int64_t timeout_ms)
{
    const int64_t end = clock_deadline_ms(timeout_ms);
    for (;;) {
        long n = unacked_bytes(srv);
        if (n <= 0) return true;
        if (clock_expired(end)) return false;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

bool rpc_server_shutdown_grace(rpc_server *srv, int64_t grace_ms)
{
    if (!srv || srv->stopped) return true;
    srv->stopped = true;
    if (!srv->started) { /* nobody runs the CQ and no call exists: wait for the notification */
        atomic_store(&srv->shutting_down, true);
        grpc_server_shutdown_and_notify(srv->server, srv->cqs[0].cq, &srv->t_shutdown.base);
        for (;;) {
            grpc_event ev =
                grpc_completion_queue_next(srv->cqs[0].cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            if (ev.type == GRPC_OP_COMPLETE && ev.tag == &srv->t_shutdown.base) break;
        }
        return true;
    }
    const int64_t end = clock_deadline_ms(grace_ms > 0 ? grace_ms : 0);
    atomic_store(&srv->draining, true);
    cancel_calls(srv, true, "server shutting down");
    /* 1. every call finished by its owner, its status batch completed, released */
    bool clean = wait_done(srv, true, clock_left_ms(end));
    bool ended = clean;
    if (!clean) {
        atomic_store(&srv->cancelling, true);
        int n = cancel_calls(srv, false, "server shutting down: grace period over");
        if (grace_ms > 0)
            LOG_WARN("rpc server: %d call%s still open after the %lld ms grace period: cancelled",
                     n, n == 1 ? "" : "s", (long long)grace_ms);
        ended = wait_done(srv, true, RPC_SERVER_CANCEL_MS); /* the owners finish them */
    }
    /* 2. everything written is acknowledged by the clients (a client that stopped reading
     *    gets the rest of the grace, at least RPC_SERVER_CANCEL_MS) */
    if (ended) {
        int64_t left = clock_left_ms(end);
        if (!wait_acknowledged(srv, left > RPC_SERVER_CANCEL_MS ? left : RPC_SERVER_CANCEL_MS))
            LOG_WARN("rpc server: some clients did not acknowledge their last frames: closing");
    }
    /* 3. GOAWAY, connections close; what is left is dropped */
    atomic_store(&srv->shutting_down, true);
    grpc_server_shutdown_and_notify(srv->server, srv->cqs[0].cq, &srv->t_shutdown.base);
    if (!ended || !wait_done(srv, false, RPC_SERVER_CLOSE_MS))
        grpc_server_cancel_all_calls(srv->server);
    wait_done(srv, false, WAIT_FOREVER);
    for (int i = 0; i < srv->n_cqs; i++) pthread_join(srv->cqs[i].thread, NULL);
    /* the probes' port last: it answers (NOT_SERVING while draining) until the main one closed */
    if (srv->health_srv) rpc_server_shutdown_grace(srv->health_srv, 0);
    return clean;
}

void rpc_server_shutdown(rpc_server *srv) { rpc_server_shutdown_grace(srv, 0); }

void rpc_server_destroy(rpc_server *srv)
{
    if (!srv) return;
    if (srv->server) {
        rpc_server_shutdown(srv);
        grpc_server_destroy(srv->server);
    }
    if (srv->health_srv) rpc_server_destroy(srv->health_srv);
    for (int i = 0; i < srv->n_cqs; i++) {
        if (!srv->cqs[i].cq) continue;
        drain_cq(srv->cqs[i].cq);
        grpc_completion_queue_destroy(srv->cqs[i].cq);
    }
    for (int i = 0; i < srv->n_calls; i++) {
        pthread_mutex_destroy(&srv->calls[i].mu);
        free(srv->calls[i].ring);
        if (srv->calls[i].spare) grpc_byte_buffer_destroy(srv->calls[i].spare);
    }
    pthread_mutex_destroy(&srv->done_mu);
    pthread_mutex_destroy(&srv->pool_mu);
    pthread_mutex_destroy(&srv->sock_mu);
    pthread_cond_destroy(&srv->done_cv);
    free(srv->calls);
    free(srv);
    grpc_shutdown();
}

int rpc_server_live_calls(rpc_server *srv) { return atomic_load(&srv->live); }

int rpc_server_n_cqs(const rpc_server *srv) { return srv->n_cqs; }

void *rpc_server_cq(rpc_server *srv, int i) { return srv->cqs[i % srv->n_cqs].cq; }

void rpc_server_hold(rpc_server *srv) { atomic_fetch_add(&srv->held, 1); }

void rpc_server_unhold(rpc_server *srv)
{
    const int was = atomic_fetch_sub(&srv->held, 1);
    DS_ASSERT(was > 0);
}

void *rpc_call_cq(const rpc_call *call) { return call->srv->cqs[call->cq].cq; }

int64_t rpc_call_deadline_ms(const rpc_call *call) { return call->deadline_ms; }
bool rpc_call_cancelled(const rpc_call *call) { return atomic_load(&call->cancelled); }
void rpc_call_set_data(rpc_call *call, void *data) { call->data = data; }
void *rpc_call_data(const rpc_call *call) { return call->data; }

static int enqueue(rpc_call *c, grpc_byte_buffer *bb)
{
    if (c->ring_n == c->ring_cap) {
        int cap = c->ring_cap ? c->ring_cap * 2 : 16;
        grpc_byte_buffer **r = malloc((size_t)cap * sizeof *r);
        if (!r) return STATUS_NOMEM;
        for (int i = 0; i < c->ring_n; i++) r[i] = c->ring[(c->ring_head + i) % c->ring_cap];
        free(c->ring);
        c->ring = r;
        c->ring_cap = cap;
        c->ring_head = 0;
    }
    c->ring[(c->ring_head + c->ring_n) % c->ring_cap] = bb;
    c->ring_n++;
    return STATUS_OK;
}

/* Sends the packed message in sl (its reference taken). */
static int send_slice(rpc_call *call, grpc_slice sl)
{
    int rc = STATUS_OK;
    pthread_mutex_lock(&call->mu);
    DS_ASSERT(call->state == RPC_CALL_OPEN); /* only the owner sends, before it finishes */
    grpc_byte_buffer *bb = call->spare;
    call->spare = NULL;
    if (!bb) bb = grpc_raw_byte_buffer_create(NULL, 0);
    grpc_slice_buffer_add(&bb->data.raw.slice_buffer, sl); /* takes the slice's reference */
    if (atomic_load(&call->cancelled)) rc = STATUS_CANCELLED;
    else if (!call->send_buf) start_send(call, bb);
    else rc = enqueue(call, bb);
    if (rc != STATUS_OK) {
        grpc_slice_buffer_reset_and_unref(&bb->data.raw.slice_buffer);
        call->spare = bb;
    }
    pthread_mutex_unlock(&call->mu);
    return rc;
}

int rpc_call_send(rpc_call *call, const ProtobufCMessage *msg)
{
    /* packed into one slice: inline in the slice itself up to 23 bytes (a few token ids),
       else one gRPC allocation */
    const size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice sl = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
    return send_slice(call, sl);
}

int rpc_call_send_bytes(rpc_call *call, const uint8_t *bytes, size_t n)
{
    grpc_slice sl = grpc_slice_malloc(n);
    memcpy(GRPC_SLICE_START_PTR(sl), bytes, n);
    return send_slice(call, sl);
}

void rpc_call_finish(rpc_call *call, grpc_status_code code, const char *msg)
{
    pthread_mutex_lock(&call->mu);
    DS_ASSERT(call->state == RPC_CALL_OPEN); /* the owner finishes exactly once */
    finish_locked(call, code, msg);
    pthread_mutex_unlock(&call->mu);
}

void rpc_call_finish_status(rpc_call *call, const status *st)
{
    rpc_call_finish(call, rpc_status_to_grpc(st->code), st->msg);
}

void rpc_call_reply(rpc_call *call, const ProtobufCMessage *msg)
{
    rpc_call_send(call, msg); /* a cancelled call just drops it */
    rpc_call_finish(call, GRPC_STATUS_OK, NULL);
}
