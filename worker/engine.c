/* Continuous-batching engine: see engine.h.
 *
 * Locking: e->mu guards the request pool, the waiting FIFO, running[] (slot -> request), the
 * counters GetLoad reads and the aborted flags. The engine thread snapshots running[] into
 * active[] under the lock at the start of each step and works on active[] without the lock;
 * fields of a request that only the engine thread touches (n_prefilled, n_generated, started,
 * timings) are written only there. Sinks are called without the lock. */
#include "worker/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "worker/engine_metrics.h"

#define MIN_PREFILL_CHUNK 16

struct engine {
    worker_backend *b; /* borrowed */
    engine_opts o;
    int n_slots;

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
    uint32_t kv_total, kv_reserved; /* paged KV blocks (worker_backend.kv_blocks_total): every
                                       running request reserves its worst case at admission */
    uint64_t steps, tokens_generated, n_finished;
    int64_t tps_t0;
    uint64_t tps_tok0;
    double tps;

    /* engine thread only */
    pthread_t thread;
    bool thread_started;
    engine_request **active;  /* owned, [n_slots] this step's requests */
    worker_batch_item *items; /* owned, [n_slots] */
    engine_request **item_req; /* owned, [n_slots] */
    int *item_chunk;          /* owned, [n_slots]: prompt tokens fed by the item */
    engine_request **done;    /* owned, [n_slots + queue] requests ending this step */
    engine_request *retired;  /* owned, [n_slots + queue] copies of done[] for the sinks */

    engine_metrics m;
};


/* ---- pool and queue (under e->mu) ---- */

static int free_slot(const engine *e)
{
    for (int s = 0; s < e->n_slots; s++)
        if (!e->running[s]) return s;
    return -1;
}

/* The KV blocks a request can use at most: its prompt and every token it may generate (the
 * request was validated against the context), in the backend's blocks; 0 without paged KV. */
static uint32_t kv_need(const engine *e, const engine_params *p)
{
    if (!e->kv_total) return 0;
    const int64_t tok = (int64_t)p->n_prompt + p->max_new_tokens, bt = e->b->kv_block_tokens;
    return (uint32_t)((tok + bt - 1) / bt);
}

/* A free slot for r, and room in the KV pool for its worst case: the slot, else -1. */
static int slot_for(const engine *e, const engine_request *r)
{
    if (e->kv_total && e->kv_reserved + r->kv_blocks > e->kv_total) return -1;
    return free_slot(e);
}

static void admit(engine *e, engine_request *r, int slot, int64_t now)
{
    r->slot = slot;
    r->t_admit = now;
    r->admit_seq = e->next_admit_seq++;
    e->running[slot] = r;
    e->n_running++;
    e->kv_reserved += r->kv_blocks;
}

/* Waiting requests take free slots (and KV room), oldest first: a request that does not fit
 * holds the ones behind it (FIFO). After every locked section that frees a slot or KV this
 * runs, so "the head could run" implies "nobody waits" (submit relies on it). */
static void admit_waiting(engine *e, int64_t now)
{
    int slot;
    while (e->wait_head && (slot = slot_for(e, e->wait_head)) >= 0) {
        engine_request *r = e->wait_head;
        e->wait_head = r->next;
        if (!e->wait_head) e->wait_tail = NULL;
        e->n_waiting--;
        r->next = NULL;
        admit(e, r, slot, now);
    }
}

static uint64_t request_tokens_left(const engine_request *r)
{
    return (uint64_t)(r->p.n_prompt - r->n_prefilled) + (uint64_t)(r->p.max_new_tokens - r->n_generated);
}

/* ---- submit / abort / load ---- */

