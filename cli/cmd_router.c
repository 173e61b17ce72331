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
} router_cli_opts;

static const flag_spec specs[] = {
    {"listen", "DS_LISTEN", "127.0.0.1:0", FLAG_STR, offsetof(router_cli_opts, listen),
     "gRPC address HOST:PORT (port 0 picks one; logged as 'listening on HOST:PORT')"},
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
    {"grace-seconds", "DS_GRACE_SECONDS", "30", FLAG_INT,
     offsetof(router_cli_opts, grace_seconds), "on SIGTERM/SIGINT, time for in-flight streams"},
    {"log-level", "DS_LOG_LEVEL", "info", FLAG_STR, offsetof(router_cli_opts, log_level),
     "debug, info, warn or error"},
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
    log_write(LOG_LEVEL_INFO, "router: listening on %s:%d (%s routing, %s)", host, router_port(r),
              o.routing, ro.model ? "text and ids prompts" : "ids prompts only: no --model");
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
