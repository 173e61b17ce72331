/* The decode kernels other than the GEMV against their CPU twins (kernels/cpu ref_*), over the
 * shapes of the reference models and of 0.8B/4B/27B: RMSNorm (+ Q8 output), the DeltaNet conv
 * (standalone and fused into the qkv GEMV), the delta rule + gated norm over several tokens
 * (outputs, S and conv state; S stored as F32 and as bf16), attention (norms, RoPE, KV append,
 * split softmax crossing the chunk boundary, sigmoid gate; F16 and F32 caches), attn_prep alone
 * against ref_attn_prep, and the embedding step. Cases that perturb an output assert the check
 * fails. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cpu/act.h"
#include "kernels/cpu/attn.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/norm.h"
#include "tests/gpu/gpu_dev.h"
#include "tests/gpu/gpu_parity.h"

static bool g_have_gpu;
static gpu_rng g_rng;
static cuda_device_props g_props; /* for gemv_matrix_plan */

/* device buffer helpers (dev, dev_from: gpu_dev.h): every failure is a test failure with the message printed */
static void to_dev(void *d, const void *h, size_t bytes)
{
    status st;
    CU_ASSERT_EQUAL(cuda_upload(d, h, bytes, &st), STATUS_OK);
}
static void to_host(void *h, const void *d, size_t bytes)
{
    status st;
    CU_ASSERT_EQUAL_FATAL(cuda_sync(NULL, "kernels", &st), STATUS_OK);
    CU_ASSERT_EQUAL(cuda_download(h, d, bytes, &st), STATUS_OK);
}
/* ---- RMSNorm ---- */
static void test_norm(void)
{
    if (!g_have_gpu) return;
    static const int ns[] = {32, 256, 1024, 2560, 5120, 4096 + 32};
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        const int n = ns[c];
        float *x = gpu_rand_vec(&g_rng, n, 3.0f), *w = gpu_rand_vec(&g_rng, n, 1.0f), *ref = malloc(n * 4),
              *got = malloc(n * 4);
        int8_t *q = malloc(gemv_xq_bytes(n));
        ref_rmsnorm(x, w, n, 1e-6f, ref);
        float *d_x = dev_from(x, n * 4), *d_w = dev_from(w, n * 4), *d_y = dev(n * 4);
        void *d_q = dev(gemv_xq_bytes(n));
        norm_rms(d_x, d_w, n, 1e-6f, d_y, d_q, NULL);
        to_host(got, d_y, n * 4);
        to_host(q, d_q, gemv_xq_bytes(n));
        char name[64];
        snprintf(name, sizeof name, "norm_rms n=%d", n);
        CU_ASSERT_TRUE(gpu_parity_check(name, got, ref, n, 1e-5, 1e-5, 1e-10, false, NULL));
        /* the Q8 form decodes to the F32 output within half a step */
        const float *ds = (const float *)(q + n);
        int64_t bad = 0;
        for (int i = 0; i < n; i++)
            bad += fabsf(ds[2 * (i / 32)] * q[i] - got[i]) > 0.5f * ds[2 * (i / 32)] * 1.001f + 1e-7f;
        CU_ASSERT_EQUAL(bad, 0);
        cuda_free(d_x), cuda_free(d_w), cuda_free(d_y), cuda_free(d_q);
        free(x), free(w), free(ref), free(got), free(q);
    }
}

/* ---- DeltaNet ---- */
typedef struct gdn_shape {
    int n_k, n_v, d_k, d_v;
} gdn_shape;

/* bf16: S stored as bf16 on the device and rounded where it is stored by the twin (gdn.h "State
 * storage"); its state bound is then two bf16 steps (elements the sides round apart, 5 rows) */
