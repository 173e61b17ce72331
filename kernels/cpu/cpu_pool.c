/* Thread pool: one mutex + two condition variables; tasks claimed with an atomic counter. */
#include "kernels/cpu/cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

struct cpu_pool {
    int n_threads;         /* including the caller */
    pthread_t *threads;    /* owned, [n_threads - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    uint64_t gen;          /* bumped per run; guarded by mu */
    int n_busy;            /* workers still inside the current run; guarded by mu */
    int quit;              /* guarded by mu */
    cpu_pool_fn fn;        /* current run */
    void *arg;
    int n_tasks;
    atomic_int next;       /* next unclaimed task */
};

typedef struct worker_arg {
    cpu_pool *p;
    int index;
} worker_arg;

static _Thread_local int tls_thread_index;

int cpu_pool_thread_index(void) { return tls_thread_index; }

static void run_tasks(cpu_pool *p)
{
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->arg, t);
    }
}

static void *worker_main(void *varg)
{
    worker_arg wa = *(worker_arg *)varg;
    free(varg);
    cpu_pool *p = wa.p;
    tls_thread_index = wa.index;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_tasks(p);
        pthread_mutex_lock(&p->mu);
        if (--p->n_busy == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* The CLI's --threads (env DS_THREADS, common/flags.h) arrives as n_threads; 0 means this. */
static int default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int cpu_pool_create(cpu_pool **out, int n_threads, status *st)
{
    *out = NULL;
    if (n_threads <= 0) n_threads = default_threads();
    if (n_threads > 1024) return status_fail(st, STATUS_INVALID, "cpu_pool: %d threads", n_threads);
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return status_fail(st, STATUS_NOMEM, "cpu_pool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->next, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) goto nomem;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->p = p;
            wa->index = i;
        }
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i; /* stop and join the i - 1 already running */
            cpu_pool_destroy(p);
            return status_fail(st, STATUS_NOMEM, "cpu_pool: cannot start thread %d of %d", i,
                               n_threads);
        }
    }
    *out = p;
    return STATUS_OK;
nomem:
    free(p);
    return status_fail(st, STATUS_NOMEM, "cpu_pool: out of memory");
}

void cpu_pool_destroy(cpu_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int cpu_pool_n_threads(const cpu_pool *p) { return p ? p->n_threads : 1; }

void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *arg, int n_tasks)
{
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(arg, t);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->n_busy = p->n_threads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p);
    pthread_mutex_lock(&p->mu);
    while (p->n_busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