int engine_submit(engine *e, const engine_params *p, const engine_sink *sink, void *sink_arg,
                  status *st)
{
    DS_ASSERT(p->n_prompt >= 1 && p->max_new_tokens >= 1 && sink && sink->on_finish);
    int32_t *copy = malloc((size_t)p->n_prompt * sizeof *copy);
    if (!copy) return status_fail(st, STATUS_NOMEM, "request %s: out of memory for the prompt", p->id);
    memcpy(copy, p->prompt, (size_t)p->n_prompt * sizeof *copy);
    int64_t now = clock_now_us();

    const uint32_t need = kv_need(e, p);
    pthread_mutex_lock(&e->mu);
    int rc = STATUS_OK;
    /* a slot and KV room now, and nobody ahead (admit_waiting keeps the head waiting only
     * while it cannot run): FIFO holds */
    const engine_request probe = {.kv_blocks = need};
    int slot = e->n_waiting ? -1 : slot_for(e, &probe);
    if (e->draining || e->stop) {
        rc = status_fail(st, STATUS_UNAVAILABLE, "worker is draining");
        engine_metrics_rejected(&e->m, true);
    } else if (e->failed) {
        rc = status_fail(st, STATUS_UNAVAILABLE, "worker backend failed");
    } else if (need > e->kv_total) {
        rc = status_fail(st, STATUS_RANGE,
                         "request %s: %d prompt + %d new tokens need %u KV blocks of %d tokens; "
                         "the worker's cache holds %u", p->id, p->n_prompt, p->max_new_tokens,
                         need, e->b->kv_block_tokens, e->kv_total);
    } else if (slot < 0 && e->n_waiting >= e->o.queue) {
        rc = status_fail(st, STATUS_EXHAUSTED,
                         "request %s: admission queue full (%d running, %d waiting)", p->id,
                         e->n_running, e->n_waiting);
        engine_metrics_rejected(&e->m, false);
    }
    if (rc != STATUS_OK) {
        pthread_mutex_unlock(&e->mu);
        free(copy);
        return rc;
    }
    engine_request *r = e->free_list;
    DS_ASSERT(r); /* pool = slots + queue */
    e->free_list = r->next;
    memset(r, 0, sizeof *r);
    r->p = *p;
    r->p.prompt = copy;
    r->prompt_copy = copy;
    r->slot = -1;
    r->stop_token = -1;
    r->t_arrival = now;
    r->kv_blocks = need;
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
    out->total_kv_blocks = e->kv_total;
    out->free_kv_blocks = e->kv_total - e->kv_reserved;
    out->outstanding_tokens = e->outstanding;
    /* the engine refreshes tps every second while it works; when idle it goes stale */
    double dt = (double)(now - e->tps_t0) / 1e6;
    out->tokens_per_second = dt > 2.0 ? (double)(e->tokens_generated - e->tps_tok0) / dt : e->tps;
    out->draining = e->draining;
    out->steps = e->steps;
    out->tokens_generated = e->tokens_generated;
    out->requests_finished = e->n_finished;
    pthread_mutex_unlock(&e->mu);
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

/* Builds the batch from active[]: decode items first, then prefill chunks within budget. */
static int build_batch(engine *e, engine_request **active, int na)
{
    int n = 0, n_pre = 0;
    engine_request *pre[na > 0 ? na : 1];
    for (int i = 0; i < na; i++) {
        engine_request *r = active[i];
        if (r->n_prefilled < r->p.n_prompt) {
            pre[n_pre++] = r;
            continue;
        }
        worker_batch_item *it = &e->items[n];
        memset(it, 0, sizeof *it);
        it->slot = r->slot;
        it->tokens = &r->last_token;
        it->n_tokens = 1;
        it->sample = true;
        e->item_req[n] = r;
        e->item_chunk[n++] = 0;
    }
    sort_by_admission(pre, n_pre);
    int budget = e->o.step_tokens - n;
    /* a backend that runs prompt tokens as rows of the step caps them while others decode */
    const int cap = n > 0 && e->b->prompt_rows_while_decoding > 0 ? e->b->prompt_rows_while_decoding : 0;
    for (int i = 0; i < n_pre; i++) {
        engine_request *r = pre[i];
        int left = r->p.n_prompt - r->n_prefilled;
        int chunk = left < budget ? left : budget;
        if (i == 0 && chunk < MIN_PREFILL_CHUNK) /* progress even when decodes fill the budget */
            chunk = left < MIN_PREFILL_CHUNK ? left : MIN_PREFILL_CHUNK;
        if (cap && chunk > cap) chunk = cap;
        if (chunk <= 0) break;
        worker_batch_item *it = &e->items[n];
        memset(it, 0, sizeof *it);
        it->slot = r->slot;
        it->tokens = r->p.prompt + r->n_prefilled;
        it->n_tokens = chunk;
        it->prompt = true;
        it->sample = r->n_prefilled + chunk == r->p.n_prompt;
        e->item_req[n] = r;
        e->item_chunk[n++] = chunk;
        budget -= chunk;
    }
    return n;
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
    int32_t t = it->token;
    r->n_generated++;
    r->last_token = t;
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
    LOG_INFO("request %s: prompt %d, generated %d, finish %s, queue %.1f ms, ttft %.1f ms, "
             "decode %.1f ms (%.1f tok/s), total %.1f ms, status %s%s%s",
             r->p.id, r->p.n_prompt, r->n_generated, finish_reason_name(r->finish), queue, ttft,
             decode, tps, total, status_code_name(r->result.code), r->result.msg[0] ? ": " : "",
             r->result.msg);
}

/* Frees the slots of the ended requests and returns them to the pool, then tells the sinks
 * (from copies). In this order, whoever sees the end of a stream (the client, after on_finish
 * sent the status) also sees its slot free: a request sent right after is admitted, and GetLoad
 * no longer counts it. Idle (engine_drain, engine_wait_idle) waits for the sinks too. */
static void retire(engine *e, engine_request **done, int nd)
{
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < nd; i++) {
        engine_request *r = done[i];
        if (r->slot >= 0) {
            DS_ASSERT(e->running[r->slot] == r);
            e->running[r->slot] = NULL;
            e->n_running--;
            e->kv_reserved -= r->kv_blocks;
        }
        free(r->prompt_copy);
        r->prompt_copy = NULL;
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

    for (int i = 0; i < nd; i++) { /* the backend's KV blocks back, before any new seq_start */
        const engine_request *r = &e->retired[i];
        if (r->slot >= 0 && r->started && e->b->vt->seq_end) e->b->vt->seq_end(e->b, r->slot);
    }
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

static void *engine_main(void *arg)
{
    engine *e = arg;
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

        status st;
        status_clear(&st);
        if (failed) { /* nothing runs any more: fail everything that arrives */
            status_fail(&st, STATUS_DEVICE, "worker backend failed");
            nd = fail_items(e, e->active, na, &st, nd);
            retire(e, e->done, nd);
            continue;
        }
        /* new sequences */
        int kept = 0;
        for (int i = 0; i < na; i++) {
            engine_request *r = e->active[i];
            if (!r->started) {
                if (e->b->vt->seq_start(e->b, r->slot, &r->p.sampling, &st) != STATUS_OK) {
                    nd = fail_items(e, &r, 1, &st, nd);
                    continue;
                }
                r->started = true;
            }
            e->active[kept++] = r;
        }
        na = kept;
        int n = build_batch(e, e->active, na);
        uint64_t generated = 0;
        if (n > 0) {
            int rc = e->b->vt->step(e->b, e->items, n, &st);
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
                    r->n_prefilled += e->item_chunk[i];
                    if (!e->items[i].sample) continue;
                    generated++;
                    if (take_token(e, r, &e->items[i], now)) e->done[nd++] = r;
                }
            }
        }
        engine_metrics_step(&e->m, generated);

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
    e->n_slots = b->n_slots;
    e->kv_total = b->kv_block_tokens > 0 ? b->kv_blocks_total : 0;
    int n_pool = e->n_slots + e->o.queue;
    e->pool = calloc((size_t)n_pool, sizeof *e->pool);
    e->running = calloc((size_t)e->n_slots, sizeof *e->running);
    e->active = calloc((size_t)e->n_slots, sizeof *e->active);
    e->items = calloc((size_t)e->n_slots, sizeof *e->items);
    e->item_req = calloc((size_t)e->n_slots, sizeof *e->item_req);
    e->item_chunk = calloc((size_t)e->n_slots, sizeof *e->item_chunk);
    e->done = calloc((size_t)n_pool, sizeof *e->done);
    e->retired = calloc((size_t)n_pool, sizeof *e->retired);
    if (!e->pool || !e->running || !e->active || !e->items || !e->item_req || !e->item_chunk ||
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
    engine_metrics_init(&e->m, e->o.metrics, e->n_slots);
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
    free(e->pool);
    free(e->running);
    free(e->active);
    free(e->items);
    free(e->item_req);
    free(e->item_chunk);
    free(e->done);
    free(e->retired);
    free(e);
}
