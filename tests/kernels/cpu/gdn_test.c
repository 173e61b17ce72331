/* Gated DeltaNet kernels against plain formulas: the decode step against HF's S[key][value]
 * recurrence in double, chunked vs token-by-token at chunk boundaries, the conv window, and
 * the fused per-token mixer (ref_gdn_decode) against its pieces. bf16 state storage: the
 * rounding (nearest even, exact round trip), where each form rounds (after every token, after
 * every chunk), and a state that stays finite and near the F32 one over thousands of tokens and
 * over 131072 (a 128K context). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "kernel_check.h"
#include "kernels/cpu/act.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/norm.h"
#include "tests/testutil/testutil.h"

/* Random inputs shaped like the real ones: q, k unit-norm (q also / sqrt(d_k)), β in (0,1),
 * g <= 0, v ~ U(-1, 1). Token t of head-local arrays at stride d. */
typedef struct gdn_case {
    int T, d_k, d_v;
    float *q, *k, *v, *beta, *g, *S0;
} gdn_case;

static void case_make(gdn_case *c, int T, int d_k, int d_v, uint64_t seed, float gmin)
{
    kc_rng r = {seed};
    c->T = T, c->d_k = d_k, c->d_v = d_v;
    c->q = malloc(sizeof(float) * T * d_k);
    c->k = malloc(sizeof(float) * T * d_k);
    c->v = malloc(sizeof(float) * T * d_v);
    c->beta = malloc(sizeof(float) * T);
    c->g = malloc(sizeof(float) * T);
    c->S0 = malloc(sizeof(float) * d_k * d_v);
    kc_fill(&r, c->q, (long)T * d_k, 1);
    kc_fill(&r, c->k, (long)T * d_k, 1);
    kc_fill(&r, c->v, (long)T * d_v, 1);
    for (int t = 0; t < T; t++) {
        ref_l2norm(c->q + t * d_k, d_k, 1e-6f, 1.0f / sqrtf((float)d_k));
        ref_l2norm(c->k + t * d_k, d_k, 1e-6f, 1.0f);
        c->beta[t] = (float)kc_uniform(&r);
        c->g[t] = gmin * (float)kc_uniform(&r);
    }
    kc_fill(&r, c->S0, (long)d_k * d_v, 0.5f);
}

static void case_free(gdn_case *c)
{
    free(c->q), free(c->k), free(c->v), free(c->beta), free(c->g), free(c->S0);
}

/* HF torch_recurrent_gated_delta_rule in double with S_hf[i][j] (i key, j value). S is given
 * and returned in the kernels' [d_v][d_k] layout. */
static void naive_recurrent(const gdn_case *c, float *S, float *o)
{
    int dk = c->d_k, dv = c->d_v;
    double *Sh = malloc(sizeof(double) * dk * dv), *u = malloc(sizeof(double) * dv);
    for (int i = 0; i < dk; i++)
        for (int j = 0; j < dv; j++) Sh[i * dv + j] = S[j * dk + i];
    for (int t = 0; t < c->T; t++) {
        const float *q = c->q + t * dk, *k = c->k + t * dk, *v = c->v + t * dv;
        double e = exp((double)c->g[t]);
        for (int n = 0; n < dk * dv; n++) Sh[n] *= e;
        for (int j = 0; j < dv; j++) {
            u[j] = 0;
            for (int i = 0; i < dk; i++) u[j] += Sh[i * dv + j] * k[i];
            u[j] = c->beta[t] * (v[j] - u[j]);
        }
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) Sh[i * dv + j] += k[i] * u[j];
        for (int j = 0; j < dv; j++) {
            double acc = 0;
            for (int i = 0; i < dk; i++) acc += Sh[i * dv + j] * q[i];
            o[t * dv + j] = (float)acc;
        }
    }
    for (int i = 0; i < dk; i++)
        for (int j = 0; j < dv; j++) S[j * dk + i] = (float)Sh[i * dv + j];
    free(Sh), free(u);
}