static bool gdn_case(gdn_shape sh, int n_tokens, bool bf16, bool perturb)
{
    const int K = 4, C = 2 * sh.n_k * sh.d_k + sh.n_v * sh.d_v, D_v = sh.n_v * sh.d_v;
    const int64_t nS = (int64_t)sh.n_v * sh.d_v * sh.d_k;
    float *conv_w = gpu_rand_vec(&g_rng, (int64_t)C * K, 0.5f), *dt = gpu_rand_vec(&g_rng, sh.n_v, 1.0f);
    float *ssm_a = gpu_rand_vec(&g_rng, sh.n_v, 1.0f), *norm_w = gpu_rand_vec(&g_rng, sh.d_v, 1.0f);
    for (int h = 0; h < sh.n_v; h++) ssm_a[h] = -expf(0.5f * ssm_a[h]); /* -exp(A_log) */
    float *cs = calloc((size_t)C * (K - 1), 4), *S = gpu_rand_vec(&g_rng, nS, 0.05f);
    float *y = malloc(D_v * 4), *got = malloc(D_v * 4), *scratch =
        malloc(ref_gdn_decode_scratch_floats(C, sh.n_v) * 4);
    float *d_cw = dev_from(conv_w, (size_t)C * K * 4), *d_dt = dev_from(dt, sh.n_v * 4);
    float *d_sa = dev_from(ssm_a, sh.n_v * 4), *d_nw = dev_from(norm_w, sh.d_v * 4);
    float *d_cs = dev_from(cs, (size_t)C * (K - 1) * 4);
    void *d_S = gpu_state_dev(S, nS, bf16);
    float *d_mixed = dev(C * 4), *d_conv = dev(C * 4), *d_z = dev(D_v * 4);
    float *d_b = dev(sh.n_v * 4), *d_a = dev(sh.n_v * 4), *d_o = dev(D_v * 4), *d_y = dev(D_v * 4);
    void *d_yq = dev(gemv_xq_bytes(D_v));
    bool ok = true;
    char name[96];
    for (int t = 0; t < n_tokens; t++) {
        float *mixed = gpu_rand_vec(&g_rng, C, 1.0f), *z = gpu_rand_vec(&g_rng, D_v, 1.0f), *b = gpu_rand_vec(&g_rng, sh.n_v, 1.0f),
              *a = gpu_rand_vec(&g_rng, sh.n_v, 1.0f);
        status st;
        cuda_upload(d_mixed, mixed, C * 4, &st), cuda_upload(d_z, z, D_v * 4, &st);
        cuda_upload(d_b, b, sh.n_v * 4, &st), cuda_upload(d_a, a, sh.n_v * 4, &st);
        gdn_conv(d_mixed, d_cw, d_cs, C, K, d_conv, NULL);
        gdn_decode(d_conv, d_b, d_a, d_dt, d_sa, sh.n_k, sh.n_v, sh.d_k, sh.d_v, 1e-6f, d_S, bf16,
                   d_o, NULL);
        gdn_norm_gated(d_o, d_z, d_nw, sh.n_v, sh.d_v, 1e-6f, d_y, d_yq, NULL);
        ref_gdn_decode(mixed, z, b, a, conv_w, dt, ssm_a, norm_w, sh.n_k, sh.n_v, sh.d_k, sh.d_v,
                       K, 1e-6f, cs, S, bf16, y, scratch);
        to_host(got, d_y, D_v * 4);
        if (perturb) got[D_v / 3] += 0.01f;
        snprintf(name, sizeof name, "gdn n_k %d n_v %d d_k %d d_v %d%s token %d%s", sh.n_k,
                 sh.n_v, sh.d_k, sh.d_v, bf16 ? " bf16 state" : "", t,
                 perturb ? " (perturbed)" : "");
        /* bf16: an S element the two sides round apart (a 2^-8 step) moves the output too */
        ok &= gpu_parity_check(name, got, y, D_v, bf16 ? 1e-3 : 2e-4, bf16 ? 1e-2 : 2e-4, 1e-8,
                               !perturb, NULL);
        free(mixed), free(z), free(b), free(a);
    }
    float *gS = gpu_state_host(d_S, nS, bf16), *gcs = malloc((size_t)C * (K - 1) * 4);
    to_host(gcs, d_cs, (size_t)C * (K - 1) * 4);
    snprintf(name, sizeof name, "  state S after %d tokens", n_tokens);
    if (bf16) ok &= gpu_parity_check(name, gS, S, nS, 2e-4, 2e-2, 1e-7, true, NULL);
    else ok &= gpu_parity_check(name, gS, S, nS, 1e-5, 1e-4, 1e-9, true, NULL);
    ok &= gpu_parity_check("  conv state", gcs, cs, (int64_t)C * (K - 1), 0, 0, 0, true, NULL);
    cuda_free(d_cw), cuda_free(d_dt), cuda_free(d_sa), cuda_free(d_nw), cuda_free(d_cs);
    cuda_free(d_S), cuda_free(d_mixed), cuda_free(d_conv), cuda_free(d_z), cuda_free(d_b);
    cuda_free(d_a), cuda_free(d_o), cuda_free(d_y), cuda_free(d_yq);
    free(conv_w), free(dt), free(ssm_a), free(norm_w), free(cs), free(S), free(y), free(got);
    free(scratch), free(gS), free(gcs);
    return ok;
}

