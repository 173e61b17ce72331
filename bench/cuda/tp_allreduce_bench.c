/* The all-reduces of a tensor-parallel step, alone: how much of a step they take.
 *
 * A step of the sharded forward (model/forward_cuda.h, --tp) sums two activations a layer over the
 * ranks (after o_proj / ssm_out and after ffn_down: B rows of the hidden size each), in place,
 * captured in the rank's step graph. This captures the same 2 x layers tp_comm_sum calls of B x
 * hidden floats in one graph per rank (a host thread a rank, as the forward), replays it on every
 * rank at once and prints µs per step: against `bench decode` / `bench batch` with --tp 2 in the
 * same call, the time the all-reduces take when nothing overlaps them. Nothing else runs in the
 * graphs, so it is the sums' cost, not a share measured inside the step.
 *
 *   tp_allreduce_bench [--gpus 0,1] [--hidden 5120] [--layers 64] [--rows 1,16,64,256] [--iters 200]
 *
 * Needs at least two GPUs and libnccl.so.2 (kernels/cuda/tp_comm.h); otherwise one line saying
 * which, exit 1. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/flags.h"
#include "common/status.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/tp_comm.h"

#define AR_MAX_RANKS 8
#define AR_MAX_ROWS 8

typedef struct ar_opts {
    const char *gpus, *rows;
    int hidden, layers, iters;
} ar_opts;

static const flag_spec ar_flags[] = {
    {"gpus", NULL, "0,1", FLAG_STR, offsetof(ar_opts, gpus), "the ranks' GPUs"},
    {"hidden", NULL, "5120", FLAG_INT, offsetof(ar_opts, hidden), "floats a row (the 27B's hidden size)"},
    {"layers", NULL, "64", FLAG_INT, offsetof(ar_opts, layers), "layers: two sums each"},
    {"rows", NULL, "1,16,64,256", FLAG_STR, offsetof(ar_opts, rows), "rows a step (B)"},
    {"iters", NULL, "200", FLAG_INT, offsetof(ar_opts, iters), "timed steps"},
    {0},
};

typedef struct ar_shared {
    int n, hidden, layers, iters, rows;
    pthread_barrier_t bar;
    int failed; /* some rank failed its part: every rank leaves at the next barrier */
} ar_shared;

typedef struct ar_rank {
    ar_shared *sh;
    tp_comm *comm;
    int dev, max_rows;
    float *buf;
    cuda_stream s;
    cuda_event e0, e1;
    double us; /* last case's µs a step */
    status st;
} ar_rank;

/* every rank reaches it; true when some rank failed before it */
static bool ar_sync(ar_rank *r, bool ok)
{
    if (!ok) __atomic_store_n(&r->sh->failed, 1, __ATOMIC_SEQ_CST);
    pthread_barrier_wait(&r->sh->bar);
    const bool failed = __atomic_load_n(&r->sh->failed, __ATOMIC_SEQ_CST) != 0;
    pthread_barrier_wait(&r->sh->bar); /* nobody sets it again before everyone has read it */
    return failed;
}

/* one case (sh->rows rows): capture, warm up, time */
static bool ar_case(ar_rank *r)
{
    const ar_shared *sh = r->sh;
    const size_t count = (size_t)sh->rows * sh->hidden;
    cuda_graph_exec g = NULL;
    bool ok = !cuda_graph_capture_begin(r->s, &r->st);
    for (int i = 0; ok && i < 2 * sh->layers; i++) ok = !tp_comm_sum(r->comm, r->buf, count, r->s, &r->st);
    if (ok) ok = !cuda_graph_capture_end(r->s, &g, NULL, &r->st);
    if (ar_sync(r, ok)) goto out;
    for (int i = 0; ok && i < 5; i++) ok = !cuda_graph_launch(g, r->s);
    ok = ok && !cuda_sync(r->s, "all-reduce warm-up", &r->st);
    if (ar_sync(r, ok)) goto out;
    cuda_event_record(r->e0, r->s);
    for (int i = 0; ok && i < sh->iters; i++) ok = !cuda_graph_launch(g, r->s);
    cuda_event_record(r->e1, r->s);
    ok = ok && !cuda_sync(r->s, "all-reduce steps", &r->st);
    if (ok) r->us = 1000.0 * cuda_event_elapsed_ms(r->e0, r->e1) / sh->iters;
    ok = !ar_sync(r, ok);
out:
    if (g) cuda_graph_exec_destroy(g);
    return ok && !sh->failed;
}

