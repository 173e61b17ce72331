/* The CUDA forward (model/forward_cuda.h) behind the worker's backend interface
 * (worker/backend.h, "cuda"), against the CPU forward pass (model/forward.h), the specification:
 * teacher-forced logits of a prefill chunk then token by token, 256 positions, on every
 * reference model (F32 weights: bound 1e-3 of max|logit|); a deliberately perturbed copy that
 * the same check must reject; greedy generation; the per-token counters (after warm-up: no host
 * allocation, no device allocation, <= 8 device-to-host and 0 host-to-device bytes per greedy
 * token, one host sync); the worker backends' tokens on both devices; fwd.kv as the forward's
 * one KV bookkeeper (blocks taken by the step or by the caller, exhaustion, release); --tp 2
 * refused without NCCL (runs without a GPU); synthetic models (DS_ENGINE_GGUF=path[:path...],
 * required when DS_REQUIRE_GPU=1) with a loose bound. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sampling.h"
#include "common/status.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/tp_comm.h"
#include "model/forward.h"
#include "model/fwd.h"
#include "model/kv_pool.h"
#include "model/qwen35.h"
#include "tests/gpu/gpu_parity.h"
#include "tests/model/ref_cases.h"
#include "worker/backend.h"

/* Counting allocator: while g_counting is set, every malloc/calloc/realloc of the process
 * (g_allocs) and of the thread that set t_mine, the one running the token path (g_mine). The
 * assertion is on the latter (the rule is about the token path; other threads, the CUDA
 * driver's, are not ours); both are printed: on the H200 one of two runs of the same binary
 * counted one process-wide allocation, without saying which thread made it. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
static atomic_long g_allocs, g_mine;
static atomic_int g_counting;
static _Thread_local int t_mine;
static void count_alloc(void)
{
    if (!atomic_load(&g_counting)) return;
    atomic_fetch_add(&g_allocs, 1);
    if (t_mine) atomic_fetch_add(&g_mine, 1);
}
void *malloc(size_t n)
{
    count_alloc();
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    count_alloc();
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    count_alloc();
    return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }

static bool g_have_gpu;

/* Reference models: the shared cases ($DS_REFERENCE_DIR or ../shared/reference beside the
 * checkout; without them the project's own equivalents own-r2-tied / own-r1-untied, through
 * ref_case_resolve_path) and the project's own (tests/reference, $DS_REPO_ROOT). */
static const char *const k_ref[][2] = {
    {"shared", "tiny-r2-tied.gguf"},
    {"shared", "tiny-r1-untied.gguf"},
    {"own", "tiny-r3-gqa3.gguf"},
};
enum { N_REF = sizeof k_ref / sizeof k_ref[0] };

static void ref_path(int i, char *out, size_t n)
{
    const char *root = getenv("DS_REPO_ROOT");
    if (!strcmp(k_ref[i][0], "own")) {
        snprintf(out, n, "%s/tests/reference/%s", root ? root : ".", k_ref[i][1]);
    } else {
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(strlen(k_ref[i][1]) - 5), k_ref[i][1]); /* no .gguf */
        ref_case_resolve_path(name, ".gguf", out, n);
    }
}

typedef struct cmp_result {
    double worst_rel; /* max over positions of max|d| / max|logit_cpu| */
    int argmax_checked, argmax_equal;
} cmp_result;

/* max|a-b| / max|a| over V logits (inf when b has a NaN or inf); *a1 = argmax of a, *gap its
 * margin over the runner-up minus twice max|a-b| (> 0: b's argmax must be the same) */