static void test_step_vs_hf_formula(void)
{
    gdn_case c;
    case_make(&c, 40, 32, 24, 7, -2.0f);
    float *S1 = malloc(sizeof(float) * 32 * 24), *S2 = malloc(sizeof(float) * 32 * 24);
    float *o1 = malloc(sizeof(float) * 40 * 24), *o2 = malloc(sizeof(float) * 40 * 24);
    memcpy(S1, c.S0, sizeof(float) * 32 * 24);
    memcpy(S2, c.S0, sizeof(float) * 32 * 24);
    ref_gdn_recurrent(c.T, c.q, c.k, c.d_k, c.v, c.d_v, c.beta, c.g, 1, c.d_k, c.d_v, S1, false, o1, c.d_v);
    naive_recurrent(&c, S2, o2);
    CU_ASSERT_EQUAL(kernel_check("o", o1, o2, 40 * 24, 1e-5, 1e-4), 0);
    CU_ASSERT_EQUAL(kernel_check("S", S1, S2, 32 * 24, 1e-5, 1e-4), 0);
    free(S1), free(S2), free(o1), free(o2);
    case_free(&c);
}

/* chunked vs recurrent over T tokens: outputs and final state within 1e-4 relative. */
static int chunked_vs_recurrent(int T, int d_k, int d_v, float gmin, int perturb)
{
    gdn_case c;
    case_make(&c, T, d_k, d_v, 1000 + T, gmin);
    long ns = (long)d_k * d_v;
    float *S1 = malloc(sizeof(float) * ns), *S2 = malloc(sizeof(float) * ns);
    float *o1 = malloc(sizeof(float) * T * d_v), *o2 = malloc(sizeof(float) * T * d_v);
    float *scratch = malloc(sizeof(float) * ref_gdn_chunked_scratch_floats(d_k, d_v));
    memcpy(S1, c.S0, sizeof(float) * ns);
    memcpy(S2, c.S0, sizeof(float) * ns);
    ref_gdn_recurrent(T, c.q, c.k, d_k, c.v, d_v, c.beta, c.g, 1, d_k, d_v, S1, false, o1, d_v);
    ref_gdn_chunked(T, c.q, c.k, d_k, c.v, d_v, c.beta, c.g, 1, d_k, d_v, S2, false, o2, d_v, scratch);
    if (perturb) o2[T * d_v / 2] += 1e-2f;
    float omax = 0, smax = 0;
    for (long i = 0; i < (long)T * d_v; i++) omax = fmaxf(omax, fabsf(o1[i]));
    for (long i = 0; i < ns; i++) smax = fmaxf(smax, fabsf(S1[i]));
    long bad = kernel_check("o", o2, o1, (long)T * d_v, 1e-4 * omax, 1e-4) +
               kernel_check("S", S2, S1, ns, 1e-4 * smax, 1e-4);
    free(S1), free(S2), free(o1), free(o2), free(scratch);
    case_free(&c);
    return bad != 0;
}

static void test_chunked_boundaries(void)
{
    static const int Ts[] = {1, 2, 63, 64, 65, 127, 128, 129, 200};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        CU_ASSERT_EQUAL(chunked_vs_recurrent(Ts[i], 64, 64, -1.0f, 0), 0);
        CU_ASSERT_EQUAL(chunked_vs_recurrent(Ts[i], 32, 48, -4.0f, 0), 0); /* d_k != d_v, fast decay */
    }
    CU_ASSERT_EQUAL(chunked_vs_recurrent(300, 128, 128, -0.05f, 0), 0); /* real head dims, slow decay */
}

static void test_chunked_check_can_fail(void)
{
    CU_ASSERT_EQUAL(chunked_vs_recurrent(65, 32, 32, -1.0f, 1), 1);
}

