/* The relay's common message on the wire, read and written without protobuf-c: a worker
 * message that carries token ids only (field 1 of GenerateResponse, packed or not), and a
 * client message of token ids and text (fields 1 and 2). Anything else (the first message's
 * usage and timings, a final message, logprobs, a chat's fields) goes through protobuf-c.
 * The bytes written are the ones protobuf_c_message_pack writes for the same message. */
#ifndef DS_ROUTER_ROUTER_WIRE_H
#define DS_ROUTER_ROUTER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "proto/deltaserve/v1/deltaserve.pb-c.h"

/* The GenerateResponse in b[0, n) when it has no field but token_ids: the message and its ids
 * taken from alloc (free with protobuf_c_message_free_unpacked(m, alloc)). NULL when it has
 * another field, is malformed or alloc failed: the caller unpacks it with protobuf-c, which
 * reads or refuses it. An empty message is not taken either. */
Deltaserve__V1__GenerateResponse *router_wire_decode_tokens(const uint8_t *b, size_t n,
                                                             ProtobufCAllocator *alloc);

/* Bytes router_wire_encode_tokens writes at most for n_ids ids and text_len bytes of text. */
size_t router_wire_tokens_max(size_t n_ids, size_t text_len);

/* A GenerateResponse of ids (field 1, packed; absent when n_ids is 0) and text (field 2;
 * absent when text_len is 0) into out (room for router_wire_tokens_max); returns its length. */
size_t router_wire_encode_tokens(const int32_t *ids, size_t n_ids, const char *text,
                                 size_t text_len, uint8_t *out);

#endif