static double rel_diff(const float *a, const float *b, int V, int *a1, double *gap)
{
    double maxabs = 0, maxd = 0;
    int i1 = 0, i2 = -1;
    for (int i = 0; i < V; i++) {
        if (!isfinite(b[i])) return INFINITY;
        maxabs = fmax(maxabs, fabs(a[i]));
        maxd = fmax(maxd, fabs((double)a[i] - b[i]));
        if (a[i] > a[i1]) i2 = i1, i1 = i;
        else if (i != i1 && (i2 < 0 || a[i] > a[i2])) i2 = i;
    }
    *a1 = i1;
    *gap = (i2 >= 0 ? (double)a[i1] - a[i2] : INFINITY) - 2 * maxd;
    return maxd / (maxabs > 0 ? maxabs : 1);
}

/* The same T ids through the CPU forward (F32 dots: the specification) and the GPU backend:
 * the first P as one prefill item (rows of one step on the GPU), the rest token by token;
 * every position's logits compared. With perturb, one GPU logit at position T/2 is moved by
 * 2·bound·max|logit| first: the check must then fail (worst_rel > bound). */
static int compare_model(const char *path, int T, int P, double bound, bool perturb,
                         cmp_result *res)
{
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    qwen35_ctx *ctx = NULL;
    qwen35_state *s = NULL;
    worker_backend *g = NULL;
    float *lc = NULL, *lg = NULL;
    int32_t *ids = malloc((size_t)T * 4);
    memset(res, 0, sizeof *res);
    const worker_backend_opts o = {.n_slots = 1, .n_ctx = T + 1, .max_prefill_tokens = P};
    const sampling_params greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */
    if (qwen35_model_load(&m, path, &st) || qwen35_ctx_create(m, &(qwen35_ctx_opts){.dot_mode = QWEN35_DOT_EXACT}, &ctx, &st) ||
        qwen35_state_create(m, T + 1, &s, &st) || worker_backend_create("cuda", m, &o, &g, &st) ||
        worker_backend_seq_start(g, 0, &greedy, &st))
        goto fail;
    if (strncmp(g->device, "cuda:", 5)) {
        status_fail(&st, STATUS_UNAVAILABLE, "the backend is %s, not the GPU", g->device);
        goto fail;
    }
    const int V = m->cfg.V;
    lc = malloc((size_t)T * V * 4), lg = malloc((size_t)T * V * 4);
    gpu_rng rng;
    gpu_rng_seed(&rng, 99);
    for (int t = 0; t < P; t++) ids[t] = (int32_t)(gpu_rng_u64(&rng) % (uint64_t)V);
    worker_batch_item it = {.slot = 0, .tokens = ids, .n_tokens = P, .prompt = true, .logits = lg};
    if (qwen35_prefill(ctx, s, ids, P, lc, true, &st) || worker_backend_step(g, &it, 1, &st)) goto fail;
    for (int t = P; t < T; t++) {
        int a1;
        double gap;
        (void)rel_diff(lc + (size_t)(t - 1) * V, lc + (size_t)(t - 1) * V, V, &a1, &gap);
        /* next input: the CPU's argmax half the time, a random id otherwise */
        ids[t] = (gpu_rng_u64(&rng) & 1) ? a1 : (int32_t)(gpu_rng_u64(&rng) % (uint64_t)V);
        it = (worker_batch_item){.slot = 0, .tokens = ids + t, .n_tokens = 1, .prompt = true,
                                 .logits = lg + (size_t)t * V};
        if (qwen35_decode_batch(ctx, &s, ids + t, 1, lc + (size_t)t * V, &st) ||
            worker_backend_step(g, &it, 1, &st))
            goto fail;
    }
    if (perturb) {
        double mx = 0;
        for (int i = 0; i < V; i++) mx = fmax(mx, fabs(lc[(size_t)(T / 2) * V + i]));
        lg[(size_t)(T / 2) * V + 7] += (float)(2 * bound * mx);
    }
    for (int t = 0; t < T; t++) {
        int a1, ag;
        double gap, gg;
        const double rel = rel_diff(lc + (size_t)t * V, lg + (size_t)t * V, V, &a1, &gap);
        (void)rel_diff(lg + (size_t)t * V, lg + (size_t)t * V, V, &ag, &gg);
        if (rel > res->worst_rel) res->worst_rel = rel;
        if (gap > 0 && isfinite(rel)) { /* argmax compared where the margin is clear */
            res->argmax_checked++;
            res->argmax_equal += ag == a1;
        }
        if (rel > bound && !perturb)
            printf("  %s position %d: max|dlogit| = %.3g of max|logit| (bound %.1g)\n", path, t,
                   rel, bound);
    }
    printf("  %s%s: %d positions (prefill %d, then decode), worst max|dlogit|/max|logit| %.3g, "
           "argmax equal %d/%d (clear margin)\n", path, perturb ? " (perturbed)" : "", T, P,
           res->worst_rel, res->argmax_equal, res->argmax_checked);
fail:
    if (st.code) printf("  %s: %s\n", path, st.msg);
    free(lc), free(lg), free(ids);
    worker_backend_destroy(g);
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    qwen35_model_free(m);
    return st.code;
}

