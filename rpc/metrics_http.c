/* GET /metrics over libmicrohttpd (rpc/metrics_http.h). */
#include "rpc/metrics_http.h"

#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

struct metrics_http {
    struct MHD_Daemon *daemon; /* owned; its own polling thread */
    int port;
};

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    metrics *m = cls;
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    struct MHD_Response *resp;
    enum MHD_Result rc;
    if (strcmp(method, "GET") != 0 || (strcmp(url, "/metrics") != 0 && strcmp(url, "/") != 0)) {
        static const char nf[] = "not found: GET /metrics\n";
        resp = MHD_create_response_from_buffer(sizeof nf - 1, (void *)nf, MHD_RESPMEM_PERSISTENT);
        rc = MHD_queue_response(conn, MHD_HTTP_NOT_FOUND, resp);
        MHD_destroy_response(resp);
        return rc;
    }
    size_t need;
    char *buf = metrics_render(m, &need);
    if (!buf) return MHD_NO;
    resp = MHD_create_response_from_buffer(need, buf, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    rc = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* "HOST:PORT" or "[V6]:PORT" -> host and port strings. */
static int split_host_port(const char *listen, char *host, size_t host_cap, char *port,
                           size_t port_cap)
{
    const char *colon = strrchr(listen, ':');
    if (!colon || !colon[1]) return -1;
    const char *h = listen;
    size_t hn = (size_t)(colon - listen);
    if (hn >= 2 && h[0] == '[' && h[hn - 1] == ']') {
        h++;
        hn -= 2;
    }
    if (hn >= host_cap || strlen(colon + 1) >= port_cap) return -1;
    memcpy(host, h, hn);
    host[hn] = '\0';
    strcpy(port, colon + 1);
    return 0;
}

int http_listen_resolve(const char *listen, const char *what, struct addrinfo **ai, int *port,
                        status *st)
{
    char host[128], ports[16];
    *ai = NULL;
    if (split_host_port(listen, host, sizeof host, ports, sizeof ports))
        return status_fail(st, STATUS_INVALID, "%s: bad listen address '%s' (HOST:PORT)", what,
                           listen);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int e = getaddrinfo(host[0] ? host : NULL, ports, &hints, ai);
    if (e != 0 || !*ai) {
        if (*ai) freeaddrinfo(*ai);
        *ai = NULL;
        return status_fail(st, STATUS_IO, "%s: cannot resolve '%s': %s", what, listen,
                           gai_strerror(e));
    }
    *port = atoi(ports);
    return STATUS_OK;
}

int metrics_http_start(metrics *m, const char *listen, metrics_http **out, status *st)
{
    struct addrinfo *ai;
    int port_num;
    *out = NULL;
    int rc = http_listen_resolve(listen, "metrics", &ai, &port_num, st);
    if (rc) return rc;
    metrics_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return status_fail(st, STATUS_NOMEM, "metrics: out of memory");
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(flags, (uint16_t)port_num, NULL, NULL, on_http, m,
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)10, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->daemon) {
        free(h);
        return status_fail(st, STATUS_IO, "metrics: cannot listen on %s (port in use?)", listen);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : port_num;
    *out = h;
    return STATUS_OK;
}

int metrics_http_port(const metrics_http *h) { return h->port; }

void metrics_http_stop(metrics_http *h)
{
    if (!h) return;
    MHD_stop_daemon(h->daemon);
    free(h);
}
