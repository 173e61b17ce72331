#include "rpc/rpc_client.h"
#include "rpc/rpc_tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "rpc/rpc_codec.h"

struct rpc_client_channel {
    grpc_channel *ch;   /* owned */
    char target[256];
};

/* A streaming call. Tags are the addresses of the tag_* fields. */
struct rpc_client_stream {
    grpc_completion_queue *cq; /* pluck; owned unless borrowed */
    int cq_borrowed;
    grpc_call *call;           /* owned */
    grpc_byte_buffer *send;    /* owned until the start batch completes */
    grpc_byte_buffer *recv;    /* owned, the message of the last RECV_MESSAGE */
    grpc_metadata_array init_md, trailing_md;
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
    grpc_init();
    grpc_channel_credentials *creds = NULL;
    if (tls && rpc_tls_client_creds(tls, &creds, st)) {
        free(c);
        grpc_shutdown();
        return st->code;
    }
    strcpy(c->target, target);
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, .value.integer = 100},
        /* gRPC core reads this as the minimum time a connection attempt (TCP connect and the
         * HTTP/2 SETTINGS exchange) may take, not as a backoff. At 100 ms a peer on a loaded
         * machine missed it and calls failed UNAVAILABLE "connection attempt timed out before
         * receiving SETTINGS frame" (CI, client_cli_test); 5 s still gives up on a black hole
         * well before gRPC's default of 20 s. A refused connection fails at once either way. */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, .value.integer = 5000},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 1000},
    };
    grpc_channel_args ca = {.num_args = sizeof args / sizeof args[0], .args = args};
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
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
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
    grpc_init();
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
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
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