static void test_reference_logits(void)
{
    if (!g_have_gpu) return;
    for (int i = 0; i < N_REF; i++) {
        char path[1024];
        ref_path(i, path, sizeof path);
        cmp_result r;
        CU_ASSERT_EQUAL(compare_model(path, 256, 200, 1e-3, false, &r), STATUS_OK);
        CU_ASSERT(r.worst_rel <= 1e-3);
        CU_ASSERT_EQUAL(r.argmax_equal, r.argmax_checked);
    }
}

/* Prefill of P tokens as one item (the batched pass: chunked delta rule, chunks of 64 from the
 * prompt's start, passes of 256 rows) at P = 1, 63, 64, 65, 200 and 4000, then 4 tokens decoded
 * on the state it left: every position within 1e-3 of max|logit| of the CPU forward (whose
 * prefill is chunked too), so the state after the prompt is checked through the logits it
 * gives the next tokens. */
static void test_prefill_lengths(void)
{
    if (!g_have_gpu) return;
    static const int Ps[] = {1, 63, 64, 65, 200, 4000};
    for (int i = 0; i < N_REF; i++) {
        char path[1024];
        ref_path(i, path, sizeof path);
        for (size_t k = 0; k < sizeof Ps / sizeof Ps[0]; k++) {
            cmp_result r;
            CU_ASSERT_EQUAL(compare_model(path, Ps[k] + 4, Ps[k], 1e-3, false, &r), STATUS_OK);
            CU_ASSERT(r.worst_rel <= 1e-3);
        }
    }
}

/* The check can fail: the same run with one logit moved is rejected. */
static void test_perturbed_fails(void)
{
    if (!g_have_gpu) return;
    char path[1024];
    ref_path(0, path, sizeof path);
    cmp_result r;
    CU_ASSERT_EQUAL(compare_model(path, 48, 24, 1e-3, true, &r), STATUS_OK);
    CU_ASSERT(r.worst_rel > 1e-3);
}

/* Greedy through the backends: the GPU equals the CPU; and the per-token counters. */
static int greedy_tokens(worker_backend *b, const int32_t *prompt, int P, int n, int32_t *out,
                         status *st)
{
    const sampling_params greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */
    if (worker_backend_seq_start(b, 0, &greedy, st)) return st->code;
    worker_batch_item it = {.slot = 0, .tokens = prompt, .n_tokens = P, .prompt = true,
                            .sample = true};
    for (int i = 0; i < n; i++) {
        if (worker_backend_step(b, &it, 1, st)) return st->code;
        out[i] = it.out.token;
        it = (worker_batch_item){.slot = 0, .tokens = &out[i], .n_tokens = 1, .sample = true};
    }
    return STATUS_OK;
}