static void test_gdn(void)
{
    if (!g_have_gpu) return;
    static const gdn_shape shapes[] = {{2, 4, 64, 64}, {4, 4, 32, 32}, {16, 16, 128, 128},
                                       {16, 32, 128, 128}, {16, 48, 128, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        CU_ASSERT_TRUE(gdn_case(shapes[i], 5, false, false));
        CU_ASSERT_TRUE(gdn_case(shapes[i], 5, true, false));
    }
}

/* qkv GEMV with the conv fused: rows < n_conv conv'd, the rest plain */
static void test_gemv_conv(void)
{
    if (!g_have_gpu) return;
    const int n_in = 512, n_conv = 96, n_out = 130, K = 4;
    const uint64_t raw = quant_row_bytes(GGML_TYPE_Q4_K, (uint64_t)n_in * n_out);
    void *host = malloc(raw);
    gpu_random_tensor(GGML_TYPE_Q4_K, (int64_t)n_in * n_out, 0.1f, &g_rng, host);
    float *x = gpu_rand_vec(&g_rng, n_in, 1.0f), *xd = malloc(n_in * 4), *cw = gpu_rand_vec(&g_rng, n_conv * K, 0.5f);
    float *cs = gpu_rand_vec(&g_rng, n_conv * (K - 1), 1.0f), *mixed = malloc(n_out * 4), *ref = malloc(n_out * 4);
    float *got = malloc(n_out * 4), *gcs = malloc(n_conv * (K - 1) * 4);
    int8_t *qs = malloc(n_in);
    float *qd = malloc(n_in / 32 * 4), *qsum = malloc(n_in / 32 * 4);
    gpu_twin_q8_quantize(x, n_in, qs, qd, qsum, xd);
    void *d_raw = dev_from(host, raw), *d_w = dev(gemv_packed_bytes(GGML_TYPE_Q4_K, n_in, n_out));
    gemv_pack(GGML_TYPE_Q4_K, d_raw, d_w, n_in, n_out, NULL);
    float *d_x = dev_from(x, n_in * 4), *d_cw = dev_from(cw, n_conv * K * 4);
    float *d_cs = dev_from(cs, n_conv * (K - 1) * 4), *d_y = dev(n_out * 4);
    void *d_xq = dev(gemv_xq_bytes(n_in));
    gemv_quantize_x(d_x, d_xq, n_in, NULL);
    quant_matvec(GGML_TYPE_Q4_K, host, quant_row_bytes(GGML_TYPE_Q4_K, n_in), n_in, xd, mixed, 0, n_out);
    float *cs0 = malloc(n_conv * (K - 1) * 4);
    memcpy(cs0, cs, n_conv * (K - 1) * 4);
    ref_gdn_conv(mixed, n_conv, 1, n_conv, K, cw, cs, ref);
    memcpy(ref + n_conv, mixed + n_conv, (n_out - n_conv) * 4);
    /* the warp kernel also with 2 and 4 rows a warp (forced: the table gives Q4_K one) */
    static const int kern[] = {GEMV_KERNEL_AUTO, GEMV_KERNEL_WARP, GEMV_KERNEL_WARP,
                               GEMV_KERNEL_WARP, GEMV_KERNEL_FLAT};
    static const int rows[] = {0, 0, 2, 4, 0};
    static const char *kname[] = {"planned", "warp", "warp r2", "warp r4", "flat"};
    for (int k = 0; k < 5; k++) {
        char name[96];
        snprintf(name, sizeof name, "gemv_conv q4_K 130x512 (96 conv rows) %s", kname[k]);
        gemv_matrix m = {.type = GGML_TYPE_Q4_K, .n_in = n_in, .n_out = n_out, .d_w = d_w,
                         .kernel = kern[k], .rows_per_warp = rows[k]};
        status pst;
        CU_ASSERT_EQUAL_FATAL(gemv_matrix_plan(&m, &g_props, &pst), STATUS_OK);
        to_dev(d_cs, cs0, n_conv * (K - 1) * 4);
        gemv_conv(&m, d_x, d_xq, d_y, d_cw, d_cs, n_conv, K, NULL);
        to_host(got, d_y, n_out * 4);
        to_host(gcs, d_cs, n_conv * (K - 1) * 4);
        CU_ASSERT_TRUE(gpu_parity_check(name, got, ref, n_out, 2e-4, 2e-4, 1e-8, false, NULL));
        CU_ASSERT_TRUE(gpu_parity_check("  conv state", gcs, cs, n_conv * (K - 1), 1e-4, 1e-4, 1e-8, true, NULL));
    }
    free(cs0);
    cuda_free(d_raw), cuda_free(d_w), cuda_free(d_x), cuda_free(d_cw), cuda_free(d_cs);
    cuda_free(d_y), cuda_free(d_xq);
    free(host), free(x), free(xd), free(cw), free(cs), free(mixed), free(ref), free(got);
    free(gcs), free(qs), free(qd), free(qsum);
}

/* ---- attention ---- */
typedef struct attn_shape {
    int n_h, n_kv, d_h, n_rot;
} attn_shape;

/* What a cache of type t holds for v; its bytes per element; its name. */
static float kv_round(float v, attn_kv_type t)
{
    return t == ATTN_KV_F32 ? v : quant_f16_to_f32(quant_f32_to_f16(v));
}
static size_t kv_elem(attn_kv_type t) { return t == ATTN_KV_F32 ? 4 : 2; }
static const char *kv_name(attn_kv_type t) { return t == ATTN_KV_F32 ? "F32" : "F16"; }

/* Bounds: the reference holds the cache values the GPU's would hold if both computed K alike;
 * where the two K floats (norm sums, powf in RoPE) round to different halves an F16 element is
 * one F16 step (2^-10 relative) off, which F32 does not have: its bounds are half of F16's.
 * What remains is mostly RoPE's powf (<= 4 ulp) at high positions: a host emulation of these
 * cases with every inv_freq off by up to 4 ulp reached 0.25 of the F32 NMSE bound (4000
 * positions) and 0.08 of the element bounds over 3 seeds. */
static bool attn_case(attn_shape sh, int P, int n_ctx, attn_kv_type kv)
{
    const int HA = sh.n_h * sh.d_h, KVA = sh.n_kv * sh.d_h;
    const float base = 1e7f, eps = 1e-6f;
    float *qw = gpu_rand_vec(&g_rng, sh.d_h, 1.0f), *kw = gpu_rand_vec(&g_rng, sh.d_h, 1.0f);
    float *kc = malloc((size_t)P * KVA * 4), *vc = malloc((size_t)P * KVA * 4);
    float *q = malloc(HA * 4), *o = malloc(HA * 4), *got = malloc(HA * 4), *scores =
        malloc(REF_ATTN_BLOCK * 4), *qg = NULL;
    float *d_qw = dev_from(qw, sh.d_h * 4), *d_kw = dev_from(kw, sh.d_h * 4);
    float *d_qg = dev(2 * HA * 4), *d_k = dev(KVA * 4), *d_v = dev(KVA * 4), *d_q = dev(HA * 4);
    void *d_kc = dev((size_t)n_ctx * KVA * kv_elem(kv)), *d_vc = dev((size_t)n_ctx * KVA * kv_elem(kv));
    float *d_part = dev(attn_partial_floats(sh.n_h, sh.d_h, n_ctx) * 4), *d_o = dev(HA * 4);
    void *d_oq = dev(gemv_xq_bytes(HA));
    int32_t *d_pos = dev(4);
    status st;
    for (int t = 0; t < P; t++) {
        free(qg);
        qg = gpu_rand_vec(&g_rng, 2 * HA, 1.0f);
        float *k = gpu_rand_vec(&g_rng, KVA, 1.0f), *v = gpu_rand_vec(&g_rng, KVA, 1.0f);
        cuda_upload(d_qg, qg, 2 * HA * 4, &st), cuda_upload(d_k, k, KVA * 4, &st);
        cuda_upload(d_v, v, KVA * 4, &st), cuda_upload(d_pos, &t, 4, &st);
        attn_prep(d_qg, d_k, d_v, d_qw, d_kw, sh.n_h, sh.n_kv, sh.d_h, sh.n_rot, base, eps, d_pos,
                  NULL, d_kc, d_vc, d_q, kv, NULL);
        /* CPU: the same per-token steps; the cache holds the values of the GPU's type */
        ref_rmsnorm_heads(k, kw, sh.n_kv, sh.d_h, eps);
        ref_rope(k, sh.n_kv, sh.d_h, sh.n_rot, t, base);
        for (int i = 0; i < KVA; i++) {
            kc[(size_t)t * KVA + i] = kv_round(k[i], kv);
            vc[(size_t)t * KVA + i] = kv_round(v[i], kv);
        }
        free(k), free(v);
    }
    attn_decode(d_q, d_qg, NULL, d_kc, d_vc, sh.n_h, sh.n_kv, sh.d_h, n_ctx, d_pos, d_part, d_o,
                d_oq, kv, NULL);
    to_host(got, d_o, HA * 4);
    int8_t *gq = malloc(gemv_xq_bytes(HA));
    to_host(gq, d_oq, gemv_xq_bytes(HA));
    for (int h = 0; h < sh.n_h; h++) memcpy(q + h * sh.d_h, qg + h * 2 * sh.d_h, sh.d_h * 4);
    ref_rmsnorm_heads(q, qw, sh.n_h, sh.d_h, eps);
    ref_rope(q, sh.n_h, sh.d_h, sh.n_rot, P - 1, base);
    ref_attn_decode(q, kc, vc, P, sh.n_h, sh.n_kv, sh.d_h, 1.0f / sqrtf((float)sh.d_h), scores, o);
    for (int h = 0; h < sh.n_h; h++) ref_sigmoid_gate(o + h * sh.d_h, qg + h * 2 * sh.d_h + sh.d_h, sh.d_h);
    char name[128];
    snprintf(name, sizeof name, "attn n_h %d n_kv %d d_h %d, %d positions, %s cache", sh.n_h,
             sh.n_kv, sh.d_h, P, kv_name(kv));
    const double f = kv == ATTN_KV_F32 ? 0.5 : 1.0;
    bool ok = gpu_parity_check(name, got, o, HA, f * 1e-4, f * 1e-3, f * 1e-8, false, NULL);
    ok &= gpu_check_q8_of(name, got, gq, HA); /* the Q8 the out-projection reads */
    free(gq);
    cuda_free(d_qw), cuda_free(d_kw), cuda_free(d_qg), cuda_free(d_k), cuda_free(d_v);
    cuda_free(d_q), cuda_free(d_kc), cuda_free(d_vc), cuda_free(d_part), cuda_free(d_o);
    cuda_free(d_oq), cuda_free(d_pos);
    free(qw), free(kw), free(kc), free(vc), free(q), free(o), free(got), free(scores), free(qg);
    return ok;
}

static void test_attn(void)
{
    if (!g_have_gpu) return;
    static const attn_shape shapes[] = {{4, 2, 64, 16},   {2, 1, 64, 16},  {8, 2, 256, 64},
                                        {24, 4, 256, 64}, {16, 4, 128, 64}, {8, 1, 256, 64},
                                        {3, 3, 32, 16}};
    static const int Ps[] = {1, 5, 257, 300};
    for (int t = 0; t < 2; t++) {
        const attn_kv_type kv = t ? ATTN_KV_F32 : ATTN_KV_F16;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (size_t p = 0; p < sizeof Ps / sizeof Ps[0]; p++)
                CU_ASSERT_TRUE(attn_case(shapes[i], Ps[p], 600, kv));
        CU_ASSERT_TRUE(attn_case(shapes[3], 1030, 1100, kv)); /* 5 chunks */
        CU_ASSERT_TRUE(attn_case(shapes[2], 4000, 4096, kv)); /* the 0.8B at 4K: 125 of 128 */
        /* super-chunks of 96 positions (40,000: 1,250 chunks, 3 a super-chunk, 417 partials),
         * the last one partial */
        CU_ASSERT_TRUE(attn_case(shapes[0], 20000, 40000, kv));
    }
}

/* attn_prep alone against ref_attn_prep: q out, K and V rows of the caches, and every other
 * cache row left as it was (both caches start as SENTINEL bytes on both sides). Grid: n_h/n_kv
 * 1, 2, 3 (n_kv 1..3), d_h 32/64/256, n_rot 16 and d_h, positions 0, 1, 4095.
 * Bounds: the norm differs by float vs double sums (~1e-6 relative); RoPE by CUDA's powf
 * (<= 4 ulp, libm's < 1), so an angle pos·inv_freq differs by up to ~5e-7·pos rad, times
 * |(x_i, x_{i+half})| (up to ~5 here): atol grows with pos, as in ops_test's rope case. A host
 * emulation of the kernel with every powf off by up to 4 ulp stayed under 0.8 of these bounds
 * (and 0.1 of the NMSE ones) over 30 seeds. An F16 K adds one F16 step (2^-10 relative) where
 * the two floats round apart; an F32 K has q's bounds (the same norm and RoPE). V is stored
 * from the same floats by the same rule: exact in both. Both cache types run the grid. */
enum { PREP_SENTINEL = 0xA5 };

static bool prep_case(attn_shape sh, int pos, bool perturb, attn_kv_type kv)
{
    const int d = sh.d_h, HA = sh.n_h * d, KVA = sh.n_kv * d, n_ctx = pos + 2;
    const float base = 1e7f, eps = 1e-6f;
    const size_t row = (size_t)KVA * kv_elem(kv), cache_bytes = (size_t)n_ctx * row;
    const size_t at = pos * row;
    float *qg = gpu_rand_vec(&g_rng, 2 * HA, 2.0f), *k = gpu_rand_vec(&g_rng, KVA, 2.0f), *v = gpu_rand_vec(&g_rng, KVA, 2.0f);
    float *qw = gpu_rand_vec(&g_rng, d, 0.5f), *kw = gpu_rand_vec(&g_rng, d, 0.5f);
    for (int i = 0; i < d; i++) qw[i] += 1.0f, kw[i] += 1.0f; /* GGUF norms hold 1 + w */
    float *q_ref = malloc(HA * 4), *q_got = malloc(HA * 4);
    float *k_ref = malloc(KVA * 4), *k_got = malloc(KVA * 4);
    float *v_ref = malloc(KVA * 4), *v_got = malloc(KVA * 4);
    uint8_t *kc_ref = malloc(cache_bytes), *vc_ref = malloc(cache_bytes);
    uint8_t *kc_got = malloc(cache_bytes), *vc_got = malloc(cache_bytes);
    memset(kc_ref, PREP_SENTINEL, cache_bytes), memset(vc_ref, PREP_SENTINEL, cache_bytes);
    const int32_t p32 = pos;
    ref_attn_prep(qg, k, v, qw, kw, sh.n_h, sh.n_kv, d, sh.n_rot, base, eps, &p32, kc_ref, vc_ref,
                  q_ref, kv);

    float *d_qg = dev_from(qg, 2 * HA * 4), *d_k = dev_from(k, KVA * 4), *d_v = dev_from(v, KVA * 4);
    float *d_qw = dev_from(qw, d * 4), *d_kw = dev_from(kw, d * 4), *d_q = dev(HA * 4);
    int32_t *d_pos = dev_from(&p32, 4);
    void *d_kc = dev(cache_bytes), *d_vc = dev(cache_bytes);
    status st;
    CU_ASSERT_EQUAL(cuda_memset(d_kc, PREP_SENTINEL, cache_bytes, &st), STATUS_OK);
    CU_ASSERT_EQUAL(cuda_memset(d_vc, PREP_SENTINEL, cache_bytes, &st), STATUS_OK);
    attn_prep(d_qg, d_k, d_v, d_qw, d_kw, sh.n_h, sh.n_kv, d, sh.n_rot, base, eps, d_pos, NULL,
              d_kc, d_vc, d_q, kv, NULL);
    to_host(q_got, d_q, HA * 4);
    to_host(kc_got, d_kc, cache_bytes);
    to_host(vc_got, d_vc, cache_bytes);
    if (perturb) q_got[HA / 3] += 0.01f;

    if (kv == ATTN_KV_F32) {
        memcpy(k_ref, kc_ref + at, row), memcpy(k_got, kc_got + at, row);
        memcpy(v_ref, vc_ref + at, row), memcpy(v_got, vc_got + at, row);
    } else {
        for (int i = 0; i < KVA; i++) {
            k_ref[i] = quant_f16_to_f32(((const ggml_half *)(kc_ref + at))[i]);
            k_got[i] = quant_f16_to_f32(((const ggml_half *)(kc_got + at))[i]);
            v_ref[i] = quant_f16_to_f32(((const ggml_half *)(vc_ref + at))[i]);
            v_got[i] = quant_f16_to_f32(((const ggml_half *)(vc_got + at))[i]);
        }
    }
    const double atol = 2e-5 + 2e-6 * pos, nmse_pos = 1e-13 * (double)pos * pos;
    char name[128];
    snprintf(name, sizeof name, "attn_prep n_h %d n_kv %d d_h %d n_rot %d pos %d %s cache%s",
             sh.n_h, sh.n_kv, d, sh.n_rot, pos, kv_name(kv), perturb ? " (perturbed)" : "");
    bool ok = gpu_parity_check(name, q_got, q_ref, HA, atol, 1e-4, 1e-10 + nmse_pos, false, NULL);
    if (kv == ATTN_KV_F32)
        ok &= gpu_parity_check("  K row (F32)", k_got, k_ref, KVA, atol, 1e-4, 1e-10 + nmse_pos,
                               true, NULL);
    else
        ok &= gpu_parity_check("  K row (F16)", k_got, k_ref, KVA, 1.5 * atol, 1.1e-3,
                               1e-8 + 10 * nmse_pos, true, NULL);
    ok &= gpu_parity_check(kv == ATTN_KV_F32 ? "  V row (F32)" : "  V row (F16)", v_got, v_ref,
                           KVA, 0, 0, 0, true, NULL);
    /* every other row untouched: the sentinel on both sides */
    const bool rest = memcmp(kc_got, kc_ref, at) == 0 && memcmp(vc_got, vc_ref, at) == 0 &&
                      memcmp(kc_got + at + row, kc_ref + at + row, cache_bytes - at - row) == 0 &&
                      memcmp(vc_got + at + row, vc_ref + at + row, cache_bytes - at - row) == 0;
    if (!rest) printf("  %s: cache written outside row %d\n", name, pos);
    ok &= rest;
    cuda_free(d_qg), cuda_free(d_k), cuda_free(d_v), cuda_free(d_qw), cuda_free(d_kw);
    cuda_free(d_q), cuda_free(d_pos), cuda_free(d_kc), cuda_free(d_vc);
    free(qg), free(k), free(v), free(qw), free(kw), free(q_ref), free(q_got), free(k_ref);
    free(k_got), free(v_ref), free(v_got), free(kc_ref), free(vc_ref), free(kc_got), free(vc_got);
    return ok;
}

static void test_attn_prep(void)
{
    if (!g_have_gpu) return;
    static const int heads[][2] = {{1, 1}, {2, 1}, {3, 1}, {4, 2}, {6, 3}, {3, 3}};
    static const int dhs[] = {32, 64, 256}, positions[] = {0, 1, 4095};
    for (size_t a = 0; a < sizeof heads / sizeof heads[0]; a++)
        for (size_t b = 0; b < sizeof dhs / sizeof dhs[0]; b++)
            for (int rot = 0; rot < 2; rot++)
                for (size_t p = 0; p < sizeof positions / sizeof positions[0]; p++) {
                    const attn_shape sh = {heads[a][0], heads[a][1], dhs[b], rot ? dhs[b] : 16};
                    CU_ASSERT_TRUE(prep_case(sh, positions[p], false, ATTN_KV_F16));
                    CU_ASSERT_TRUE(prep_case(sh, positions[p], false, ATTN_KV_F32));
                }
}

/* ---- embedding step ---- */
static void test_embed_step(void)
{
    if (!g_have_gpu) return;
    static const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                                     GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    const int n_in = 512, n_out = 37, tok = 29;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const quant_traits *tr = quant_get(types[t]);
        const uint64_t rb = quant_row_bytes(types[t], n_in), raw = rb * n_out;
        void *host = malloc(raw);
        gpu_random_tensor(types[t], (int64_t)n_in * n_out, 0.5f, &g_rng, host);
        float *ref = malloc(n_in * 4), *got = malloc(n_in * 4);
        tr->dequant((const uint8_t *)host + tok * rb, ref, n_in);
        void *d_raw = dev_from(host, raw), *d_w = dev(gemv_packed_bytes(types[t], n_in, n_out));
        gemv_pack(types[t], d_raw, d_w, n_in, n_out, NULL);
        const gemv_matrix m = {.type = types[t], .n_in = n_in, .n_out = n_out, .d_w = d_w};
        const int32_t pos[2] = {0, 41};
        const unsigned long long best = 0x1234ull << 32 | (uint32_t)~(uint32_t)tok;
        int32_t *d_pos = dev_from(pos, 8), *d_tok_out = dev(4);
        unsigned long long *d_best = dev_from(&best, 8);
        float *d_x = dev(n_in * 4);
        /* the cursor, then the forced tokens: the second call takes tokens[1] = tok */
        const int32_t staged[3] = {1, 3, tok};
        int32_t *d_staged = dev_from(staged, sizeof staged);
        gemv_embed_step(&m, NULL, d_staged, d_best, d_tok_out, d_pos, d_x, NULL); /* argmax's */
        to_host(got, d_x, n_in * 4);
        int32_t gpos[2], gtok, gcur;
        unsigned long long gbest;
        to_host(gpos, d_pos, 8), to_host(&gtok, d_tok_out, 4), to_host(&gbest, d_best, 8);
        to_host(&gcur, d_staged, 4);
        char name[64];
        snprintf(name, sizeof name, "embed_step %s row %d", tr->name, tok);
        CU_ASSERT_TRUE(gpu_parity_check(name, got, ref, n_in, 1e-6, 1e-5, 1e-10, false, NULL));
        CU_ASSERT_EQUAL(gtok, tok);
        CU_ASSERT_EQUAL(gpos[0], 41);
        CU_ASSERT_EQUAL(gpos[1], 42);
        CU_ASSERT_EQUAL(gbest, 0);
        CU_ASSERT_EQUAL(gcur, 1); /* not advanced: no forced token taken */
        CU_ASSERT_EQUAL(cuda_memset(d_x, 0xff, n_in * 4, &(status){0}), STATUS_OK);
        gemv_embed_step(&m, d_staged + 1, d_staged, d_best, d_tok_out, d_pos, d_x, NULL);
        to_host(got, d_x, n_in * 4);
        to_host(gpos, d_pos, 8), to_host(&gtok, d_tok_out, 4), to_host(&gcur, d_staged, 4);
        snprintf(name, sizeof name, "embed_step %s forced row %d", tr->name, tok);
        CU_ASSERT_TRUE(gpu_parity_check(name, got, ref, n_in, 1e-6, 1e-5, 1e-10, false, NULL));
        CU_ASSERT_EQUAL(gtok, tok);
        CU_ASSERT_EQUAL(gpos[0], 42);
        CU_ASSERT_EQUAL(gcur, 2); /* advanced past the token it took */
        cuda_free(d_raw), cuda_free(d_w), cuda_free(d_pos), cuda_free(d_tok_out);
        cuda_free(d_best), cuda_free(d_x), cuda_free(d_staged);
        free(host), free(ref), free(got);
    }
}