/* The conv over T tokens at once equals T one-token calls, and a plain zero-padded conv. */
static void test_conv(void)
{
    enum { C = 13, K = 4, T = 9 };
    kc_rng r = {42};
    float x[T * C], w[C * K], st1[C * (K - 1)], st2[C * (K - 1)], y1[T * C], y2[T * C];
    kc_fill(&r, x, T * C, 2);
    kc_fill(&r, w, C * K, 1);
    memset(st1, 0, sizeof st1);
    memset(st2, 0, sizeof st2);
    ref_gdn_conv(x, C, T, C, K, w, st1, y1);
    for (int t = 0; t < T; t++) ref_gdn_conv(x + t * C, C, 1, C, K, w, st2, y2 + t * C);
    CU_ASSERT_EQUAL(kernel_check("conv y", y1, y2, T * C, 1e-6, 1e-6), 0);
    CU_ASSERT_EQUAL(kernel_check("conv state", st1, st2, C * (K - 1), 0, 0), 0);
    float y3[T * C];
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int i = 0; i < K; i++) {
                int src = t - (K - 1) + i;
                if (src >= 0) acc += w[c * K + i] * x[src * C + c];
            }
            y3[t * C + c] = ref_silu((float)acc);
        }
    CU_ASSERT_EQUAL(kernel_check("conv naive", y1, y3, T * C, 1e-6, 1e-5), 0);
    /* T = 2 < K-1: the new state mixes old state and new inputs */
    float st3[C * (K - 1)], y4[2 * C];
    memcpy(st3, st1, sizeof st3);
    ref_gdn_conv(x, C, 2, C, K, w, st3, y4);
    for (int c = 0; c < C; c++) {
        CU_ASSERT_EQUAL(st3[c * 3 + 0], st1[c * 3 + 2]);
        CU_ASSERT_EQUAL(st3[c * 3 + 1], x[c]);
        CU_ASSERT_EQUAL(st3[c * 3 + 2], x[C + c]);
    }
}

/* ref_gdn_decode (fused) against conv + norms + gates + step + gated norm done by hand,
 * with n_v = 2 n_k so that the tiled key-head mapping hv % n_k matters. */
static void test_decode_fused(void)
{
    enum { nk = 2, nv = 4, dk = 16, dv = 8, K = 4, C = 2 * nk * dk + nv * dv };
    kc_rng r = {9};
    float mixed[C], z[nv * dv], b[nv], a[nv], w[C * K], dtb[nv], ssma[nv], nw[dv];
    float cs1[C * (K - 1)], cs2[C * (K - 1)], S1[nv * dv * dk], S2[nv * dv * dk], y1[nv * dv], y2[nv * dv];
    kc_fill(&r, mixed, C, 2), kc_fill(&r, z, nv * dv, 2), kc_fill(&r, b, nv, 2), kc_fill(&r, a, nv, 2);
    kc_fill(&r, w, C * K, 1), kc_fill(&r, dtb, nv, 1), kc_fill(&r, nw, dv, 1);
    for (int h = 0; h < nv; h++) ssma[h] = -expf(kc_sym(&r, 1));
    kc_fill(&r, cs1, C * (K - 1), 1);
    kc_fill(&r, S1, nv * dv * dk, 0.3f);
    memcpy(cs2, cs1, sizeof cs1);
    memcpy(S2, S1, sizeof S1);
    float scratch[C + 2 * nv];
    CU_ASSERT(ref_gdn_decode_scratch_floats(C, nv) <= (long)(sizeof scratch / sizeof(float)));
    ref_gdn_decode(mixed, z, b, a, w, dtb, ssma, nw, nk, nv, dk, dv, K, 1e-6f, cs1, S1, false, y1, scratch);

    float y[C];
    for (int c = 0; c < C; c++) {
        double acc = w[c * K + 3] * mixed[c];
        for (int i = 0; i < K - 1; i++) acc += w[c * K + i] * cs2[c * (K - 1) + i];
        y[c] = ref_silu((float)acc);
    }
    for (int h = 0; h < nk; h++) {
        ref_l2norm(y + h * dk, dk, 1e-6f, 1.0f / sqrtf(dk));
        ref_l2norm(y + (nk + h) * dk, dk, 1e-6f, 1.0f);
    }
    for (int hv = 0; hv < nv; hv++) {
        int kh = hv % nk;
        float beta = 1.0f / (1.0f + expf(-b[hv]));
        float g = ssma[hv] * logf(1.0f + expf(a[hv] + dtb[hv]));
        ref_gdn_step(y + kh * dk, y + (nk + kh) * dk, y + 2 * nk * dk + hv * dv, beta, g, dk, dv,
                     S2 + hv * dv * dk, y2 + hv * dv);
        double ss = 0;
        for (int j = 0; j < dv; j++) ss += (double)y2[hv * dv + j] * y2[hv * dv + j];
        float rr = (float)(1 / sqrt(ss / dv + 1e-6));
        for (int j = 0; j < dv; j++) {
            float zz = z[hv * dv + j];
            y2[hv * dv + j] *= rr * nw[j] * zz / (1 + expf(-zz));
        }
    }
    CU_ASSERT_EQUAL(kernel_check("decode y", y1, y2, nv * dv, 1e-5, 1e-4), 0);
    CU_ASSERT_EQUAL(kernel_check("decode S", S1, S2, nv * dv * dk, 1e-6, 1e-5), 0);
    CU_ASSERT_EQUAL(cs1[0], cs2[1]); /* window shifted */
    CU_ASSERT_EQUAL(cs1[K - 2], mixed[0]);
}

