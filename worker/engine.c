/* Continuous-batching engine: see engine.h.
 *
 * Locking: e->mu guards the request pool, the waiting FIFO, running[] (slot -> request), the
 * counters GetLoad reads, the KV blocks promised to admitted requests and the aborted flags.
 * The engine thread snapshots running[] into active[] under the lock at the start of each step
 * and works on active[] without the lock; fields of a request that only the engine thread
 * touches (n_fed, n_generated, tokens past the prompt, started, timings) are written only
 * there. Only the engine thread calls the backend and changes the KV pool; it takes blocks
 * under the lock (kv_grow), so that the free blocks and the promises admission reads agree;
 * other threads read the free blocks (an atomic). Sinks are called without the lock. */
#include "worker/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "model/kv_pool.h"
#include "model/prefix_cache.h"
#include "worker/engine_metrics.h"
#include "worker/spec.h"

/* Admission leaves this share of the KV pool free while others run (at least one block): room
 * for the running sequences to grow a while before anyone is preempted (vLLM's watermark). */
#define KV_WATERMARK_PERCENT 1
/* A new sequence waits for a running one to snapshot the prefix their prompts share only when
 * that saves it at least this many tokens over what the cache holds now. */
#define PREFIX_WAIT_MIN 64
#define SPEC_MAX_BATCH_DEFAULT 8

struct engine {
    worker_backend *b; /* borrowed */
    engine_opts o;
    int n_slots;
    kv_pool *kv;           /* b->kv: the backend's KV blocks (NULL: no paged KV) */
    uint32_t kv_watermark; /* blocks admission leaves free while others run */
    prefix_cache *pc;      /* owned, NULL without snapshots: changed by the engine thread under
                              mu (engine_prefix_heads reads it) */
    uint32_t pc_spare;     /* blocks only the cache holds (prefix_cache_reclaimable), as of its
                              last change or the last sequence's end (under mu) */
    /* sequences started with the cache on (under mu): how many, how many resumed, the tokens
       they looked up and those they resumed */
    uint64_t px_queries, px_hits, px_queried_tokens, px_cached_tokens;
    worker_spec *sp;       /* owned: the draft head, NULL when nothing speculates */
    uint64_t spec_steps, spec_drafted, spec_accepted, spec_switched_off; /* under mu */
    spec_gate gate;        /* engine_opts.spec_gate: whether speculating pays (engine thread) */
    int crowded;           /* consecutive steps with more than spec_max_batch sequences
                              decoding, up to SPEC_CROWDED_STEPS (engine thread) */

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* new work, abort or stop */
    pthread_cond_t idle_cv; /* a request ended */
    engine_request *pool;   /* owned, [n_slots + queue] */
    engine_request *free_list;
    engine_request *wait_head, *wait_tail;
    int n_waiting;
    engine_request **running; /* owned, [n_slots]: slot -> request or NULL */
    int n_running;
    int n_retiring; /* ended and out of the pool, sinks not told yet (engine thread) */
    uint64_t next_admit_seq;
    bool draining, stop, failed;
    uint64_t outstanding; /* prompt tokens to feed + tokens to generate, all requests */
    uint32_t kv_promised; /* sum of kv_promise over running requests */
    uint64_t steps, tokens_generated, n_finished, n_preemptions;
    int64_t tps_t0;
    uint64_t tps_tok0;
    double tps;

    /* engine thread only */
    pthread_t thread;
    bool thread_started;
    engine_request **active;  /* owned, [n_slots] this step's requests */
    worker_batch_item *items; /* owned, [n_slots] */
    engine_request **item_req; /* owned, [n_slots] */
    int *item_order;          /* owned, [n_slots]: item indices, oldest admission first */
    engine_request **done;    /* owned, [n_slots + queue] requests ending this step */
    engine_request *retired;  /* owned, [n_slots + queue] copies of done[] for the sinks */

    engine_metrics m;
};


/* ---- pool and queue (under e->mu) ---- */

/* after the prefix cache changed or a sequence ended: the blocks admission may count */
static void prefix_spare(engine *e)
{
    if (e->pc) e->pc_spare = prefix_cache_reclaimable(e->pc);
}

static int free_slot(const engine *e)
{
    for (int s = 0; s < e->n_slots; s++)
        if (!e->running[s]) return s;
    return -1;
}

static int known_tokens(const engine_request *r) { return r->p.n_prompt + r->n_generated; }

/* Whether the KV pool has room to admit a request that knows n_known tokens (its prompt and
 * what it generated before a preemption): the blocks free or held only by the prefix cache
 * (which gives them back when asked: running sequences win over the cache), less those
 * promised to requests admitted before and not yet taken, cover n_known + 1 positions (its
 * prefill and the next token) and the watermark. With nothing running the answer is yes: a
 * request that fits the pool (engine_submit checks) then always gets to run. */
static bool kv_room(const engine *e, int n_known)
{
    if (!e->kv || e->n_running == 0) return true;
    const uint64_t free = (uint64_t)kv_pool_free_blocks(e->kv) + e->pc_spare;
    const uint64_t avail = free > e->kv_promised ? free - e->kv_promised : 0;
    return avail >= (uint64_t)kv_pool_blocks_for(e->kv, (int64_t)n_known + 1) + e->kv_watermark;
}

/* Blocks a request that knows n_known tokens lacks among the free ones (kv_room without the
 * cache's blocks): what admitting it takes back from the cache. */
static uint32_t free_blocks_short(const engine *e, int n_known)
{
    const uint64_t free = kv_pool_free_blocks(e->kv);
    const uint64_t need = (uint64_t)kv_pool_blocks_for(e->kv, (int64_t)n_known + 1) +
                          e->kv_watermark + e->kv_promised;
    return need > free ? (uint32_t)(need - free) : 0;
}

/* A free slot for a request that knows n_known tokens, and KV room for it: the slot, else -1. */
static int slot_for(const engine *e, int n_known)
{
    return kv_room(e, n_known) ? free_slot(e) : -1;
}

static void admit(engine *e, engine_request *r, int slot, int64_t now)
{
    r->slot = slot;
    if (!r->t_admit) r->t_admit = now;          /* a re-admitted request keeps its first */
    if (!r->admit_seq) r->admit_seq = ++e->next_admit_seq;
    e->running[slot] = r;
    e->n_running++;
    if (e->kv) {
        r->kv_promise = kv_pool_blocks_for(e->kv, (int64_t)known_tokens(r) + 1);
        e->kv_promised += r->kv_promise;
    }
}

/* Takes r off its slot (it keeps its tokens; its sequence has ended in the backend). */
static void unadmit(engine *e, engine_request *r)
{
    DS_ASSERT(e->running[r->slot] == r);
    e->running[r->slot] = NULL;
    e->n_running--;
    r->slot = -1;
    e->kv_promised -= r->kv_promise;
    r->kv_promise = 0;
}

/* Waiting requests take free slots (and KV room), oldest first: a request that does not fit
 * holds the ones behind it (FIFO). After every locked section that frees a slot or KV this
 * runs, so "the head could run" implies "nobody waits" (submit relies on it). */