static void test_greedy_and_counters(void)
{
    if (!g_have_gpu) return;
    char path[1024];
    ref_path(0, path, sizeof path);
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    worker_backend *cpu = NULL, *gpu = NULL;
    enum { P = 6, N = 40 };
    const int32_t prompt[P] = {11, 300, 42, 7, 999, 5};
    int32_t cpu_out[N], gpu_out[N];
    const worker_backend_opts o = {.n_slots = 1, .n_ctx = 128, .max_prefill_tokens = 16};
    if (qwen35_model_load(&m, path, &st) || worker_backend_create("cpu", m, &o, &cpu, &st) ||
        worker_backend_create("cuda", m, &o, &gpu, &st) ||
        greedy_tokens(cpu, prompt, P, N, cpu_out, &st) ||
        greedy_tokens(gpu, prompt, P, 8, gpu_out, &st)) /* warm-up */
        goto fail;
    fwd_stats s0, s1;
    worker_backend_get_stats(gpu, &s0);
    const uint64_t dev0 = cuda_alloc_count();
    atomic_store(&g_allocs, 0);
    atomic_store(&g_mine, 0);
    worker_batch_item it = {.slot = 0, .tokens = &gpu_out[7], .n_tokens = 1, .sample = true};
    t_mine = 1;
    atomic_store(&g_counting, 1);
    int rc = STATUS_OK;
    for (int i = 8; i < N && !rc; i++) {
        rc = worker_backend_step(gpu, &it, 1, &st);
        gpu_out[i] = it.out.token;
        it.tokens = &gpu_out[i];
    }
    atomic_store(&g_counting, 0);
    t_mine = 0;
    if (rc) goto fail;
    worker_backend_get_stats(gpu, &s1);
    const long host_allocs = atomic_load(&g_mine), other_allocs = atomic_load(&g_allocs) - host_allocs;
    const uint64_t dev_allocs = cuda_alloc_count() - dev0;
    const double n = (double)(s1.tokens - s0.tokens);
    const double d2h = (double)(s1.d2h_bytes - s0.d2h_bytes) / n;
    const double h2d = (double)(s1.h2d_bytes - s0.h2d_bytes) / n;
    const double syncs = (double)(s1.steps - s0.steps) / n;
    printf("  greedy %d tokens: after warm-up %ld host allocations (%ld on other threads), "
           "%llu device allocations, %.1f D2H and %.1f H2D bytes/token, %.2f syncs/token, "
           "%llu kernels/token\n", N - 8, host_allocs, other_allocs,
           (unsigned long long)dev_allocs, d2h, h2d, syncs, (unsigned long long)s1.kernels_per_token);
    CU_ASSERT_EQUAL(host_allocs, 0);
    CU_ASSERT_EQUAL(dev_allocs, 0);
    CU_ASSERT(d2h <= 8.0);
    CU_ASSERT(h2d == 0.0); /* the chained graph takes the token from the device */
    CU_ASSERT(syncs == 1.0);
    int same = 0;
    while (same < N && cpu_out[same] == gpu_out[same]) same++;
    printf("  greedy: CPU and GPU agree on the first %d of %d tokens\n", same, N);
    CU_ASSERT_EQUAL(same, N);
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    worker_backend_destroy(cpu);
    worker_backend_destroy(gpu);
    qwen35_model_free(m);
}

/* Synthetic models from DS_ENGINE_GGUF (tools/gpu-test makes a 0.8B Q4_K_M; required when
 * DS_REQUIRE_GPU=1): logits reported; a loose bound asserted. The GPU dots quantised weights
 * with Q8 activations per 32 values, the CPU here in F32; a random-weight network amplifies
 * that rounding: the CPU forward itself, given Q8-rounded activations, moves the 0.8B's logits
 * by 0.14 of max|logit| at the first token and 0.24 by the third (docs/GPU.md). The bound (0.5)
 * still catches garbage (wrong wiring gave 1.7-26) and any NaN. */
