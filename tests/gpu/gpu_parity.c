#include "tests/gpu/gpu_parity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cuda/cuda_device.h"

bool gpu_parity_check(const char *name, const float *got, const float *ref, int64_t n,
                      double atol, double rtol, double max_nmse, bool quiet,
                      gpu_parity_result *res)
{
    gpu_parity_result r = {0, -1, 0.0, 0.0};
    double num = 0.0, den = 0.0;
    int printed = 0;
    char lines[5][160];
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i], f = ref[i], e = fabs(g - f);
        num += (g - f) * (g - f);
        den += f * f;
        if (!(e <= atol + rtol * fabs(f)) || !isfinite(g)) { /* NaN-safe */
            if (r.first_bad < 0) r.first_bad = i;
            if (printed < 5)
                snprintf(lines[printed++], sizeof lines[0],
                         "    [%lld] got %.9g ref %.9g |err| %.3g > %.3g", (long long)i, g, f, e,
                         atol + rtol * fabs(f));
            r.n_bad++;
        }
        if (e > r.max_abs_err || isnan(e)) r.max_abs_err = e;
    }
    r.nmse = den > 0 ? num / den : num;
    const bool ok = r.n_bad == 0 && r.nmse <= max_nmse;
    if (!quiet || !ok) {
        printf("  %-40s %s  bad %lld/%lld  max|err| %.3g  nmse %.3g (<= %.1g)\n", name,
               ok ? "ok  " : "FAIL", (long long)r.n_bad, (long long)n, r.max_abs_err, r.nmse,
               max_nmse);
        for (int k = 0; k < printed; k++) printf("%s\n", lines[k]);
    }
    if (res) *res = r;
    return ok;
}

void gpu_rng_seed(gpu_rng *r, uint64_t seed)
{
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    r->s = (z ^ (z >> 31)) | 1;
}

uint64_t gpu_rng_u64(gpu_rng *r)
{
    uint64_t x = r->s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    r->s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float gpu_rng_uniform(gpu_rng *r) { return (float)(gpu_rng_u64(r) >> 40) / 16777216.0f; }

float gpu_rng_normal(gpu_rng *r)
{
    float u1 = gpu_rng_uniform(r), u2 = gpu_rng_uniform(r);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

float *gpu_rand_vec(gpu_rng *r, int64_t n, float scale)
{
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    DS_ASSERT(v);
    for (int64_t i = 0; i < n; i++) v[i] = scale * gpu_rng_normal(r);
    return v;
}

void gpu_rng_permutation(gpu_rng *r, int32_t *a, int n)
{
    for (int i = 0; i < n; i++) a[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(gpu_rng_u64(r) % (uint64_t)(i + 1));
        const int32_t t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

void gpu_runs_make(const int *len, int n_runs, int R, const int32_t *slot_of, int32_t *slot,
                   int32_t *run)
{
    for (int k = 0, i = 0; k < R; k++) {
        run[k] = k < n_runs ? i : 0;
        run[R + k] = k < n_runs ? len[k] : 0;
        for (int t = 0; k < n_runs && t < len[k]; t++) slot[i++] = slot_of[k];
    }
}

static void random_bytes(uint8_t *p, uint64_t n, gpu_rng *r)
{
    for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(gpu_rng_u64(r) >> 56);
}

static ggml_half random_scale(gpu_rng *r, float scale)
{
    return quant_f32_to_f16(scale * (0.25f + gpu_rng_uniform(r)));
}

uint64_t gpu_random_tensor(uint32_t type, int64_t n, float scale, gpu_rng *r, void *dst)
{
    const uint64_t bytes = quant_row_bytes(type, (uint64_t)n);
    DS_ASSERT(bytes > 0 || n == 0);
    uint8_t *p = dst;
    switch (type) {
    case GGML_TYPE_F32:
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = scale * gpu_rng_normal(r);
        break;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            ((ggml_half *)dst)[i] = quant_f32_to_f16(scale * gpu_rng_normal(r));
        break;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            ((ggml_bf16 *)dst)[i] = quant_f32_to_bf16(scale * gpu_rng_normal(r));
        break;
    case GGML_TYPE_Q8_0:
        random_bytes(p, bytes, r);
        for (int64_t b = 0; b < n / QK8_0; b++) {
            block_q8_0 *q = (block_q8_0 *)p + b;
            q->d = random_scale(r, scale / 64.0f);
        }
        break;
    case GGML_TYPE_Q4_K:
        random_bytes(p, bytes, r);
        for (int64_t b = 0; b < n / QK_K; b++) {
            block_q4_K *q = (block_q4_K *)p + b;
            q->d = random_scale(r, scale / 64.0f);
            q->dmin = random_scale(r, scale / 64.0f);
        }
        break;
    case GGML_TYPE_Q5_K:
        random_bytes(p, bytes, r);
        for (int64_t b = 0; b < n / QK_K; b++) {
            block_q5_K *q = (block_q5_K *)p + b;
            q->d = random_scale(r, scale / 128.0f);
            q->dmin = random_scale(r, scale / 128.0f);
        }
        break;
    case GGML_TYPE_Q6_K:
        random_bytes(p, bytes, r);
        for (int64_t b = 0; b < n / QK_K; b++) {
            block_q6_K *q = (block_q6_K *)p + b;
            q->d = random_scale(r, scale / 1024.0f);
        }
        break;
    default:
        DS_ASSERT(!"gpu_random_tensor: unsupported type");
    }
    return bytes;
}

bool gpu_test_have_gpu(const char *what)
{
    status st;
    status_clear(&st);
    if (cuda_device_available(&st)) return true;
    const char *req = getenv("DS_REQUIRE_GPU");
    if (req && strcmp(req, "1") == 0) { /* the GPU host: a missing GPU is a failure */
        printf("no GPU (%s) but DS_REQUIRE_GPU=1: %s FAILED\n", st.msg, what);
        fflush(stdout);
        exit(1);
    }
    printf("no GPU (%s): %s skipped\n", st.msg, what);
    return false;
}

void gpu_twin_q8_quantize(const float *x, int64_t n, int8_t *qs, float *d, float *s,
                          float *x_deq)
{
    DS_ASSERT(n % 32 == 0);
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        const float db = amax / 127.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            const int q = amax == 0.0f ? 0 : (int)roundf(x[32 * b + i] / db);
            qs[32 * b + i] = (int8_t)q;
            sum += q;
            if (x_deq) x_deq[32 * b + i] = db * (float)q;
        }
        d[b] = db;
        s[b] = db * (float)sum;
    }
}

bool gpu_check_q8_of(const char *what, const float *v, const int8_t *gq, int64_t n)
{
    int8_t *qs = malloc(n);
    float *qd = malloc(n / 32 * sizeof(float)), *qsum = malloc(n / 32 * sizeof(float));
    DS_ASSERT(qs && qd && qsum);
    gpu_twin_q8_quantize(v, n, qs, qd, qsum, NULL);
    const float *gds = (const float *)(gq + n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += gq[i] != qs[i];
    for (int64_t b = 0; b < n / 32; b++)
        bad += gds[2 * b] != qd[b] || fabsf(gds[2 * b + 1] - qsum[b]) > 1e-5f * (1 + fabsf(qsum[b]));
    if (bad) printf("  %s: Q8 of the output: %lld mismatches\n", what, (long long)bad);
    free(qs), free(qd), free(qsum);
    return bad == 0;
}
