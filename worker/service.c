/* deltaserve.v1.Worker over rpc_server: see service.h. */
#include "worker/service.h"

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/splitmix64.h"
#include "gguf/quant.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "proto/proto_descriptors.h"
#include "rpc/rpc_auth.h"
#include "rpc/rpc_health.h"
#include "rpc/rpc_reflection.h"
#include "rpc/rpc_server.h"
#include "worker/request.h"

#define READY_SERVICE "deltaserve.v1.Worker"

typedef enum ws_state { WS_LOADING, WS_READY, WS_DRAINING } ws_state;

struct worker_service {
    rpc_server *srv;        /* owned */
    rpc_health *health;     /* owned */
    rpc_reflection *refl;   /* owned */
    rpc_auth *auth;         /* owned, or NULL: no auth_token_file */
    metrics_series *rejected_invalid; /* in the caller's registry, or NULL */
    char name[160];

    pthread_mutex_t mu; /* guards state and the attached pointers */
    ws_state state;
    const qwen35_model *model; /* borrowed */
    worker_backend *backend;   /* borrowed */
    engine *engine;            /* borrowed */
    worker_model_desc desc;
    char path[512];
    char quantization[32];
    char arch[64];
    char model_name[128];
    uint64_t n_params;
    bool has_chat_template; /* the GGUF has a non-empty tokenizer.chat_template */
    bool thinking_default;  /* that template reasons when not told */

    atomic_uint_fast64_t n_requests; /* for made-up request ids and seeds */
    uint64_t seed_base;
};

/* ---- the engine sink: engine thread -> rpc_call ---- */

static bool sink_cancelled(void *arg) { return rpc_call_cancelled(arg); }

static void sink_token(void *arg, const engine_request *r, const worker_batch_item *it)
{
    Deltaserve__V1__GenerateResponse m = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    int32_t id = it->out.token;
    m.n_token_ids = 1;
    m.token_ids = &id;
    Deltaserve__V1__TokenLogprob lp = DELTASERVE__V1__TOKEN_LOGPROB__INIT;
    Deltaserve__V1__TokenLogprob *lps[1] = {&lp};
    Deltaserve__V1__TopLogprob top[SAMPLING_MAX_LOGPROBS];
    Deltaserve__V1__TopLogprob *tops[SAMPLING_MAX_LOGPROBS];
    if (r->p.sampling.n_logprobs > 0) {
        lp.token_id = it->out.token;
        lp.logprob = it->out.logprob;
        for (int i = 0; i < it->out.n_top; i++) {
            top[i] = (Deltaserve__V1__TopLogprob)DELTASERVE__V1__TOP_LOGPROB__INIT;
            top[i].token_id = it->out.top_id[i];
            top[i].logprob = it->out.top_logprob[i];
            tops[i] = &top[i];
        }
        lp.n_top = (size_t)it->out.n_top;
        lp.top = tops;
        m.n_logprobs = 1;
        m.logprobs = lps;
    }
    /* the first token also says what the prompt cost (see the proto's conventions) */
    Deltaserve__V1__Usage u = DELTASERVE__V1__USAGE__INIT;
    if (r->n_generated == 1) {
        u.prompt_tokens = (uint32_t)r->p.n_prompt;
        u.cached_tokens = (uint32_t)r->n_cached;
        m.usage = &u;
    }
    rpc_call_send(arg, &m.base); /* a gone client: the engine sees it at the next step */
}

static float ms_between(int64_t a_us, int64_t b_us) { return a_us && b_us ? (float)(b_us - a_us) / 1000.0f : 0; }

