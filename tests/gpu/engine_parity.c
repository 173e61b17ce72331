/* The CUDA engine (worker/cuda_backend.h) against the CPU forward pass (model/forward.h), the
 * specification: teacher-forced logits token by token on the shared reference models (F32
 * weights), greedy generation, and the per-token counters (after warm-up: no host allocation,
 * no device allocation, <= 8 device-to-host bytes per greedy token).
 * Optional: DS_ENGINE_GGUF=path[:path...] adds synthetic models (e.g. 0.8B Q4_K_M), compared
 * over DS_ENGINE_TOKENS tokens (default 64) with the bound reported, not asserted tightly. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cuda/cuda_device.h"
#include "model/forward.h"
#include "model/qwen35.h"
#include "tests/gpu/gpu_parity.h"
#include "worker/backend.h"
#include "worker/cuda_backend.h"

/* Counting allocator: while g_counting is set, every malloc/calloc/realloc of the process
 * (g_allocs) and of the thread that set t_mine, the one running the token path (g_mine). The
 * assertion is on the latter (the rule is about the token path; other threads, the CUDA
 * driver's, are not ours); both are printed. H200 run 23 counted one process-wide allocation
 * in one of two runs of the same binary, without saying which thread made it. */
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

static void ref_path(const char *name, char *out, size_t n)
{
    const char *dir = getenv("DS_REFERENCE_DIR");
    const char *root = getenv("DS_REPO_ROOT");
    if (dir && *dir)
        snprintf(out, n, "%s/%s", dir, name);
    else
        snprintf(out, n, "%s/../shared/reference/%s", root ? root : ".", name);
}

typedef struct cmp_result {
    double worst_rel; /* max over steps of max|Δ| / max|logit_cpu| */
    int argmax_checked, argmax_equal;
} cmp_result;

/* Feeds the same T ids to the CPU and the GPU, comparing the logits after each. */
static int compare_model(const char *path, int T, double bound, cmp_result *res)
{
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    qwen35_ctx *ctx = NULL;
    qwen35_state *s = NULL;
    cuda_backend *g = NULL;
    float *lc = NULL, *lg = NULL;
    memset(res, 0, sizeof *res);
    if (qwen35_model_load(&m, path, &st) || qwen35_ctx_create(m, NULL, &ctx, &st) ||
        qwen35_state_create(m, T + 1, &s, &st) ||
        cuda_backend_create(m, &(cuda_backend_opts){.n_ctx = T + 1, .verbose = true}, &g, &st))
        goto fail;
    /* the CPU side dots in F32 (the specification), not with its own Q8_K activation rounding:
     * otherwise two different roundings, each amplified by random weights, are compared
     * (H200 run 7: 0.44 / 0.60 of max|logit| on the synthetic 0.8B / 4B with the CPU's Q8_K,
     * against 0.24 / 0.29 with F32 in run 3) */
    qwen35_ctx_set_dot_mode(ctx, QWEN35_DOT_EXACT);
    const int V = m->cfg.V;
    lc = malloc((size_t)V * 4), lg = malloc((size_t)V * 4);
    gpu_rng rng;
    gpu_rng_seed(&rng, 99);
    int32_t tok = 1;
    for (int t = 0; t < T; t++) {
        if (qwen35_decode_batch(ctx, &s, &tok, 1, lc, &st)) goto fail;
        int32_t next;
        if (cuda_backend_decode(g, 0, tok, lg, &next, &st)) goto fail;
        double maxabs = 0, maxd = 0;
        int a1 = 0, a2 = -1;
        for (int i = 0; i < V; i++) {
            if (!isfinite(lg[i])) {
                maxd = INFINITY; /* a NaN or Inf logit fails any bound */
                continue;
            }
            maxabs = fmax(maxabs, fabs(lc[i]));
            maxd = fmax(maxd, fabs((double)lc[i] - lg[i]));
            if (lc[i] > lc[a1]) a2 = a1, a1 = i;
            else if (a2 < 0 || lc[i] > lc[a2]) a2 = i;
        }
        const double rel = maxd / (maxabs > 0 ? maxabs : 1);
        if (rel > res->worst_rel) res->worst_rel = rel;
        if (lc[a1] - lc[a2] > 2 * maxd) { /* argmax compared only where the margin is clear */
            res->argmax_checked++;
            res->argmax_equal += next == a1;
        }
        if (rel > bound)
            printf("  %s token %d: max|dlogit| %.3g = %.3g of max|logit| (bound %.1g)\n", path,
                   t, maxd, rel, bound);
        /* next input: the CPU's argmax half the time, a random id otherwise */
        tok = (gpu_rng_u64(&rng) & 1) ? a1 : (int32_t)(gpu_rng_u64(&rng) % (uint64_t)V);
    }
    printf("  %s: %d tokens, worst max|dlogit|/max|logit| %.3g, argmax equal %d/%d (clear margin)\n",
           path, T, res->worst_rel, res->argmax_equal, res->argmax_checked);
fail:
    if (st.code) printf("  %s: %s\n", path, st.msg);
    free(lc), free(lg);
    cuda_backend_destroy(g);
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    qwen35_model_free(m);
    return st.code;
}

