/* The router's token feeds (router_internal.h "Feeds"): one Worker/Feed call per healthy
 * worker, on a CQ thread of the router's server, whose FeedBatch messages carry the messages of
 * every Generate call that named it; each item goes to its relay by the call's tag. */
#include <stdlib.h>
#include <string.h>

#include <grpc/status.h>

#include "common/log.h"
#include "common/splitmix64.h"
#include "router/router_internal.h"
#include "router/router_tags.h"
#include "rpc/rpc_client.h"
#include "rpc/rpc_codec.h"
#include "rpc/rpc_server.h"
#include "rpc/rpc_status.h"

#define FEED_PATH "/deltaserve.v1.Worker/Feed"
#define FEED_ARENA_BYTES (64 * 1024) /* a batch's unpacked memory to start with */

typedef enum { FEED_OPENING, FEED_UP, FEED_DOWN } feed_state;


struct router_feed {
    router *r;
    router_worker *w;       /* referenced until the feed is freed */
    rpc_client_async *call; /* owned */
    uint64_t id;
    atomic_int refs;        /* the feeds' table while listed, each attached relay, a running call */
    rpc_arena arena;        /* the batches' memory, reset after each */
    pthread_mutex_t mu;     /* guards state, the tags and next_tag */
    feed_state state;
    int unimplemented;      /* the worker has no Worker/Feed (an older build) */
    router_tags tags;       /* the relays riding on it, by their calls' tags */
    uint64_t next_tag;
};

struct router_feeds {
    router *r;
    pthread_mutex_t mu;     /* guards the list and closed */
    router_feed *list[ROUTER_POOL_MAX_WORKERS];
    int n;
    /* workers that answered UNIMPLEMENTED (referenced): no feed is opened to them again
     * until they leave the healthy set (a restart may bring a build that has it) */
    router_worker *nofeed[ROUTER_POOL_MAX_WORKERS];
    int n_nofeed;
    int closed;             /* no new feed opens */
    atomic_uint next_cq;
};

static void feed_unref(router_feed *f)
{
    if (atomic_fetch_sub(&f->refs, 1) != 1) return;
    rpc_client_async_destroy(f->call);
    router_pool_unref(f->r->pool, f->w);
    rpc_arena_free(&f->arena);
    pthread_mutex_destroy(&f->mu);
    router_tags_free(&f->tags);
    free(f);
}

/* One batch: each item to its relay (a reference held across, the feed's lock not), in one
 * cork scope (rpc_server.h): the step's messages to the clients leave together. */
static void feed_batch(router_feed *f, Deltaserve__V1__FeedBatch *b)
{
    rpc_cork_begin();
    metrics_inc(f->r->m.feed_batches, 1);
    metrics_inc(f->r->m.feed_items, (double)b->n_items);
    for (size_t i = 0; i < b->n_items; i++) {
        const Deltaserve__V1__FeedItem *it = b->items[i];
        if (!it->response) continue;
        pthread_mutex_lock(&f->mu);
        router_req *q = router_tags_get(&f->tags, it->tag);
        if (q) router_relay_ref(q);
        pthread_mutex_unlock(&f->mu);
        if (!q) continue; /* its attempt is over */
        router_relay_feed_message(q, it->tag, it->response);
        router_relay_unref(q);
    }
    rpc_cork_end();
}

