#include "router/router_pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct router_worker {
    char addr[ROUTER_ADDR_MAX];
    uint64_t key;              /* router_policy_hash_str(addr) */
    void *conn;                /* owned through ops: connect/disconnect */
    router_worker_state state;
    int listed;                /* in the current set (0: retired, freed at refs == 0) */
    int refs;                  /* the set's own reference + snapshots + requests */
    int64_t local_outstanding; /* tokens routed here by this router, not yet finished */
    router_worker_load polled; /* last GetLoad */
    int64_t others;            /* other routers' outstanding tokens: min of the last two polls */
    int64_t others_last;       /* the last poll's estimate */
    int max_context;           /* its ModelInfo.max_context; 0: not known (re-read when it
                                  turns healthy again: a restarted worker may differ) */
};

struct router_pool {
    pthread_mutex_t mu;
    router_policy policy;
    router_pool_ops ops;
    router_worker *w[ROUTER_POOL_MAX_WORKERS]; /* owned: the listed workers, [n] */
    int n;
    router_policy_cand cand[ROUTER_POOL_MAX_WORKERS]; /* scratch for acquire, under mu */
};

int router_pool_create(router_pool **out, const router_policy *policy, const router_pool_ops *ops,
                       status *st)
{
    router_pool *p = calloc(1, sizeof *p);
    if (!p) return status_fail(st, STATUS_NOMEM, "router pool: out of memory");
    pthread_mutex_init(&p->mu, NULL);
    p->policy = *policy;
    p->ops = *ops;
    *out = p;
    return 0;
}

/* Under mu: drops one reference; frees a retired worker at zero. */
static void unref_locked(router_pool *p, router_worker *w)
{
    DS_ASSERT(w->refs > 0);
    if (--w->refs == 0) {
        DS_ASSERT(!w->listed);
        if (w->conn) p->ops.disconnect(w->conn, p->ops.ctx);
        free(w);
    }
}

void router_pool_destroy(router_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) {
        DS_ASSERT(p->w[i]->refs == 1); /* every request released its worker */
        p->w[i]->listed = 0;
        unref_locked(p, p->w[i]);
    }
    p->n = 0;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static int find_locked(const router_pool *p, const char *addr)
{
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->w[i]->addr, addr)) return i;
    return -1;
}

int router_pool_set(router_pool *p, const char *const *addrs, int n, status *st)
{
    for (int i = 0; i < n; i++) {
        size_t l = strlen(addrs[i]);
        if (l == 0 || l >= ROUTER_ADDR_MAX)
            return status_fail(st, STATUS_INVALID, "worker address %d: '%s' is empty or too long",
                               i, addrs[i]);
    }
    int added = 0;
    pthread_mutex_lock(&p->mu);
    /* retire the ones not in the new set */
    for (int i = 0; i < p->n;) {
        int keep = 0;
        for (int j = 0; j < n && !keep; j++) keep = !strcmp(p->w[i]->addr, addrs[j]);
        if (keep) { i++; continue; }
        router_worker *w = p->w[i];
        p->w[i] = p->w[--p->n];
        w->listed = 0;
        unref_locked(p, w);
    }
    int rc = 0;
    for (int j = 0; j < n; j++) {
        if (find_locked(p, addrs[j]) >= 0) continue;
        if (p->n == ROUTER_POOL_MAX_WORKERS) {
            rc = status_fail(st, STATUS_EXHAUSTED, "worker %s: more than %d workers", addrs[j],
                             ROUTER_POOL_MAX_WORKERS);
            break;
        }
        router_worker *w = calloc(1, sizeof *w);
        if (!w) { rc = status_fail(st, STATUS_NOMEM, "worker %s: out of memory", addrs[j]); break; }
        strcpy(w->addr, addrs[j]);
        w->key = router_policy_hash_str(w->addr);
        w->conn = p->ops.connect(w->addr, p->ops.ctx);
        if (!w->conn) {
            free(w);
            rc = status_fail(st, STATUS_UNAVAILABLE, "worker %s: cannot open a channel", addrs[j]);
            break;
        }
        w->listed = 1;
        w->refs = 1;
        p->w[p->n++] = w;
        added++;
    }
    pthread_mutex_unlock(&p->mu);
    return rc ? rc : added;
}

