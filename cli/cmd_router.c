/* deltaserve router: the public Generation API over a set of workers (router/router.h). */
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/flags.h"
#include "common/log.h"
#include "router/router.h"

typedef struct router_cli_opts {
    const char *listen, *workers, *workers_dns, *model, *metrics_listen, *routing, *log_level;
    int prefix_tokens, poll_ms, dns_refresh_ms, max_inflight, max_attempts, grace_seconds;
    int cq_threads, stream_interval;
    int worker_feed; /* FLAG_BOOL */
    const char *tls_cert, *tls_key, *tls_ca, *tls_client_cert, *tls_client_key, *health_listen;
    const char *auth_token_file, *worker_token_file, *workers_tls_name;
    const char *http_listen, *served_model_name;
    int reflection_auth;
} router_cli_opts;

static const char *opt(const char *s) { return s && s[0] ? s : NULL; }

static const flag_spec specs[] = {
    {"listen", "DS_LISTEN", "127.0.0.1:0", FLAG_STR, offsetof(router_cli_opts, listen),
     "gRPC address HOST:PORT (port 0 picks one; logged as 'listening on HOST:PORT')"},
    {"http-listen", "DS_HTTP_LISTEN", NULL, FLAG_STR, offsetof(router_cli_opts, http_listen),
     "OpenAI-compatible HTTP HOST:PORT (/v1/chat/completions, /v1/completions, /v1/models, "
     "/health; same TLS and token as --listen; off if unset)"},
    {"served-model-name", "DS_SERVED_MODEL_NAME", NULL, FLAG_STR,
     offsetof(router_cli_opts, served_model_name),
     "model id on the HTTP API (default: the GGUF's general.name, else its file name)"},
    {"workers", "DS_WORKERS", NULL, FLAG_STR, offsetof(router_cli_opts, workers),
     "worker addresses HOST:PORT,HOST:PORT"},
    {"workers-dns", "DS_WORKERS_DNS", NULL, FLAG_STR, offsetof(router_cli_opts, workers_dns),
     "NAME:PORT resolved (and re-resolved) to the workers, e.g. a headless Service"},
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(router_cli_opts, model),
     "GGUF whose tokenizer is used for text and chat prompts (ids-only without it)"},
    {"metrics-listen", "DS_METRICS_LISTEN", NULL, FLAG_STR,
     offsetof(router_cli_opts, metrics_listen), "Prometheus metrics HOST:PORT (off if unset)"},
    {"routing", "DS_ROUTING", "least", FLAG_STR, offsetof(router_cli_opts, routing),
     "least (power of two choices on outstanding tokens) or prefix (prompt-prefix affinity)"},
    {"prefix-tokens", "DS_PREFIX_TOKENS", "32", FLAG_INT, offsetof(router_cli_opts, prefix_tokens),
     "prompt tokens hashed for --routing prefix"},
    {"poll-ms", "DS_POLL_MS", "500", FLAG_INT, offsetof(router_cli_opts, poll_ms),
     "health check and load poll interval"},
    {"dns-refresh-ms", "DS_DNS_REFRESH_MS", "5000", FLAG_INT,
     offsetof(router_cli_opts, dns_refresh_ms), "--workers-dns re-resolution interval"},
    {"max-inflight", "DS_MAX_INFLIGHT", "1024", FLAG_INT, offsetof(router_cli_opts, max_inflight),
     "Generate calls at once; more are RESOURCE_EXHAUSTED"},
    {"max-attempts", "DS_MAX_ATTEMPTS", "3", FLAG_INT, offsetof(router_cli_opts, max_attempts),
     "workers tried per request before its first token"},
    {"cq-threads", "DS_CQ_THREADS", "1", FLAG_INT, offsetof(router_cli_opts, cq_threads),
     "completion-queue threads serving every stream and worker call (more only when one "
     "thread saturates a core: each costs CPU per token, docs/BENCH.md 3.11)"},
    {"stream-interval", "DS_STREAM_INTERVAL", "1", FLAG_INT,
     offsetof(router_cli_opts, stream_interval),
     "tokens a client message gathers before it leaves (the first token and the end leave at "
     "once): fewer messages, less router CPU a token, burstier streams (docs/BENCH.md 3.8)"},
    {"worker-feed", "DS_WORKER_FEED", "true", FLAG_BOOL, offsetof(router_cli_opts, worker_feed),
     "the workers' messages come on one Worker/Feed stream per worker, an engine step's in one "
     "message (router/README.md \"Feeds\"); false: each request's on its own call"},
    {"grace-seconds", "DS_GRACE_SECONDS", "30", FLAG_INT,
     offsetof(router_cli_opts, grace_seconds), "on SIGTERM/SIGINT, time for in-flight streams"},
    {"log-level", "DS_LOG_LEVEL", "info", FLAG_STR, offsetof(router_cli_opts, log_level),
     "debug, info, warn or error"},
    {"tls-cert", "DS_TLS_CERT", NULL, FLAG_STR, offsetof(router_cli_opts, tls_cert),
     "PEM certificate chain: serve --listen over TLS (with --tls-key)"},
    {"tls-key", "DS_TLS_KEY", NULL, FLAG_STR, offsetof(router_cli_opts, tls_key),
     "PEM private key of --tls-cert"},
    {"tls-ca", "DS_TLS_CA", NULL, FLAG_STR, offsetof(router_cli_opts, tls_ca),
     "PEM CA bundle: call the workers over TLS, verifying them with it"},
    {"workers-tls-name", "DS_WORKERS_TLS_NAME", NULL, FLAG_STR,
     offsetof(router_cli_opts, workers_tls_name),
     "name the workers' certificates are verified against (default: NAME of --workers-dns; "
     "with --workers, each address's host)"},
    {"tls-client-cert", "DS_TLS_CLIENT_CERT", NULL, FLAG_STR,
     offsetof(router_cli_opts, tls_client_cert),
     "PEM client certificate presented to the workers (mTLS; needs --tls-ca)"},
    {"tls-client-key", "DS_TLS_CLIENT_KEY", NULL, FLAG_STR,
     offsetof(router_cli_opts, tls_client_key), "PEM private key of --tls-client-cert"},
    {"health-listen", "DS_HEALTH_LISTEN", NULL, FLAG_STR, offsetof(router_cli_opts, health_listen),
     "plaintext HOST:PORT serving only grpc.health.v1 (kubelet probes when TLS is on)"},
    {"auth-token-file", "DS_AUTH_TOKEN_FILE", NULL, FLAG_STR,
     offsetof(router_cli_opts, auth_token_file),
     "Generation calls need metadata 'authorization: Bearer <file's token>' (re-read on change)"},
    {"worker-token-file", "DS_WORKER_TOKEN_FILE", NULL, FLAG_STR,
     offsetof(router_cli_opts, worker_token_file),
     "token sent as 'authorization: Bearer <token>' on every call to the workers (their "
     "--auth-token-file; re-read on change)"},
    {"reflection-auth", "DS_REFLECTION_AUTH", NULL, FLAG_BOOL,
     offsetof(router_cli_opts, reflection_auth),
     "with --auth-token-file: reflection needs the token too (default: open)"},
    {0},
};

