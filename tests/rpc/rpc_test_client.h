/* A tiny blocking gRPC C core client for the rpc/ tests (independent of rpc/rpc_client so a
 * server bug cannot hide behind a matching client bug). Every wait is bounded (10 s) so a
 * broken server fails the test instead of hanging it. */
#ifndef DS_TESTS_RPC_TEST_CLIENT_H
#define DS_TESTS_RPC_TEST_CLIENT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <protobuf-c/protobuf-c.h>

typedef struct tcall {
    grpc_call *call;
    grpc_completion_queue *cq;
    grpc_metadata_array md_init, md_trail;
    grpc_status_code code;
    grpc_slice details;
    char message[256];
    bool ok; /* the last batch succeeded */
} tcall;

static gpr_timespec tc_in_ms(int64_t ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Runs one batch and waits (<= 10 s) for it; false if it failed or timed out. */
static bool tc_batch(tcall *t, const grpc_op *ops, size_t n)
{
    static int tag_counter;
    void *tag = (void *)(intptr_t)(++tag_counter);
    if (grpc_call_start_batch(t->call, ops, n, tag, NULL) != GRPC_CALL_OK) return false;
    grpc_event ev = grpc_completion_queue_pluck(t->cq, tag, tc_in_ms(10000), NULL);
    t->ok = ev.type == GRPC_OP_COMPLETE && ev.success;
    return ev.type == GRPC_OP_COMPLETE;
}

static grpc_byte_buffer *tc_pack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Starts a call and sends req (NULL: none); close_send: half-close right away. */
static bool tc_start(tcall *t, grpc_channel *ch, const char *method, const ProtobufCMessage *req,
                     int64_t timeout_ms, bool close_send)
{
    memset(t, 0, sizeof *t);
    t->cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice m = grpc_slice_from_copied_string(method);
    t->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, t->cq, m, NULL,
                                       timeout_ms > 0 ? tc_in_ms(timeout_ms)
                                                      : gpr_inf_future(GPR_CLOCK_REALTIME),
                                       NULL);
    grpc_slice_unref(m);
    grpc_metadata_array_init(&t->md_init);
    grpc_metadata_array_init(&t->md_trail);
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    grpc_byte_buffer *bb = NULL;
    if (req) {
        bb = tc_pack(req);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = bb;
    }
    if (close_send) ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &t->md_init;
    bool r = tc_batch(t, ops, n);
    if (bb) grpc_byte_buffer_destroy(bb);
    return r;
}

static bool tc_send(tcall *t, const ProtobufCMessage *req)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = tc_pack(req);
    bool r = tc_batch(t, &op, 1) && t->ok;
    grpc_byte_buffer_destroy(op.data.send_message.send_message);
    return r;
}

static bool tc_close_send(tcall *t)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    return tc_batch(t, &op, 1) && t->ok;
}

/* The next message, or NULL at the end of the stream (or on timeout). */
static ProtobufCMessage *tc_recv(tcall *t, const ProtobufCMessageDescriptor *desc)
{
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (!tc_batch(t, &op, 1) || !bb) return NULL;
    grpc_byte_buffer_reader rd;
    grpc_byte_buffer_reader_init(&rd, bb);
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    grpc_byte_buffer_destroy(bb);
    ProtobufCMessage *m =
        protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    return m;
}

/* The final status; -1 if it did not arrive within 10 s. */
static int tc_status(tcall *t)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &t->md_trail;
    op.data.recv_status_on_client.status = &t->code;
    op.data.recv_status_on_client.status_details = &t->details;
    if (!tc_batch(t, &op, 1)) return -1;
    size_t n = GRPC_SLICE_LENGTH(t->details);
    if (n >= sizeof t->message) n = sizeof t->message - 1;
    memcpy(t->message, GRPC_SLICE_START_PTR(t->details), n);
    t->message[n] = '\0';
    grpc_slice_unref(t->details);
    return (int)t->code;
}

static void tc_cancel(tcall *t) { grpc_call_cancel(t->call, NULL); }

static void tc_destroy(tcall *t)
{
    grpc_call_unref(t->call);
    grpc_metadata_array_destroy(&t->md_init);
    grpc_metadata_array_destroy(&t->md_trail);
    grpc_completion_queue_shutdown(t->cq);
    while (grpc_completion_queue_pluck(t->cq, NULL, tc_in_ms(1000), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(t->cq);
}

static grpc_channel *tc_channel(int port)
{
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, cr, NULL);
    grpc_channel_credentials_release(cr);
    return ch;
}

#endif
