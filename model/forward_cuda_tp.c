/* Tensor parallel over NCCL (forward_cuda_tp.h): a host thread per rank, each owning its GPU's
 * forward; the caller's thread posts one job (create, seq_start, seq_end, fill, step) to every
 * rank and waits until all have done it. */
#include "model/forward_cuda_tp.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cuda/tp_comm.h"
#include "model/tp_shard.h"

enum tp_job { TP_CREATE, TP_SEQ_START, TP_SEQ_END, TP_FILL, TP_STEP, TP_QUIT };

typedef struct tp_arg {
    struct qwen35_cuda_tp *t;
    int r;
} tp_arg;

struct qwen35_cuda_tp {
    int n;
    int devs[TP_SHARD_MAX_RANKS];
    tp_shard_model *shard[TP_SHARD_MAX_RANKS]; /* owned */
    tp_comm *comm[TP_SHARD_MAX_RANKS];         /* owned */
    qwen35_cuda *rank[TP_SHARD_MAX_RANKS];     /* owned (created and destroyed by its thread) */
    fwd_row *rows_of[TP_SHARD_MAX_RANKS]; /* owned for r > 0: [max_rows] copies */
    pthread_t th[TP_SHARD_MAX_RANKS];
    tp_arg args[TP_SHARD_MAX_RANKS];
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    uint64_t seq;  /* jobs posted */
    int n_done;    /* ranks done with the current job */
    /* the current job */
    enum tp_job job;
    qwen35_cuda_opts opts;
    const sampling_params *params;
    int slot, n_past, B;
    fwd_row *rows;
    int rc[TP_SHARD_MAX_RANKS];
    status st[TP_SHARD_MAX_RANKS];
};


static void run_job(qwen35_cuda_tp *t, int r)
{
    status *st = &t->st[r];
    status_clear(st);
    int rc = STATUS_OK;
    switch (t->job) {
    case TP_CREATE: {
        qwen35_cuda_opts o = t->opts;
        o.device = t->devs[r];
        o.tp = t->comm[r];
        o.tp_rank = r;
        o.vocab_begin = t->shard[r]->vocab_begin;
        rc = qwen35_cuda_create(&t->shard[r]->model, &o, &t->rank[r], st);
        break;
    }
    case TP_SEQ_START: rc = qwen35_cuda_seq_start(t->rank[r], t->slot, t->params, st); break;
    case TP_SEQ_END: qwen35_cuda_seq_end(t->rank[r], t->slot); break;
    case TP_FILL: rc = qwen35_cuda_fill(t->rank[r], t->slot, t->n_past, st); break;
    case TP_STEP: rc = qwen35_cuda_step(t->rank[r], r ? t->rows_of[r] : t->rows, t->B, st); break;
    case TP_QUIT:
        qwen35_cuda_destroy(t->rank[r]);
        t->rank[r] = NULL;
        break;
    }
    t->rc[r] = rc;
}

static void *rank_main(void *arg)
{
    const tp_arg *a = arg;
    qwen35_cuda_tp *t = a->t;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (t->seq == seen) pthread_cond_wait(&t->cv_job, &t->mu);
        seen = t->seq;
        const enum tp_job job = t->job;
        pthread_mutex_unlock(&t->mu);
        run_job(t, a->r);
        pthread_mutex_lock(&t->mu);
        if (++t->n_done == t->n) pthread_cond_broadcast(&t->cv_done);
        pthread_mutex_unlock(&t->mu);
        if (job == TP_QUIT) return NULL;
    }
}

/* Posts the job to every rank and waits for all; the first rank's error, named. */
static int post(qwen35_cuda_tp *t, enum tp_job job, status *st)
{
    pthread_mutex_lock(&t->mu);
    t->job = job;
    t->n_done = 0;
    t->seq++;
    pthread_cond_broadcast(&t->cv_job);
    while (t->n_done < t->n) pthread_cond_wait(&t->cv_done, &t->mu);
    pthread_mutex_unlock(&t->mu);
    for (int r = 0; r < t->n; r++)
        if (t->rc[r]) {
            if (st) status_fail(st, t->rc[r], "tensor-parallel rank %d (cuda:%d): %s", r,
                                t->devs[r], t->st[r].msg);
            return t->rc[r];
        }
    return STATUS_OK;
}

