/* The router's OpenAI-compatible HTTP/1.1 + SSE door (--http-listen): POST /v1/chat/completions,
 * POST /v1/completions, GET /v1/models, GET /health, over libmicrohttpd with one thread per
 * connection. Requests are parsed with json-c into a Generation request and run by the same
 * relay as gRPC (router_internal.h: router_relay_*), n relays for n choices; the relay's
 * messages come back through a router_sink that formats OpenAI's JSON (router_json.h) into
 * buffers kept per request, so a token costs no allocation. docs/HTTP.md is the reference
 * (fields, mapping, errors). TLS is --tls-cert/--tls-key (the gRPC port's), the token is
 * --auth-token-file's ("Authorization: Bearer"), admission is the gRPC side's (draining, 503;
 * --max-inflight, 429). Not a public header: router.c starts and stops it. */
#ifndef DS_ROUTER_ROUTER_HTTP_H
#define DS_ROUTER_ROUTER_HTTP_H

#include "common/status.h"

#define ROUTER_HTTP_MAX_BODY (8u << 20) /* bytes of a request body; larger is 413 */
#define ROUTER_HTTP_MAX_N 16            /* choices per request (n) */

typedef struct router router;
typedef struct router_http router_http;

/* Binds listen (HOST:PORT, port 0 picks one) and starts serving. Errors name --http-listen
 * or the TLS flag's file. */
int router_http_start(router *r, const char *listen, router_http **out, status *st);
int router_http_port(const router_http *h);

/* New requests get 503; requests still running are cancelled (their relays end); the daemon's
 * threads are joined. NULL is a no-op. */
void router_http_stop(router_http *h);

#endif
