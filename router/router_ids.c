#include "router/router_ids.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct router_ids {
    pthread_mutex_t mu; /* guards the list and every entry's fields */
    router_live head;   /* sentinel of the circular list */
};

int router_ids_create(router_ids **out, status *st)
{
    router_ids *ids = calloc(1, sizeof *ids);
    if (!ids) return status_fail(st, STATUS_NOMEM, "router: out of memory");
    pthread_mutex_init(&ids->mu, NULL);
    ids->head.prev = ids->head.next = &ids->head;
    *out = ids;
    return STATUS_OK;
}

void router_ids_destroy(router_ids *ids)
{
    if (!ids) return;
    DS_ASSERT(ids->head.next == &ids->head);
    pthread_mutex_destroy(&ids->mu);
    free(ids);
}

void router_ids_register(router_ids *ids, router_live *e, const char *rid)
{
    snprintf(e->rid, sizeof e->rid, "%s", rid);
    e->worker = e->call = NULL;
    e->aborted = 0;
    pthread_mutex_lock(&ids->mu);
    e->next = ids->head.next;
    e->prev = &ids->head;
    e->next->prev = e;
    ids->head.next = e;
    pthread_mutex_unlock(&ids->mu);
}

void router_ids_unregister(router_ids *ids, router_live *e)
{
    pthread_mutex_lock(&ids->mu);
    e->prev->next = e->next;
    e->next->prev = e->prev;
    e->prev = e->next = NULL;
    pthread_mutex_unlock(&ids->mu);
}

int router_ids_attach(router_ids *ids, router_live *e, void *worker, void *call)
{
    pthread_mutex_lock(&ids->mu);
    e->worker = worker;
    e->call = call;
    int aborted = e->aborted;
    pthread_mutex_unlock(&ids->mu);
    return aborted;
}

void router_ids_detach(router_ids *ids, router_live *e)
{
    pthread_mutex_lock(&ids->mu);
    e->worker = e->call = NULL;
    pthread_mutex_unlock(&ids->mu);
}

int router_ids_aborted(router_ids *ids, const router_live *e)
{
    pthread_mutex_lock(&ids->mu);
    int a = e->aborted;
    pthread_mutex_unlock(&ids->mu);
    return a;
}

int router_ids_abort(router_ids *ids, const char *rid, void (*hold)(void *worker, void *ctx),
                     void *ctx, void **workers, int cap, int *n_workers)
{
    int found = 0, nw = 0;
    pthread_mutex_lock(&ids->mu);
    for (router_live *e = ids->head.next; e != &ids->head; e = e->next) {
        if (strcmp(e->rid, rid) != 0) continue;
        found++;
        e->aborted = 1;
        if (!e->worker) continue;
        int seen = 0;
        for (int i = 0; i < nw && !seen; i++) seen = workers[i] == e->worker;
        if (seen || nw == cap) continue;
        hold(e->worker, ctx);
        workers[nw++] = e->worker;
    }
    pthread_mutex_unlock(&ids->mu);
    *n_workers = nw;
    return found;
}

int router_ids_cancel(router_ids *ids, const char *rid, const void *worker,
                      void (*cancel)(void *call, void *ctx), void *ctx)
{
    int n = 0;
    pthread_mutex_lock(&ids->mu);
    for (router_live *e = ids->head.next; e != &ids->head; e = e->next)
        if (e->aborted && e->worker == worker && e->call && strcmp(e->rid, rid) == 0) {
            cancel(e->call, ctx);
            n++;
        }
    pthread_mutex_unlock(&ids->mu);
    return n;
}
