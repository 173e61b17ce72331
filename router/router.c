#include "router/router.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/finish.h"
#include "common/log.h"
#include "gguf/gguf.h"
#include "router/router_http.h"
#include "router/router_internal.h"
#include "proto/proto_descriptors.h"
#include "rpc/rpc_client.h"

#include <grpc/grpc_security.h>

static void *pool_connect(const char *addr, void *ctx)
{
    const router *r = ctx;
    rpc_client_channel *ch = NULL;
    status st;
    if (rpc_client_channel_create_tls(&ch, addr, r->opts.worker_tls ? &r->worker_tls : NULL,
                                      &st)) {
        LOG_WARN("router: worker %s: %s", addr, st.msg);
        return NULL;
    }
    if (r->worker_auth) rpc_client_channel_set_auth(ch, r->worker_auth);
    return ch;
}

static void pool_disconnect(void *conn, void *ctx)
{
    (void)ctx;
    rpc_client_channel_destroy(conn);
}

/* Gauges read at exposition time. */
static void metrics_collect(void *arg)
{
    router *r = arg;
    pthread_mutex_lock(&r->mu);
    int inflight = r->inflight;
    pthread_mutex_unlock(&r->mu);
    metrics_set(r->m.running, inflight);
    metrics_set(r->m.healthy, router_pool_n_healthy(r->pool));
    metrics_set(r->m.workers, router_pool_n_workers(r->pool));
}

static int metrics_setup(router *r, status *st)
{
    int rc = metrics_create(32, &r->metrics, st);
    if (rc) return rc;
    metrics *m = r->metrics;
    for (int i = 0; i < 4; i++) {
        char label[64];
        snprintf(label, sizeof label, "finished_reason=\"%s\"", finish_reason_name(FINISH_STOP + i));
        r->m.ok[i] = metrics_counter(m, "deltaserve:request_success_total", label,
                                     "Requests that ended with status OK, by finish reason.");
    }
    r->m.failed = metrics_counter(m, "deltaserve:request_failure_total", NULL,
                                  "Requests that ended with a non-OK gRPC status.");
    r->m.retries = metrics_counter(m, "deltaserve:router_retries_total", NULL,
                                   "Requests retried on another worker before the first token.");
    r->m.prompt_tokens = metrics_counter(m, "deltaserve:prompt_tokens_total", NULL,
                                         "Prompt tokens of requests a worker took (refused ones not counted).");
    r->m.generation_tokens = metrics_counter(m, "deltaserve:generation_tokens_total", NULL,
                                             "Generated tokens relayed to clients.");
    r->m.feed_batches = metrics_counter(m, "deltaserve:router_feed_batches_total", NULL,
                                        "Messages received on the workers' token feeds.");
    r->m.feed_items = metrics_counter(m, "deltaserve:router_feed_items_total", NULL,
                                      "Worker messages they carried (items over batches: "
                                      "the streams a feed message served).");
    r->m.running = metrics_gauge(m, "deltaserve:num_requests_running", NULL,
                                 "Generate calls in flight at the router.");
    r->m.healthy = metrics_gauge(m, "deltaserve:router_healthy_workers", NULL,
                                 "Workers that passed their last health check.");
    r->m.workers = metrics_gauge(m, "deltaserve:router_workers", NULL, "Workers known.");
    r->m.ttft = metrics_histogram(m, "deltaserve:time_to_first_token_seconds", NULL,
                                  "Time to first token, at the router.", metrics_latency_buckets,
                                  metrics_n_latency_buckets);
    r->m.itl = metrics_histogram(m, "deltaserve:inter_token_latency_seconds", NULL,
                                 "Mean inter-token latency of each request, at the router.",
                                 metrics_latency_buckets, metrics_n_latency_buckets);
    r->m.e2e = metrics_histogram(m, "deltaserve:e2e_request_latency_seconds", NULL,
                                 "Arrival to end of stream, at the router.",
                                 metrics_latency_buckets, metrics_n_latency_buckets);
    metrics_set_collect(m, metrics_collect, r);
    return 0;
}

