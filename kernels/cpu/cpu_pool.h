/* A small fixed thread pool for the CPU kernels: created once (per engine), then each
 * cpu_pool_run hands n_tasks indices to the caller thread plus the pool's workers and returns
 * when all are done. No allocation and no thread creation per run.
 *
 *   cpu_pool *p; cpu_pool_create(&p, 0, st);          0 -> the online CPUs
 *   cpu_pool_run(p, fn, arg, n_tasks);                 fn(arg, task) for task in [0, n_tasks)
 *
 * Tasks are claimed dynamically (an atomic counter), so uneven tasks balance. A pool is driven
 * by one caller thread at a time. fn must not call cpu_pool_run on the same pool. */
#ifndef DS_KERNELS_CPU_CPU_POOL_H
#define DS_KERNELS_CPU_CPU_POOL_H

#include "common/status.h"

typedef struct cpu_pool cpu_pool;
typedef void (*cpu_pool_fn)(void *arg, int task);

/* n_threads counts the caller: n_threads - 1 workers are started. n_threads <= 0 picks the
 * number of online CPUs. (The CLI's --threads, env DS_THREADS, arrives as n_threads.) */
int cpu_pool_create(cpu_pool **out, int n_threads, status *st);
void cpu_pool_destroy(cpu_pool *p);
int cpu_pool_n_threads(const cpu_pool *p);

/* Runs fn(arg, t) for every t in [0, n_tasks) and waits. p may be NULL: runs serially. */
void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *arg, int n_tasks);

/* The calling thread's index in [0, n_threads) while inside a task (0 for the caller, also
 * outside any run): per-thread scratch buffers are indexed by it. */
int cpu_pool_thread_index(void);

#endif