static void sink_finish(void *arg, const engine_request *r)
{
    rpc_call *call = arg;
    if (r->result.code == STATUS_CANCELLED) { /* the client is gone: nobody reads a message */
        rpc_call_finish_status(call, &r->result);
        return;
    }
    Deltaserve__V1__GenerateResponse m = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    switch (r->finish) {
    case FINISH_STOP: m.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_STOP; break;
    case FINISH_LENGTH: m.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH; break;
    case FINISH_CANCELLED: m.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_CANCELLED; break;
    default: m.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_ERROR; break;
    }
    if (r->finish == FINISH_STOP && r->stop_token >= 0) {
        m.matched_stop_case = DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_TOKEN_ID;
        m.stop_token_id = r->stop_token;
    }
    Deltaserve__V1__Usage u = DELTASERVE__V1__USAGE__INIT;
    u.prompt_tokens = (uint32_t)r->p.n_prompt;
    u.completion_tokens = (uint32_t)r->n_generated;
    u.cached_tokens = (uint32_t)r->n_cached;
    m.usage = &u;
    Deltaserve__V1__Timings t = DELTASERVE__V1__TIMINGS__INIT;
    t.queue_ms = ms_between(r->t_arrival, r->t_admit);
    t.prefill_ms = ms_between(r->t_admit, r->t_first);
    t.ttft_ms = ms_between(r->t_arrival, r->t_first);
    t.decode_ms = ms_between(r->t_first, r->t_last);
    t.total_ms = ms_between(r->t_arrival, r->t_end);
    t.mean_itl_ms = r->n_generated > 1 ? t.decode_ms / (float)(r->n_generated - 1) : 0;
    m.timings = &t;
    m.request_id = (char *)r->p.id;
    m.seed = r->p.sampling.seed;
    m.served_by = (char *)rpc_call_data(call);
    rpc_call_send(call, &m.base);
    rpc_call_finish_status(call, &r->result);
}

static const engine_sink grpc_sink = {sink_cancelled, sink_token, sink_finish};

/* ---- handlers (CQ thread: nothing here blocks) ---- */

/* The attached engine and limits, or an UNAVAILABLE status. */
static engine *attached(worker_service *ws, worker_limits *lim, status *st)
{
    pthread_mutex_lock(&ws->mu);
    engine *e = ws->state == WS_READY ? ws->engine : NULL;
    if (ws->state == WS_LOADING) status_fail(st, STATUS_UNAVAILABLE, "worker is loading the model");
    else if (ws->state == WS_DRAINING) status_fail(st, STATUS_UNAVAILABLE, "worker is draining");
    if (e && lim) {
        lim->vocab = ws->backend->vocab;
        lim->n_ctx = ws->backend->n_ctx;
    }
    pthread_mutex_unlock(&ws->mu);
    return e;
}

static void on_generate(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    worker_service *ws = user;
    const Deltaserve__V1__WorkerGenerateRequest *req = (const void *)msg;
    status st;
    worker_limits lim;
    engine *e = attached(ws, &lim, &st);
    if (!e) {
        rpc_call_finish_status(call, &st);
        return;
    }
    uint64_t n = atomic_fetch_add(&ws->n_requests, 1);
    char fallback[32];
    snprintf(fallback, sizeof fallback, "w%llu", (unsigned long long)n);
    uint64_t seed = splitmix64(ws->seed_base ^ (n * 0x2545f4914f6cdd1dull));
    if (seed == 0) seed = 1;
    engine_params p;
    if (worker_request_parse(req, &lim, seed, fallback, &p, &st)) {
        if (ws->rejected_invalid) metrics_inc(ws->rejected_invalid, 1);
        LOG_INFO("request %s: rejected: %s", p.id[0] ? p.id : fallback, st.msg);
        rpc_call_finish_status(call, &st);
        return;
    }
    rpc_call_set_data(call, ws->name); /* served_by, static for the service's life */
    if (engine_submit(e, &p, &grpc_sink, call, &st)) {
        LOG_INFO("request %s: rejected: %s", p.id, st.msg);
        rpc_call_finish_status(call, &st);
    }
}

static void on_abort(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    worker_service *ws = user;
    const Deltaserve__V1__AbortRequest *req = (const void *)msg;
    status st;
    engine *e = attached(ws, NULL, &st);
    Deltaserve__V1__AbortResponse r = DELTASERVE__V1__ABORT_RESPONSE__INIT;
    r.found = e && req->request_id[0] && engine_abort(e, req->request_id);
    rpc_call_reply(call, &r.base);
}