static void test_gates(void)
{
    float b[3] = {0, 30, -30}, a[3] = {0, 25, -40}, dt[3] = {0, 0, 0}, sa[3] = {-1, -2, -0.5f};
    float beta[3], g[3];
    ref_gdn_gates(b, a, dt, sa, 3, beta, g);
    CU_ASSERT_DOUBLE_EQUAL(beta[0], 0.5, 1e-7);
    CU_ASSERT_DOUBLE_EQUAL(g[0], -logf(2), 1e-7);
    CU_ASSERT_DOUBLE_EQUAL(g[1], -50.0, 1e-5);    /* softplus linear above 20 */
    CU_ASSERT(g[2] <= 0 && g[2] > -1e-9);           /* softplus(-40) ~ 4e-18 */
    CU_ASSERT(beta[1] == 1.0f && beta[2] < 1e-12f);
}

/* ---- bf16 state storage ---- */

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* nearest even: the halfway cases go to the even bf16 mantissa; bf16 values stay put */
static void test_bf16_round(void)
{
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: down to 1 (even); 1 + 3·2^-8 halfway between
     * 1 + 2^-7 (odd) and 1 + 2^-6: up; just past the half: up; negatives alike */
    float x[] = {bits_f32(0x3f808000u), bits_f32(0x3f818000u), bits_f32(0x3f808001u),
                 bits_f32(0xbf808000u), bits_f32(0xbf818000u), bits_f32(0x3f807fffu),
                 0.0f, -0.0f, 1e-40f /* subnormal */, 3.0e38f};
    const uint32_t want[] = {0x3f800000u, 0x3f820000u, 0x3f810000u, 0xbf800000u, 0xbf820000u,
                             0x3f800000u, 0x00000000u, 0x80000000u};
    ref_gdn_round_bf16(x, 10);
    for (int i = 0; i < 8; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        CU_ASSERT_EQUAL(u, want[i]);
    }
    for (int i = 0; i < 10; i++) { /* every result a bf16 value (low 16 bits zero) */
        uint32_t u;
        memcpy(&u, &x[i], 4);
        CU_ASSERT_EQUAL(u & 0xffffu, 0u);
    }
    CU_ASSERT(isfinite(x[9]) && x[9] > 2.9e38f);
    /* round trip: every bf16 bit pattern that is a finite number survives, and rounding twice
     * is rounding once */
    long bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        const float v = bits_f32(h << 16);
        if (!isfinite(v)) continue;
        float y = v;
        ref_gdn_round_bf16(&y, 1);
        bad += memcmp(&y, &v, 4) != 0 || quant_f32_to_bf16(v) != (ggml_bf16)h;
    }
    CU_ASSERT_EQUAL(bad, 0);
    kc_rng r = {77};
    float a[1000], b[1000];
    kc_fill(&r, a, 1000, 3);
    ref_gdn_round_bf16(a, 1000);
    memcpy(b, a, sizeof a);
    ref_gdn_round_bf16(b, 1000);
    CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
}

