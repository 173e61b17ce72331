/* deltaserve worker: serve deltaserve.v1.Worker (plus health, reflection, metrics) for one
 * model replica on one device.
 *
 * Start-up order: the gRPC port is bound first (liveness SERVING, readiness NOT_SERVING while
 * the model loads), "listening on HOST:PORT" is logged, then the model, backend and engine are
 * created and readiness turns SERVING. SIGTERM/SIGINT drain: readiness NOT_SERVING, new
 * requests UNAVAILABLE, in-flight streams get --grace-seconds to finish, the rest end
 * UNAVAILABLE; exit 0. A failed device (sticky error) exits 3. */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/flags.h"
#include "common/log.h"
#include "model/qwen35.h"
#include "model/tokenizer.h"
#include "rpc/metrics_http.h"
#include "rpc/rpc_tls.h"
#include "worker/backend.h"
#include "worker/engine.h"
#include "worker/service.h"
#include "worker/spec.h"

#define EXIT_DEVICE_FAILED 3

typedef struct worker_opts {
    const char *model, *listen, *device, *metrics_listen, *name, *log_level, *state_dtype;
    int slots, queue, threads, ctx, step_tokens, prefill_min_tokens, grace_seconds, max_calls, tp;
    int batch_invariant; /* FLAG_BOOL: int */
    int dense_rows;
    int dense_per_pass; /* FLAG_BOOL: int */
    int prefix_cache_mb, prefix_snapshot_every, memory_mb;
    int speculative_k, spec_max_batch, spec_threads, spec_gate;
    float spec_min_acceptance;
    const char *tls_cert, *tls_key, *tls_client_ca, *health_listen, *auth_token_file;
} worker_opts;

