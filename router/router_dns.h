/* Worker discovery: parse a --workers list, or resolve a --workers-dns NAME:PORT (a Kubernetes
 * headless Service: one A/AAAA record per ready pod) into "ip:port" addresses. The router
 * re-resolves periodically and hands the answer to router_pool_set. */
#ifndef DS_ROUTER_ROUTER_DNS_H
#define DS_ROUTER_ROUTER_DNS_H

#include "common/status.h"
#include "router/router_pool.h"

typedef struct router_dns_list {
    char addr[ROUTER_POOL_MAX_WORKERS][ROUTER_ADDR_MAX];
    int n;
} router_dns_list;

/* Splits "h1:p1,h2:p2" (spaces ignored, duplicates dropped). Each entry must be HOST:PORT
 * with a port in 1..65535 ([v6]:port accepted). STATUS_INVALID naming the entry otherwise. */
int router_dns_parse_list(const char *s, router_dns_list *out, status *st);

/* Resolves NAME:PORT with getaddrinfo (TCP, IPv4 and IPv6) into sorted, deduplicated
 * "ip:port" / "[ip6]:port" entries. STATUS_INVALID for a malformed spec, STATUS_UNAVAILABLE
 * when the name does not resolve (the message carries gai_strerror). */
int router_dns_resolve(const char *name_port, router_dns_list *out, status *st);

#endif