/* the row rule with bf16: ref_gdn_step then a rounding after every token, and outputs from the
 * unrounded state; the chunked rule rounds after every chunk only (a chunk's tokens as the F32
 * rule, S rounded at its end) */
static void test_bf16_rounding_points(void)
{
    const int T = 150, dk = 32, dv = 24;
    gdn_case c;
    case_make(&c, T, dk, dv, 31, -1.0f);
    const long ns = (long)dk * dv;
    float *S1 = malloc(sizeof(float) * ns), *S2 = malloc(sizeof(float) * ns);
    float *o1 = malloc(sizeof(float) * T * dv), *o2 = malloc(sizeof(float) * T * dv);
    float *scratch = malloc(sizeof(float) * ref_gdn_chunked_scratch_floats(dk, dv));
    memcpy(S1, c.S0, sizeof(float) * ns);
    memcpy(S2, c.S0, sizeof(float) * ns);
    ref_gdn_round_bf16(S1, ns);
    ref_gdn_round_bf16(S2, ns);
    ref_gdn_recurrent(T, c.q, c.k, dk, c.v, dv, c.beta, c.g, 1, dk, dv, S1, true, o1, dv);
    for (int t = 0; t < T; t++) {
        ref_gdn_step(c.q + t * dk, c.k + t * dk, c.v + t * dv, c.beta[t], c.g[t], dk, dv, S2,
                     o2 + t * dv);
        ref_gdn_round_bf16(S2, ns);
    }
    CU_ASSERT_EQUAL(memcmp(S1, S2, sizeof(float) * ns), 0);
    CU_ASSERT_EQUAL(memcmp(o1, o2, sizeof(float) * T * dv), 0);
    /* chunked: the F32 chunked rule chunk by chunk, rounded between chunks */
    memcpy(S1, c.S0, sizeof(float) * ns);
    ref_gdn_round_bf16(S1, ns);
    memcpy(S2, S1, sizeof(float) * ns);
    ref_gdn_chunked(T, c.q, c.k, dk, c.v, dv, c.beta, c.g, 1, dk, dv, S1, true, o1, dv, scratch);
    for (int t0 = 0; t0 < T; t0 += REF_GDN_CHUNK) {
        const int n = T - t0 < REF_GDN_CHUNK ? T - t0 : REF_GDN_CHUNK;
        ref_gdn_chunked(n, c.q + t0 * dk, c.k + t0 * dk, dk, c.v + t0 * dv, dv, c.beta + t0,
                        c.g + t0, 1, dk, dv, S2, false, o2 + t0 * dv, dv, scratch);
        ref_gdn_round_bf16(S2, ns);
    }
    CU_ASSERT_EQUAL(memcmp(S1, S2, sizeof(float) * ns), 0);
    CU_ASSERT_EQUAL(memcmp(o1, o2, sizeof(float) * T * dv), 0);
    /* and bf16 = false is the F32 rule bit for bit (the flag's other side) */
    memcpy(S1, c.S0, sizeof(float) * ns);
    memcpy(S2, c.S0, sizeof(float) * ns);
    ref_gdn_recurrent(T, c.q, c.k, dk, c.v, dv, c.beta, c.g, 1, dk, dv, S1, false, o1, dv);
    for (int t = 0; t < T; t++)
        ref_gdn_step(c.q + t * dk, c.k + t * dk, c.v + t * dv, c.beta[t], c.g[t], dk, dv, S2,
                     o2 + t * dv);
    CU_ASSERT_EQUAL(memcmp(S1, S2, sizeof(float) * ns), 0);
    free(S1), free(S2), free(o1), free(o2), free(scratch);
    case_free(&c);
}