int router_pool_snapshot(router_pool *p, router_worker **out, int max)
{
    pthread_mutex_lock(&p->mu);
    int n = p->n < max ? p->n : max;
    for (int i = 0; i < n; i++) {
        out[i] = p->w[i];
        p->w[i]->refs++;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

void router_pool_ref(router_pool *p, router_worker *w)
{
    pthread_mutex_lock(&p->mu);
    DS_ASSERT(w->refs > 0);
    w->refs++;
    pthread_mutex_unlock(&p->mu);
}

void router_pool_unref(router_pool *p, router_worker *w)
{
    pthread_mutex_lock(&p->mu);
    unref_locked(p, w);
    pthread_mutex_unlock(&p->mu);
}

void router_pool_report_health(router_pool *p, router_worker *w, int serving)
{
    pthread_mutex_lock(&p->mu);
    w->state = serving ? ROUTER_WORKER_HEALTHY : ROUTER_WORKER_UNHEALTHY;
    if (!serving) w->max_context = 0;
    pthread_mutex_unlock(&p->mu);
}

void router_pool_report_context(router_pool *p, router_worker *w, int max_context)
{
    pthread_mutex_lock(&p->mu);
    w->max_context = max_context > 0 ? max_context : 0;
    pthread_mutex_unlock(&p->mu);
}

int router_pool_worker_context(router_pool *p, const router_worker *w)
{
    pthread_mutex_lock(&p->mu);
    const int n = w->max_context;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int router_pool_max_context(router_pool *p)
{
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++)
        if (p->w[i]->state == ROUTER_WORKER_HEALTHY && p->w[i]->max_context > n)
            n = p->w[i]->max_context;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void router_pool_report_load(router_pool *p, router_worker *w, const router_worker_load *load)
{
    DS_ASSERT(load->n_prefix_heads >= 0 && load->n_prefix_heads <= ROUTER_POOL_MAX_HEADS);
    pthread_mutex_lock(&p->mu);
    w->polled = *load;
    /* the worker's count includes ours: what is left over is other routers' traffic. One poll
     * can also catch requests we already ended that the worker has not dropped yet (a
     * cancel takes effect at its next step): the smaller of two consecutive estimates filters
     * such one-poll spikes while sustained foreign load persists. */
    int64_t est = load->outstanding_tokens - w->local_outstanding;
    if (est < 0) est = 0;
    w->others = est < w->others_last ? est : w->others_last;
    w->others_last = est;
    pthread_mutex_unlock(&p->mu);
}

void router_pool_report_failure(router_pool *p, router_worker *w)
{
    router_pool_report_health(p, w, 0);
}

static int64_t load_of(const router_worker *w) { return w->local_outstanding + w->others; }

static int holds_prefix(const router_worker *w, uint64_t prefix_hash)
{
    for (int i = 0; i < w->polled.n_prefix_heads; i++)
        if (w->polled.prefix_heads[i] == prefix_hash) return 1;
    return 0;
}

router_worker *router_pool_acquire(router_pool *p, uint64_t prefix_hash, int64_t cost,
                                   router_worker *const *exclude, int n_exclude, uint64_t *rng)
{
    router_worker *w = NULL;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) {
        router_worker *x = p->w[i];
        int ok = x->state == ROUTER_WORKER_HEALTHY;
        for (int j = 0; j < n_exclude && ok; j++) ok = exclude[j] != x;
        p->cand[i] = (router_policy_cand){.key = x->key, .load = load_of(x),
                                          .waiting = x->polled.waiting, .eligible = ok,
                                          .holds_prefix = holds_prefix(x, prefix_hash)};
    }
    int k = router_policy_pick(&p->policy, p->cand, p->n, prefix_hash, rng);
    if (k >= 0) {
        w = p->w[k];
        w->refs++;
        w->local_outstanding += cost;
    }
    pthread_mutex_unlock(&p->mu);
    return w;
}

void router_pool_progress(router_pool *p, router_worker *w, int64_t done)
{
    pthread_mutex_lock(&p->mu);
    w->local_outstanding -= done;
    DS_ASSERT(w->local_outstanding >= 0);
    pthread_mutex_unlock(&p->mu);
}

void router_pool_release(router_pool *p, router_worker *w, int64_t remaining)
{
    pthread_mutex_lock(&p->mu);
    w->local_outstanding -= remaining;
    DS_ASSERT(w->local_outstanding >= 0);
    unref_locked(p, w);
    pthread_mutex_unlock(&p->mu);
}

int router_pool_n_healthy(router_pool *p)
{
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) n += p->w[i]->state == ROUTER_WORKER_HEALTHY;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int router_pool_n_workers(router_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int n = p->n;
    pthread_mutex_unlock(&p->mu);
    return n;
}

const char *router_pool_worker_addr(const router_worker *w) { return w->addr; }

void *router_pool_worker_conn(const router_worker *w) { return w->conn; }

router_worker_state router_pool_worker_state(router_pool *p, const router_worker *w)
{
    pthread_mutex_lock(&p->mu);
    router_worker_state s = w->state;
    pthread_mutex_unlock(&p->mu);
    return s;
}

int64_t router_pool_worker_load(router_pool *p, const router_worker *w)
{
    pthread_mutex_lock(&p->mu);
    int64_t l = load_of(w);
    pthread_mutex_unlock(&p->mu);
    return l;
}