static void admit_waiting(engine *e, int64_t now)
{
    int slot;
    while (e->wait_head && (slot = slot_for(e, known_tokens(e->wait_head))) >= 0) {
        const uint32_t short_by =
            e->pc && e->n_running ? free_blocks_short(e, known_tokens(e->wait_head)) : 0;
        if (short_by) { /* the cache's blocks counted as room: now they are taken back */
            prefix_cache_reclaim(e->pc, kv_pool_free_blocks(e->kv) + short_by);
            prefix_spare(e);
        }
        engine_request *r = e->wait_head;
        e->wait_head = r->next;
        if (!e->wait_head) e->wait_tail = NULL;
        e->n_waiting--;
        r->next = NULL;
        admit(e, r, slot, now);
    }
}

/* Tokens still to feed before it samples again (a decode's own token not counted), plus those
 * still to generate. */
static uint64_t request_tokens_left(const engine_request *r)
{
    const int feed = known_tokens(r) - r->n_fed - (r->n_generated > 0 ? 1 : 0);
    return (uint64_t)(feed > 0 ? feed : 0) + (uint64_t)(r->p.max_new_tokens - r->n_generated);
}

/* ---- submit / abort / load ---- */

int engine_submit(engine *e, const engine_params *p, const engine_sink *sink, void *sink_arg,
                  status *st)
{
    DS_ASSERT(p->n_prompt >= 1 && p->max_new_tokens >= 1 && sink && sink->on_finish);
    /* the prompt, then room for every token it may generate (kept for a recompute) */
    const int64_t n_tokens = (int64_t)p->n_prompt + p->max_new_tokens;
    int32_t *tokens = malloc((size_t)n_tokens * sizeof *tokens);
    if (!tokens) return status_fail(st, STATUS_NOMEM, "request %s: out of memory for the prompt", p->id);
    memcpy(tokens, p->prompt, (size_t)p->n_prompt * sizeof *tokens);
    int64_t now = clock_now_us();

    /* the blocks it may hold at most, and the most one sequence can hold */
    const uint32_t need = e->kv ? kv_pool_blocks_for(e->kv, n_tokens) : 0;
    uint32_t cap = 0;
    if (e->kv) {
        cap = kv_pool_total_blocks(e->kv);
        if ((uint32_t)kv_pool_max_blocks_per_seq(e->kv) < cap) cap = (uint32_t)kv_pool_max_blocks_per_seq(e->kv);
    }
    pthread_mutex_lock(&e->mu);
    int rc = STATUS_OK;
    /* a slot and KV room now, and nobody ahead (admit_waiting keeps the head waiting only
     * while it cannot run): FIFO holds */
    int slot = e->n_waiting ? -1 : slot_for(e, p->n_prompt);
    if (e->draining || e->stop) {
        rc = status_fail(st, STATUS_UNAVAILABLE, "worker is draining");
        engine_metrics_rejected(&e->m, true);
    } else if (e->failed) {
        rc = status_fail(st, STATUS_UNAVAILABLE, "worker backend failed");
    } else if (need > cap) {
        rc = status_fail(st, STATUS_RANGE,
                         "request %s: %d prompt + %d new tokens need %u KV blocks of %d tokens; "
                         "the worker's cache holds %u for one sequence", p->id, p->n_prompt,
                         p->max_new_tokens, need, kv_pool_block_tokens(e->kv), cap);
    } else if (slot < 0 && e->n_waiting >= e->o.queue) {
        rc = status_fail(st, STATUS_EXHAUSTED,
                         "request %s: admission queue full (%d running, %d waiting)", p->id,
                         e->n_running, e->n_waiting);
        engine_metrics_rejected(&e->m, false);
    }
    if (rc != STATUS_OK) {
        pthread_mutex_unlock(&e->mu);
        free(tokens);
        return rc;
    }
    engine_request *r = e->free_list;
    DS_ASSERT(r); /* pool = slots + queue */
    e->free_list = r->next;
    memset(r, 0, sizeof *r);
    r->p = *p;
    r->p.prompt = tokens;
    r->tokens = tokens;
    r->slot = -1;
    r->stop_token = -1;
    r->t_arrival = now;
    r->sink = sink;
    r->sink_arg = sink_arg;
    status_clear(&r->result);
    if (slot >= 0) {
        admit(e, r, slot, now);
    } else {
        if (e->wait_tail) e->wait_tail->next = r;
        else e->wait_head = r;
        e->wait_tail = r;
        e->n_waiting++;
    }
    e->outstanding += request_tokens_left(r);
    engine_metrics_occupancy(&e->m, e->n_running, e->n_waiting, e->n_slots);
    pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    engine_metrics_accepted(&e->m, p->n_prompt);
    return STATUS_OK;
}

/* under e->mu: marks r to end at the next step with result res. */
static void mark_aborted(engine_request *r, status_code code, const char *msg)
{
    if (r->aborted) return;
    r->aborted = true;
    if (code == STATUS_OK) status_clear(&r->abort_result);
    else status_fail(&r->abort_result, code, "request %s: %s", r->p.id, msg);
}

bool engine_abort(engine *e, const char *request_id)
{
    bool found = false;
    pthread_mutex_lock(&e->mu);
    for (int s = 0; s < e->n_slots && !found; s++) {
        engine_request *r = e->running[s];
        if (r && !r->aborted && strcmp(r->p.id, request_id) == 0) {
            mark_aborted(r, STATUS_OK, NULL);
            found = true;
        }
    }
    for (engine_request *r = e->wait_head; r && !found; r = r->next) {
        if (!r->aborted && strcmp(r->p.id, request_id) == 0) {
            mark_aborted(r, STATUS_OK, NULL);
            found = true;
        }
    }
    if (found) pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    return found;
}

void engine_get_load(engine *e, engine_load *out)
{
    int64_t now = clock_now_us();
    pthread_mutex_lock(&e->mu);
    out->running = e->n_running;
    out->waiting = e->n_waiting;
    out->total_slots = e->n_slots;
    out->free_slots = e->n_slots - e->n_running;
    out->queue_capacity = e->o.queue;
    out->total_kv_blocks = e->kv ? kv_pool_total_blocks(e->kv) : 0;
    out->free_kv_blocks = e->kv ? kv_pool_free_blocks(e->kv) : 0;
    out->preemptions = e->n_preemptions;
    out->speculative = e->sp != NULL;
    out->spec_steps = e->spec_steps;
    out->spec_drafted = e->spec_drafted;
    out->spec_accepted = e->spec_accepted;
    out->spec_switched_off = e->spec_switched_off;
    out->outstanding_tokens = e->outstanding;
    /* the engine refreshes tps every second while it works; when idle it goes stale */
    double dt = (double)(now - e->tps_t0) / 1e6;
    out->tokens_per_second = dt > 2.0 ? (double)(e->tokens_generated - e->tps_tok0) / dt : e->tps;
    out->draining = e->draining;
    out->steps = e->steps;
    out->tokens_generated = e->tokens_generated;
    out->requests_finished = e->n_finished;
    out->prefix_queries = e->px_queries;
    out->prefix_hits = e->px_hits;
    out->prefix_queried_tokens = e->px_queried_tokens;
    out->prefix_cached_tokens = e->px_cached_tokens;
    pthread_mutex_unlock(&e->mu);
    if (!e->pc) return;
    prefix_cache_stats ps;
    prefix_cache_get_stats(e->pc, &ps);
    out->prefix_cache = true;
    out->prefix_evictions = ps.evictions;
    out->prefix_snapshots = ps.snapshots;
    out->prefix_blocks = ps.blocks;
    out->prefix_snapshot_bytes = ps.snapshot_bytes;
}

