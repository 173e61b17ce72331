#include "router/router_dns.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Splits HOST:PORT; host may be [v6]. Returns 0 and fills host (without brackets) / port. */
static int split_host_port(const char *s, char *host, size_t host_cap, int *port)
{
    const char *colon;
    size_t hl;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':') return -1;
        hl = (size_t)(rb - s - 1);
        if (hl == 0 || hl >= host_cap) return -1;
        memcpy(host, s + 1, hl);
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) return -1;
        hl = (size_t)(colon - s);
        if (hl == 0 || hl >= host_cap || memchr(s, ':', hl)) return -1;
        memcpy(host, s, hl);
    }
    host[hl] = 0;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || p < 1 || p > 65535) return -1;
    *port = (int)p;
    return 0;
}

static int add_unique(router_dns_list *out, const char *a, status *st)
{
    for (int i = 0; i < out->n; i++)
        if (!strcmp(out->addr[i], a)) return 0;
    if (out->n == ROUTER_POOL_MAX_WORKERS)
        return status_fail(st, STATUS_INVALID, "workers: more than %d", ROUTER_POOL_MAX_WORKERS);
    snprintf(out->addr[out->n++], ROUTER_ADDR_MAX, "%s", a);
    return 0;
}

int router_dns_parse_list(const char *s, router_dns_list *out, status *st)
{
    out->n = 0;
    char item[ROUTER_ADDR_MAX], host[ROUTER_ADDR_MAX];
    while (*s) {
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        size_t n = strcspn(s, ", ");
        if (n >= sizeof item)
            return status_fail(st, STATUS_INVALID, "--workers: entry '%.40s...' is too long", s);
        memcpy(item, s, n);
        item[n] = 0;
        s += n;
        int port;
        if (split_host_port(item, host, sizeof host, &port))
            return status_fail(st, STATUS_INVALID, "--workers: '%s' is not HOST:PORT", item);
        if (add_unique(out, item, st)) return STATUS_INVALID;
    }
    if (out->n == 0) return status_fail(st, STATUS_INVALID, "--workers: no worker address given");
    return 0;
}

static int cmp_addr(const void *a, const void *b) { return strcmp(a, b); }

int router_dns_resolve(const char *name_port, router_dns_list *out, status *st)
{
    out->n = 0;
    char host[ROUTER_ADDR_MAX], port_s[16];
    int port;
    if (split_host_port(name_port, host, sizeof host, &port))
        return status_fail(st, STATUS_INVALID, "--workers-dns: '%s' is not NAME:PORT", name_port);
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, port_s, &hints, &res);
    if (rc)
        return status_fail(st, STATUS_UNAVAILABLE, "--workers-dns %s: %s", name_port,
                           gai_strerror(rc));
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        char ip[INET6_ADDRSTRLEN], a[ROUTER_ADDR_MAX];
        if (ai->ai_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr, ip, sizeof ip);
            snprintf(a, sizeof a, "%s:%d", ip, port);
        } else if (ai->ai_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr, ip, sizeof ip);
            snprintf(a, sizeof a, "[%s]:%d", ip, port);
        } else {
            continue;
        }
        if (add_unique(out, a, st)) break;
    }
    freeaddrinfo(res);
    qsort(out->addr, (size_t)out->n, sizeof out->addr[0], cmp_addr);
    return 0;
}
