/* The Prometheus endpoint: GET /metrics (and GET /) answers metrics_render of a registry
 * (common/metrics.h) over libmicrohttpd, on its own thread; anything else is 404.
 *
 *   metrics_http *h;  metrics_http_start(m, "0.0.0.0:0", &h, &st);  metrics_http_port(h);
 *   ...
 *   metrics_http_stop(h);  metrics_destroy(m);   (stop before the registry goes) */
#ifndef DS_RPC_METRICS_HTTP_H
#define DS_RPC_METRICS_HTTP_H

#include "common/metrics.h"
#include "common/status.h"

typedef struct metrics_http metrics_http;
struct addrinfo;

/* "HOST:PORT" or "[V6]:PORT" (empty host: every address) -> *ai (freeaddrinfo it) and the
 * port, for every libmicrohttpd listener (this one, the router's HTTP door). STATUS_INVALID for a
 * malformed address, STATUS_IO when it cannot be resolved; messages start with what. */
int http_listen_resolve(const char *listen, const char *what, struct addrinfo **ai, int *port,
                        status *st);

/* Serves m (borrowed; must outlive the endpoint) on "HOST:PORT" or "[V6]:PORT" (port 0 picks
 * one: metrics_http_port). STATUS_INVALID for a malformed address, STATUS_IO naming it when it
 * cannot be resolved or listened on. */
int metrics_http_start(metrics *m, const char *listen, metrics_http **out, status *st);
int metrics_http_port(const metrics_http *h);
/* Stops the endpoint (waits for its thread) and frees it. NULL is a no-op. */
void metrics_http_stop(metrics_http *h);

#endif