static void on_get_load(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    worker_service *ws = user;
    const Deltaserve__V1__GetLoadRequest *req = (const void *)msg;
    Deltaserve__V1__Load l = DELTASERVE__V1__LOAD__INIT;
    uint64_t heads[WORKER_SERVICE_MAX_HEADS];
    pthread_mutex_lock(&ws->mu);
    engine *e = ws->engine;
    bool draining = ws->state == WS_DRAINING;
    pthread_mutex_unlock(&ws->mu);
    if (e) {
        engine_load el = {0};
        engine_get_load(e, &el);
        l.running = (uint32_t)el.running;
        l.waiting = (uint32_t)el.waiting;
        l.free_slots = (uint32_t)el.free_slots;
        l.total_slots = (uint32_t)el.total_slots;
        l.outstanding_tokens = el.outstanding_tokens;
        l.free_kv_blocks = el.free_kv_blocks;
        l.total_kv_blocks = el.total_kv_blocks;
        l.tokens_per_second = (float)el.tokens_per_second;
        l.queue_capacity = (uint32_t)el.queue_capacity;
        draining = draining || el.draining;
        l.prefix_cache = el.prefix_cache;
        l.prefix_queries = el.prefix_queries;
        l.prefix_hits = el.prefix_hits;
        l.prefix_queried_tokens = el.prefix_queried_tokens;
        l.prefix_cached_tokens = el.prefix_cached_tokens;
        l.prefix_evictions = el.prefix_evictions;
        l.prefix_snapshots = el.prefix_snapshots;
        l.prefix_blocks = el.prefix_blocks;
        l.prefix_snapshot_bytes = el.prefix_snapshot_bytes;
        if (req->prefix_tokens > 0) {
            int nt = req->prefix_tokens < INT32_MAX ? (int)req->prefix_tokens : INT32_MAX;
            int n = engine_prefix_heads(e, nt, heads,
                                        WORKER_SERVICE_MAX_HEADS);
            l.n_prefix_heads = n > 0 ? (size_t)n : 0;
            l.prefix_heads = heads;
        }
    }
    l.draining = draining;
    rpc_call_reply(call, &l.base);
}

static void on_get_model_info(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    worker_service *ws = user;
    status st;
    pthread_mutex_lock(&ws->mu);
    if (!ws->model) {
        pthread_mutex_unlock(&ws->mu);
        status_fail(&st, STATUS_UNAVAILABLE, "worker is loading the model");
        rpc_call_finish_status(call, &st);
        return;
    }
    const qwen35_config *c = &ws->model->cfg;
    Deltaserve__V1__ModelInfo mi = DELTASERVE__V1__MODEL_INFO__INIT;
    mi.architecture = ws->arch;
    mi.name = ws->model_name;
    mi.n_params = ws->n_params;
    mi.n_layers = (uint32_t)c->n_layer;
    mi.n_deltanet_layers = (uint32_t)c->n_gdn_layers;
    mi.n_attention_layers = (uint32_t)c->n_attn_layers;
    mi.hidden_size = (uint32_t)c->H;
    mi.vocab_size = (uint32_t)c->V;
    mi.n_eos_token_ids = (size_t)ws->desc.n_eos_ids;
    mi.eos_token_ids = ws->desc.eos_ids;
    mi.max_context = (uint32_t)ws->backend->n_ctx;
    mi.quantization = ws->quantization;
    mi.device = ws->backend->device;
    mi.max_running = (uint32_t)ws->backend->n_slots;
    mi.path = ws->path;
    mi.bos_token_id = ws->desc.bos_id;
    mi.has_chat_template = ws->has_chat_template;
    mi.thinking_default = ws->thinking_default;
    pthread_mutex_unlock(&ws->mu);
    rpc_call_reply(call, &mi.base); /* packed (copied) before return: pointers may go after */
}

/* ---- model description ---- */

static void upper(char *s)
{
    for (; *s; s++) *s = (char)toupper((unsigned char)*s);
}