static void on_feed_event(void *user, rpc_client_async_event ev)
{
    router_feed *f = user;
    if (ev == RPC_CLIENT_ASYNC_MESSAGE) {
        ProtobufCMessage *m = rpc_client_async_take_with(
            f->call, &deltaserve__v1__feed_batch__descriptor, &f->arena.alloc);
        if (!m) return; /* unparsable: the call was cancelled, its END follows */
        pthread_mutex_lock(&f->mu);
        const bool opened = f->state == FEED_OPENING;
        if (opened) f->state = FEED_UP; /* the first (empty) batch: the worker has it */
        pthread_mutex_unlock(&f->mu);
        if (opened) LOG_DEBUG("router: worker %s: token feed open", router_pool_worker_addr(f->w));
        feed_batch(f, (Deltaserve__V1__FeedBatch *)m);
        protobuf_c_message_free_unpacked(m, &f->arena.alloc);
        rpc_arena_reset(&f->arena);
        rpc_client_async_read(f->call);
        return;
    }
    /* the end: every relay on it loses its attempt's messages still to come */
    const rpc_client_result *res = rpc_client_async_result(f->call);
    pthread_mutex_lock(&f->mu);
    const feed_state was = f->state;
    f->state = FEED_DOWN;
    f->unimplemented = res->code == GRPC_STATUS_UNIMPLEMENTED;
    router_tags tags = f->tags;
    f->tags = (router_tags){0};
    for (size_t i = 0; i < tags.cap; i++) /* held across: a relay may detach (and end) meanwhile */
        if (tags.slots[i].tag) router_relay_ref(tags.slots[i].v);
    pthread_mutex_unlock(&f->mu);
    if (was == FEED_UP && res->code != GRPC_STATUS_CANCELLED)
        LOG_INFO("router: worker %s: token feed ended: %s%s%s", router_pool_worker_addr(f->w),
                 rpc_status_grpc_name(res->code), res->message[0] ? ": " : "", res->message);
    for (size_t i = 0; i < tags.cap; i++)
        if (tags.slots[i].tag) {
            router_relay_feed_lost(tags.slots[i].v, tags.slots[i].tag);
            router_relay_unref(tags.slots[i].v);
        }
    router_tags_free(&tags);
    router *r = f->r;
    feed_unref(f);          /* the call's reference */
    rpc_server_unhold(r->srv);
}

int router_feeds_create(router *r, router_feeds **out, status *st)
{
    router_feeds *fs = calloc(1, sizeof *fs);
    if (!fs) return status_fail(st, STATUS_NOMEM, "router: out of memory for the feeds");
    fs->r = r;
    pthread_mutex_init(&fs->mu, NULL);
    *out = fs;
    return STATUS_OK;
}

/* Under fs->mu: opens a feed to w. */
static void feed_open(router_feeds *fs, router_worker *w)
{
    router *r = fs->r;
    if (fs->n == ROUTER_POOL_MAX_WORKERS) return;
    router_feed *f = calloc(1, sizeof *f);
    status st;
    if (!f || rpc_client_async_create(&f->call, on_feed_event, f, &st)) {
        free(f);
        return;
    }
    f->r = r;
    f->w = w;
    router_pool_ref(r->pool, w);
    pthread_mutex_init(&f->mu, NULL);
    rpc_arena_init(&f->arena, FEED_ARENA_BYTES); /* out of memory: batches use malloc */
    do f->id = splitmix64(atomic_fetch_add(&r->seed_rng, 0x9e3779b97f4a7c15ull));
    while (!f->id);
    f->state = FEED_OPENING;
    atomic_init(&f->refs, 2); /* the list's and the call's */
    Deltaserve__V1__FeedRequest req = DELTASERVE__V1__FEED_REQUEST__INIT;
    req.feed_id = f->id;
    rpc_server_hold(r->srv); /* the CQ threads run until the call ended */
    void *cq = rpc_server_cq(r->srv, (int)(atomic_fetch_add(&fs->next_cq, 1) & 0xffff));
    if (rpc_client_async_start(f->call, cq, router_pool_worker_conn(w), FEED_PATH, &req.base,
                               CLOCK_NO_DEADLINE, &st)) {
        LOG_WARN("router: worker %s: token feed: %s", router_pool_worker_addr(w), st.msg);
        rpc_server_unhold(r->srv);
        atomic_store(&f->refs, 1);
        feed_unref(f);
        return;
    }
    fs->list[fs->n++] = f;
}

static bool in_round(router_worker *w, router_worker *const *ws, int n)
{
    for (int k = 0; k < n; k++)
        if (ws[k] == w) return true;
    return false;
}

