/* The poller: DNS re-resolution, health checks and load polls of every worker, readiness. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "proto/grpc/health/v1/health.pb-c.h"
#include "router/router_internal.h"
#include "rpc/rpc_client.h"

#include <grpc/status.h>

#define POLL_TIMEOUT_MS 1000 /* per health check / GetLoad */

void router_update_readiness(router *r)
{
    pthread_mutex_lock(&r->mu);
    int draining = r->draining;
    pthread_mutex_unlock(&r->mu);
    rpc_health_set(r->health, ROUTER_SERVICE, !draining && router_pool_n_healthy(r->pool) > 0);
}

static void resolve(router *r)
{
    status st;
    if (router_dns_resolve(r->opts.workers_dns, r->dns, &st)) {
        /* keep the current set: a DNS hiccup must not empty the pool */
        LOG_WARN("router: %s", st.msg);
        return;
    }
    const char *addrs[ROUTER_POOL_MAX_WORKERS];
    for (int i = 0; i < r->dns->n; i++) addrs[i] = r->dns->addr[i];
    status_clear(&st);
    int added = router_pool_set(r->pool, addrs, r->dns->n, &st);
    if (st.code) LOG_WARN("router: worker set: %s", st.msg);
    else if (added > 0)
        LOG_INFO("router: %s resolved to %d worker%s (%d new)", r->opts.workers_dns, r->dns->n,
                 r->dns->n == 1 ? "" : "s", added);
}

static void poll_worker(router *r, router_worker *w)
{
    rpc_client_channel *ch = router_pool_worker_conn(w);
    Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    hreq.service = ROUTER_WORKER_SERVICE;
    ProtobufCMessage *resp;
    rpc_client_result res;
    int serving = 0, answered = 0;
    if (rpc_client_unary(ch, "/grpc.health.v1.Health/Check", &hreq.base,
                         &grpc__health__v1__health_check_response__descriptor, &resp,
                         POLL_TIMEOUT_MS, &res) == 0) {
        answered = 1;
        serving = ((Grpc__Health__V1__HealthCheckResponse *)resp)->status ==
                  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    router_worker_state before = router_pool_worker_state(r->pool, w);
    /* a worker turning unhealthy because it speaks the other protocol: say that (once) */
    if (!serving && res.code && before != ROUTER_WORKER_UNHEALTHY)
        if (!rpc_client_explain(ch, &res, POLL_TIMEOUT_MS) &&
            strstr(res.message, "not in peer certificate")) {
            size_t n = strlen(res.message);
            snprintf(res.message + n, sizeof res.message - n,
                     " (the worker's certificate must carry that name as a DNS SAN, or "
                     "--workers-tls-name must give the name it carries)");
        }
    if (serving) {
        Deltaserve__V1__GetLoadRequest lreq = DELTASERVE__V1__GET_LOAD_REQUEST__INIT;
        /* the heads of the workers' prefix caches feed prefix routing only */
        if (r->opts.policy.mode == ROUTER_ROUTING_PREFIX)
            lreq.prefix_tokens = (uint32_t)r->opts.policy.prefix_tokens;
        if (rpc_client_unary(ch, "/deltaserve.v1.Worker/GetLoad", &lreq.base,
                             &deltaserve__v1__load__descriptor, &resp, POLL_TIMEOUT_MS, &res) == 0) {
            Deltaserve__V1__Load *l = (Deltaserve__V1__Load *)resp;
            router_worker_load load = {
                .outstanding_tokens = (int64_t)l->outstanding_tokens,
                .running = (int)l->running,
                .waiting = (int)l->waiting,
                .free_slots = (int)l->free_slots,
                .total_slots = (int)l->total_slots,
                .queue_capacity = (int)l->queue_capacity,
            };
            for (size_t i = 0; i < l->n_prefix_heads && i < ROUTER_POOL_MAX_HEADS; i++)
                load.prefix_heads[load.n_prefix_heads++] = l->prefix_heads[i];
            if (l->draining) serving = 0;
            router_pool_report_load(r->pool, w, &load);
            protobuf_c_message_free_unpacked(resp, NULL);
        } else if (res.code == GRPC_STATUS_UNAUTHENTICATED) {
            serving = 0; /* health is open, the Worker calls need the token: none would pass */
        }
    }
    router_check c = serving ? ROUTER_CHECK_SERVING
                     : answered || res.code == GRPC_STATUS_UNAUTHENTICATED ? ROUTER_CHECK_NOT_SERVING
                                                                          : ROUTER_CHECK_FAILED;
    router_worker_state after = router_pool_report_health(r->pool, w, c);
    if (c == ROUTER_CHECK_FAILED && after == ROUTER_WORKER_HEALTHY && before == after)
        LOG_DEBUG("router: worker %s: health check failed, still in the pool: %s",
                  router_pool_worker_addr(w), res.message);
    /* once per healthy spell (the worker's context), and until the router knows its model */
    if (serving && (!router_pool_worker_context(r->pool, w) || !router_api_model_known(r))) {
        Deltaserve__V1__GetModelInfoRequest mreq = DELTASERVE__V1__GET_MODEL_INFO_REQUEST__INIT;
        if (rpc_client_unary(ch, "/deltaserve.v1.Worker/GetModelInfo", &mreq.base,
                             &deltaserve__v1__model_info__descriptor, &resp, POLL_TIMEOUT_MS,
                             &res) == 0) {
            Deltaserve__V1__ModelInfo *mi = (Deltaserve__V1__ModelInfo *)resp;
            router_pool_report_context(r->pool, w, mi->max_context > INT32_MAX
                                                       ? INT32_MAX : (int)mi->max_context);
            router_api_learn_model(r, w, mi); /* keeps it or frees it */
        } else {
            LOG_WARN("router: worker %s: GetModelInfo: %s", router_pool_worker_addr(w),
                     res.message);
        }
    }
    if (before != after)
        LOG_INFO("router: worker %s is %s%s%s", router_pool_worker_addr(w),
                 serving ? "healthy" : "unhealthy", serving ? "" : ": ",
                 serving ? "" : (res.code ? res.message : "NOT_SERVING"));
}

void router_poll_once(router *r, int resolve_dns)
{
    if (resolve_dns && r->opts.workers_dns) resolve(r);
    router_worker **ws = malloc(ROUTER_POOL_MAX_WORKERS * sizeof *ws);
    if (!ws) return;
    int n = router_pool_snapshot(r->pool, ws, ROUTER_POOL_MAX_WORKERS);
    for (int i = 0; i < n; i++) poll_worker(r, ws[i]);
    if (r->feeds) router_feeds_maintain(r->feeds, ws, n);
    for (int i = 0; i < n; i++) router_pool_unref(r->pool, ws[i]);
    free(ws);
    router_update_readiness(r);
}

void *router_poll_main(void *arg)
{
    router *r = arg;
    int64_t next_dns = 0;
    for (;;) {
        int64_t now = clock_now_ms();
        int dns = now >= next_dns;
        if (dns) next_dns = now + r->opts.dns_refresh_ms;
        router_poll_once(r, dns);
        /* sleep one interval, or until told to stop */
        const struct timespec ts = clock_timespec_ms(clock_deadline_ms(r->opts.poll_ms));
        pthread_mutex_lock(&r->mu);
        while (!r->stopping && pthread_cond_timedwait(&r->cv, &r->mu, &ts) == 0) {
        }
        int stop = r->stopping;
        pthread_mutex_unlock(&r->mu);
        if (stop) break;
    }
    return NULL;
}
