/* ref_attn_prep (the twin of the CUDA attn_prep) against the CPU forward's own steps for one
 * row (model/forward_attn.c: ref_rmsnorm + ref_rope per q head in place, ref_rmsnorm_heads +
 * ref_rope on k, K and V copied into row pos), for both cache types: F32 holds them as computed,
 * F16 rounded as the GPU's F16 cache holds them.
 * Shapes: n_h/n_kv 1, 2, 3 (n_kv 1..3), d_h 32/64/256, n_rot 16 and d_h, positions 0, 1, 4095.
 * The gate halves of qg are NaN, so reading them (a wrong q|gate split) fails the check; every
 * cache row but pos must keep its sentinel bytes. One case perturbs q_out and must fail. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "kernel_check.h"
#include "kernels/cpu/attn.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "tests/testutil/testutil.h"

enum { N_CTX = 4096, SENTINEL = 0xA5 };

typedef struct prep_shape {
    int n_h, n_kv, d_h, n_rot;
} prep_shape;

/* Bytes of [from, to) that differ from the sentinel. */
static long sentinel_bad(const unsigned char *p, size_t from, size_t to)
{
    long bad = 0;
    for (size_t i = from; i < to; i++) bad += p[i] != SENTINEL;
    return bad;
}

static size_t kv_elem_bytes(attn_kv_type t) { return t == ATTN_KV_F32 ? 4 : 2; }

/* Element i of a cache of type t, as a float. */
static float kv_get(const void *cache, attn_kv_type t, size_t i)
{
    return t == ATTN_KV_F32 ? ((const float *)cache)[i]
                            : quant_f16_to_f32(((const ggml_half *)cache)[i]);
}

/* What a cache of type t holds for x. */
static float kv_round(float x, attn_kv_type t)
{
    return t == ATTN_KV_F32 ? x : quant_f16_to_f32(quant_f32_to_f16(x));
}

/* Number of mismatching elements (plus clobbered cache bytes) of one case. */
static long prep_case(prep_shape sh, int pos, int perturb, attn_kv_type kv_type)
{
    const int d = sh.d_h, HA = sh.n_h * d, KVA = sh.n_kv * d;
    const float base = 1e7f, eps = 1e-6f;
    kc_rng r = {1000003u * (uint64_t)(sh.n_h * 7 + sh.n_kv) + 31u * (uint64_t)d + (uint64_t)pos + 1};
    float *qg = malloc(sizeof(float) * 2 * HA), *qg_nan = malloc(sizeof(float) * 2 * HA);
    float *k = malloc(sizeof(float) * KVA), *v = malloc(sizeof(float) * KVA);
    float *qw = malloc(sizeof(float) * d), *kw = malloc(sizeof(float) * d);
    float *q_out = malloc(sizeof(float) * HA), *q_ref = malloc(sizeof(float) * HA);
    float *k_got = malloc(sizeof(float) * KVA), *k_ref = malloc(sizeof(float) * KVA);
    float *v_got = malloc(sizeof(float) * KVA), *v_ref = malloc(sizeof(float) * KVA);
    const size_t elem = kv_elem_bytes(kv_type), cache_bytes = (size_t)N_CTX * KVA * elem;
    unsigned char *kc = malloc(cache_bytes), *vc = malloc(cache_bytes);
    kc_fill(&r, qg, 2 * HA, 3), kc_fill(&r, k, KVA, 3), kc_fill(&r, v, KVA, 2);
    for (int i = 0; i < d; i++) qw[i] = 1 + kc_sym(&r, 0.5f), kw[i] = 1 + kc_sym(&r, 0.5f);
    memcpy(qg_nan, qg, sizeof(float) * 2 * HA);
    for (int h = 0; h < sh.n_h; h++)
        for (int i = 0; i < d; i++) qg_nan[(long)h * 2 * d + d + i] = NAN;
    memset(kc, SENTINEL, cache_bytes), memset(vc, SENTINEL, cache_bytes);
    const int32_t p32 = pos;

    ref_attn_prep(qg_nan, k, v, qw, kw, sh.n_h, sh.n_kv, d, sh.n_rot, base, eps, &p32, kc, vc,
                  q_out, kv_type);

    /* the CPU forward's steps (model/forward_attn.c, cpu_fwd_attn_layer's row loop) */
    for (int h = 0; h < sh.n_h; h++) {
        ref_rmsnorm(qg + (long)h * 2 * d, qw, d, eps, qg + (long)h * 2 * d);
        ref_rope(qg + (long)h * 2 * d, 1, d, sh.n_rot, pos, base);
        memcpy(q_ref + (long)h * d, qg + (long)h * 2 * d, sizeof(float) * d);
    }
    ref_rmsnorm_heads(k, kw, sh.n_kv, d, eps);
    ref_rope(k, sh.n_kv, d, sh.n_rot, pos, base);
    for (int i = 0; i < KVA; i++) { /* F16: round to nearest even, as the GPU's cache */
        k_ref[i] = kv_round(k[i], kv_type);
        v_ref[i] = kv_round(v[i], kv_type);
        k_got[i] = kv_get(kc, kv_type, (size_t)pos * KVA + i);
        v_got[i] = kv_get(vc, kv_type, (size_t)pos * KVA + i);
    }
    if (perturb) q_out[HA / 3] *= 1.001f;

    /* the same primitives in the same order: equal to the last bit, checked with a hair of room */
    long bad = kernel_check("q_out", q_out, q_ref, HA, 1e-7, 1e-6);
    bad += kernel_check("K row", k_got, k_ref, KVA, 1e-7, 1e-6);
    bad += kernel_check("V row", v_got, v_ref, KVA, 0, 0);
    const size_t row = (size_t)KVA * elem, at = (size_t)pos * row;
    long clobbered = sentinel_bad(kc, 0, at) + sentinel_bad(kc, at + row, cache_bytes) +
                     sentinel_bad(vc, 0, at) + sentinel_bad(vc, at + row, cache_bytes);
    if (clobbered) fprintf(stderr, "  %ld cache bytes outside row %d written\n", clobbered, pos);
    if (bad || clobbered)
        fprintf(stderr, "  ^ n_h %d n_kv %d d_h %d n_rot %d pos %d %s cache%s\n", sh.n_h,
                sh.n_kv, d, sh.n_rot, pos, kv_type == ATTN_KV_F32 ? "F32" : "F16",
                perturb ? " (perturbed)" : "");
    free(qg), free(qg_nan), free(k), free(v), free(qw), free(kw), free(q_out), free(q_ref);
    free(k_got), free(k_ref), free(v_got), free(v_ref), free(kc), free(vc);
    return bad + clobbered;
}