static void test_synthetic(void)
{
    const char *list = getenv("DS_ENGINE_GGUF");
    const char *req = getenv("DS_REQUIRE_GPU");
    if (!g_have_gpu) return;
    if (!list || !*list) {
        printf("  DS_ENGINE_GGUF unset: no synthetic model given\n");
        CU_ASSERT(!(req && !strcmp(req, "1")));
        return;
    }
    const int T = getenv("DS_ENGINE_TOKENS") ? atoi(getenv("DS_ENGINE_TOKENS")) : 64;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *p = strtok_r(buf, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
        cmp_result r;
        CU_ASSERT_EQUAL(compare_model(p, T, T / 2, 0.5, false, &r), STATUS_OK);
        CU_ASSERT(r.worst_rel <= 0.5);
    }
}

/* The worker backend interface on the GPU, chosen by worker_backend_create("cuda"): two slots, prompts then greedy decode steps with both
 * sequences in one step, equal to the CPU backend's tokens (worker/backend.h). */
static int run_worker_with(worker_backend *b, const sampling_params *sp, int32_t out[2][12], status *st)
{
    static const int32_t p0[] = {3, 17, 200, 5}, p1[] = {500, 2, 44}; /* ids < 773, the smallest reference vocabulary */
    for (int s = 0; s < 2; s++)
        if (worker_backend_seq_start(b, s, sp, st)) return st->code;
    worker_batch_item it[2] = {{.slot = 0, .tokens = p0, .n_tokens = 4, .prompt = true, .sample = true},
                               {.slot = 1, .tokens = p1, .n_tokens = 3, .prompt = true, .sample = true}};
    if (worker_backend_step(b, it, 2, st)) return st->code;
    for (int k = 0; k < 12; k++) {
        out[0][k] = it[0].out.token, out[1][k] = it[1].out.token;
        for (int s = 0; s < 2; s++) {
            it[s].tokens = &out[s][k];
            it[s].n_tokens = 1;
            it[s].prompt = false;
        }
        if (k + 1 < 12 && worker_backend_step(b, it, 2, st)) return st->code;
    }
    return STATUS_OK;
}

static int run_worker(worker_backend *b, int32_t out[2][12], status *st)
{
    const sampling_params greedy = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    return run_worker_with(b, &greedy, out, st);
}

/* Sampling that must give the greedy tokens but goes through the sampler (on the GPU: the step
 * enqueued without a sync and the sampler's readback the token's one sync): top_k 1 at a
 * temperature, and temperature 0 with logprobs. A sampler reading the logits before the step
 * wrote them, or a step left unfinished, shows as other tokens. */
static int run_worker_sampled(worker_backend *b, int32_t out[2][2][12], status *st)
{
    const sampling_params topk1 = {.temperature = 0.7f, .top_k = 1, .top_p = 1,
                                   .repetition_penalty = 1, .penalize_prompt = true, .seed = 11};
    const sampling_params lp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1,
                                .penalize_prompt = true, .n_logprobs = 2};
    if (run_worker_with(b, &topk1, out[0], st)) return st->code;
    return run_worker_with(b, &lp, out[1], st);
}