static void *ar_main(void *arg)
{
    ar_rank *r = arg;
    cuda_device_props p; /* also makes r->dev this thread's device */
    const size_t bytes = (size_t)r->max_rows * r->sh->hidden * 4;
    bool ok = !cuda_device_props_get(r->dev, &p, &r->st) &&
              !cuda_alloc((void **)&r->buf, bytes, "all-reduce buffer", &r->st) &&
              !cuda_memset(r->buf, 0, bytes, &r->st) && !cuda_stream_create(&r->s, &r->st) &&
              !cuda_event_create(&r->e0, &r->st) && !cuda_event_create(&r->e1, &r->st);
    if (!ar_sync(r, ok)) ar_case(r);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *usage = "tp_allreduce_bench [--gpus 0,1] [--hidden 5120] [--layers 64] "
                        "[--rows 1,16,64,256] [--iters 200]";
    ar_opts o = {0};
    status st = {0};
    int rc = flags_parse(ar_flags, &o, argc, argv, usage, &st);
    if (rc == STATUS_CANCELLED) return 0;
    int devs[AR_MAX_RANKS], rows[AR_MAX_ROWS];
    const int n = rc ? 0 : flags_int_list(o.gpus, devs, AR_MAX_RANKS, 0, 1023);
    const int n_rows = rc ? 0 : flags_int_list(o.rows, rows, AR_MAX_ROWS, 1, 4096);
    if (rc || n < 2 || !n_rows || o.hidden < 1 || o.layers < 1 || o.iters < 1) {
        fprintf(stderr, "tp_allreduce_bench: %s\n",
                rc ? st.msg : "--gpus: two or more GPU indices; --rows: sizes in [1, 4096]; "
                              "--hidden, --layers, --iters >= 1");
        return 2;
    }
    tp_comm *comm[AR_MAX_RANKS] = {0};
    if (tp_comm_init_all(n, devs, comm, &st)) {
        fprintf(stderr, "tp_allreduce_bench: %s\n", st.msg);
        return 1;
    }
    int max_rows = 0;
    for (int i = 0; i < n_rows; i++) max_rows = rows[i] > max_rows ? rows[i] : max_rows;
    printf("%s, %d ranks (GPUs %s), %d layers x 2 in-place sums of rows x %d floats a step\n",
           tp_comm_describe(), n, o.gpus, o.layers, o.hidden);
    printf("| rows | bytes a sum | sums a step | µs a step | µs a sum | GB/s a rank (2(n-1)/n x bytes) |\n");
    printf("|---|---|---|---|---|---|\n");
    int bad = 0;
    for (int c = 0; c < n_rows && !bad; c++) {
        ar_shared sh = {.n = n, .hidden = o.hidden, .layers = o.layers, .iters = o.iters,
                        .rows = rows[c]};
        pthread_barrier_init(&sh.bar, NULL, (unsigned)n);
        ar_rank rk[AR_MAX_RANKS];
        pthread_t th[AR_MAX_RANKS];
        for (int r = 0; r < n; r++) {
            rk[r] = (ar_rank){.sh = &sh, .comm = comm[r], .dev = devs[r], .max_rows = max_rows};
            pthread_create(&th[r], NULL, ar_main, &rk[r]);
        }
        for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
        pthread_barrier_destroy(&sh.bar);
        if (sh.failed) {
            for (int r = 0; r < n; r++)
                if (rk[r].st.code) fprintf(stderr, "tp_allreduce_bench: rank %d: %s\n", r, rk[r].st.msg);
            bad = 1;
        } else {
            const double bytes = (double)rows[c] * o.hidden * 4, per = rk[0].us / (2.0 * o.layers);
            printf("| %d | %.0f | %d | %.1f | %.2f | %.1f |\n", rows[c], bytes, 2 * o.layers,
                   rk[0].us, per, 2.0 * (n - 1) / n * bytes / (per * 1e3));
        }
        for (int r = 0; r < n; r++) {
            if (rk[r].buf) cuda_free(rk[r].buf);
            if (rk[r].s) cuda_stream_destroy(rk[r].s);
            if (rk[r].e0) cuda_event_destroy(rk[r].e0);
            if (rk[r].e1) cuda_event_destroy(rk[r].e1);
        }
    }
    for (int r = 0; r < n; r++) tp_comm_destroy(comm[r]);
    return bad;
}
