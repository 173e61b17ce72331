/* A gRPC C core server (grpc 1.51) with a few completion-queue threads (one by default) that
 * never block on work.
 *
 * Calls are preallocated structs (a pool sized at creation) used as completion-queue tags,
 * with a small state machine. Methods are dispatched by path ("/pkg.Service/Method"; protoc-c
 * "services" are not gRPC services). Request messages are unpacked with protobuf-c before the
 * handler sees them; replies are packed from protobuf-c messages.
 *
 *   rpc_server *srv; status st;
 *   rpc_server_create(&(rpc_server_opts){.listen = "127.0.0.1:0"}, &srv, &st);
 *   rpc_server_add_method(srv, &(rpc_method){"/deltaserve.v1.Worker/GetLoad",
 *       &deltaserve__v1__get_load_request__descriptor, RPC_METHOD_UNARY, on_get_load}, &st);
 *   rpc_server_start(srv, &st);            // spawns the CQ threads
 *   ... rpc_server_shutdown_grace(srv, 10000); rpc_server_destroy(srv);
 *
 * Threads: each CQ thread runs its own completion queue; a call is accepted on one of them and
 * every callback of that call (on_request, on_cancel, on_writable, on_release) runs on that
 * thread. gRPC publishes the calls of one connection to one queue (picked per connection), so
 * the threads share the load of several clients, not of one connection. Other code may start its own batches on the same queues (rpc_server_cq, rpc_call_cq,
 * with rpc_cq.h tags: rpc_client.h's asynchronous streams), so one set of threads serves the
 * calls and the calls they make; rpc_server_hold keeps the threads until those batches ended.
 *
 * Handler contract (on_request): runs on the CQ thread and must not block (short mutexes are
 * fine; no waiting on work, no sleeping). From then on the handler owns the call and must call
 * rpc_call_finish exactly once, from any thread, sooner or later:
 *   - unary: rpc_call_reply(call, &reply) (= send + finish OK), or rpc_call_finish(code, msg);
 *   - server stream: hand the call to a producer thread, which calls rpc_call_send any number
 *     of times (thread-safe, never blocks: one SEND is outstanding on the wire, the rest are
 *     queued in order) and then rpc_call_finish;
 *   - bidi stream: on_request runs once per client message and once more with req == NULL
 *     when the client half-closes; the handler may send and finish from any of those calls.
 * Initial metadata is always sent before any status (TOOLCHAIN §5 pitfall B), so even an
 * immediate error status reaches the client.
 *
 * Cancellation: a client cancel, a dropped connection, an expired deadline (gRPC cancels the
 * call itself at the client's deadline) or server shutdown sets rpc_call_cancelled() and
 * calls on_cancel (if given) once on the CQ thread; the handler must still finish the call
 * (the status is then dropped by gRPC). Producers poll rpc_call_cancelled at step boundaries.
 * rpc_call_send on a cancelled call returns STATUS_CANCELLED.
 *
 * Lifetime: after rpc_call_finish the caller must not touch the call. on_cancel may still be
 * running (or start) concurrently with or after rpc_call_finish; per-call data set with
 * rpc_call_set_data must therefore stay valid until on_release, which runs once on the CQ
 * thread when the call is completely done; no callback runs for the call after it.
 *
 * Shutdown (rpc_server_shutdown_grace): open-ended streams (methods with end_at_shutdown: health
 * Watch, reflection) end at once with UNAVAILABLE; every other call gets up to the grace period
 * to be finished by its owner, its final messages and status written and the call released;
 * then the server waits until the clients have acknowledged every byte written to them, and
 * only then stops accepting (grpc_server_shutdown_and_notify: GOAWAY) and closes the
 * connections (RPC_SERVER_CLOSE_MS at most for gRPC's graceful GOAWAY). Until then new calls
 * are still handed to their owners, who should refuse them while draining. A call still open
 * after the grace is cancelled with UNAVAILABLE "server shutting down: grace period over"
 * (on_cancel runs); owners must therefore finish their calls when cancelled (e.g. the engine at
 * its next step); what cannot end RPC_SERVER_CANCEL_MS later (a client that stopped reading)
 * has its connection dropped (grpc_server_cancel_all_calls). rpc_server_shutdown = a grace of
 * 0: cancel at once. See rpc_server.c for why this order. */
#ifndef DS_RPC_RPC_SERVER_H
#define DS_RPC_RPC_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "common/status.h"

typedef struct rpc_server rpc_server;
typedef struct rpc_call rpc_call;

typedef enum rpc_method_kind {
    RPC_METHOD_UNARY = 0,      /* one request, one reply */
    RPC_METHOD_SERVER_STREAM,  /* one request, a stream of replies */
    RPC_METHOD_BIDI_STREAM,    /* a stream each way (server reflection) */
} rpc_method_kind;