void router_feeds_maintain(router_feeds *fs, router_worker *const *ws, int n)
{
    router *r = fs->r;
    pthread_mutex_lock(&fs->mu);
    /* drop the ended; cancel those of workers gone or not healthy */
    for (int i = 0; i < fs->n;) {
        router_feed *f = fs->list[i];
        pthread_mutex_lock(&f->mu);
        const bool down = f->state == FEED_DOWN, unimpl = down && f->unimplemented;
        pthread_mutex_unlock(&f->mu);
        const bool keep = !down && !fs->closed &&
                          router_pool_worker_state(r->pool, f->w) == ROUTER_WORKER_HEALTHY &&
                          in_round(f->w, ws, n);
        if (keep) {
            i++;
            continue;
        }
        if (!down) rpc_client_async_cancel(f->call);
        if (unimpl && fs->n_nofeed < ROUTER_POOL_MAX_WORKERS) {
            LOG_INFO("router: worker %s has no token feed (Worker/Feed UNIMPLEMENTED): its "
                     "streams come on their own calls", router_pool_worker_addr(f->w));
            router_pool_ref(r->pool, f->w);
            fs->nofeed[fs->n_nofeed++] = f->w;
        }
        fs->list[i] = fs->list[--fs->n];
        feed_unref(f); /* the list's reference */
    }
    for (int i = 0; i < fs->n_nofeed;) { /* out of the healthy set: it may come back new */
        router_worker *w = fs->nofeed[i];
        if (router_pool_worker_state(r->pool, w) == ROUTER_WORKER_HEALTHY && in_round(w, ws, n)) {
            i++;
            continue;
        }
        fs->nofeed[i] = fs->nofeed[--fs->n_nofeed];
        router_pool_unref(r->pool, w);
    }
    for (int k = 0; k < n && !fs->closed; k++) {
        if (router_pool_worker_state(r->pool, ws[k]) != ROUTER_WORKER_HEALTHY) continue;
        bool has = in_round(ws[k], fs->nofeed, fs->n_nofeed);
        for (int i = 0; i < fs->n && !has; i++) has = fs->list[i]->w == ws[k];
        if (!has) feed_open(fs, ws[k]);
    }
    pthread_mutex_unlock(&fs->mu);
}

void router_feeds_close(router_feeds *fs)
{
    if (!fs) return;
    pthread_mutex_lock(&fs->mu);
    fs->closed = 1;
    for (int i = 0; i < fs->n; i++) {
        rpc_client_async_cancel(fs->list[i]->call);
        feed_unref(fs->list[i]);
    }
    fs->n = 0;
    for (int i = 0; i < fs->n_nofeed; i++) router_pool_unref(fs->r->pool, fs->nofeed[i]);
    fs->n_nofeed = 0;
    pthread_mutex_unlock(&fs->mu);
}

void router_feeds_destroy(router_feeds *fs)
{
    if (!fs) return;
    router_feeds_close(fs);
    pthread_mutex_destroy(&fs->mu);
    free(fs);
}

router_feed *router_feed_attach(router_feeds *fs, router_worker *w, router_req *q,
                                uint64_t *feed_id, uint64_t *tag)
{
    router_feed *f = NULL;
    pthread_mutex_lock(&fs->mu);
    for (int i = 0; i < fs->n && !f; i++) {
        router_feed *c = fs->list[i];
        if (c->w != w) continue;
        pthread_mutex_lock(&c->mu);
        if (c->state == FEED_UP && router_tags_put(&c->tags, c->next_tag + 1, q) == 0) {
            *tag = ++c->next_tag;
            *feed_id = c->id;
            atomic_fetch_add(&c->refs, 1);
            f = c;
        }
        pthread_mutex_unlock(&c->mu);
        break;
    }
    pthread_mutex_unlock(&fs->mu);
    return f;
}

void router_feed_detach(router_feed *f, uint64_t tag)
{
    pthread_mutex_lock(&f->mu);
    router_tags_remove(&f->tags, tag); /* (gone already when the feed ended) */
    pthread_mutex_unlock(&f->mu);
    feed_unref(f);
}
