/* The public Generation/Abort and Generation/GetModelInfo (see router.h). GetModelInfo answers
 * from what the poller learnt from a worker (router_api_learn_model); Abort runs on a short
 * thread of its own, because ending a request on its worker (Worker/Abort) waits on that
 * worker and the completion-queue thread never waits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/status.h>

#include "common/log.h"
#include "router/router_internal.h"
#include "router/router_request.h"
#include "rpc/rpc_client.h"

#define ABORT_PATH "/" ROUTER_SERVICE "/Abort"
#define INFO_PATH "/" ROUTER_SERVICE "/GetModelInfo"
#define WORKER_ABORT_PATH "/" ROUTER_WORKER_SERVICE "/Abort"
#define ABORT_TIMEOUT_MS 2000 /* per Worker/Abort */
#define ABORT_MAX_WORKERS 16  /* workers one Abort reaches (requests sharing an id) */

_Static_assert(ROUTER_IDS_ID_MAX == ROUTER_REQUEST_ID_MAX, "one request id limit");

/* ---- GetModelInfo ---- */

int router_api_model_known(router *r)
{
    pthread_mutex_lock(&r->mu);
    int known = r->model_info != NULL;
    pthread_mutex_unlock(&r->mu);
    return known;
}

void router_api_learn_model(router *r, router_worker *w, Deltaserve__V1__ModelInfo *mi)
{
    pthread_mutex_lock(&r->mu);
    if (!r->model_info) {
        r->model_info = mi;
        mi = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    if (mi) {
        protobuf_c_message_free_unpacked(&mi->base, NULL);
        return;
    }
    LOG_INFO("router: model from worker %s: %s, vocabulary %u, context %u, chat template %s",
             router_pool_worker_addr(w), r->model_info->name, r->model_info->vocab_size,
             r->model_info->max_context, r->model_info->has_chat_template ? "yes" : "no");
}

static void on_get_model_info(rpc_call *call, const ProtobufCMessage *req, void *user)
{
    (void)req;
    router *r = user;
    pthread_mutex_lock(&r->mu);
    if (!r->model_info) {
        pthread_mutex_unlock(&r->mu);
        char m[160];
        snprintf(m, sizeof m, "no worker has reported its model yet (%d known, %d healthy)",
                 router_pool_n_workers(r->pool), router_pool_n_healthy(r->pool));
        rpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, m);
        return;
    }
    Deltaserve__V1__ModelInfo mi = *r->model_info;
    /* Chat prompts are rendered here, with the router's own copy of the template (--model):
     * the template facts are the router's, whatever the workers' file holds. */
    mi.has_chat_template = r->chat_tmpl.tmpl != NULL;
    mi.thinking_default = r->chat_tmpl.thinking_default;
    rpc_call_reply(call, &mi.base); /* packed under the lock: the cache is never replaced, but
                                       this keeps the read simple */
    pthread_mutex_unlock(&r->mu);
}

/* ---- Abort ---- */

typedef struct abort_job {
    router *r;
    rpc_call *call;
    char rid[ROUTER_IDS_ID_MAX + 1];
} abort_job;

static void hold_worker(void *w, void *ctx)
{
    router *r = ctx;
    router_pool_ref(r->pool, w);
}

static void cancel_call(void *call, void *ctx)
{
    (void)ctx;
    rpc_client_async_cancel(call);
}

/* Marks the id's live requests aborted; ends each one running on a worker there with
 * Worker/Abort (its stream then ends with the worker's FINISH_REASON_CANCELLED message), or,
 * when the worker does not know it (not admitted yet) or cannot be reached, by cancelling the
 * router's worker call (the relay then sends the final message itself). */
static void *abort_main(void *arg)
{
    abort_job *j = arg;
    router *r = j->r;
    void *ws[ABORT_MAX_WORKERS];
    int nw = 0;
    int found = router_ids_abort(r->ids, j->rid, hold_worker, r, ws, ABORT_MAX_WORKERS, &nw);
    int ended_there = 0;
    for (int i = 0; i < nw; i++) {
        router_worker *w = ws[i];
        Deltaserve__V1__AbortRequest ar = DELTASERVE__V1__ABORT_REQUEST__INIT;
        ar.request_id = j->rid;
        ProtobufCMessage *resp;
        rpc_client_result res;
        int ok = 0;
        if (rpc_client_unary(router_pool_worker_conn(w), WORKER_ABORT_PATH, &ar.base,
                             &deltaserve__v1__abort_response__descriptor, &resp, ABORT_TIMEOUT_MS,
                             &res) == 0) {
            ok = ((Deltaserve__V1__AbortResponse *)resp)->found;
            protobuf_c_message_free_unpacked(resp, NULL);
        }
        if (ok) ended_there++;
        else router_ids_cancel(r->ids, j->rid, w, cancel_call, NULL);
        router_pool_unref(r->pool, w);
    }
    LOG_INFO("abort %s: %s (%d on workers, %d ended by Worker/Abort)", j->rid,
             found ? "found" : "not found", nw, ended_there);
    Deltaserve__V1__AbortResponse out = DELTASERVE__V1__ABORT_RESPONSE__INIT;
    out.found = found > 0;
    rpc_call_reply(j->call, &out.base);
    free(j);
    pthread_mutex_lock(&r->mu);
    r->relays--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void on_abort(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    router *r = user;
    const Deltaserve__V1__AbortRequest *req = (const void *)msg;
    size_t n = strlen(req->request_id);
    if (n == 0) {
        rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                        "request_id: empty (the id of the request to abort)");
        return;
    }
    if (n > ROUTER_IDS_ID_MAX) {
        char m[96];
        snprintf(m, sizeof m, "request_id: %zu bytes, at most %d", n, ROUTER_IDS_ID_MAX);
        rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, m);
        return;
    }
    abort_job *j = calloc(1, sizeof *j);
    if (!j) {
        rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "router out of memory");
        return;
    }
    j->r = r;
    j->call = call;
    memcpy(j->rid, req->request_id, n + 1);
    pthread_mutex_lock(&r->mu);
    r->relays++; /* router_drain waits for it */
    pthread_mutex_unlock(&r->mu);
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 128 * 1024);
    int rc = pthread_create(&th, &attr, abort_main, j);
    pthread_attr_destroy(&attr);
    if (rc) {
        free(j);
        pthread_mutex_lock(&r->mu);
        r->relays--;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "router: cannot start an abort");
    }
}

int router_api_add_methods(router *r, status *st)
{
    const rpc_method ms[] = {
        {.path = ABORT_PATH, .request_desc = &deltaserve__v1__abort_request__descriptor,
         .kind = RPC_METHOD_UNARY, .on_request = on_abort, .user = r},
        {.path = INFO_PATH, .request_desc = &deltaserve__v1__get_model_info_request__descriptor,
         .kind = RPC_METHOD_UNARY, .on_request = on_get_model_info, .user = r},
    };
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++)
        if (rpc_server_add_method(r->srv, &ms[i], st)) return st->code;
    return STATUS_OK;
}