/* general.file_type (llama_ftype) name, else the weight type holding the most bytes. */
static void describe_quantization(const gguf_file *f, char *out, size_t cap)
{
    static const struct { uint32_t ft; const char *name; } ftypes[] = {
        {0, "F32"}, {1, "F16"}, {2, "Q4_0"}, {3, "Q4_1"}, {7, "Q8_0"}, {8, "Q5_0"}, {9, "Q5_1"},
        {10, "Q2_K"}, {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
        {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"}, {32, "BF16"},
    };
    uint32_t ft;
    if (gguf_get_u32(f, "general.file_type", &ft, NULL) == STATUS_OK)
        for (size_t i = 0; i < sizeof ftypes / sizeof *ftypes; i++)
            if (ftypes[i].ft == ft) {
                snprintf(out, cap, "%s", ftypes[i].name);
                return;
            }
    uint64_t bytes[64] = {0};
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].n_dims >= 2 && f->tensors[i].type < 64)
            bytes[f->tensors[i].type] += f->tensors[i].n_bytes;
    uint32_t best = 0;
    for (uint32_t t = 1; t < 64; t++)
        if (bytes[t] > bytes[best]) best = t;
    const quant_traits *q = quant_get(best);
    snprintf(out, cap, "%s", q && q->name ? q->name : "unknown");
    upper(out);
}

static void copy_gguf_str(const gguf_file *f, const char *key, char *out, size_t cap, const char *def)
{
    gguf_str s;
    if (gguf_get_str(f, key, &s, NULL) == STATUS_OK && s.len > 0)
        snprintf(out, cap, "%.*s", (int)(s.len < cap ? s.len : cap - 1), s.ptr);
    else
        snprintf(out, cap, "%s", def);
}

void worker_service_attach(worker_service *ws, const qwen35_model *m, worker_backend *b,
                           engine *e, const worker_model_desc *desc)
{
    const gguf_file *f = m->file;
    uint64_t n_params = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        uint64_t n = 1;
        for (uint32_t d = 0; d < f->tensors[i].n_dims; d++) n *= f->tensors[i].ne[d];
        n_params += n;
    }
    const char *base = strrchr(desc->path, '/');
    base = base ? base + 1 : desc->path;
    pthread_mutex_lock(&ws->mu);
    ws->model = m;
    ws->backend = b;
    ws->engine = e;
    ws->desc = *desc;
    snprintf(ws->path, sizeof ws->path, "%s", desc->path);
    ws->desc.path = ws->path;
    ws->n_params = n_params;
    describe_quantization(f, ws->quantization, sizeof ws->quantization);
    copy_gguf_str(f, "general.architecture", ws->arch, sizeof ws->arch, "qwen35");
    copy_gguf_str(f, "general.name", ws->model_name, sizeof ws->model_name, base);
    gguf_str tmpl;
    ws->has_chat_template = gguf_get_str(f, "tokenizer.chat_template", &tmpl, NULL) == STATUS_OK &&
                            tmpl.len > 0;
    /* LEAD: the one assignment to wire to model/chat_template.h's
     * chat_template_thinking_default() over tmpl once it lands. */
    ws->thinking_default = false;
    if (ws->state == WS_LOADING) ws->state = WS_READY;
    bool ready = ws->state == WS_READY;
    pthread_mutex_unlock(&ws->mu);
    rpc_health_set_ready(ws->health, ready);
}

/* ---- lifecycle ---- */

