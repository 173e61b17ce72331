/* The router's live requests by request_id, for Generation/Abort: which worker call (if any)
 * serves each one right now.
 *
 * A relay registers its request once its id is known and unregisters it before it ends the
 * public call; around each attempt on a worker it attaches the worker and the worker call
 * (router_ids_attach) and detaches them before destroying the call. Abort marks every live
 * request of an id aborted (router_ids_abort): one waiting for a worker or between retries
 * ends at the relay's next check (router_ids_aborted), one on a worker is ended there
 * (Worker/Abort, or router_ids_cancel when the worker does not know it yet). An aborted
 * request's stream ends with FINISH_REASON_CANCELLED and status OK.
 *
 * No gRPC here: workers and calls are opaque pointers; the caller passes what to do with them.
 * All functions are thread-safe (one mutex; the callbacks run under it and must not block). */
#ifndef DS_ROUTER_ROUTER_IDS_H
#define DS_ROUTER_ROUTER_IDS_H

#include <stddef.h>

#include "common/status.h"

#define ROUTER_IDS_ID_MAX 128 /* bytes of a request id (GenerateRequest.request_id) */

/* One live request; storage is the relay's (it outlives registration). Fields are the
 * registry's: read them only through the functions below. */
typedef struct router_live {
    char rid[ROUTER_IDS_ID_MAX + 1];
    void *worker;  /* borrowed: the worker of the attempt running, or NULL */
    void *call;    /* borrowed: that attempt's worker call, or NULL */
    int aborted;
    struct router_live *prev, *next;
} router_live;

typedef struct router_ids router_ids;

int router_ids_create(router_ids **out, status *st);
/* Every request must have unregistered. */
void router_ids_destroy(router_ids *ids);

/* Adds e under rid (cut to ROUTER_IDS_ID_MAX bytes). Ids need not be unique: Abort ends every
 * live request of the id. */
void router_ids_register(router_ids *ids, router_live *e, const char *rid);
void router_ids_unregister(router_ids *ids, router_live *e);

/* An attempt on worker starts its worker call. Returns 1 when the request is aborted already
 * (the caller then ends the call itself: nobody else will). */
int router_ids_attach(router_ids *ids, router_live *e, void *worker, void *call);
/* Before the worker call is destroyed. */
void router_ids_detach(router_ids *ids, router_live *e);

/* Whether Abort reached the request. */
int router_ids_aborted(router_ids *ids, const router_live *e);

/* Marks every live request of rid aborted. For each one with a worker call running, calls
 * hold(worker, ctx) (take a reference) and puts the worker in workers[] once (at most cap).
 * Returns the number of live requests of rid (0: not found); *n_workers the workers listed. */
int router_ids_abort(router_ids *ids, const char *rid, void (*hold)(void *worker, void *ctx),
                     void *ctx, void **workers, int cap, int *n_workers);

/* For the aborted requests of rid whose worker call runs on worker: cancel(call, ctx). Returns
 * how many. */
int router_ids_cancel(router_ids *ids, const char *rid, const void *worker,
                      void (*cancel)(void *call, void *ctx), void *ctx);

#endif