int engine_prefix_heads(engine *e, int n_tokens, uint64_t *out, int max)
{
    if (!e->pc) return 0;
    pthread_mutex_lock(&e->mu);
    const int n = prefix_cache_heads(e->pc, n_tokens, out, max);
    pthread_mutex_unlock(&e->mu);
    return n;
}

bool engine_failed(engine *e)
{
    pthread_mutex_lock(&e->mu);
    bool f = e->failed;
    pthread_mutex_unlock(&e->mu);
    return f;
}

/* ---- the engine thread ---- */

static void end_request(engine_request *r, finish_reason f, const status *res)
{
    r->finish = f;
    if (res) r->result = *res;
    r->t_end = clock_now_us();
}

/* r's sequence ends in the backend (its KV blocks back to the pool), once. Engine thread. */
static void end_seq(engine *e, engine_request *r)
{
    if (!r->started) return;
    r->started = false;
    worker_backend_seq_end(e->b, r->slot);
}

/* ---- the prefix cache (engine thread; every change under e->mu) ---- */

/* Keeps r's fed prefix tokens[0 .. n_fed) in the cache with a snapshot of its state there (the
 * copy is queued behind the slot's last step: no host sync). */
static void prefix_keep(engine *e, engine_request *r)
{
    r->snap_last = r->n_fed;
    if (r->snap_at && r->snap_at <= r->n_fed) r->snap_at = 0;
    pthread_mutex_lock(&e->mu);
    const int snap = prefix_cache_insert(e->pc, r->slot, r->tokens, r->n_fed, clock_now_us());
    status st;
    if (snap >= 0 && worker_backend_snap_save(e->b, r->slot, snap, &st) != STATUS_OK) {
        /* a snapshot id the forward refused: the cache cannot be trusted, start it over */
        LOG_ERROR("request %s: snapshot %d at %d tokens: %s; prefix cache cleared", r->p.id, snap,
                  r->n_fed, st.msg);
        prefix_cache_clear(e->pc);
    }
    prefix_spare(e);
    pthread_mutex_unlock(&e->mu);
}

/* After a step fed r's tokens up to n_fed: a snapshot where one is due (where its prompt leaves
 * the cached KV or a waiting request's prompt leaves its own, the end of its prompt, every
 * prefix_snap_every computed tokens of a long prompt). */