static void test_worker_backend(void)
{
    if (!g_have_gpu) return;
    char path[1024];
    ref_path(1, path, sizeof path);
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    worker_backend *cpu = NULL, *gpu = NULL;
    int32_t a[2][12], g[2][12], as[2][2][12], gs[2][2][12];
    const worker_backend_opts o = {.n_slots = 2, .n_ctx = 64, .max_prefill_tokens = 16};
    if (qwen35_model_load(&m, path, &st) || worker_backend_create("cpu", m, &o, &cpu, &st) ||
        worker_backend_create("cuda", m, &o, &gpu, &st))
        goto fail;
    /* the dispatch the worker binary uses must pick the GPU here (//model:backends_all linked) */
    CU_ASSERT_PTR_NOT_NULL(fwd_backend_find("cuda"));
    CU_ASSERT_EQUAL(strncmp(gpu->device, "cuda:", 5), 0);
    if (run_worker(cpu, a, &st) || run_worker(gpu, g, &st)) goto fail;
    printf("  worker backend (%s), 2 slots x 12 greedy tokens: %s\n", gpu->device,
           memcmp(a, g, sizeof a) ? "DIFFER from the CPU backend" : "same as the CPU backend");
    CU_ASSERT_EQUAL(memcmp(a, g, sizeof a), 0);
    if (run_worker_sampled(cpu, as, &st) || run_worker_sampled(gpu, gs, &st)) goto fail;
    for (int v = 0; v < 2; v++) {
        printf("  worker backend, %s: CPU %s, GPU %s greedy\n", v ? "temperature 0 + logprobs" : "top_k 1",
               memcmp(as[v], a, sizeof a) ? "DIFFERS from" : "same as",
               memcmp(gs[v], a, sizeof a) ? "DIFFERS from" : "same as");
        CU_ASSERT_EQUAL(memcmp(as[v], a, sizeof a), 0);
        CU_ASSERT_EQUAL(memcmp(gs[v], a, sizeof a), 0);
    }
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    worker_backend_destroy(cpu);
    worker_backend_destroy(gpu);
    qwen35_model_free(m);
}

/* The forward's KV pool is fwd.kv, the one bookkeeper of its blocks (model/kv_pool.h): no block
 * held at create (the pad slot's block lies outside the pool); a step takes the blocks its rows
 * need, or none when the caller took them first (the scheduler's way); a step that needs more
 * than are free fails with STATUS_EXHAUSTED and runs nothing; a sequence's end gives its blocks
 * back; and the greedy tokens do not depend on who took the blocks. */
enum { KV_P = 70, KV_N = 20 }; /* a prompt over two blocks of 64 positions */

static int kv_run(fwd *f, int slot, const int32_t *prompt, fwd_row *rows, int32_t *out,
                  status *st)
{
    for (int i = 0; i < KV_P; i++)
        rows[i] = (fwd_row){.token = prompt[i], .slot = slot, .pos = fwd_n_past(f, slot) + i,
                            .prompt = true, .sample = i == KV_P - 1};
    if (fwd_step(f, rows, KV_P, st)) return st->code;
    out[0] = rows[KV_P - 1].out.token;
    for (int k = 1; k < KV_N; k++) {
        rows[0] = (fwd_row){.token = out[k - 1], .slot = slot, .pos = fwd_n_past(f, slot),
                            .sample = true};
        if (fwd_step(f, rows, 1, st)) return st->code;
        out[k] = rows[0].out.token;
    }
    return STATUS_OK;
}

