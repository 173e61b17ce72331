/* The rank threads of a tensor-parallel group (forward_cuda_impl.h fc_ranks): a host thread per
 * rank, each the only thread that touches its rank's GPU; the caller's thread posts one job to
 * every rank and waits until all have done it. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/forward_cuda_impl.h"

typedef struct rank_arg {
    struct fc_ranks *t;
    int r;
} rank_arg;

struct fc_ranks {
    int n;           /* threads started */
    pthread_t th[FWD_MAX_RANKS];
    rank_arg args[FWD_MAX_RANKS];
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    uint64_t seq;    /* jobs posted */
    int n_done;      /* ranks done with the current job */
    void (*fn)(void *arg, int r); /* the current job; NULL: stop */
    void *arg;
};

static void *rank_main(void *p)
{
    const rank_arg *a = p;
    fc_ranks *t = a->t;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (t->seq == seen) pthread_cond_wait(&t->cv_job, &t->mu);
        seen = t->seq;
        void (*fn)(void *, int) = t->fn;
        void *arg = t->arg;
        pthread_mutex_unlock(&t->mu);
        if (fn) fn(arg, a->r);
        pthread_mutex_lock(&t->mu);
        if (++t->n_done == t->n) pthread_cond_broadcast(&t->cv_done);
        pthread_mutex_unlock(&t->mu);
        if (!fn) return NULL;
    }
}

/* Posts fn (NULL: stop) to every thread and waits for all. */
static void post(fc_ranks *t, void (*fn)(void *arg, int r), void *arg)
{
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->n_done = 0;
    t->seq++;
    pthread_cond_broadcast(&t->cv_job);
    while (t->n_done < t->n) pthread_cond_wait(&t->cv_done, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

int fc_ranks_start(int n, fc_ranks **out, status *st)
{
    *out = NULL;
    DS_ASSERT(n >= 1 && n <= FWD_MAX_RANKS);
    fc_ranks *t = calloc(1, sizeof *t);
    if (!t) return status_fail(st, STATUS_NOMEM, "tensor parallel: rank threads");
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv_job, NULL);
    pthread_cond_init(&t->cv_done, NULL);
    for (int r = 0; r < n; r++) {
        t->args[r] = (rank_arg){t, r};
        if (pthread_create(&t->th[r], NULL, rank_main, &t->args[r]) != 0) {
            fc_ranks_stop(t);
            return status_fail(st, STATUS_INTERNAL, "tensor parallel: cannot start rank %d's "
                               "thread", r);
        }
        pthread_mutex_lock(&t->mu); /* a thread counts once started: jobs wait for t->n */
        t->n++;
        pthread_mutex_unlock(&t->mu);
    }
    *out = t;
    return STATUS_OK;
}

void fc_ranks_run(fc_ranks *t, void (*fn)(void *arg, int r), void *arg)
{
    DS_ASSERT(fn);
    post(t, fn, arg);
}

void fc_ranks_stop(fc_ranks *t)
{
    if (!t) return;
    if (t->n) {
        post(t, NULL, NULL);
        for (int r = 0; r < t->n; r++) pthread_join(t->th[r], NULL);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv_job);
    pthread_cond_destroy(&t->cv_done);
    free(t);
}