static const flag_spec worker_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(worker_opts, model), "GGUF model file (arch qwen35)"},
    {"listen", "DS_LISTEN", "0.0.0.0:50051", FLAG_STR, offsetof(worker_opts, listen), "gRPC address HOST:PORT (port 0: pick one)"},
    {"device", "DS_DEVICE", "cpu", FLAG_STR, offsetof(worker_opts, device), "cpu | cuda | cuda:N | cuda:A,B,... (the --tp ranks' GPUs; cuda without a GPU: CPU)"},
    {"metrics-listen", "DS_METRICS_LISTEN", NULL, FLAG_STR, offsetof(worker_opts, metrics_listen), "Prometheus /metrics HOST:PORT (unset: off)"},
    {"slots", "DS_SLOTS", "0", FLAG_INT, offsetof(worker_opts, slots), "sequence slots: requests running at once (0: as many as fit in memory with a quarter of the context each: at most 256 on cuda, 8 on the CPU)"},
    {"batch-invariant", "DS_BATCH_INVARIANT", "false", FLAG_BOOL, offsetof(worker_opts, batch_invariant), "cuda: every step through the batched kernels, so a sequence's tokens never depend on the others running beside it (slower for a lone stream)"},
    {"dense-rows", "DS_DENSE_ROWS", "-1", FLAG_INT, offsetof(worker_opts, dense_rows), "passes of this many rows or more multiply the quantised weights as F16 through cuBLAS (-1: 64 with the F16 copies resident, 128 when dequantised every pass; 0: never; cuda, not with --batch-invariant)"},
    {"dense-per-pass", "DS_DENSE_PER_PASS", "false", FLAG_BOOL, offsetof(worker_opts, dense_per_pass), "the dense path dequantises every pass instead of keeping F16 copies of the weights resident (they are kept when they take at most half of the free GPU memory)"},
    {"state-dtype", "DS_STATE_DTYPE", "auto", FLAG_STR, offsetof(worker_opts, state_dtype), "f32 | bf16 | auto: how the DeltaNet recurrent state S is stored (arithmetic F32 either way; bf16 halves its bytes on cuda, so about twice the slots and snapshots fit, and its traffic in batched steps; docs/BENCH.md has its drift); auto: bf16 on cuda, f32 on the CPU"},
    {"prefix-cache-mb", "DS_PREFIX_CACHE_MB", "-1", FLAG_INT, offsetof(worker_opts, prefix_cache_mb), "MiB of recurrent-state snapshots kept for prefix reuse (-1: chosen by the device: a share of free GPU memory, 4 per slot on the CPU; 0: off)"},
    {"prefix-snapshot-every", "DS_PREFIX_SNAPSHOT_EVERY", "1024", FLAG_INT, offsetof(worker_opts, prefix_snapshot_every), "a long prompt's prefill keeps a snapshot at the end of a step when this many tokens were computed since its last one, so that prompts sharing part of it resume near where they part (0: only at the prompt's end and where prompts part)"},
    {"speculative-k", "DS_SPECULATIVE_K", "0", FLAG_INT, offsetof(worker_opts, speculative_k), "speculative decoding with the model's MTP head: tokens drafted per verify run, 0 (off) .. 4; needs a model with an MTP head and a device with verify runs (cpu; cuda: greedy requests, the head drafting on the GPU), else it stays off and the log says why"},
    {"spec-max-batch", "DS_SPEC_MAX_BATCH", "8", FLAG_INT, offsetof(worker_opts, spec_max_batch), "speculate only while at most this many sequences decode (more: plain decode steps)"},
    {"spec-gate", "DS_SPEC_GATE", "true", FLAG_BOOL, offsetof(worker_opts, spec_gate), "speculate with a number of decoding sequences only while its steps measure faster per token than plain steps there (a plain or speculating step every 32 keeps both measured); false: whenever allowed"},
    {"spec-min-acceptance", "DS_SPEC_MIN_ACCEPTANCE", "0.3", FLAG_FLOAT, offsetof(worker_opts, spec_min_acceptance), "0..1: a request whose rolling draft acceptance (accepted / drafted, each verify run weighted 1/8) is below this after 8 verify runs stops speculating for the rest of its life (its tokens unchanged; 0: never)"},
    {"spec-threads", "DS_SPEC_THREADS", "0", FLAG_INT, offsetof(worker_opts, spec_threads), "CPU threads of the MTP head's drafts where it drafts on the CPU (0: as --threads)"},
    {"tp", "DS_TP", "1", FLAG_INT, offsetof(worker_opts, tp), "tensor-parallel ranks: cpu simulates them in one process; cuda runs one per GPU over NCCL (libnccl.so.2 loaded at run time)"},
    {"queue", "DS_QUEUE", "64", FLAG_INT, offsetof(worker_opts, queue), "admission queue: requests waiting for a slot"},
    {"threads", "DS_THREADS", "0", FLAG_INT, offsetof(worker_opts, threads), "CPU threads (0: all online CPUs)"},
    {"ctx", "DS_CTX", "0", FLAG_INT, offsetof(worker_opts, ctx), "context per sequence (0: the model's, e.g. 262144, shrunk to what fits in memory; a given one that does not fit exits 1)"},
    {"memory-mb", "DS_MEMORY_MB", "0", FLAG_INT, offsetof(worker_opts, memory_mb), "MiB the slots' state and the KV pool may take (0: chosen by the device: 50% of the available RAM on the CPU, the free GPU memory after the weights on cuda)"},
    {"step-tokens", "DS_STEP_TOKENS", "0", FLAG_INT, offsetof(worker_opts, step_tokens), "token budget per engine step (decode rows + prompt chunks; 0: 1024 on cuda, 256 on the CPU; docs/BENCH.md 1.7 has the trade-off)"},
    {"prefill-min-tokens", "DS_PREFILL_MIN_TOKENS", "16", FLAG_INT, offsetof(worker_opts, prefill_min_tokens), "prompt tokens every step may run however many sequences decode (at most --step-tokens): how fast waiting prompts get in when decodes fill the step"},
    {"grace-seconds", "DS_GRACE_SECONDS", "30", FLAG_INT, offsetof(worker_opts, grace_seconds), "drain: time in-flight streams get to finish"},
    {"name", "DS_WORKER_NAME", NULL, FLAG_STR, offsetof(worker_opts, name), "served_by name (default: the bound address)"},
    {"max-calls", "DS_MAX_CALLS", "4096", FLAG_INT, offsetof(worker_opts, max_calls), "concurrent gRPC calls"},
    {"log-level", "DS_LOG_LEVEL", "info", FLAG_STR, offsetof(worker_opts, log_level), "debug | info | warn | error"},
    {"tls-cert", "DS_TLS_CERT", NULL, FLAG_STR, offsetof(worker_opts, tls_cert), "PEM certificate chain: serve --listen over TLS (with --tls-key)"},
    {"tls-key", "DS_TLS_KEY", NULL, FLAG_STR, offsetof(worker_opts, tls_key), "PEM private key of --tls-cert"},
    {"tls-client-ca", "DS_TLS_CLIENT_CA", NULL, FLAG_STR, offsetof(worker_opts, tls_client_ca), "PEM CA: require and verify client certificates (mTLS; needs --tls-cert)"},
    {"health-listen", "DS_HEALTH_LISTEN", NULL, FLAG_STR, offsetof(worker_opts, health_listen), "plaintext HOST:PORT serving only grpc.health.v1 (kubelet probes when TLS is on)"},
    {"auth-token-file", "DS_AUTH_TOKEN_FILE", NULL, FLAG_STR, offsetof(worker_opts, auth_token_file), "deltaserve.v1.Worker calls need metadata 'authorization: Bearer <file's token>' (the router's --worker-token-file; re-read on change; health and reflection stay open)"},
    {0},
};

