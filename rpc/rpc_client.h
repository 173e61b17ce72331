/* Blocking gRPC C core client helpers: a channel, unary calls and server-streaming calls with a
 * deadline, cancellation from another thread, and protobuf-c packing. Used by the router (to
 * call workers), `deltaserve client` and bench/loadgen.
 *
 * Each call owns a pluck completion queue and is driven by the thread that calls next/unary;
 * rpc_client_stream_cancel is the only function that may be called from another thread.
 * A call made with a parent (a server call being handled, e.g. the router's public Generate)
 * inherits the parent's deadline and is cancelled when the parent is (gRPC propagation).
 *
 *   rpc_client_channel *ch;  rpc_client_channel_create(&ch, "127.0.0.1:5000", &st);
 *   rpc_client_stream *s;    rpc_client_stream_start(&s, ch, "/deltaserve.v1.Worker/Generate",
 *                                                    &req.base, 5000, NULL, &st);
 *   ProtobufCMessage *m;     rpc_client_result r;
 *   while (rpc_client_stream_next(s, &deltaserve__v1__generate_response__descriptor, &m, &r))
 *       { ...; protobuf_c_message_free_unpacked(m, NULL); }
 *   r.code == GRPC_STATUS_OK ?  r.message;  rpc_client_stream_destroy(s);
 */
#ifndef DS_RPC_RPC_CLIENT_H
#define DS_RPC_RPC_CLIENT_H

#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "common/status.h"

typedef struct rpc_client_channel rpc_client_channel;
typedef struct rpc_client_stream rpc_client_stream;

/* The status a call ended with: a grpc_status_code and the peer's message. */
typedef struct rpc_client_result {
    int code;
    char message[512];
} rpc_client_result;

/* Opens a lazily-connecting insecure channel to "host:port" (or any gRPC target such as
 * "dns:///name:port"). Reconnect backoff is short (100 ms .. 1 s), so a restarted peer is seen
 * quickly. */
int rpc_client_channel_create(rpc_client_channel **out, const char *target, status *st);
/* The same over TLS (rpc/rpc_tls.h: the CA that verifies the server, and optionally a client
 * certificate for mTLS); tls NULL = insecure. STATUS_IO naming a file that cannot be read. */
typedef struct rpc_tls_client rpc_tls_client;
int rpc_client_channel_create_tls(rpc_client_channel **out, const char *target,
                                  const rpc_tls_client *tls, status *st);
void rpc_client_channel_destroy(rpc_client_channel *ch);

/* Every later call on ch sends metadata "authorization: Bearer <token>" with auth's current
 * token (rpc/rpc_auth.h: the file is re-read when it changes). auth is borrowed and must
 * outlive the channel's calls; NULL stops sending it. Call before the channel is shared. */
typedef struct rpc_auth rpc_auth;
void rpc_client_channel_set_auth(rpc_client_channel *ch, rpc_auth *auth);

/* For a call that ended UNAVAILABLE before any message: asks the server at ch's target what
 * it speaks (a TCP connection sending the HTTP/2 preface; at most timeout_ms) and, when that
 * is not what the channel speaks, rewrites r->message to say so: "the server at X speaks TLS:
 * use --tls-ca" (plaintext channel) or "the server at X is not using TLS: drop --tls-ca" (TLS
 * channel), the original message kept after it. Blocks; for error paths only. Returns 1 when
 * it rewrote the message. */
int rpc_client_explain(const rpc_client_channel *ch, rpc_client_result *r, int timeout_ms);

/* Unary call. timeout_ms <= 0: no deadline. Returns the gRPC code (0 = OK, then *resp is set;
 * free it with protobuf_c_message_free_unpacked). r gets the code and the peer's message. */
int rpc_client_unary(rpc_client_channel *ch, const char *method, const ProtobufCMessage *req,
                     const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                     int64_t timeout_ms, rpc_client_result *r);

/* Starts a server-streaming call and sends its request. timeout_ms <= 0: no deadline of its own.
 * parent_call: a grpc_call * of a server call whose deadline and cancellation propagate, or
 * NULL. Errors (nothing started): STATUS_NOMEM, STATUS_INTERNAL. */
int rpc_client_stream_start(rpc_client_stream **out, rpc_client_channel *ch, const char *method,
                            const ProtobufCMessage *req, int64_t timeout_ms, void *parent_call,
                            status *st);

/* A pluck completion queue a thread can reuse for all its streams (bench/loadgen: one per
 * thread). rpc_client_stream_start uses a private one per stream. */
typedef struct rpc_client_cq rpc_client_cq;
rpc_client_cq *rpc_client_cq_create(void);
/* After every stream started on it was destroyed. */
void rpc_client_cq_destroy(rpc_client_cq *cq);