int worker_service_create(const worker_service_opts *o, worker_service **out, status *st)
{
    static const char *ready[] = {READY_SERVICE};
    static const char *services[] = {READY_SERVICE, "grpc.health.v1.Health",
                                     "grpc.reflection.v1alpha.ServerReflection",
                                     "grpc.reflection.v1.ServerReflection"};
    *out = NULL;
    worker_service *ws = calloc(1, sizeof *ws);
    if (!ws) return status_fail(st, STATUS_NOMEM, "worker service: out of memory");
    pthread_mutex_init(&ws->mu, NULL);
    ws->state = WS_LOADING;
    ws->seed_base = splitmix64((uint64_t)clock_now_us() ^ ((uint64_t)(uintptr_t)ws << 16));
    if (o->metrics)
        ws->rejected_invalid = metrics_counter(o->metrics, "deltaserve:request_rejected_total",
                                               "reason=\"invalid\"", "Requests refused at admission.");
    const rpc_method methods[] = {
        {"/deltaserve.v1.Worker/Generate", &deltaserve__v1__worker_generate_request__descriptor,
         RPC_METHOD_SERVER_STREAM, on_generate, NULL, NULL, ws, false},
        {"/deltaserve.v1.Worker/Abort", &deltaserve__v1__abort_request__descriptor,
         RPC_METHOD_UNARY, on_abort, NULL, NULL, ws, false},
        {"/deltaserve.v1.Worker/GetLoad", &deltaserve__v1__get_load_request__descriptor,
         RPC_METHOD_UNARY, on_get_load, NULL, NULL, ws, false},
        {"/deltaserve.v1.Worker/GetModelInfo", &deltaserve__v1__get_model_info_request__descriptor,
         RPC_METHOD_UNARY, on_get_model_info, NULL, NULL, ws, false},
    };
    if (o->auth_token_file && rpc_auth_create(o->auth_token_file, &ws->auth, st)) goto fail;
    if (rpc_server_create(&(rpc_server_opts){.listen = o->listen, .max_calls = o->max_calls,
                                             .tls = o->tls, .health_listen = o->health_listen,
                                             .auth = ws->auth},
                          &ws->srv, st))
        goto fail;
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
        if (rpc_server_add_method(ws->srv, &methods[i], st)) goto fail;
    /* with a token: deltaserve.v1.Worker needs it; health (probes) and reflection stay open */
    rpc_server_require_auth(ws->srv, "/deltaserve.v1.Worker/");
    if (rpc_health_create(ready, 1, &ws->health, st) || rpc_health_add_methods(ws->health, ws->srv, st) ||
        rpc_reflection_create(proto_descriptors_data, proto_descriptors_bytes, services, 4,
                              &ws->refl, st) ||
        rpc_reflection_add_methods(ws->refl, ws->srv, st))
        goto fail;
    if (o->name && o->name[0]) {
        snprintf(ws->name, sizeof ws->name, "%s", o->name);
    } else {
        const char *colon = strrchr(o->listen, ':');
        int hn = colon ? (int)(colon - o->listen) : (int)strlen(o->listen);
        snprintf(ws->name, sizeof ws->name, "%.*s:%d", hn, o->listen, rpc_server_port(ws->srv));
    }
    if (rpc_server_start(ws->srv, st)) goto fail;
    *out = ws;
    return STATUS_OK;
fail:
    worker_service_destroy(ws);
    return st->code;
}

int worker_service_port(const worker_service *ws) { return rpc_server_port(ws->srv); }
int worker_service_health_port(const worker_service *ws) { return rpc_server_health_port(ws->srv); }
const char *worker_service_name(const worker_service *ws) { return ws->name; }

void worker_service_begin_drain(worker_service *ws)
{
    pthread_mutex_lock(&ws->mu);
    ws->state = WS_DRAINING;
    pthread_mutex_unlock(&ws->mu);
    rpc_health_set_ready(ws->health, false);
}

int worker_service_drain(worker_service *ws, int64_t grace_ms)
{
    worker_service_begin_drain(ws);
    pthread_mutex_lock(&ws->mu);
    engine *e = ws->engine;
    pthread_mutex_unlock(&ws->mu);
    return e ? engine_drain(e, grace_ms) : 0;
}

bool worker_service_shutdown(worker_service *ws, int64_t flush_ms)
{
    return !ws->srv || rpc_server_shutdown_grace(ws->srv, flush_ms);
}

void worker_service_destroy(worker_service *ws)
{
    if (!ws) return;
    /* a no-op after worker_service_shutdown; every call ended: no handler runs after */
    if (ws->srv) worker_service_shutdown(ws, WORKER_SERVICE_FLUSH_MS);
    rpc_health_destroy(ws->health);
    rpc_reflection_destroy(ws->refl);
    rpc_server_destroy(ws->srv);
    rpc_auth_destroy(ws->auth); /* after the server: no check runs any more */
    pthread_mutex_destroy(&ws->mu);
    free(ws);
}