/* The model id of the HTTP door (router_internal.h: model_id). */
static void set_model_id(router *r)
{
    const router_opts *o = &r->opts;
    if (o->served_model_name) {
        snprintf(r->model_id, sizeof r->model_id, "%s", o->served_model_name);
        return;
    }
    if (!o->model) {
        snprintf(r->model_id, sizeof r->model_id, "deltaserve");
        return;
    }
    const char *base = strrchr(o->model, '/');
    base = base ? base + 1 : o->model;
    snprintf(r->model_id, sizeof r->model_id, "%s", base);
    gguf_file *f = NULL;
    status st;
    gguf_str name;
    if (gguf_open(&f, o->model, &st) == 0 && gguf_get_str(f, "general.name", &name, NULL) == 0 &&
        name.len > 0 && name.len < sizeof r->model_id && !memchr(name.ptr, 0, name.len))
        snprintf(r->model_id, sizeof r->model_id, "%.*s", (int)name.len, name.ptr);
    if (f) gguf_close(f);
}

static void apply_defaults(router_opts *o)
{
    if (o->poll_ms <= 0) o->poll_ms = 500;
    if (o->dns_refresh_ms <= 0) o->dns_refresh_ms = 5000;
    if (o->max_inflight <= 0) o->max_inflight = 1024;
    if (o->max_attempts <= 0) o->max_attempts = 3;
    if (o->cq_threads <= 0) o->cq_threads = 1;
    if (o->stream_interval <= 0) o->stream_interval = 1;
    if (o->policy.prefix_tokens <= 0) o->policy.prefix_tokens = 32;
}