/* 6000 tokens at the real head size with slow decay (g near 0: the state's memory is long, so
 * the roundings accumulate): the bf16 state stays finite, every element a bf16 value, and near
 * the F32 state (max |ΔS| <= 2% of max |S|, outputs within 2% of max |o|); row and chunked
 * bf16 rules agree as closely. */
static void test_bf16_long_run(void)
{
    const int T = 6000, dk = 128, dv = 128;
    gdn_case c;
    case_make(&c, T, dk, dv, 4242, -0.02f);
    const long ns = (long)dk * dv;
    float *Sf = malloc(sizeof(float) * ns), *Sb = malloc(sizeof(float) * ns);
    float *Sc = malloc(sizeof(float) * ns);
    float *of = malloc(sizeof(float) * T * dv), *ob = malloc(sizeof(float) * T * dv);
    float *oc = malloc(sizeof(float) * T * dv);
    float *scratch = malloc(sizeof(float) * ref_gdn_chunked_scratch_floats(dk, dv));
    ref_gdn_round_bf16(c.S0, ns); /* the three start from the same values */
    memcpy(Sf, c.S0, sizeof(float) * ns);
    memcpy(Sb, c.S0, sizeof(float) * ns);
    memcpy(Sc, c.S0, sizeof(float) * ns);
    ref_gdn_recurrent(T, c.q, c.k, dk, c.v, dv, c.beta, c.g, 1, dk, dv, Sf, false, of, dv);
    ref_gdn_recurrent(T, c.q, c.k, dk, c.v, dv, c.beta, c.g, 1, dk, dv, Sb, true, ob, dv);
    ref_gdn_chunked(T, c.q, c.k, dk, c.v, dv, c.beta, c.g, 1, dk, dv, Sc, true, oc, dv, scratch);
    long non_finite = 0, not_bf16 = 0;
    for (long i = 0; i < ns; i++) {
        uint32_t u;
        memcpy(&u, &Sb[i], 4);
        non_finite += !isfinite(Sb[i]) || !isfinite(Sc[i]);
        not_bf16 += (u & 0xffffu) != 0;
    }
    for (long i = 0; i < (long)T * dv; i++) non_finite += !isfinite(ob[i]) || !isfinite(oc[i]);
    CU_ASSERT_EQUAL(non_finite, 0);
    CU_ASSERT_EQUAL(not_bf16, 0);
    float smax = 0, omax = 0;
    for (long i = 0; i < ns; i++) smax = fmaxf(smax, fabsf(Sf[i]));
    for (long i = 0; i < (long)T * dv; i++) omax = fmaxf(omax, fabsf(of[i]));
    CU_ASSERT(smax > 0.1f); /* a state that is not just decayed away */
    CU_ASSERT_EQUAL(kernel_check("bf16 S vs F32", Sb, Sf, ns, 2e-2 * smax, 0), 0);
    CU_ASSERT_EQUAL(kernel_check("bf16 o vs F32", ob, of, (long)T * dv, 2e-2 * omax, 0), 0);
    CU_ASSERT_EQUAL(kernel_check("bf16 chunked S vs row", Sc, Sb, ns, 2e-2 * smax, 0), 0);
    CU_ASSERT_EQUAL(kernel_check("bf16 chunked o vs row", oc, ob, (long)T * dv, 2e-2 * omax, 0), 0);
    /* the bound can fail: a state off by 5% of its largest value somewhere */
    Sb[ns / 3] += 0.05f * smax;
    CU_ASSERT_NOT_EQUAL(kernel_check("bf16 S, perturbed (must fail)", Sb, Sf, ns, 2e-2 * smax, 0), 0);
    free(Sf), free(Sb), free(Sc), free(of), free(ob), free(oc), free(scratch);
    case_free(&c);
}