int cmd_router(int argc, char **argv)
{
    router_cli_opts o;
    memset(&o, 0, sizeof o);
    status st;
    status_clear(&st);
    int rc = flags_parse(specs, &o, argc, argv, "deltaserve router", &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc) {
        fprintf(stderr, "deltaserve router: %s\n", st.msg);
        return 2;
    }
    int lvl = log_level_parse(o.log_level);
    if (lvl < 0) {
        fprintf(stderr, "deltaserve router: --log-level: '%s' is not debug/info/warn/error\n",
                o.log_level);
        return 2;
    }
    log_threshold = (log_level)lvl;
    router_opts ro;
    memset(&ro, 0, sizeof ro);
    router_policy_defaults(&ro.policy);
    if (router_policy_parse_mode(o.routing, &ro.policy.mode, &st)) {
        fprintf(stderr, "deltaserve router: %s\n", st.msg);
        return 2;
    }
    if (o.stream_interval < 1 || o.stream_interval > 256) {
        fprintf(stderr, "deltaserve router: --stream-interval: %d is not in 1..256\n",
                o.stream_interval);
        return 2;
    }
    if ((o.workers && o.workers[0]) == (o.workers_dns && o.workers_dns[0])) {
        fprintf(stderr, "deltaserve router: give exactly one of --workers and --workers-dns\n");
        return 2;
    }
    ro.listen = o.listen;
    ro.workers = o.workers && o.workers[0] ? o.workers : NULL;
    ro.workers_dns = o.workers_dns && o.workers_dns[0] ? o.workers_dns : NULL;
    ro.model = o.model && o.model[0] ? o.model : NULL;
    ro.metrics_listen = o.metrics_listen && o.metrics_listen[0] ? o.metrics_listen : NULL;
    ro.policy.prefix_tokens = o.prefix_tokens;
    ro.poll_ms = o.poll_ms;
    ro.dns_refresh_ms = o.dns_refresh_ms;
    ro.max_inflight = o.max_inflight;
    ro.max_attempts = o.max_attempts;
    ro.stream_interval = o.stream_interval;
    ro.cq_threads = o.cq_threads;
    ro.worker_feed_off = !o.worker_feed;
    rpc_tls_server tls = {opt(o.tls_cert), opt(o.tls_key), NULL};
    rpc_tls_client wtls = {opt(o.tls_ca), opt(o.tls_client_cert), opt(o.tls_client_key),
                           opt(o.workers_tls_name)};
    if (!tls.cert_file != !tls.key_file ||
        (!wtls.ca_file && (wtls.cert_file || wtls.key_file || wtls.target_name))) {
        fprintf(stderr, "deltaserve router: give --tls-cert with --tls-key, and "
                        "--tls-client-cert/--tls-client-key/--workers-tls-name only with "
                        "--tls-ca\n");
        return 2;
    }
    ro.tls = tls.cert_file ? &tls : NULL;
    ro.worker_tls = wtls.ca_file ? &wtls : NULL;
    ro.health_listen = opt(o.health_listen);
    ro.auth_token_file = opt(o.auth_token_file);
    ro.worker_token_file = opt(o.worker_token_file);
    ro.reflection_auth = o.reflection_auth;
    ro.http_listen = opt(o.http_listen);
    ro.served_model_name = opt(o.served_model_name);

    /* SIGINT/SIGTERM are taken by sigwait below: block them before any thread starts. Reset
     * their disposition first: a shell starts background jobs with SIGINT ignored, and an
     * ignored signal never becomes pending for sigwait. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    router *r = NULL;
    if (router_create(&r, &ro, &st) || router_start(r, &st)) {
        fprintf(stderr, "deltaserve router: %s\n", st.msg);
        router_destroy(r);
        return 1;
    }
    char host[256];
    snprintf(host, sizeof host, "%s", o.listen);
    char *colon = strrchr(host, ':');
    if (colon) *colon = 0;
    /* always printed, whatever --log-level: scripts and tests wait for this line */
    log_write(LOG_LEVEL_INFO, "router: listening on %s:%d (%s routing, %s%s%s)", host,
              router_port(r), o.routing,
              ro.model ? "text and ids prompts" : "ids prompts only: no --model",
              ro.tls ? ", TLS" : "", ro.auth_token_file ? ", token auth" : "");
    if (router_health_port(r)) {
        char hhost[256];
        snprintf(hhost, sizeof hhost, "%s", ro.health_listen);
        char *hc = strrchr(hhost, ':');
        if (hc) *hc = 0;
        log_write(LOG_LEVEL_INFO, "router: health (plaintext) on %s:%d", hhost,
                  router_health_port(r));
    }
    if (router_http_port_of(r)) {
        char hhost[256];
        snprintf(hhost, sizeof hhost, "%s", ro.http_listen);
        char *hc = strrchr(hhost, ':');
        if (hc) *hc = 0;
        /* always printed: scripts and tests wait for this line too */
        log_write(LOG_LEVEL_INFO, "router: HTTP (OpenAI API) on %s://%s:%d/v1",
                  ro.tls ? "https" : "http", hhost, router_http_port_of(r));
    }
    if (router_metrics_port(r)) {
        char mhost[256];
        snprintf(mhost, sizeof mhost, "%s", ro.metrics_listen);
        char *mc = strrchr(mhost, ':');
        if (mc) *mc = 0;
        LOG_INFO("router: metrics on http://%s:%d/metrics", mhost, router_metrics_port(r));
    }
    int sig = 0;
    sigwait(&sigs, &sig);
    router_begin_drain(r); /* new calls are refused from here: then say so */
    LOG_INFO("router: %s: draining (grace %d s)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
             o.grace_seconds);
    int left = router_drain(r, o.grace_seconds * 1000);
    router_destroy(r);
    LOG_INFO("router: stopped%s", left ? " (some streams were cancelled)" : "");
    return 0;
}