/* The engine thread reports a dead device by signalling the main thread's sigwait. */
static void on_fatal(void *arg)
{
    (void)arg;
    kill(getpid(), SIGUSR1);
}

static int eog_ids(const qwen35_model *m, worker_model_desc *d)
{
    tokenizer *tk = NULL;
    status st;
    d->n_eos_ids = 0;
    d->bos_id = -1;
    if (tokenizer_load(&tk, m->file, &st)) {
        LOG_WARN("no tokenizer in the model (%s): no end-of-generation ids", st.msg);
        return 0;
    }
    int32_t ids[3];
    size_t n = tokenizer_eog_ids(tk, ids);
    for (size_t i = 0; i < n && d->n_eos_ids < ENGINE_MAX_EOS_IDS; i++) d->eos_ids[d->n_eos_ids++] = ids[i];
    d->bos_id = tokenizer_bos_id(tk);
    tokenizer_destroy(tk);
    return 0;
}

int cmd_worker(int argc, char **argv)
{
    worker_opts o = {0};
    status st = {0};
    int rc = flags_parse(worker_flags, &o, argc, argv,
                         "deltaserve worker --model F --listen HOST:PORT [--device cpu|cuda] "
                         "[--metrics-listen HOST:PORT] [--slots N] [--queue N] [--threads N]",
                         &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc) {
        fprintf(stderr, "deltaserve worker: %s\n", st.msg);
        return 2;
    }
    int lvl = log_level_parse(o.log_level);
    if (!o.model || lvl < 0 || o.slots < 0 || o.queue < 0 || o.ctx < 0 || o.memory_mb < 0 || o.step_tokens < 0 || o.prefill_min_tokens < 1 ||
        o.grace_seconds < 0 || o.threads < 0 || o.max_calls < 1 || o.prefix_cache_mb < -1 ||
        o.prefix_snapshot_every < 0 || o.speculative_k < 0 || o.speculative_k > SPEC_MAX_K ||
        o.spec_max_batch < 1 || o.spec_threads < 0) {
        fprintf(stderr, "deltaserve worker: %s\n",
                !o.model ? "--model is required"
                : lvl < 0 ? "--log-level must be debug, info, warn or error"
                          : "--prefill-min-tokens and --max-calls must be >= 1; --slots, --queue, --ctx, "
                            "--step-tokens, --memory-mb, --threads, --grace-seconds, --prefix-snapshot-every and "
                            "--spec-threads >= 0; --prefix-cache-mb >= -1; --speculative-k 0..4; "
                            "--spec-max-batch >= 1");
        return 2;
    }
    if (!(o.spec_min_acceptance >= 0 && o.spec_min_acceptance <= 1)) { /* NaN too */
        fprintf(stderr, "deltaserve worker: --spec-min-acceptance must be 0..1 (0: never switch "
                "speculation off), not %g\n", (double)o.spec_min_acceptance);
        return 2;
    }
    log_threshold = (log_level)lvl;
    if (strcmp(o.device, "cpu") && strcmp(o.device, "cuda") && strncmp(o.device, "cuda:", 5)) {
        fprintf(stderr, "deltaserve worker: --device must be cpu, cuda, cuda:N or cuda:A,B,... (the "
                "GPUs of --tp ranks), not '%s'\n", o.device);
        return 2;
    }
    fwd_state_dtype state_dtype;
    if (fwd_state_dtype_parse(o.state_dtype, &state_dtype, &st)) {
        fprintf(stderr, "deltaserve worker: --state-dtype: %s\n", st.msg);
        return 2;
    }
    if (worker_backend_check_tp(o.device, o.tp, &st)) {
        fprintf(stderr, "deltaserve worker: %s\n", st.msg);
        return 2;
    }

    /* Signals are taken by sigwait in this thread only: block them before any thread starts. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    metrics *mx = NULL;
    metrics_http *mx_http = NULL;
    worker_service *ws = NULL;
    qwen35_model *model = NULL;
    worker_backend *backend = NULL;
    engine *eng = NULL;
    int ret = 1;

    const char *tls_cert = o.tls_cert && o.tls_cert[0] ? o.tls_cert : NULL;
    const char *tls_key = o.tls_key && o.tls_key[0] ? o.tls_key : NULL;
    const char *tls_client_ca = o.tls_client_ca && o.tls_client_ca[0] ? o.tls_client_ca : NULL;
    if (!tls_cert != !tls_key || (tls_client_ca && !tls_cert)) {
        fprintf(stderr, "deltaserve worker: give --tls-cert with --tls-key; --tls-client-ca needs both\n");
        return 2;
    }
    rpc_tls_server tls = {tls_cert, tls_key, tls_client_ca};
    const char *health_listen = o.health_listen && o.health_listen[0] ? o.health_listen : NULL;
    const char *token_file = o.auth_token_file && o.auth_token_file[0] ? o.auth_token_file : NULL;
    if (metrics_create(64, &mx, &st)) goto fail;
    if (worker_service_create(&(worker_service_opts){.listen = o.listen, .name = o.name,
                                                     .max_calls = o.max_calls, .metrics = mx,
                                                     .tls = tls_cert ? &tls : NULL,
                                                     .health_listen = health_listen,
                                                     .auth_token_file = token_file},
                              &ws, &st))
        goto fail;
    {
        const char *colon = strrchr(o.listen, ':');
        int hn = colon ? (int)(colon - o.listen) : (int)strlen(o.listen);
        /* always logged, whatever --log-level: scripts and tests wait for this line */
        log_write(LOG_LEVEL_INFO, "listening on %.*s:%d%s%s", hn, o.listen, worker_service_port(ws),
                  tls_cert ? (tls_client_ca ? " (TLS, client certificates required)" : " (TLS)") : "",
                  token_file ? " (token auth)" : "");
        if (health_listen) {
            const char *hc = strrchr(health_listen, ':');
            int hhn = hc ? (int)(hc - health_listen) : (int)strlen(health_listen);
            log_write(LOG_LEVEL_INFO, "health (plaintext) on %.*s:%d", hhn, health_listen,
                      worker_service_health_port(ws));
        }
    }
    if (o.metrics_listen) {
        if (metrics_http_start(mx, o.metrics_listen, &mx_http, &st)) goto fail;
        const char *colon = strrchr(o.metrics_listen, ':');
        int hn = colon ? (int)(colon - o.metrics_listen) : (int)strlen(o.metrics_listen);
        LOG_INFO("metrics on http://%.*s:%d/metrics", hn, o.metrics_listen, metrics_http_port(mx_http));
    }

    /* measured on the 4B under 16-256 streams (docs/BENCH.md 1.7); the CPU keeps short steps
     * (also when --device cuda finds no GPU: below) */
    const bool step_default = o.step_tokens == 0;
    if (step_default) o.step_tokens = strncmp(o.device, "cuda", 4) ? 256 : 1024;
    int64_t t0 = clock_now_us();
    if (qwen35_model_load(&model, o.model, &st)) goto fail;
    worker_model_desc desc = {.path = o.model};
    eog_ids(model, &desc);
    /* the model's context unless --ctx: the forward shrinks a default that does not fit, and
     * refuses a given one */
    const int n_ctx = o.ctx ? o.ctx : model->cfg.n_ctx_train > 0 ? model->cfg.n_ctx_train : 4096;
    worker_backend_opts bo = {.n_slots = o.slots, .n_ctx = n_ctx, .ctx_fit = !o.ctx,
                              .mem_budget = (int64_t)o.memory_mb << 20, .n_threads = o.threads,
                              .tp = o.tp, .max_prefill_tokens = o.step_tokens,
                              .batch_invariant = o.batch_invariant, .dense_rows = o.dense_rows,
                              .dense_per_pass = o.dense_per_pass, .state_dtype = state_dtype,
                              .snap_budget = o.prefix_cache_mb < 0
                                                 ? -1 : (int64_t)o.prefix_cache_mb << 20,
                              /* the kept states of verify runs only where drafts can come */
                              .verify_rows = o.speculative_k > 0 && model->mtp.present
                                                 ? o.speculative_k + 1 : 0,
                              .verify_runs = o.spec_max_batch};
    if (worker_backend_create(o.device, model, &bo, &backend, &st)) {
        if (st.code == STATUS_NOMEM && (o.ctx || o.slots)) { /* name the flags that asked */
            char m[sizeof st.msg];
            snprintf(m, sizeof m, "%s", st.msg);
            char flags[64] = "";
            if (o.ctx) snprintf(flags, sizeof flags, "--ctx %d", o.ctx);
            if (o.slots)
                snprintf(flags + strlen(flags), sizeof flags - strlen(flags), "%s--slots %d",
                         o.ctx ? " " : "", o.slots);
            status_fail(&st, STATUS_NOMEM, "%s: %s", flags, m);
        }
        goto fail;
    }
    if (step_default && strncmp(backend->device, "cuda", 4)) o.step_tokens = 256;
    /* always logged: how many sequences of what length fit, and why */
    log_write(LOG_LEVEL_INFO, "memory: %s", backend->f->plan);
    engine_opts eo = {.queue = o.queue, .step_tokens = o.step_tokens,
                      .prefill_min_tokens = o.prefill_min_tokens, .metrics = mx,
                      .prefix_snap_every = o.prefix_snapshot_every, .on_fatal = on_fatal,
                      .spec_k = o.speculative_k, .spec_max_batch = o.spec_max_batch,
                      .spec_min_accept = o.spec_min_acceptance, .spec_gate = o.spec_gate != 0,
                      .spec_threads = o.spec_threads ? o.spec_threads : o.threads};
    for (int i = 0; i < desc.n_eos_ids; i++) eo.eos_ids[eo.n_eos_ids++] = desc.eos_ids[i];
    if (engine_create(backend, &eo, &eng, &st)) goto fail;
    worker_service_attach(ws, model, backend, eng, &desc);
    char prefix[96];
    if (backend->f->n_snaps > 0)
        snprintf(prefix, sizeof prefix, "prefix cache %d snapshots of %.1f MiB",
                 backend->f->n_snaps, (double)backend->f->snap_bytes / (1 << 20));
    else
        snprintf(prefix, sizeof prefix, "prefix cache off");
    log_write(LOG_LEVEL_INFO, "ready: %s, %d layers, vocab %d, device %s, %d slots x %d ctx (%.1f MiB state each, "
             "S %s), %s, queue %d, step %d tokens, loaded in %.0f ms",
             o.model, model->cfg.n_layer, model->cfg.V, backend->device, backend->n_slots, backend->n_ctx,
             (double)backend->state_bytes / (1 << 20), fwd_state_dtype_name(backend->f->state_dtype), prefix, o.queue, o.step_tokens,
             (double)(clock_now_us() - t0) / 1000.0);

    int sig = 0;
    sigwait(&sigs, &sig);
    worker_service_begin_drain(ws); /* new requests are refused from here: then say so */
    if (sig == SIGUSR1) {
        LOG_ERROR("device failed: exiting with code %d", EXIT_DEVICE_FAILED);
        worker_service_drain(ws, 0);
        ret = EXIT_DEVICE_FAILED;
    } else {
        LOG_INFO("%s: draining (grace %d s)", sig == SIGTERM ? "SIGTERM" : "SIGINT", o.grace_seconds);
        int n = worker_service_drain(ws, (int64_t)o.grace_seconds * 1000);
        LOG_INFO("drained (%d request%s cancelled at the end of the grace period); exiting", n,
                 n == 1 ? "" : "s");
        ret = 0;
    }
    /* every stream has its final message and status queued: let them reach the clients */
    if (!worker_service_shutdown(ws, WORKER_SERVICE_FLUSH_MS))
        LOG_WARN("some final statuses could not be delivered within %d ms", WORKER_SERVICE_FLUSH_MS);
    worker_service_destroy(ws);
    engine_destroy(eng);
    worker_backend_destroy(backend);
    qwen35_model_free(model);
    metrics_http_stop(mx_http);
    metrics_destroy(mx);
    return ret;

fail:
    LOG_ERROR("worker: %s", st.msg);
    fprintf(stderr, "deltaserve worker: %s\n", st.msg);
    if (ws) worker_service_drain(ws, 0);
    worker_service_destroy(ws);
    engine_destroy(eng);
    worker_backend_destroy(backend);
    qwen35_model_free(model);
    metrics_http_stop(mx_http);
    metrics_destroy(mx);
    return ret;
}