/* 131072 tokens (a 128K context) of one 64 x 64 head, inputs drawn token by token as case_make
 * draws them, slow decay (g in [-0.01, 0]): the bf16 state (row rule) stays finite and bounded
 * like the F32 one (its largest element within 5% of the F32 state's, every element within 5% of
 * that), and the last 1000 tokens' outputs stay as close */
static void test_bf16_128k(void)
{
    enum { T = 131072, dk = 64, dv = 64, NS = dk * dv };
    kc_rng r = {128};
    static float Sf[NS], Sb[NS];
    float q[dk], k[dk], v[dv], of[dv], ob[dv];
    kc_fill(&r, Sf, NS, 0.5f);
    ref_gdn_round_bf16(Sf, NS);
    memcpy(Sb, Sf, sizeof Sf);
    long non_finite = 0;
    double o_max = 0, o_diff = 0;
    for (int t = 0; t < T; t++) {
        kc_fill(&r, q, dk, 1), kc_fill(&r, k, dk, 1), kc_fill(&r, v, dv, 1);
        ref_l2norm(q, dk, 1e-6f, 1.0f / sqrtf((float)dk));
        ref_l2norm(k, dk, 1e-6f, 1.0f);
        const float beta = (float)kc_uniform(&r), g = -0.01f * (float)kc_uniform(&r);
        ref_gdn_step(q, k, v, beta, g, dk, dv, Sf, of);
        ref_gdn_step(q, k, v, beta, g, dk, dv, Sb, ob);
        ref_gdn_round_bf16(Sb, NS);
        if (t >= T - 1000)
            for (int j = 0; j < dv; j++) {
                non_finite += !isfinite(ob[j]);
                o_max = fmax(o_max, fabs(of[j]));
                o_diff = fmax(o_diff, fabs((double)ob[j] - of[j]));
            }
    }
    float sf = 0, sb = 0;
    for (int i = 0; i < NS; i++) {
        non_finite += !isfinite(Sb[i]);
        sf = fmaxf(sf, fabsf(Sf[i]));
        sb = fmaxf(sb, fabsf(Sb[i]));
    }
    printf("\n  128K tokens: max|S| F32 %.4g, bf16 %.4g; last 1000 outputs: max|o| %.4g, "
           "max|Δo| %.3g\n", sf, sb, o_max, o_diff);
    CU_ASSERT_EQUAL(non_finite, 0);
    CU_ASSERT(fabsf(sb - sf) <= 0.05f * sf);
    CU_ASSERT_EQUAL(kernel_check("128K: bf16 S vs F32", Sb, Sf, NS, 0.05 * sf, 0), 0);
    CU_ASSERT(o_diff <= 0.05 * o_max);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("gdn", NULL, NULL);
    CU_add_test(s, "step_vs_hf_formula", test_step_vs_hf_formula);
    CU_add_test(s, "chunked_boundaries", test_chunked_boundaries);
    CU_add_test(s, "chunked_check_can_fail", test_chunked_check_can_fail);
    CU_add_test(s, "conv", test_conv);
    CU_add_test(s, "decode_fused", test_decode_fused);
    CU_add_test(s, "gates", test_gates);
    CU_add_test(s, "bf16_round", test_bf16_round);
    CU_add_test(s, "bf16_rounding_points", test_bf16_rounding_points);
    CU_add_test(s, "bf16_long_run", test_bf16_long_run);
    CU_add_test(s, "bf16_128k", test_bf16_128k);
    return testutil_cunit_run();
}