int qwen35_cuda_tp_create(const qwen35_model *m, int n_ranks, const int *devs,
                          const qwen35_cuda_opts *o, qwen35_cuda_tp **out, status *st)
{
    *out = NULL;
    if (n_ranks < 2 || n_ranks > TP_SHARD_MAX_RANKS)
        return status_fail(st, STATUS_INVALID, "tensor parallel: %d ranks (2..%d)", n_ranks,
                           TP_SHARD_MAX_RANKS);
    for (int i = 0; i < n_ranks; i++)
        for (int j = 0; j < i; j++)
            if (devs[i] == devs[j])
                return status_fail(st, STATUS_INVALID, "tensor parallel: cuda:%d twice", devs[i]);
    int rc = tp_shard_check(&m->cfg, n_ranks, st);
    if (rc) return rc;
    qwen35_cuda_tp *t = calloc(1, sizeof *t);
    if (!t) return status_fail(st, STATUS_NOMEM, "tensor parallel");
    t->n = n_ranks;
    memcpy(t->devs, devs, (size_t)n_ranks * sizeof *devs);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv_job, NULL);
    pthread_cond_init(&t->cv_done, NULL);
    for (int r = 0; r < n_ranks && !rc; r++) rc = tp_shard_model_create(m, n_ranks, r, &t->shard[r], st);
    if (!rc) rc = tp_comm_init_all(n_ranks, devs, t->comm, st);
    for (int r = 0; r < n_ranks && !rc; r++) {
        t->args[r] = (tp_arg){t, r};
        if (pthread_create(&t->th[r], NULL, rank_main, &t->args[r]) != 0)
            rc = status_fail(st, STATUS_INTERNAL, "tensor parallel: cannot start rank %d's thread", r);
        else
            t->n_threads++;
    }
    if (rc) goto fail;
    /* every rank at once (capturing a graph may connect NCCL's peers, which then must all be
     * there), each with the same slots and so the same KV pool: sized from free memory each
     * rank could choose differently, so 0 slots means 64 here */
    t->opts = o ? *o : (qwen35_cuda_opts){0};
    if (t->opts.n_slots <= 0) t->opts.n_slots = 64;
    if ((rc = post(t, TP_CREATE, st))) goto fail;
    LOG_INFO("cuda: tensor parallel over %d GPUs (%s)", n_ranks, tp_comm_describe());
    const int max_rows = qwen35_cuda_max_rows(t->rank[0]);
    for (int r = 1; r < n_ranks; r++) {
        t->rows_of[r] = calloc((size_t)max_rows, sizeof *t->rows_of[r]);
        if (!t->rows_of[r]) {
            rc = status_fail(st, STATUS_NOMEM, "tensor parallel: rows");
            goto fail;
        }
        if (qwen35_cuda_n_slots(t->rank[r]) != qwen35_cuda_n_slots(t->rank[0]) ||
            qwen35_cuda_kv_blocks(t->rank[r], NULL) != qwen35_cuda_kv_blocks(t->rank[0], NULL) ||
            qwen35_cuda_max_rows(t->rank[r]) != max_rows) {
            rc = status_fail(st, STATUS_INTERNAL, "tensor parallel: rank %d sized %d slots, %d "
                             "KV blocks, %d rows; rank 0 %d, %d, %d (give --slots)", r,
                             qwen35_cuda_n_slots(t->rank[r]), qwen35_cuda_kv_blocks(t->rank[r], NULL),
                             qwen35_cuda_max_rows(t->rank[r]), qwen35_cuda_n_slots(t->rank[0]),
                             qwen35_cuda_kv_blocks(t->rank[0], NULL), max_rows);
            goto fail;
        }
    }
    *out = t;
    return STATUS_OK;
fail:
    qwen35_cuda_tp_destroy(t);
    return rc;
}

void qwen35_cuda_tp_destroy(qwen35_cuda_tp *t)
{
    if (!t) return;
    t->n = t->n_threads; /* fewer when a thread never started: then nothing was created */
    if (t->n) {
        (void)post(t, TP_QUIT, NULL);
        for (int r = 0; r < t->n; r++) pthread_join(t->th[r], NULL);
    }
    for (int r = 0; r < TP_SHARD_MAX_RANKS; r++) {
        tp_comm_destroy(t->comm[r]);
        tp_shard_model_destroy(t->shard[r]);
        free(t->rows_of[r]);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv_job);
    pthread_cond_destroy(&t->cv_done);
    free(t);
}

int qwen35_cuda_tp_seq_start(qwen35_cuda_tp *t, int slot, const sampling_params *p, status *st)
{
    t->slot = slot;
    t->params = p;
    return post(t, TP_SEQ_START, st);
}

void qwen35_cuda_tp_seq_end(qwen35_cuda_tp *t, int slot)
{
    t->slot = slot;
    (void)post(t, TP_SEQ_END, NULL);
}

int qwen35_cuda_tp_fill(qwen35_cuda_tp *t, int slot, int n_past, status *st)
{
    t->slot = slot;
    t->n_past = n_past;
    return post(t, TP_FILL, st);
}

int qwen35_cuda_tp_step(qwen35_cuda_tp *t, fwd_row *rows, int B, status *st)
{
    if (B < 1 || B > qwen35_cuda_max_rows(t->rank[0]))
        return status_fail(st, STATUS_RANGE, "step of %d rows (1..%d)", B,
                           qwen35_cuda_max_rows(t->rank[0]));
    for (int r = 1; r < t->n; r++) memcpy(t->rows_of[r], rows, (size_t)B * sizeof *rows);
    t->rows = rows;
    t->B = B;
    return post(t, TP_STEP, st);
}

qwen35_cuda *qwen35_cuda_tp_rank(const qwen35_cuda_tp *t, int r) { return t->rank[r]; }
int qwen35_cuda_tp_n_ranks(const qwen35_cuda_tp *t) { return t->n; }