int router_create(router **out, const router_opts *opts, status *st)
{
    *out = NULL;
    if (!opts->listen) return status_fail(st, STATUS_INVALID, "--listen: required");
    if (!opts->workers == !opts->workers_dns)
        return status_fail(st, STATUS_INVALID, "give exactly one of --workers and --workers-dns");
    router *r = calloc(1, sizeof *r);
    if (!r) return status_fail(st, STATUS_NOMEM, "router: out of memory");
    r->opts = *opts;
    apply_defaults(&r->opts);
    pthread_mutex_init(&r->mu, NULL);
    clock_cond_init(&r->cv);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = (uint64_t)ts.tv_sec * 1000000007ULL ^ (uint64_t)ts.tv_nsec ^
                    ((uint64_t)(uintptr_t)r << 16);
    atomic_init(&r->seed_rng, seed);
    r->id_base = router_policy_rand(&seed);
    atomic_init(&r->next_id, 1);
    int rc;
    if ((rc = router_ids_create(&r->ids, st))) goto fail;
    r->dns = calloc(1, sizeof *r->dns);
    if (!r->dns) { rc = status_fail(st, STATUS_NOMEM, "router: out of memory"); goto fail; }
    if (r->opts.model) {
        if ((rc = tokenizer_load_path(&r->tok, r->opts.model, st))) goto fail;
        LOG_INFO("router: tokenizer of %s: %zu tokens", r->opts.model, tokenizer_n_vocab(r->tok));
    }
    router_request_template_init(&r->chat_tmpl, r->tok);
    if (r->opts.model && !r->chat_tmpl.tmpl)
        LOG_WARN("router: chat prompts will fail (FAILED_PRECONDITION): %s", r->chat_tmpl.why);
    else if (r->chat_tmpl.tmpl)
        LOG_INFO("router: chat template of %s parsed (thinks by default: %s)", r->opts.model,
                 r->chat_tmpl.thinking_default ? "yes" : "no");
    set_model_id(r);
    r->t_start = (int64_t)ts.tv_sec;
    if (r->opts.worker_tls) {
        /* the files are read here once, so a bad one is a start-up error naming its flag */
        r->worker_tls = *r->opts.worker_tls;
        if (!r->worker_tls.target_name && r->opts.workers_dns) {
            const char *spec = r->opts.workers_dns, *colon = strrchr(spec, ':');
            size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
            if (n >= 2 && spec[0] == '[' && spec[n - 1] == ']') {
                spec++;
                n -= 2;
            }
            if (n >= sizeof r->worker_tls_name) n = sizeof r->worker_tls_name - 1;
            memcpy(r->worker_tls_name, spec, n);
            r->worker_tls_name[n] = 0;
            r->worker_tls.target_name = r->worker_tls_name;
        }
        grpc_channel_credentials *creds = NULL;
        if ((rc = rpc_tls_client_creds(&r->worker_tls, &creds, st))) goto fail;
        grpc_channel_credentials_release(creds);
        if (r->worker_tls.target_name)
            LOG_INFO("router: worker certificates are verified against the name %s",
                     r->worker_tls.target_name);
    }
    if (r->opts.worker_token_file &&
        (rc = rpc_auth_create_flag(r->opts.worker_token_file, "--worker-token-file",
                                   &r->worker_auth, st)))
        goto fail;
    router_pool_ops ops = {pool_connect, pool_disconnect, r};
    if ((rc = router_pool_create(&r->pool, &r->opts.policy, &ops, st))) goto fail;
    if (r->opts.workers) {
        if ((rc = router_dns_parse_list(r->opts.workers, r->dns, st))) goto fail;
        const char *addrs[ROUTER_POOL_MAX_WORKERS];
        for (int i = 0; i < r->dns->n; i++) addrs[i] = r->dns->addr[i];
        rc = router_pool_set(r->pool, addrs, r->dns->n, st);
        if (rc < 0 || (rc > 0 && st->code)) goto fail;
    }
    const char *services[] = {ROUTER_SERVICE};
    if ((rc = rpc_health_create(services, 1, &r->health, st))) goto fail;
    if (r->opts.auth_token_file && (rc = rpc_auth_create(r->opts.auth_token_file, &r->auth, st)))
        goto fail;
    rpc_server_opts so = {.listen = r->opts.listen, .tls = r->opts.tls,
                          .health_listen = r->opts.health_listen, .auth = r->auth,
                          .cq_threads = r->opts.cq_threads};
    if ((rc = rpc_server_create(&so, &r->srv, st))) goto fail;
    if (!r->opts.worker_feed_off && (rc = router_feeds_create(r, &r->feeds, st))) goto fail;
    if ((rc = router_generate_add_method(r, st))) goto fail;
    if ((rc = router_api_add_methods(r, st))) goto fail;
    if ((rc = rpc_health_add_methods(r->health, r->srv, st))) goto fail;
    const char *listed[] = {ROUTER_SERVICE, "grpc.health.v1.Health",
                            "grpc.reflection.v1alpha.ServerReflection",
                            "grpc.reflection.v1.ServerReflection"};
    if ((rc = rpc_reflection_create(proto_descriptors_data, proto_descriptors_bytes, listed, 4,
                                    &r->refl, st)))
        goto fail;
    if ((rc = rpc_reflection_add_methods(r->refl, r->srv, st))) goto fail;
    /* health stays open (probes); reflection follows --reflection-auth */
    rpc_server_require_auth(r->srv, "/" ROUTER_SERVICE "/");
    if (r->opts.reflection_auth) rpc_server_require_auth(r->srv, "/grpc.reflection.");
    if ((rc = metrics_setup(r, st))) goto fail;
    *out = r;
    return 0;
fail:
    router_destroy(r);
    return rc ? rc : STATUS_INTERNAL;
}

