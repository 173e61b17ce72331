/* The HTTP door's input: an OpenAI request body (parsed by json-c) checked field by field and
 * turned into Generation requests, one per choice (router_http.h; docs/HTTP.md has the field
 * mapping). Every error is OpenAI's error object with the field named in `param`; a string
 * holding U+0000 is refused, never cut. */
#ifndef DS_ROUTER_ROUTER_HTTP_PARSE_H
#define DS_ROUTER_ROUTER_HTTP_PARSE_H

#include <json-c/json.h>

#include "proto/deltaserve/v1/deltaserve.pb-c.h"

typedef enum { ROUTER_HTTP_CHAT, ROUTER_HTTP_COMPLETION } router_http_kind;

/* An HTTP error as OpenAI's error object. */
typedef struct router_http_error {
    unsigned http;    /* status */
    const char *type; /* static: "invalid_request_error", ... */
    const char *code; /* static, or NULL */
    char param[96];   /* the field, or "" */
    char msg[600];
} router_http_error;

/* What does not depend on the choice. */
typedef struct router_http_params {
    router_http_kind kind;
    int stream, include_usage, n;
    int lp_top; /* alternatives printed per token; -1: no logprobs */
} router_http_params;

/* Sets e and returns -1, so an error path is one line. */
int router_http_parse_fail(router_http_error *e, unsigned http, const char *type, const char *code,
                           const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* model (404 when it is not model_id), n, stream, stream_options, logprobs, unsupported fields.
 * 0, or -1 with e set. */
int router_http_parse_params(json_object *req, router_http_kind kind, const char *model_id,
                             router_http_params *hp, router_http_error *e);

/* The Generation request of choice i (seed + i when a seed is given), every part malloc'd
 * (protobuf_c_message_free_unpacked frees it); NULL with e set. Its request_id is a
 * placeholder the caller replaces. */
Deltaserve__V1__GenerateRequest *router_http_parse_request(json_object *req,
                                                           const router_http_params *hp,
                                                           const char *id, int i,
                                                           router_http_error *e);

#endif