typedef struct rpc_method {
    const char *path;                               /* "/deltaserve.v1.Worker/Generate" */
    const ProtobufCMessageDescriptor *request_desc; /* how to unpack requests */
    rpc_method_kind kind;
    /* CQ thread; must not block. req is freed by the server after the handler returns (copy
     * what you keep), unless owns_request. req is NULL only for bidi half-close. */
    void (*on_request)(rpc_call *call, const ProtobufCMessage *req, void *user);
    /* CQ thread, at most once, not before on_request; may be NULL. Must not block. */
    void (*on_cancel)(rpc_call *call, void *user);
    /* CQ thread, exactly once per call that reached on_request, when it is completely done;
     * may be NULL. Free per-call data here if on_cancel uses it. */
    void (*on_release)(rpc_call *call, void *user);
    void *user; /* borrowed; passed to the callbacks */
    /* A stream with no natural end (health Watch, reflection): a graceful shutdown ends it
     * (UNAVAILABLE, through on_cancel) at once instead of waiting the grace period for it. */
    bool end_at_shutdown;
    /* CQ thread; may be NULL. A message rpc_call_send started has left (handed to the
     * transport, or dropped because the call is over: rpc_call_cancelled) and no other is
     * queued behind it, while the owner has not finished the call. An owner that keeps one
     * message in flight sends what accumulated meanwhile from here, in one message (the
     * worker's Generate coalesces tokens so). Must not block. */
    void (*on_writable)(rpc_call *call, void *user);
    /* on_request takes req (non-NULL) and frees it with protobuf_c_message_free_unpacked: a
     * handler that keeps the request as received (the router's Generate) needs no copy. */
    bool owns_request;
} rpc_method;

typedef struct rpc_tls_server rpc_tls_server; /* rpc/rpc_tls.h */
typedef struct rpc_auth rpc_auth;             /* rpc/rpc_auth.h */

typedef struct rpc_server_opts {
    const char *listen; /* "HOST:PORT"; port 0 picks a free port (rpc_server_port) */
    const rpc_tls_server *tls; /* NULL: plaintext; else TLS (mTLS with a client CA) on listen */
    /* "HOST:PORT" of a second, plaintext port that serves only grpc.health.v1 (the methods
     * added whose path starts with /grpc.health.v1.Health/), for kubelet's gRPC probes, which
     * cannot speak TLS; NULL: none. */
    const char *health_listen;
    rpc_auth *auth; /* borrowed, NULL: no tokens; methods marked by rpc_server_require_auth
                       need "authorization: Bearer <token>" or get UNAUTHENTICATED, unhandled */
    int max_calls;      /* preallocated call structs = most calls alive at once; 0 -> 4096.
                           Beyond that, new calls wait inside gRPC until one is released. */
    int max_recv_bytes; /* largest request message accepted; 0 -> 16 MiB */
    int cq_threads;     /* completion queues, a thread each; 0 -> 1, at most
                           RPC_SERVER_MAX_CQ_THREADS */
} rpc_server_opts;

#define RPC_SERVER_MAX_CQ_THREADS 64

/* Initialises gRPC, creates the server and binds the port (and health_listen), with TLS
 * credentials when opts->tls is set. STATUS_IO naming the address when it cannot be bound or a
 * TLS file cannot be read. */
int rpc_server_create(const rpc_server_opts *opts, rpc_server **out, status *st);

/* The bound port (the picked one when the listen port was 0); the health-only port, 0 if none. */
int rpc_server_port(const rpc_server *srv);
int rpc_server_health_port(const rpc_server *srv);

/* Marks the methods added so far whose path starts with prefix as needing the bearer token
 * (opts->auth; a no-op without one). A call that lacks it or has a wrong one is finished with
 * UNAUTHENTICATED by the server before its request is read: no handler runs. */
void rpc_server_require_auth(rpc_server *srv, const char *prefix);

/* Adds a method (the struct is copied) before rpc_server_start. Paths must be unique. */
int rpc_server_add_method(rpc_server *srv, const rpc_method *m, status *st);

/* Starts serving: spawns the CQ thread. */
int rpc_server_start(rpc_server *srv, status *st);

/* After the grace period of a shutdown, how long cancelled calls get to end before their
 * connections are dropped. */
#define RPC_SERVER_CANCEL_MS 2000
/* Once every call has ended, how long a connection gets to close by gRPC's graceful GOAWAY (the
 * client answers a ping, proving it read everything) before it is closed anyway. */
#define RPC_SERVER_CLOSE_MS 1000