int router_start(router *r, status *st)
{
    int rc;
    if (r->opts.metrics_listen &&
        (rc = metrics_http_start(r->metrics, r->opts.metrics_listen, &r->metrics_http, st)))
        return rc;
    if ((rc = rpc_server_start(r->srv, st))) return rc;
    if (r->opts.http_listen && (rc = router_http_start(r, r->opts.http_listen, &r->http, st)))
        return rc;
    /* one synchronous round first, so workers that are already up are usable at once */
    router_poll_once(r, 1);
    if (pthread_create(&r->poller, NULL, router_poll_main, r))
        return status_fail(st, STATUS_INTERNAL, "router: cannot start the poller thread");
    r->started = 1;
    return 0;
}

int router_port(const router *r) { return rpc_server_port(r->srv); }

int router_health_port(const router *r) { return rpc_server_health_port(r->srv); }

int router_http_port_of(const router *r) { return r->http ? router_http_port(r->http) : 0; }

int router_metrics_port(const router *r)
{
    return r->metrics_http ? metrics_http_port(r->metrics_http) : 0;
}

void router_begin_drain(router *r)
{
    pthread_mutex_lock(&r->mu);
    r->draining = 1;
    pthread_mutex_unlock(&r->mu);
    if (r->health) rpc_health_set_ready(r->health, false);
}

int router_drain(router *r, int grace_ms)
{
    router_begin_drain(r);
    const struct timespec ts = clock_timespec_ms(clock_deadline_ms(grace_ms > 0 ? grace_ms : 0));
    pthread_mutex_lock(&r->mu);
    while (r->inflight > 0 && pthread_cond_timedwait(&r->cv, &r->mu, &ts) == 0) {
    }
    int left = r->inflight;
    pthread_mutex_unlock(&r->mu);
    if (left) LOG_WARN("router: drain: %d request%s still running after %d ms: ending them with "
                       "UNAVAILABLE", left, left == 1 ? "" : "s", grace_ms);
    router_http_stop(r->http); /* HTTP requests left are cancelled */
    r->http = NULL;
    /* Every Generate call is released (its status batch completed: no fixed linger needed)
     * unless some are left. The graceful stop then lets the other calls end and the connections
     * close after their last frames; Generate calls left are cancelled with UNAVAILABLE at once
     * (their relays see on_cancel). */
    router_feeds_close(r->feeds); /* their calls end before the server's threads stop */
    if (r->srv && !rpc_server_shutdown_grace(r->srv, left ? 0 : ROUTER_DRAIN_FLUSH_MS) && !left)
        LOG_WARN("router: drain: some calls could not end within %d ms", ROUTER_DRAIN_FLUSH_MS);
    pthread_mutex_lock(&r->mu);
    r->stopping = 1;
    pthread_cond_broadcast(&r->cv);
    /* every call is released now; relays and Abort threads may still be ending */
    while (r->relays > 0) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    if (r->started) {
        pthread_join(r->poller, NULL);
        r->started = 0;
    }
    return left;
}

void router_destroy(router *r)
{
    if (!r) return;
    if (r->started) router_drain(r, 0);
    router_http_stop(r->http);
    if (r->srv) rpc_server_destroy(r->srv);
    router_feeds_destroy(r->feeds); /* before the pool: a feed holds its worker */
    if (r->health) rpc_health_destroy(r->health);
    if (r->refl) rpc_reflection_destroy(r->refl);
    rpc_auth_destroy(r->auth); /* after the server: no check runs any more */
    metrics_http_stop(r->metrics_http);
    if (r->metrics) metrics_destroy(r->metrics);
    if (r->pool) router_pool_destroy(r->pool);
    rpc_auth_destroy(r->worker_auth); /* after the pool: its channels send it */
    router_request_template_free(&r->chat_tmpl);
    if (r->tok) tokenizer_destroy(r->tok);
    free(r->dns);
    router_ids_destroy(r->ids);
    if (r->model_info) protobuf_c_message_free_unpacked(&r->model_info->base, NULL);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