static void prefix_after_step(engine *e, engine_request *r, const worker_batch_item *it)
{
    if (r->snap_at && r->snap_at < r->n_fed) r->snap_at = 0; /* passed (never due past it) */
    const bool due = r->snap_at == r->n_fed ||
                     (it->prompt && (r->n_fed == r->p.n_prompt ||
                                     (e->o.prefix_snap_every > 0 &&
                                      r->n_fed - r->snap_last >= e->o.prefix_snap_every)));
    if (due) prefix_keep(e, r);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    const int n = na < nb ? na : nb;
    int i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Whether r, not started, still waits for its leader's snapshot (under e->mu). */
static bool prefix_waits(const engine *e, const engine_request *r)
{
    const engine_request *l = e->running[r->leader_slot];
    return l && l->admit_seq == r->leader_seq && l->started && l->snap_at == r->leader_pos &&
           l->n_fed < r->leader_pos;
}

/* A running request that is computing a longer prefix of r's first n tokens than the cache holds
 * (have), and has not passed it: the prefix length (its pending snapshot's, when it has one
 * inside that prefix), *leader set; 0 when none saves PREFIX_WAIT_MIN tokens. Under e->mu. */
static int prefix_leader(engine *e, const engine_request *r, int n, int have,
                         engine_request **leader)
{
    int best = have + PREFIX_WAIT_MIN - 1;
    *leader = NULL;
    for (int s = 0; s < e->n_slots; s++) {
        engine_request *l = e->running[s];
        if (!l || l == r || !l->started || l->n_fed > n) continue;
        int d = common_prefix(l->tokens, known_tokens(l), r->tokens, n);
        if (d <= best || l->n_fed > d) continue;
        if (l->snap_at > l->n_fed && l->snap_at != d) { /* it snapshots elsewhere first */
            if (l->snap_at > d || l->snap_at <= best) continue;
            d = l->snap_at;
        }
        best = d;
        *leader = l;
    }
    return *leader ? best : 0;
}

/* Starts r's sequence in its slot: from the deepest prefix of its known tokens the cache holds
 * a snapshot of (the prompt at most, and one token short of what it knows: the last one is fed
 * to sample), else from nothing. 1: started; 0: it waits for a running request that computes a
 * longer shared prefix to snapshot it (r->leader_*); -1: the backend failed (st). */
static int start_seq(engine *e, engine_request *r, status *st)
{
    r->n_cached = 0;
    r->snap_at = 0;
    r->snap_last = 0;
    if (!e->pc) goto cold;
    pthread_mutex_lock(&e->mu);
    if (r->leader_seq && prefix_waits(e, r)) {
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
    r->leader_seq = 0;
    const int known = known_tokens(r);
    const int lim = known - 1 < r->p.n_prompt ? known - 1 : r->p.n_prompt;
    if (lim < 1) {
        pthread_mutex_unlock(&e->mu);
        goto cold;
    }
    /* the partial block's copy needs a free block */
    if (kv_pool_free_blocks(e->kv) == 0) prefix_cache_reclaim(e->pc, 1);
    const int64_t now = clock_now_us();
    prefix_match m;
    prefix_cache_match(e->pc, r->tokens, lim, now, &m);
    engine_request *l;
    const int d = prefix_leader(e, r, lim, m.n_kv > m.n_pos ? m.n_kv : m.n_pos, &l);
    if (d && l->n_fed < d) { /* it gets there later: wait for it */
        l->snap_at = d;
        r->leader_seq = l->admit_seq;
        r->leader_slot = l->slot;
        r->leader_pos = d;
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
    if (d) { /* it is there now: keep its prefix, resume from it */
        pthread_mutex_unlock(&e->mu);
        prefix_keep(e, l);
        pthread_mutex_lock(&e->mu);
        prefix_cache_match(e->pc, r->tokens, lim, now, &m);
    }
    if (m.n_kv > m.n_pos) r->snap_at = m.n_kv; /* the next one sharing that much resumes there */
    if (m.n_pos > 0) {
        const fwd_prefix x = {.snap = m.snap, .n_pos = m.n_pos, .blocks = m.blocks,
                              .tokens = r->tokens};
        if (worker_backend_seq_resume(e->b, r->slot, &r->p.sampling, &x, st) == STATUS_OK) {
            r->n_fed = r->n_cached = r->snap_last = m.n_pos;
            e->px_queries++;
            e->px_queried_tokens += (uint64_t)lim;
            e->px_hits++;
            e->px_cached_tokens += (uint64_t)m.n_pos;
            /* the blocks it holds now leave its promise */
            const uint32_t want = kv_pool_blocks_for(e->kv, (int64_t)known + 1);
            const uint32_t held = (uint32_t)kv_pool_held(e->kv, r->slot);
            const uint32_t left = want > held ? want - held : 0;
            if (left < r->kv_promise) {
                e->kv_promised -= r->kv_promise - left;
                r->kv_promise = left;
            }
            prefix_spare(e);
            pthread_mutex_unlock(&e->mu);
            r->started = true;
            r->spec = false; /* the draft head has no rows for the cached prefix */
            return 1;
        }
        if (st->code != STATUS_EXHAUSTED) {
            pthread_mutex_unlock(&e->mu);
            return -1;
        }
        r->snap_at = m.n_kv > 0 ? m.n_kv : 0; /* no block for the copy: computed from 0 */
    }
    e->px_queries++;
    e->px_queried_tokens += (uint64_t)lim;
    pthread_mutex_unlock(&e->mu);
cold:
    if (worker_backend_seq_start(e->b, r->slot, &r->p.sampling, st) != STATUS_OK) return -1;
    r->started = true;
    /* a forward without sampled verify runs (fwd.verify_sampled) takes greedy ones only */
    r->spec = e->sp && !r->p.no_speculation && !r->spec_switched_off &&
              sampling_params_no_penalty(&r->p.sampling) &&
              (e->b->f->verify_sampled || sampling_params_is_greedy(&r->p.sampling));
    if (r->spec) spec_start(e->sp, r->slot);
    return 1;
}

/* Under e->mu at the start of a step: ends aborted/cancelled waiting requests, admits
 * waiting ones into free slots, snapshots running[] into active[], collects aborted/cancelled
 * running ones into done[]. Returns the number of active requests; *n_done set. */
static int collect_step(engine *e, int *n_done)
{
    int nd = 0;
    int64_t now = clock_now_us();
    engine_request **pp = &e->wait_head, *prev = NULL;
    while (*pp) { /* waiting: cancelled ones leave the queue */
        engine_request *r = *pp;
        bool gone = r->sink->cancelled && r->sink->cancelled(r->sink_arg);
        if (r->aborted || gone) {
            *pp = r->next;
            if (e->wait_tail == r) e->wait_tail = prev;
            e->n_waiting--;
            status cs;
            if (r->aborted) cs = r->abort_result;
            else status_fail(&cs, STATUS_CANCELLED, "request %s: cancelled by the client", r->p.id);
            end_request(r, FINISH_CANCELLED, &cs);
            e->done[nd++] = r;
            continue;
        }
        prev = r;
        pp = &r->next;
    }
    admit_waiting(e, now);
    int na = 0;
    for (int s = 0; s < e->n_slots; s++) {
        engine_request *r = e->running[s];
        if (!r) continue;
        bool gone = r->sink->cancelled && r->sink->cancelled(r->sink_arg);
        if (r->aborted || gone) {
            status cs;
            if (r->aborted) cs = r->abort_result;
            else status_fail(&cs, STATUS_CANCELLED, "request %s: cancelled by the client", r->p.id);
            end_request(r, FINISH_CANCELLED, &cs);
            e->done[nd++] = r;
        } else {
            e->active[na++] = r;
        }
    }
    *n_done = nd;
    return na;
}

/* Sorts prefill candidates by admission order (n <= n_slots: insertion sort). */
static void sort_by_admission(engine_request **v, int n)
{
    for (int i = 1; i < n; i++) {
        engine_request *x = v[i];
        int j = i - 1;
        while (j >= 0 && v[j]->admit_seq > x->admit_seq) {
            v[j + 1] = v[j];
            j--;
        }
        v[j + 1] = x;
    }
}

/* Builds the batch from active[]: a decode item for every sequence whose only token not fed
 * is its last generated one, then chunks of the others' known tokens (a prompt, or after a
 * preemption the prompt and the tokens generated before it) within the budget, oldest
 * admission first. A chunk holds prompt tokens or generated ones, never both: the sampler
 * counts the two apart (penalize_prompt); a chunk ends where its sequence is due a snapshot
 * (snap_at). */
static bool decoding(const engine_request *r)
{
    return r->n_fed >= r->p.n_prompt && known_tokens(r) - r->n_fed == 1;
}

/* Drafts a verify item of r may carry: spec_k, fewer near the end of its tokens or context
 * (the verify run's last position must fit, and drafts past max_new_tokens are never used). */
static int spec_drafts(const engine *e, const engine_request *r)
{
    int k = e->sp->k;
    const int room = e->b->n_ctx - 1 - r->n_fed, left = r->p.max_new_tokens - r->n_generated - 1;
    if (k > room) k = room;
    if (k > left) k = left;
    return k;
}

static void spec_off(engine_request *r, const status *st);

/* The draft head's room for an item of n rows of r: its queued pairs fed first when a draft
 * follows (flush) or the rows would not fit; false (r stops speculating) when that fails. */
static bool spec_room(engine *e, engine_request *r, int n, bool flush)
{
    status st;
    if ((flush ? spec_flush(e->sp, r->slot, &st) : spec_reserve(e->sp, r->slot, n, &st)) ==
        STATUS_OK)
        return true;
    spec_off(r, &st);
    return false;
}

/* Whether this step's decoding sequences may speculate (the gate asked once a step); counts the
 * crowded steps (spec.h SPEC_CROWDED_STEPS). */
static bool step_speculates(engine *e, engine_request **active, int na)
{
    int n_decoding = 0;
    for (int i = 0; i < na; i++) n_decoding += decoding(active[i]);
    if (!e->sp) return false;
    if (n_decoding > e->o.spec_max_batch) {
        if (e->crowded < SPEC_CROWDED_STEPS) e->crowded++;
        return false;
    }
    e->crowded = 0;
    return !e->o.spec_gate || spec_gate_choose(&e->gate, n_decoding);
}

/* r stops speculating for good (the rolling acceptance or the crowd rule, spec.h): it decodes
 * one token a step from here on, its tokens unchanged, and its rows no longer reach the head. */
static void spec_switch_off(engine *e, engine_request *r, const char *why)
{
    LOG_DEBUG("request %s: speculative decoding off: %s", r->p.id, why);
    r->spec = false;
    r->spec_switched_off = true;
    pthread_mutex_lock(&e->mu);
    e->spec_switched_off++;
    pthread_mutex_unlock(&e->mu);
    engine_metrics_spec_switched_off(&e->m);
}

static int build_batch(engine *e, engine_request **active, int na, bool speculate)
{
    int n = 0, n_pre = 0;
    engine_request *pre[na > 0 ? na : 1];
    for (int i = 0; i < na; i++) {
        engine_request *r = active[i];
        if (!decoding(r)) {
            pre[n_pre++] = r;
            continue;
        }
        if (r->spec && e->crowded >= SPEC_CROWDED_STEPS)
            spec_switch_off(e, r, "more sequences decoding than --spec-max-batch for "
                                  "SPEC_CROWDED_STEPS steps");
        worker_batch_item *it = &e->items[n];
        memset(it, 0, sizeof *it);
        it->slot = r->slot;
        it->tokens = r->tokens + r->n_fed;
        it->n_tokens = 1;
        it->sample = true;
        const int k = r->spec && speculate ? spec_drafts(e, r) : 0;
        if (r->spec && spec_room(e, r, k + 1, k >= 1)) {
            it->hidden = spec_hidden(e->sp, r->slot);
            if (k >= 1) { /* the tokens are drafted once the batch is final (spec_draft_all) */
                it->verify = true;
                it->n_tokens = k + 1;
                it->tokens = spec_tokens(e->sp, r->slot);
                it->outs = spec_outs(e->sp, r->slot);
            }
        }
        e->item_req[n++] = r;
    }
    sort_by_admission(pre, n_pre);
    int budget = e->o.step_tokens - n;
    if (budget < e->o.prefill_min_tokens) budget = e->o.prefill_min_tokens;
    /* a backend that runs prompt tokens as rows of the step caps them while others decode */
    const int cap = n > 0 && e->b->prompt_rows_while_decoding > 0 ? e->b->prompt_rows_while_decoding : 0;
    for (int i = 0; i < n_pre; i++) {
        engine_request *r = pre[i];
        const bool prompt = r->n_fed < r->p.n_prompt;
        const int left = (prompt ? r->p.n_prompt : known_tokens(r)) - r->n_fed;
        int chunk = left < budget ? left : budget;
        if (cap && chunk > cap) chunk = cap;
        if (r->snap_at > r->n_fed && chunk > r->snap_at - r->n_fed) /* a snapshot is due there */
            chunk = r->snap_at - r->n_fed;
        if (chunk <= 0) break;
        worker_batch_item *it = &e->items[n];
        memset(it, 0, sizeof *it);
        it->slot = r->slot;
        it->tokens = r->tokens + r->n_fed;
        it->n_tokens = chunk;
        it->prompt = prompt;
        it->sample = r->n_fed + chunk == known_tokens(r);
        if (r->spec && spec_room(e, r, chunk, false)) it->hidden = spec_hidden(e->sp, r->slot);
        e->item_req[n++] = r;
        budget -= chunk;
    }
    return n;
}

/* Takes r out of active[0 .. *na), keeping the others' order. */
static void drop_active(engine_request **active, int *na, const engine_request *r)
{
    int i = 0;
    while (i < *na && active[i] != r) i++;
    DS_ASSERT(i < *na);
    memmove(active + i, active + i + 1, (size_t)(*na - i - 1) * sizeof *active);
    (*na)--;
}

/* Preemption (recompute): v's sequence ends in the backend (its KV blocks back to the pool) and
 * v goes back to the head of the waiting queue with its tokens, to prefill them again when it
 * is re-admitted. It leaves active[]. */
static void preempt(engine *e, engine_request *v, int *na)
{
    drop_active(e->active, na, v);
    const int slot = v->slot;
    end_seq(e, v);
    pthread_mutex_lock(&e->mu);
    unadmit(e, v);
    v->n_fed = 0;
    v->n_preempted++;
    v->next = e->wait_head;
    e->wait_head = v;
    if (!e->wait_tail) e->wait_tail = v;
    e->n_waiting++;
    e->n_preemptions++;
    engine_metrics_occupancy(&e->m, e->n_running, e->n_waiting, e->n_slots);
    pthread_mutex_unlock(&e->mu);
    engine_metrics_preempted(&e->m);
    LOG_INFO("request %s: preempted from slot %d, its KV blocks back (%u of %u free); %d tokens "
             "to recompute", v->p.id, slot, kv_pool_free_blocks(e->kv),
             kv_pool_total_blocks(e->kv), known_tokens(v));
}

/* Grows each item's block table to cover the positions after the item, oldest admission first,
 * under the lock: the blocks a request takes leave its admission's promise at once, so that
 * admission never counts them twice; blocks only the prefix cache holds are taken back before
 * anyone is preempted. true: every item has its blocks. false: the pool ran dry
 * and one request left active[] (the one admitted last, preempted; or a request the pool cannot
 * hold even alone, or whose table is too short, failed into done[]): the batch is to be built
 * again. Engine thread. */
static bool kv_grow(engine *e, int n, int *na, int *nd)
{
    int *order = e->item_order;
    for (int i = 0; i < n; i++) { /* insertion sort by admission (n <= n_slots) */
        int j = i;
        while (j > 0 && e->item_req[order[j - 1]]->admit_seq > e->item_req[i]->admit_seq) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    engine_request *r = NULL;
    int64_t n_pos = 0;
    status st;
    pthread_mutex_lock(&e->mu);
    for (int k = 0; k < n; k++) {
        engine_request *q = e->item_req[order[k]];
        const int64_t want = (int64_t)q->n_fed + e->items[order[k]].n_tokens;
        const int held = kv_pool_held(e->kv, q->slot);
        int rc = kv_pool_ensure(e->kv, q->slot, want, &st);
        if (rc == STATUS_EXHAUSTED && e->pc) { /* the cache gives its blocks back first */
            prefix_cache_reclaim(e->pc, kv_pool_need(e->kv, q->slot, want));
            prefix_spare(e);
            rc = kv_pool_ensure(e->kv, q->slot, want, &st);
        }
        if (rc != STATUS_OK) {
            r = q;
            n_pos = want;
            break;
        }
        const uint32_t taken = (uint32_t)(kv_pool_held(e->kv, q->slot) - held);
        const uint32_t t = taken < q->kv_promise ? taken : q->kv_promise;
        q->kv_promise -= t;
        e->kv_promised -= t;
    }
    pthread_mutex_unlock(&e->mu);
    if (!r) return true;
    if (st.code == STATUS_EXHAUSTED && *na > 1) {
        engine_request *v = e->active[0]; /* the one admitted last (LIFO) */
        for (int i = 1; i < *na; i++)
            if (e->active[i]->admit_seq > v->admit_seq) v = e->active[i];
        preempt(e, v, na);
        return false;
    }
    status res;
    if (st.code == STATUS_EXHAUSTED)
        status_fail(&res, STATUS_EXHAUSTED,
                    "request %s: %lld positions need %u KV blocks of %d; the pool has %u (%u "
                    "free) with no other sequence running", r->p.id, (long long)n_pos,
                    kv_pool_blocks_for(e->kv, n_pos), kv_pool_block_tokens(e->kv),
                    kv_pool_total_blocks(e->kv), kv_pool_free_blocks(e->kv));
    else
        status_fail(&res, st.code, "request %s: %s", r->p.id, st.msg);
    LOG_ERROR("%s", res.msg);
    drop_active(e->active, na, r);
    end_seq(e, r);
    end_request(r, FINISH_ERROR, &res);
    e->done[(*nd)++] = r;
    return false;
}

static bool is_in(int32_t t, const int32_t *v, int n)
{
    for (int i = 0; i < n; i++)
        if (v[i] == t) return true;
    return false;
}

/* A sampled token for r: timings, sink, stop conditions. Returns true if r is finished. */
static bool take_token(engine *e, engine_request *r, const worker_batch_item *it, int64_t now)
{
    int32_t t = it->out.token;
    r->tokens[r->p.n_prompt + r->n_generated++] = t;
    if (r->n_generated == 1) r->t_first = now;
    engine_metrics_token(&e->m, r, now);
    r->t_last = now;
    if (r->sink->on_token) r->sink->on_token(r->sink_arg, r, it);
    finish_reason f = FINISH_NONE;
    if (is_in(t, r->p.stop_ids, r->p.n_stop_ids) ||
        (!r->p.ignore_eos && is_in(t, e->o.eos_ids, e->o.n_eos_ids))) {
        f = FINISH_STOP;
        r->stop_token = t;
    } else if (r->n_generated >= r->p.max_new_tokens || r->p.n_prompt + r->n_generated >= e->b->n_ctx) {
        f = FINISH_LENGTH;
    }
    if (f == FINISH_NONE) return false;
    end_request(r, f, NULL);
    return true;
}

static void log_request(const engine_request *r)
{
    double ms = 1e-3;
    double queue = (double)((r->t_admit ? r->t_admit : r->t_end) - r->t_arrival) * ms;
    double ttft = r->t_first ? (double)(r->t_first - r->t_arrival) * ms : 0;
    double decode = r->t_first ? (double)(r->t_last - r->t_first) * ms : 0;
    double total = (double)(r->t_end - r->t_arrival) * ms;
    double tps = decode > 0 ? (r->n_generated - 1) / (decode * 1e-3) : 0;
    LOG_INFO("request %s: prompt %d (cached %d), generated %d, finish %s, queue %.1f ms, ttft "
             "%.1f ms, decode %.1f ms (%.1f tok/s), total %.1f ms, preempted %d, status %s%s%s",
             r->p.id, r->p.n_prompt, r->n_cached, r->n_generated, finish_reason_name(r->finish),
             queue, ttft, decode, tps, total, r->n_preempted, status_code_name(r->result.code),
             r->result.msg[0] ? ": " : "", r->result.msg);
}

/* Ends the sequences of the ended requests in the backend (their KV blocks back; the free
 * blocks gauge then holds this step's count), frees their slots and returns them to the pool,
 * then tells the sinks (from copies). In this order,
 * whoever sees the end of a stream (the client, after on_finish sent the status) also sees its
 * slot and blocks free: a request sent right after is admitted, and GetLoad no longer counts
 * it. Idle (engine_drain, engine_wait_idle) waits for the sinks too. */
static void retire(engine *e, engine_request **done, int nd)
{
    for (int i = 0; i < nd; i++) end_seq(e, done[i]);
    if (e->kv) engine_metrics_kv(&e->m, kv_pool_free_blocks(e->kv)); /* this step's blocks */
    pthread_mutex_lock(&e->mu);
    if (nd) prefix_spare(e);
    for (int i = 0; i < nd; i++) {
        engine_request *r = done[i];
        if (r->slot >= 0) unadmit(e, r);
        free(r->tokens);
        r->tokens = NULL;
        r->p.prompt = NULL;
        e->retired[i] = *r; /* r may be reused by a submit as soon as the lock is released */
        r->next = e->free_list;
        e->free_list = r;
        e->n_finished++;
    }
    e->n_retiring += nd;
    admit_waiting(e, clock_now_us());
    uint64_t out = 0; /* recount: exact and cheap (<= slots + queue requests) */
    for (int s = 0; s < e->n_slots; s++)
        if (e->running[s]) out += request_tokens_left(e->running[s]);
    for (engine_request *r = e->wait_head; r; r = r->next) out += request_tokens_left(r);
    e->outstanding = out;
    engine_metrics_occupancy(&e->m, e->n_running, e->n_waiting, e->n_slots);
    pthread_mutex_unlock(&e->mu);

    for (int i = 0; i < nd; i++) {
        const engine_request *r = &e->retired[i];
        log_request(r);
        engine_metrics_finished(&e->m, r);
        r->sink->on_finish(r->sink_arg, r);
    }
    if (!nd) return;
    pthread_mutex_lock(&e->mu);
    e->n_retiring -= nd;
    pthread_cond_broadcast(&e->idle_cv);
    pthread_mutex_unlock(&e->mu);
}

/* The backend failed: every active request of this step (or all, if fatal) ends in error. */
static int fail_items(engine *e, engine_request **active, int na, const status *st, int nd)
{
    status res;
    status_fail(&res, STATUS_INTERNAL, "%s", st->msg);
    for (int i = 0; i < na; i++) {
        end_request(active[i], FINISH_ERROR, &res);
        e->done[nd++] = active[i];
    }
    return nd;
}

/* ---- speculative decoding (worker/spec.h) ---- */

/* A step of n items that took seconds for `generated` tokens, into the gate when it had decoding
 * items only: speculated when one of them was a verify run. */
static void gate_record(engine *e, int n, double seconds, uint64_t generated)
{
    bool verify = false;
    for (int i = 0; i < n; i++) {
        if (!e->items[i].verify && e->items[i].n_tokens != 1) return; /* a prompt chunk */
        if (e->items[i].prompt) return;
        verify |= e->items[i].verify;
    }
    spec_gate_record(&e->gate, n, verify, seconds, generated);
}

/* The draft head fell behind (an error it reports: a bug, never the request's doing): r goes on
 * without speculation, its output unchanged. */
static void spec_off(engine_request *r, const status *st)
{
    LOG_ERROR("request %s: speculative decoding off: %s", r->p.id, st->msg);
    r->spec = false;
}

/* The batch is final: each verify item's drafts after its request's last token (the MTP's
 * argmax, greedy and sampled requests alike). A draft that fails turns the item back into a
 * plain decode item. */
static void spec_draft_all(engine *e, int n)
{
    for (int i = 0; i < n; i++) {
        worker_batch_item *it = &e->items[i];
        if (!it->verify) continue;
        engine_request *r = e->item_req[i];
        status st;
        if (spec_draft(e->sp, r->slot, r->tokens[r->n_fed], it->n_tokens - 1, &st) == STATUS_OK)
            continue;
        spec_off(r, &st);
        it->verify = false;
        it->hidden = NULL;
        it->outs = NULL;
        it->tokens = r->tokens + r->n_fed;
        it->n_tokens = 1;
    }
}

/* A verify item ran: the drafts accepted are the longest run where row i's choice is draft
 * i+1 (each row chose as a one-row step would: the argmax, or its draw), then the first row
 * that differs gives one more token. They go to the sink at once, until one ends the request; the
 * slot rolls back to the last row used and the draft head catches up on those rows. Returns nd
 * (r added to done[] when it ended). */
static int spec_verified(engine *e, engine_request *r, worker_batch_item *it, int64_t now, int nd,
                         uint64_t *generated)
{
    const int k = it->n_tokens - 1;
    int a = 0;
    while (a < k && it->outs[a].token == it->tokens[a + 1]) a++;
    int used = a + 1;
    bool fin = false;
    for (int j = 0; j <= a; j++) {
        worker_batch_item one = *it;
        one.out = it->outs[j];
        ++*generated;
        if (take_token(e, r, &one, now)) {
            fin = true;
            used = j + 1;
            break;
        }
    }
    status st;
    if (used < it->n_tokens && worker_backend_rollback(e->b, r->slot, r->n_fed + used, &st)) {
        status res;
        status_fail(&res, STATUS_INTERNAL, "request %s: %s", r->p.id, st.msg);
        LOG_ERROR("%s", res.msg);
        if (!fin) end_request(r, FINISH_ERROR, &res);
        e->done[nd++] = r;
        return nd;
    }
    r->n_fed += used;
    r->spec_steps++;
    r->spec_drafted += k;
    r->spec_accepted += a;
    r->spec_accept = spec_accept_mean(r->spec_accept, r->spec_steps, k, a);
    /* the rolling rule: a request whose drafts keep failing decodes plainly from here on */
    const bool quit = !fin && e->o.spec_min_accept > 0 && r->spec_steps >= SPEC_ACCEPT_MIN_RUNS &&
                      r->spec_accept < e->o.spec_min_accept;
    pthread_mutex_lock(&e->mu);
    e->spec_steps++;
    e->spec_drafted += (uint64_t)k;
    e->spec_accepted += (uint64_t)a;
    pthread_mutex_unlock(&e->mu);
    engine_metrics_spec(&e->m, k, a);
    if (e->pc) prefix_after_step(e, r, it);
    if (fin) {
        e->done[nd++] = r;
        if (e->pc) prefix_keep(e, r);
        return nd;
    }
    if (quit) {
        spec_switch_off(e, r, "rolling acceptance below --spec-min-acceptance");
        return nd;
    }
    spec_fed(e->sp, r->slot, it->tokens, used);
    return nd;
}


/* The step's tokens are all told (on_token): each sink with an on_step_end hears it once (one
 * beyond the first 4 distinct sinks of a step once per item: harmless, nothing new to hand). */
static void step_end_sinks(engine *e, int n)
{
    const engine_sink *seen[4];
    int n_seen = 0;
    for (int i = 0; i < n; i++) {
        const engine_sink *k = e->item_req[i]->sink;
        if (!e->items[i].sample || !k->on_step_end) continue;
        bool told = false;
        for (int j = 0; j < n_seen && !told; j++) told = seen[j] == k;
        if (told) continue;
        if (n_seen < 4) seen[n_seen++] = k;
        k->on_step_end(k->step_arg);
    }
}

static void *engine_main(void *arg)
{
    engine *e = arg;
    pthread_setname_np(pthread_self(), "ds-engine"); /* per-thread CPU in /proc (benches) */
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && e->n_running == 0 && e->n_waiting == 0)
            pthread_cond_wait(&e->work_cv, &e->mu);
        if (e->stop && e->n_running == 0 && e->n_waiting == 0) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        int nd;
        int na = collect_step(e, &nd);
        bool failed = e->failed;
        engine_metrics_occupancy(&e->m, e->n_running, e->n_waiting, e->n_slots);
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < nd; i++) end_seq(e, e->done[i]); /* cancelled: blocks back first */
        if (nd && e->pc) {
            pthread_mutex_lock(&e->mu);
            prefix_spare(e);
            pthread_mutex_unlock(&e->mu);
        }

        status st;
        status_clear(&st);
        if (failed) { /* nothing runs any more: fail everything that arrives */
            status_fail(&st, STATUS_DEVICE, "worker backend failed");
            nd = fail_items(e, e->active, na, &st, nd);
            retire(e, e->done, nd);
            continue;
        }
        /* new sequences (from a cached prefix where there is one; those waiting for another
           one's snapshot stay out of this step) */
        int kept = 0;
        for (int i = 0; i < na; i++) {
            engine_request *r = e->active[i];
            if (!r->started) {
                const int rc = start_seq(e, r, &st);
                if (rc < 0) nd = fail_items(e, &r, 1, &st, nd);
                if (rc <= 0) continue;
            }
            e->active[kept++] = r;
        }
        na = kept;
        int n;
        const double t_step = clock_now_s(); /* the gate's time: the head's feeds and drafts in */
        const bool speculate = step_speculates(e, e->active, na);
        while ((n = build_batch(e, e->active, na, speculate)) > 0 && e->kv &&
               !kv_grow(e, n, &na, &nd)) {
        }
        uint64_t generated = 0;
        if (n > 0) spec_draft_all(e, n);
        if (n > 0) {
            int rc = worker_backend_step(e->b, e->items, n, &st);
            int64_t now = clock_now_us();
            if (rc != STATUS_OK) {
                LOG_ERROR("engine step failed (%d items): %s", n, st.msg);
                nd = fail_items(e, e->item_req, n, &st, nd);
                if (rc == STATUS_DEVICE) {
                    pthread_mutex_lock(&e->mu);
                    e->failed = true;
                    pthread_mutex_unlock(&e->mu);
                    if (e->o.on_fatal) e->o.on_fatal(e->o.fatal_arg);
                }
            } else {
                for (int i = 0; i < n; i++) {
                    engine_request *r = e->item_req[i];
                    if (e->items[i].verify) {
                        nd = spec_verified(e, r, &e->items[i], now, nd, &generated);
                        continue;
                    }
                    r->n_fed += e->items[i].n_tokens;
                    if (r->spec) spec_fed(e->sp, r->slot, e->items[i].tokens, e->items[i].n_tokens);
                    if (e->pc) prefix_after_step(e, r, &e->items[i]);
                    if (!e->items[i].sample) continue;
                    generated++;
                    if (!take_token(e, r, &e->items[i], now)) continue;
                    e->done[nd++] = r;
                    if (e->pc) prefix_keep(e, r); /* the conversation's next turn starts here */
                }
                step_end_sinks(e, n);
                if (e->sp && e->o.spec_gate) gate_record(e, n, clock_now_s() - t_step, generated);
            }
        }
        engine_metrics_step(&e->m, generated);
        if (e->pc && e->m.on) {
            engine_load l;
            engine_get_load(e, &l);
            engine_metrics_prefix(&e->m, &l);
        }

        pthread_mutex_lock(&e->mu);
        e->steps++;
        e->tokens_generated += generated;
        int64_t now = clock_now_us();
        if (now - e->tps_t0 >= 1000000) {
            e->tps = (double)(e->tokens_generated - e->tps_tok0) * 1e6 / (double)(now - e->tps_t0);
            e->tps_t0 = now;
            e->tps_tok0 = e->tokens_generated;
        }
        pthread_mutex_unlock(&e->mu);
        retire(e, e->done, nd);
    }
    return NULL;
}

/* ---- lifecycle ---- */

int engine_create(worker_backend *b, const engine_opts *o, engine **out, status *st)
{
    *out = NULL;
    engine *e = calloc(1, sizeof *e);
    if (!e) return status_fail(st, STATUS_NOMEM, "engine: out of memory");
    e->b = b;
    e->o = *o;
    if (e->o.queue < 0) e->o.queue = 64;
    if (e->o.step_tokens <= 0) e->o.step_tokens = 256;
    if (e->o.prefill_min_tokens <= 0) e->o.prefill_min_tokens = ENGINE_PREFILL_MIN_TOKENS_DEFAULT;
    if (e->o.prefill_min_tokens > e->o.step_tokens) e->o.prefill_min_tokens = e->o.step_tokens;
    e->n_slots = b->n_slots;
    e->kv = b->kv;
    if (e->kv && kv_pool_n_seqs(e->kv) < e->n_slots) {
        status_fail(st, STATUS_INVALID, "engine: the backend's KV pool needs a table per "
                    "slot (%d tables, %d slots)", kv_pool_n_seqs(e->kv), e->n_slots);
        free(e);
        return st->code;
    }
    if (e->kv) {
        e->kv_watermark = kv_pool_total_blocks(e->kv) * KV_WATERMARK_PERCENT / 100;
        if (e->kv_watermark < 1) e->kv_watermark = 1;
    }
    if (e->kv && b->f->n_snaps > 0) {
        const prefix_cache_opts po = {.kv = e->kv, .n_snaps = b->f->n_snaps,
                                      .snap_bytes = b->f->snap_bytes,
                                      .block_bytes = b->f->kv_block_bytes};
        if (prefix_cache_create(&po, &e->pc, st) != STATUS_OK) {
            free(e);
            return st->code;
        }
    }
    if (e->o.spec_max_batch <= 0) e->o.spec_max_batch = SPEC_MAX_BATCH_DEFAULT;
    if (!(e->o.spec_min_accept >= 0 && e->o.spec_min_accept <= 1)) { /* NaN too */
        status_fail(st, STATUS_INVALID, "engine: spec_min_accept must be 0..1, not %g",
                    (double)e->o.spec_min_accept);
        prefix_cache_destroy(e->pc);
        free(e);
        return st->code;
    }
    if (e->o.spec_k > 0 && !b->model->mtp.present) {
        LOG_INFO("speculative decoding off: the model has no MTP head");
    } else if (e->o.spec_k > 0 && b->f->verify_rows < e->o.spec_k + 1) {
        LOG_INFO("speculative decoding off: %s runs no verify runs of %d rows", b->device,
                 e->o.spec_k + 1);
    } else if (e->o.spec_k > 0) {
        if (spec_create(b->model, b->f, e->n_slots, b->n_ctx, e->o.step_tokens, e->o.spec_k,
                        e->o.spec_threads, &e->sp, st) != STATUS_OK) {
            prefix_cache_destroy(e->pc);
            free(e);
            return st->code;
        }
        LOG_INFO("speculative decoding: the MTP head (%s) drafts %d tokens while at most %d "
                 "sequences decode (requests without penalties; a request stops after %d verify "
                 "runs with a rolling acceptance below %.2f; %.1f MiB of draft state)",
                 e->sp->dev ? b->device : "cpu", e->o.spec_k, e->o.spec_max_batch,
                 SPEC_ACCEPT_MIN_RUNS, (double)e->o.spec_min_accept,
                 (double)e->sp->bytes / (1 << 20));
    }
    int n_pool = e->n_slots + e->o.queue;
    e->pool = calloc((size_t)n_pool, sizeof *e->pool);
    e->running = calloc((size_t)e->n_slots, sizeof *e->running);
    e->active = calloc((size_t)e->n_slots, sizeof *e->active);
    e->items = calloc((size_t)e->n_slots, sizeof *e->items);
    e->item_req = calloc((size_t)e->n_slots, sizeof *e->item_req);
    e->item_order = calloc((size_t)e->n_slots, sizeof *e->item_order);
    e->done = calloc((size_t)n_pool, sizeof *e->done);
    e->retired = calloc((size_t)n_pool, sizeof *e->retired);
    if (!e->pool || !e->running || !e->active || !e->items || !e->item_req || !e->item_order ||
        !e->done || !e->retired) {
        engine_destroy(e);
        return status_fail(st, STATUS_NOMEM, "engine: out of memory for %d requests", n_pool);
    }
    for (int i = n_pool - 1; i >= 0; i--) {
        e->pool[i].next = e->free_list;
        e->free_list = &e->pool[i];
    }
    pthread_mutex_init(&e->mu, NULL);
    clock_cond_init(&e->work_cv);
    clock_cond_init(&e->idle_cv);
    e->tps_t0 = clock_now_us();
    engine_metrics_init(&e->m, e->o.metrics, e->n_slots, e->kv ? kv_pool_total_blocks(e->kv) : 0);
    if (e->pc) engine_metrics_prefix_init(&e->m, e->o.metrics);
    if (e->sp) engine_metrics_spec_init(&e->m, e->o.metrics);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        engine_destroy(e);
        return status_fail(st, STATUS_INTERNAL, "engine: cannot start the engine thread");
    }
    e->thread_started = true;
    *out = e;
    return STATUS_OK;
}