/* See "Shutdown" above. Blocks until every call is released and the CQ thread has stopped;
 * call from a thread that owns no unfinished call. Returns true when every call ended within
 * grace_ms (nothing was cancelled but the open-ended streams). Idempotent (later calls return
 * true at once). */
bool rpc_server_shutdown_grace(rpc_server *srv, int64_t grace_ms);

/* rpc_server_shutdown_grace(srv, 0): every call still open is cancelled at once. */
void rpc_server_shutdown(rpc_server *srv);

/* Frees the server (after rpc_server_shutdown, or if never started) and shuts gRPC down. */
void rpc_server_destroy(rpc_server *srv);

/* Calls alive right now (accepted and not yet released). */
int rpc_server_live_calls(rpc_server *srv);

/* The completion queues (grpc_completion_queue *) the CQ threads run: rpc_server_cq(srv, i)
 * for any i (taken modulo rpc_server_n_cqs), for batches of other calls whose tags are
 * rpc_cq.h's. Valid from rpc_server_create to rpc_server_destroy. */
int rpc_server_n_cqs(const rpc_server *srv);
void *rpc_server_cq(rpc_server *srv, int i);

/* Batches of other calls may be in flight on the queues: the CQ threads of a shutdown keep
 * running until as many rpc_server_unhold as rpc_server_hold were called (any thread). */
void rpc_server_hold(rpc_server *srv);
void rpc_server_unhold(rpc_server *srv);

/* ---- per call (thread-safe unless said otherwise) ---- */

/* The client's deadline in ms on common/clock.h's clock (clock_now_ms), or CLOCK_NO_DEADLINE
 * (INT64_MAX) if the client set none. gRPC cancels the call by itself when it passes. */
int64_t rpc_call_deadline_ms(const rpc_call *call);

/* true once the client cancelled, disconnected, the deadline passed or the server shuts down. */
bool rpc_call_cancelled(const rpc_call *call);

/* Packs msg (a copy is taken; msg may be freed on return) and sends it after the messages
 * already queued. Never blocks. STATUS_CANCELLED if the call was cancelled or is finished,
 * STATUS_NOMEM if the queue cannot grow. The packed bytes go into one gRPC slice (held inline,
 * without allocation, up to 23 bytes) and a byte buffer the call keeps from its last completed
 * send. */
int rpc_call_send(rpc_call *call, const ProtobufCMessage *msg);
/* rpc_call_send of a message already packed: bytes[0, n) (copied). */
int rpc_call_send_bytes(rpc_call *call, const uint8_t *bytes, size_t n);

/* The socket of the call's TCP connection (looked up from /proc/self/fd by the peer gRPC
 * names, once a call), or -1 where that is not known (a UNIX socket, the connection gone). */
int rpc_call_socket(rpc_call *call);

/* ---- coalesced writes ---- */

/* Between rpc_cork_begin and rpc_cork_end on one thread, the messages that rpc_call_send hands
 * to gRPC at once (no earlier one of their call still on the wire) after the first to the same
 * connection wait in its socket (TCP_CORK) and leave together at rpc_cork_end: the messages of
 * many streams on one connection go out as two TCP segments instead of one each, and a lone
 * message leaves at once (its socket is not even looked up: rpc_call_socket runs for a call at
 * its connection's second message of a scope). gRPC C core 1.51 writes each batch's frames to
 * the socket before grpc_call_start_batch returns, so messages of different calls otherwise
 * never share a write (each is a sendmsg and a segment, and on loopback the receiver's
 * processing of it too). A scope is short: the messages wait no longer than it lasts (the
 * kernel sends a corked socket's data after 200 ms anyway). Up to 64 connections a scope (the
 * rest write as without); scopes do not nest. */
void rpc_cork_begin(void);
void rpc_cork_end(void);

/* Ends the call with a status after every queued message (dropped if cancelled). msg may be
 * NULL or ""; it is copied. Exactly once per call; the caller must not touch the call after. */
void rpc_call_finish(rpc_call *call, grpc_status_code code, const char *msg);

/* rpc_call_finish with st's code mapped by rpc_status_to_grpc and st's message. */
void rpc_call_finish_status(rpc_call *call, const status *st);

/* Unary reply: rpc_call_send(msg) then rpc_call_finish(OK). */
void rpc_call_reply(rpc_call *call, const ProtobufCMessage *msg);

/* The completion queue the call's batches complete on (its callbacks' thread runs it). */
void *rpc_call_cq(const rpc_call *call);

/* Per-call data for the handler (see "Lifetime"). */
void rpc_call_set_data(rpc_call *call, void *data);
void *rpc_call_data(const rpc_call *call);

#endif