static void test_reference_logits(void)
{
    if (!g_have_gpu) return;
    static const char *names[] = {"tiny-r2-tied.gguf", "tiny-r1-untied.gguf"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        ref_path(names[i], path, sizeof path);
        cmp_result r;
        CU_ASSERT_EQUAL(compare_model(path, 48, 1e-3, &r), STATUS_OK);
        CU_ASSERT(r.worst_rel <= 1e-3);
        CU_ASSERT_EQUAL(r.argmax_equal, r.argmax_checked);
    }
}

/* Greedy on the GPU equals greedy on the CPU; and the per-token counters. */
static void test_greedy_and_counters(void)
{
    if (!g_have_gpu) return;
    char path[1024];
    ref_path("tiny-r2-tied.gguf", path, sizeof path);
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    qwen35_ctx *ctx = NULL;
    qwen35_state *s = NULL;
    cuda_backend *g = NULL;
    enum { P = 6, N = 40 };
    const int32_t prompt[P] = {11, 300, 42, 7, 999, 5};
    int32_t cpu_out[N], gpu_out[N];
    float *lc = NULL;
    if (qwen35_model_load(&m, path, &st) || qwen35_ctx_create(m, NULL, &ctx, &st) ||
        qwen35_state_create(m, 128, &s, &st) ||
        cuda_backend_create(m, &(cuda_backend_opts){.n_ctx = 128}, &g, &st))
        goto fail;
    lc = malloc((size_t)m->cfg.V * 4);
    /* CPU greedy */
    if (qwen35_prefill(ctx, s, prompt, P, lc, false, &st)) goto fail;
    for (int i = 0; i < N; i++) {
        int a = 0;
        for (int v = 1; v < m->cfg.V; v++)
            if (lc[v] > lc[a]) a = v;
        cpu_out[i] = a;
        if (i + 1 < N && qwen35_decode_batch(ctx, &s, &cpu_out[i], 1, lc, &st)) goto fail;
    }
    /* GPU: prompt token by token, then greedy with the argmax on the GPU */
    for (int i = 0; i < P - 1; i++)
        if (cuda_backend_decode(g, 0, prompt[i], NULL, NULL, &st)) goto fail;
    if (cuda_backend_generate(g, 0, prompt[P - 1], 8, gpu_out, &st)) goto fail; /* warm-up */
    cuda_backend_stats s0, s1;
    cuda_backend_get_stats(g, &s0);
    const uint64_t dev0 = cuda_alloc_count();
    atomic_store(&g_allocs, 0);
    atomic_store(&g_mine, 0);
    t_mine = 1;
    atomic_store(&g_counting, 1);
    const int rc = cuda_backend_generate(g, 0, gpu_out[7], N - 8, gpu_out + 8, &st);
    atomic_store(&g_counting, 0);
    t_mine = 0;
    if (rc) goto fail;
    cuda_backend_get_stats(g, &s1);
    const long host_allocs = atomic_load(&g_mine), other_allocs = atomic_load(&g_allocs) - host_allocs;
    const uint64_t dev_allocs = cuda_alloc_count() - dev0;
    const double d2h = (double)(s1.d2h_bytes - s0.d2h_bytes) / (double)(s1.tokens - s0.tokens);
    printf("  greedy %d tokens: after warm-up %ld host allocations (%ld on other threads), "
           "%llu device allocations, %.1f D2H bytes/token, %llu kernels/token\n", N - 8,
           host_allocs, other_allocs, (unsigned long long)dev_allocs, d2h,
           (unsigned long long)s1.kernels_per_token);
    CU_ASSERT_EQUAL(host_allocs, 0);
    CU_ASSERT_EQUAL(dev_allocs, 0);
    CU_ASSERT(d2h <= 8.0);
    int same = 0;
    while (same < N && cpu_out[same] == gpu_out[same]) same++;
    printf("  greedy: CPU and GPU agree on the first %d of %d tokens\n", same, N);
    CU_ASSERT_EQUAL(same, N);
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    free(lc);
    cuda_backend_destroy(g);
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    qwen35_model_free(m);
}