static void test_attn_prep_grid(void)
{
    static const int heads[][2] = {{1, 1}, {2, 1}, {3, 1}, {4, 2}, {6, 3}, {3, 3}};
    static const int dhs[] = {32, 64, 256}, positions[] = {0, 1, N_CTX - 1};
    for (size_t a = 0; a < sizeof heads / sizeof heads[0]; a++)
        for (size_t b = 0; b < sizeof dhs / sizeof dhs[0]; b++)
            for (int rot = 0; rot < 2; rot++)
                for (size_t p = 0; p < sizeof positions / sizeof positions[0]; p++) {
                    prep_shape sh = {heads[a][0], heads[a][1], dhs[b], rot ? dhs[b] : 16};
                    CU_ASSERT_EQUAL(prep_case(sh, positions[p], 0, ATTN_KV_F16), 0);
                    CU_ASSERT_EQUAL(prep_case(sh, positions[p], 0, ATTN_KV_F32), 0);
                }
}

/* The check can fail: one q_out element off by 1e-3 relative. */
static void test_attn_prep_perturbed_fails(void)
{
    CU_ASSERT_NOT_EQUAL(prep_case((prep_shape){4, 2, 64, 16}, 1, 1, ATTN_KV_F16), 0);
    CU_ASSERT_NOT_EQUAL(prep_case((prep_shape){4, 2, 64, 16}, 1, 1, ATTN_KV_F32), 0);
}

/* The F32 cache is not rounded: its K and V rows differ from their F16 rounding (a twin that
 * wrote F16-rounded floats, or halves, would not). */
static void test_attn_prep_f32_unrounded(void)
{
    enum { NH = 2, NKV = 2, D = 64 };
    kc_rng r = {91};
    float qg[NH * 2 * D], k[NKV * D], v[NKV * D], w[D], q_out[NH * D];
    float kc[2 * NKV * D], vc[2 * NKV * D];
    kc_fill(&r, qg, NH * 2 * D, 2), kc_fill(&r, k, NKV * D, 2), kc_fill(&r, v, NKV * D, 2);
    kc_fill(&r, w, D, 1);
    const int32_t pos = 1;
    ref_attn_prep(qg, k, v, w, w, NH, NKV, D, 16, 1e7f, 1e-6f, &pos, kc, vc, q_out, ATTN_KV_F32);
    int k_off = 0, v_off = 0;
    for (int i = 0; i < NKV * D; i++) {
        k_off += kc[NKV * D + i] != kv_round(kc[NKV * D + i], ATTN_KV_F16);
        v_off += vc[NKV * D + i] != kv_round(vc[NKV * D + i], ATTN_KV_F16);
        CU_ASSERT_EQUAL(vc[NKV * D + i], v[i]); /* V: the input float itself */
    }
    CU_ASSERT(k_off > NKV * D / 2);
    CU_ASSERT(v_off > NKV * D / 2);
}

/* Position 0 rotates nothing: q_out and K are the plain norms (RoPE off by a row would not be). */
static void test_attn_prep_pos0_is_norm(void)
{
    enum { NH = 2, NKV = 1, D = 64 };
    kc_rng r = {77};
    float qg[NH * 2 * D], k[NKV * D], v[NKV * D], w[D], q_out[NH * D], ref[NH * D];
    ggml_half kc[NKV * D], vc[NKV * D];
    kc_fill(&r, qg, NH * 2 * D, 2), kc_fill(&r, k, NKV * D, 2), kc_fill(&r, v, NKV * D, 2);
    kc_fill(&r, w, D, 1);
    const int32_t pos = 0;
    ref_attn_prep(qg, k, v, w, w, NH, NKV, D, D, 1e7f, 1e-6f, &pos, kc, vc, q_out, ATTN_KV_F16);
    for (int h = 0; h < NH; h++) ref_rmsnorm(qg + h * 2 * D, w, D, 1e-6f, ref + h * D);
    CU_ASSERT_EQUAL(kernel_check("q_out pos 0", q_out, ref, NH * D, 0, 0), 0);
    float kn[D], kg[D];
    ref_rmsnorm(k, w, D, 1e-6f, kn);
    for (int i = 0; i < D; i++) {
        kn[i] = quant_f16_to_f32(quant_f32_to_f16(kn[i]));
        kg[i] = quant_f16_to_f32(kc[i]);
    }
    CU_ASSERT_EQUAL(kernel_check("K pos 0", kg, kn, D, 0, 0), 0);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("attn_prep", NULL, NULL);
    CU_add_test(s, "grid", test_attn_prep_grid);
    CU_add_test(s, "perturbed_fails", test_attn_prep_perturbed_fails);
    CU_add_test(s, "pos0_is_norm", test_attn_prep_pos0_is_norm);
    CU_add_test(s, "f32_unrounded", test_attn_prep_f32_unrounded);
    return testutil_cunit_run();
}