static void test_kv_pool(void)
{
    if (!g_have_gpu) return;
    char path[1024];
    ref_path(1, path, sizeof path);
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    fwd *f = NULL;
    fwd_row rows[KV_P];
    int32_t prompt[KV_P], out[2][KV_N];
    const sampling_params greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */
    if (qwen35_model_load(&m, path, &st)) goto fail;
    for (int i = 0; i < KV_P; i++) prompt[i] = (int32_t)((i * 7919 + 11) % m->cfg.V);
    if (fwd_create("cuda", m, &(fwd_opts){.n_slots = 2, .n_ctx = 256, .max_rows = 128,
                                          .kv_blocks = 3}, &f, &st))
        goto fail;
    kv_pool *kv = f->kv;
    CU_ASSERT_EQUAL(kv_pool_n_seqs(kv), f->n_slots);
    CU_ASSERT_EQUAL(kv_pool_block_tokens(kv), 64);
    CU_ASSERT_EQUAL(kv_pool_total_blocks(kv), 3);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 3);
    /* slot 0: the step takes its blocks */
    if (fwd_seq_start(f, 0, &greedy, &st) || kv_run(f, 0, prompt, rows, out[0], &st)) goto fail;
    CU_ASSERT_EQUAL(kv_pool_held(kv, 0), (int)kv_pool_blocks_for(kv, KV_P + KV_N - 1));
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 3 - kv_pool_blocks_for(kv, KV_P + KV_N - 1));
    /* slot 1: its prompt needs 2 blocks, 1 is free: refused, nothing run */
    if (fwd_seq_start(f, 1, &greedy, &st)) goto fail;
    for (int i = 0; i < KV_P; i++)
        rows[i] = (fwd_row){.token = prompt[i], .slot = 1, .pos = i, .prompt = true};
    const int rc = fwd_step(f, rows, KV_P, &st);
    printf("  kv pool: a step needing 2 blocks with 1 free: %s (%s)\n", status_code_name(rc),
           st.msg);
    CU_ASSERT_EQUAL(rc, STATUS_EXHAUSTED);
    CU_ASSERT_EQUAL(fwd_n_past(f, 1), 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 1);
    status_clear(&st);
    /* slot 0 ends; the caller takes slot 1's blocks before its steps, which then take none */
    fwd_seq_end(f, 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 3);
    if (kv_pool_ensure(kv, 1, KV_P + KV_N, &st)) goto fail;
    const uint32_t free1 = kv_pool_free_blocks(kv);
    if (kv_run(f, 1, prompt, rows, out[1], &st)) goto fail;
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), free1);
    CU_ASSERT_EQUAL(kv_pool_held(kv, 1), (int)kv_pool_blocks_for(kv, KV_P + KV_N));
    printf("  kv pool: %d greedy tokens with the blocks taken by the step and by the caller: %s\n",
           KV_N, memcmp(out[0], out[1], sizeof out[0]) ? "DIFFER" : "same");
    CU_ASSERT_EQUAL(memcmp(out[0], out[1], sizeof out[0]), 0);
    fwd_seq_end(f, 1);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 3);
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    fwd_destroy(f);
    qwen35_model_free(m);
}

/* Tensor parallel needs NCCL: without libnccl.so.2 the cuda forward refuses --tp 2 with
 * STATUS_UNSUPPORTED and one line naming the library, never STATUS_UNAVAILABLE (on which the
 * worker would serve on the CPU instead). Runs with or without a GPU; where NCCL loads there is
 * nothing to refuse. */
static void test_tp_needs_nccl(void)
{
    if (tp_comm_available()) {
        printf("  %s loads here: nothing to refuse\n", tp_comm_describe());
        return;
    }
    char path[1024];
    ref_path(0, path, sizeof path);
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    fwd *f = NULL;
    if (qwen35_model_load(&m, path, &st)) {
        printf("  %s\n", st.msg);
        CU_FAIL("model");
        return;
    }
    const int rc =
        fwd_create("cuda", m, &(fwd_opts){.n_slots = 1, .n_ctx = 64, .ranks = 2}, &f, &st);
    printf("  cuda --tp 2 without NCCL: %s: %s\n", status_code_name(rc), st.msg);
    CU_ASSERT_EQUAL(rc, STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_EQUAL(strncmp(st.msg, "--tp 2 needs NCCL (libnccl.so.2): ", 34), 0);
    CU_ASSERT_PTR_NULL(strchr(st.msg, '\n'));
    fwd_destroy(f);
    qwen35_model_free(m);
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("CUDA engine parity");
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("engine_parity", NULL, NULL);
    CU_add_test(s, "reference_logits", test_reference_logits);
    CU_add_test(s, "prefill_lengths", test_prefill_lengths);
    CU_add_test(s, "perturbed_fails", test_perturbed_fails);
    CU_add_test(s, "greedy_and_counters", test_greedy_and_counters);
    CU_add_test(s, "worker_backend", test_worker_backend);
    CU_add_test(s, "kv_pool", test_kv_pool);
    CU_add_test(s, "tp_needs_nccl", test_tp_needs_nccl);
    CU_add_test(s, "synthetic", test_synthetic);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