/* Synthetic models from DS_ENGINE_GGUF: logits reported; a loose bound asserted. The GPU dots
 * quantised weights with Q8 activations per 32 values; the CPU decode (since 71f7340) with Q8_K
 * per 256 (Q8_0 per 32 for Q8_0 weights), before that with F32; a random-weight network
 * amplifies either rounding (compare_model runs the CPU in QWEN35_DOT_EXACT, F32 activations):
 * the CPU forward itself, given Q8-rounded activations, moves the 0.8B's
 * logits by 0.14 of max|logit| at the first token and 0.24 by the third (docs/GPU.md), which
 * is what the GPU shows. The bound (0.5) still catches garbage (wrong wiring gave 1.7-26) and
 * any NaN. */
static void test_synthetic(void)
{
    const char *list = getenv("DS_ENGINE_GGUF");
    if (!g_have_gpu || !list || !*list) return;
    const int T = getenv("DS_ENGINE_TOKENS") ? atoi(getenv("DS_ENGINE_TOKENS")) : 64;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *p = strtok_r(buf, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
        cmp_result r;
        CU_ASSERT_EQUAL(compare_model(p, T, 0.5, &r), STATUS_OK);
        CU_ASSERT(r.worst_rel <= 0.5);
    }
}

/* The worker backend interface on the GPU, chosen by worker_backend_create("cuda"): two slots, prompts then greedy decode steps with both
 * sequences in one step, equal to the CPU backend's tokens (worker/backend.h). */
static int run_worker_with(worker_backend *b, const worker_sampling *sp, int32_t out[2][12], status *st)
{
    static const int32_t p0[] = {3, 17, 200, 5}, p1[] = {500, 2, 44}; /* ids < 773, the smallest reference vocabulary */
    for (int s = 0; s < 2; s++)
        if (b->vt->seq_start(b, s, sp, st)) return st->code;
    worker_batch_item it[2] = {{.slot = 0, .tokens = p0, .n_tokens = 4, .prompt = true, .sample = true},
                               {.slot = 1, .tokens = p1, .n_tokens = 3, .prompt = true, .sample = true}};
    if (b->vt->step(b, it, 2, st)) return st->code;
    for (int k = 0; k < 12; k++) {
        out[0][k] = it[0].token, out[1][k] = it[1].token;
        for (int s = 0; s < 2; s++) {
            it[s].tokens = &out[s][k];
            it[s].n_tokens = 1;
            it[s].prompt = false;
        }
        if (k + 1 < 12 && b->vt->step(b, it, 2, st)) return st->code;
    }
    return STATUS_OK;
}

static int run_worker(worker_backend *b, int32_t out[2][12], status *st)
{
    const worker_sampling greedy = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    return run_worker_with(b, &greedy, out, st);
}

/* Sampling that must give the greedy tokens but goes through the sampler (on the GPU: the step
 * enqueued without a sync and the sampler's readback the token's one sync): top_k 1 at a
 * temperature, and temperature 0 with logprobs. A sampler reading the logits before the step
 * wrote them, or a step left unfinished, shows as other tokens. */
static int run_worker_sampled(worker_backend *b, int32_t out[2][2][12], status *st)
{
    const worker_sampling topk1 = {.temperature = 0.7f, .top_k = 1, .top_p = 1, .repetition_penalty = 1,
                                   .seed = 11};
    const worker_sampling lp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1, .n_logprobs = 2};
    if (run_worker_with(b, &topk1, out[0], st)) return st->code;
    return run_worker_with(b, &lp, out[1], st);
}

static void test_worker_backend(void)
{
    if (!g_have_gpu) return;
    char path[1024];
    ref_path("tiny-r1-untied.gguf", path, sizeof path);
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    worker_backend *cpu = NULL, *gpu = NULL;
    int32_t a[2][12], g[2][12], as[2][2][12], gs[2][2][12];
    const worker_backend_opts o = {.n_slots = 2, .n_ctx = 64, .max_prefill_tokens = 16};
    if (qwen35_model_load(&m, path, &st) || worker_backend_cpu_create(m, &o, &cpu, &st) ||
        worker_backend_create("cuda", m, &o, &gpu, &st))
        goto fail;
    /* the dispatch the worker binary uses must pick the GPU here (//worker:cuda_worker linked) */
    CU_ASSERT(worker_backend_have_cuda());
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

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("CUDA engine parity");
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("engine_parity", NULL, NULL);
    CU_add_test(s, "reference_logits", test_reference_logits);
    CU_add_test(s, "greedy_and_counters", test_greedy_and_counters);
    CU_add_test(s, "worker_backend", test_worker_backend);
    CU_add_test(s, "synthetic", test_synthetic);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
