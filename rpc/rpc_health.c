#include "rpc/rpc_health.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "proto/grpc/health/v1/health.pb-c.h"

#define HEALTH_MAX_WATCHERS 1024
#define HEALTH_NAME_MAX 128

typedef struct health_watcher {
    rpc_call *call; /* borrowed until on_cancel finishes it */
    int service;    /* index into services, or -1: unknown name (stays SERVICE_UNKNOWN) */
} health_watcher;

struct rpc_health {
    pthread_mutex_t mu; /* guards everything below */
    char names[RPC_HEALTH_MAX_SERVICES][HEALTH_NAME_MAX];
    bool serving[RPC_HEALTH_MAX_SERVICES];
    int n_services;                                 /* [0] is "" */
    health_watcher watchers[HEALTH_MAX_WATCHERS];   /* [n_watchers] in use, unordered */
    int n_watchers;
};

typedef Grpc__Health__V1__HealthCheckRequest health_req;
typedef Grpc__Health__V1__HealthCheckResponse health_resp;

int rpc_health_create(const char *const *services, int n_services, rpc_health **out, status *st)
{
    *out = NULL;
    if (n_services + 1 > RPC_HEALTH_MAX_SERVICES)
        return status_fail(st, STATUS_INVALID, "health: more than %d services",
                           RPC_HEALTH_MAX_SERVICES - 1);
    rpc_health *h = calloc(1, sizeof *h);
    if (!h) return status_fail(st, STATUS_NOMEM, "health: out of memory");
    pthread_mutex_init(&h->mu, NULL);
    h->names[0][0] = '\0';
    h->serving[0] = true;
    h->n_services = 1;
    for (int i = 0; i < n_services; i++) {
        DS_ASSERT(strlen(services[i]) < HEALTH_NAME_MAX && services[i][0]);
        strcpy(h->names[h->n_services], services[i]);
        h->serving[h->n_services++] = false;
    }
    *out = h;
    return STATUS_OK;
}

static int find_service(const rpc_health *h, const char *name)
{
    for (int i = 0; i < h->n_services; i++)
        if (strcmp(h->names[i], name) == 0) return i;
    return -1;
}

static int status_of(const rpc_health *h, int service)
{
    if (service < 0) return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    return h->serving[service] ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

static void send_status(rpc_call *call, int st)
{
    health_resp r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = st;
    rpc_call_send(call, &r.base); /* a cancelled call drops it; on_cancel cleans up */
}

static void on_check(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    rpc_health *h = user;
    const health_req *req = (const health_req *)msg;
    pthread_mutex_lock(&h->mu);
    int i = find_service(h, req->service);
    int st = i >= 0 ? status_of(h, i) : 0;
    pthread_mutex_unlock(&h->mu);
    if (i < 0) {
        char m[HEALTH_NAME_MAX + 32];
        snprintf(m, sizeof m, "unknown service '%.*s'", HEALTH_NAME_MAX, req->service);
        rpc_call_finish(call, GRPC_STATUS_NOT_FOUND, m);
        return;
    }
    health_resp r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = st;
    rpc_call_reply(call, &r.base);
}

static void on_watch(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    rpc_health *h = user;
    const health_req *req = (const health_req *)msg;
    pthread_mutex_lock(&h->mu);
    if (h->n_watchers == HEALTH_MAX_WATCHERS) {
        pthread_mutex_unlock(&h->mu);
        rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "too many health watchers");
        return;
    }
    health_watcher *w = &h->watchers[h->n_watchers++];
    w->call = call;
    w->service = find_service(h, req->service);
    send_status(call, status_of(h, w->service));
    pthread_mutex_unlock(&h->mu);
}

static void on_watch_cancel(rpc_call *call, void *user)
{
    rpc_health *h = user;
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < h->n_watchers; i++) {
        if (h->watchers[i].call == call) {
            h->watchers[i] = h->watchers[--h->n_watchers];
            break;
        }
    }
    pthread_mutex_unlock(&h->mu);
    rpc_call_finish(call, GRPC_STATUS_CANCELLED, "cancelled");
}

int rpc_health_add_methods(rpc_health *h, rpc_server *srv, status *st)
{
    const rpc_method check = {"/grpc.health.v1.Health/Check",
                              &grpc__health__v1__health_check_request__descriptor,
                              RPC_METHOD_UNARY, on_check, NULL, NULL, h, false, NULL, false};
    const rpc_method watch = {"/grpc.health.v1.Health/Watch",
                              &grpc__health__v1__health_check_request__descriptor,
                              RPC_METHOD_SERVER_STREAM, on_watch, on_watch_cancel, NULL, h,
                              .end_at_shutdown = true};
    if (rpc_server_add_method(srv, &check, st)) return st->code;
    return rpc_server_add_method(srv, &watch, st);
}

static void set_locked(rpc_health *h, int i, bool serving)
{
    if (h->serving[i] == serving) return;
    h->serving[i] = serving;
    for (int k = 0; k < h->n_watchers; k++)
        if (h->watchers[k].service == i) send_status(h->watchers[k].call, status_of(h, i));
}

void rpc_health_set(rpc_health *h, const char *service, bool serving)
{
    pthread_mutex_lock(&h->mu);
    int i = find_service(h, service ? service : "");
    DS_ASSERT(i >= 0);
    set_locked(h, i, serving);
    pthread_mutex_unlock(&h->mu);
}

void rpc_health_set_ready(rpc_health *h, bool serving)
{
    pthread_mutex_lock(&h->mu);
    for (int i = 1; i < h->n_services; i++) set_locked(h, i, serving);
    pthread_mutex_unlock(&h->mu);
}

int rpc_health_n_watchers(rpc_health *h)
{
    pthread_mutex_lock(&h->mu);
    int n = h->n_watchers;
    pthread_mutex_unlock(&h->mu);
    return n;
}

void rpc_health_destroy(rpc_health *h)
{
    if (!h) return;
    DS_ASSERT(h->n_watchers == 0);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