bool engine_wait_idle(engine *e, int64_t timeout_ms)
{
    const struct timespec dl = clock_timespec_ms(clock_deadline_ms(timeout_ms));
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    while ((e->n_running || e->n_waiting || e->n_retiring) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&e->idle_cv, &e->mu, &dl);
    bool idle = !e->n_running && !e->n_waiting && !e->n_retiring;
    pthread_mutex_unlock(&e->mu);
    return idle;
}

/* under e->mu: marks every request to end with UNAVAILABLE msg. Returns how many. */
static int abort_all(engine *e, const char *msg)
{
    int n = 0;
    for (int s = 0; s < e->n_slots; s++)
        if (e->running[s] && !e->running[s]->aborted) {
            mark_aborted(e->running[s], STATUS_UNAVAILABLE, msg);
            n++;
        }
    for (engine_request *r = e->wait_head; r; r = r->next)
        if (!r->aborted) {
            mark_aborted(r, STATUS_UNAVAILABLE, msg);
            n++;
        }
    pthread_cond_signal(&e->work_cv);
    return n;
}

int engine_drain(engine *e, int64_t grace_ms)
{
    const struct timespec dl = clock_timespec_ms(clock_deadline_ms(grace_ms));
    pthread_mutex_lock(&e->mu);
    e->draining = true;
    int rc = 0;
    while ((e->n_running || e->n_waiting || e->n_retiring) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&e->idle_cv, &e->mu, &dl);
    int n = abort_all(e, "worker draining: grace period over");
    /* idle includes the sinks told: every call has its final message and status queued */
    while (e->n_running || e->n_waiting || e->n_retiring) pthread_cond_wait(&e->idle_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return n;
}

void engine_destroy(engine *e)
{
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        abort_all(e, "worker stopping");
        pthread_cond_signal(&e->work_cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->work_cv);
        pthread_cond_destroy(&e->idle_cv);
    }
    prefix_cache_destroy(e->pc);
    spec_destroy(e->sp);
    free(e->pool);
    free(e->running);
    free(e->active);
    free(e->items);
    free(e->item_req);
    free(e->item_order);
    free(e->done);
    free(e->retired);
    free(e);
}