static void test_perturbed_fails(void)
{
    if (!g_have_gpu) return;
    CU_ASSERT_FALSE(gdn_case((gdn_shape){2, 4, 64, 64}, 1, false, true));
    CU_ASSERT_FALSE(gdn_case((gdn_shape){16, 32, 128, 128}, 1, false, true));
    CU_ASSERT_FALSE(gdn_case((gdn_shape){16, 32, 128, 128}, 1, true, true)); /* bf16 state */
    CU_ASSERT_FALSE(prep_case((attn_shape){4, 2, 64, 16}, 1, true, ATTN_KV_F16));
    CU_ASSERT_FALSE(prep_case((attn_shape){4, 2, 64, 16}, 1, true, ATTN_KV_F32));
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("decode kernel parity on the GPU");
    if (g_have_gpu) {
        status st;
        if (cuda_device_props_get(0, &g_props, &st) || gemv_init(&g_props, &st)) {
            printf("%s\n", st.msg);
            return 1;
        }
    }
    gpu_rng_seed(&g_rng, 7);
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("kernels_parity", NULL, NULL);
    CU_add_test(s, "norm", test_norm);
    CU_add_test(s, "gdn", test_gdn);
    CU_add_test(s, "gemv_conv", test_gemv_conv);
    CU_add_test(s, "attn", test_attn);
    CU_add_test(s, "attn_prep", test_attn_prep);
    CU_add_test(s, "embed_step", test_embed_step);
    CU_add_test(s, "perturbed_fails", test_perturbed_fails);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