/* rpc_client_stream_start on the caller's queue (borrowed; one stream at a time per thread). */
int rpc_client_stream_start_on(rpc_client_stream **out, rpc_client_cq *cq, rpc_client_channel *ch,
                               const char *method, const ProtobufCMessage *req, int64_t timeout_ms,
                               void *parent_call, status *st);

/* Blocks for the next message. Returns 1 with *msg set (caller frees it with
 * protobuf_c_message_free_unpacked), or 0 at the end of the stream with *r holding the final
 * status (an unparsable message cancels the call and ends it with INTERNAL). Once it returned
 * 0 it keeps returning 0 with the same status. */
int rpc_client_stream_next(rpc_client_stream *s, const ProtobufCMessageDescriptor *desc,
                           ProtobufCMessage **msg, rpc_client_result *r);

/* Cancels the call (thread-safe; any thread, any time before destroy). The pending or next
 * rpc_client_stream_next ends with CANCELLED. */
void rpc_client_stream_cancel(rpc_client_stream *s);

/* Cancels if still running, waits for gRPC to finish with the call, frees everything. */
void rpc_client_stream_destroy(rpc_client_stream *s);

/* Messages received so far. */
int64_t rpc_client_stream_n_received(const rpc_client_stream *s);

/* ---- asynchronous server-streaming calls ----
 * A call driven by events on a completion queue that another thread runs (rpc_server.h's CQ
 * threads: rpc_server_cq / rpc_call_cq), for a process that relays many streams with a few
 * threads (the router). The struct is the caller's for many calls one after another; its tags
 * are rpc_cq.h's. fn runs on the queue's thread:
 *   RPC_CLIENT_ASYNC_MESSAGE  a message arrived: take it (rpc_client_async_take), then ask for
 *                             the next (rpc_client_async_read) or cancel;
 *   RPC_CLIENT_ASYNC_END      the call is over (its status in rpc_client_async_result) and
 *                             released: the struct may start another call (also from fn).
 * Exactly one END per started call, after every MESSAGE of it. */
typedef struct rpc_client_async rpc_client_async;
typedef enum rpc_client_async_event {
    RPC_CLIENT_ASYNC_MESSAGE,
    RPC_CLIENT_ASYNC_END,
} rpc_client_async_event;
typedef void (*rpc_client_async_fn)(void *user, rpc_client_async_event ev);

int rpc_client_async_create(rpc_client_async **out, rpc_client_async_fn fn, void *user,
                            status *st);
/* No call may be running (after its END, or before any start). */
void rpc_client_async_destroy(rpc_client_async *a);

/* Starts method on ch with req on the completion queue cq (a grpc_completion_queue * run by a
 * thread that dispatches rpc_cq.h tags); deadline_ms on common/clock.h's clock, or
 * CLOCK_NO_DEADLINE. The first message is asked for at once. Errors (nothing started, no END
 * follows): STATUS_INTERNAL. */
int rpc_client_async_start(rpc_client_async *a, void *cq, rpc_client_channel *ch,
                           const char *method, const ProtobufCMessage *req, int64_t deadline_ms,
                           status *st);

/* In MESSAGE: the message (the caller frees it with protobuf_c_message_free_unpacked), or NULL
 * when it does not parse as desc: the call is then cancelled and ends INTERNAL naming it. */
ProtobufCMessage *rpc_client_async_take(rpc_client_async *a, const ProtobufCMessageDescriptor *desc);
/* rpc_client_async_take with the message's memory from alloc (an rpc_arena's, rpc_codec.h;
 * NULL: malloc): free it with protobuf_c_message_free_unpacked(m, alloc). */
ProtobufCMessage *rpc_client_async_take_with(rpc_client_async *a,
                                             const ProtobufCMessageDescriptor *desc,
                                             ProtobufCAllocator *alloc);
/* In MESSAGE: the message's bytes when they are one uncompressed slice (valid until it is
 * taken or consumed), else NULL. */
const uint8_t *rpc_client_async_peek(const rpc_client_async *a, size_t *n);
/* In MESSAGE: the message was read through rpc_client_async_peek: it is dropped and counted as
 * received. */
void rpc_client_async_consume(rpc_client_async *a);
/* In MESSAGE (or after it, on the queue's thread): asks for the next message. */
void rpc_client_async_read(rpc_client_async *a);
/* Cancels the running call, if any (any thread, any time): END follows with CANCELLED unless
 * the status was already in. */
void rpc_client_async_cancel(rpc_client_async *a);
/* After END: the call's status and the peer's message. */
const rpc_client_result *rpc_client_async_result(const rpc_client_async *a);
/* Messages of the current (or last) call taken so far. */
int64_t rpc_client_async_n_received(const rpc_client_async *a);

#endif
