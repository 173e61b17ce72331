/* The batched ("rows") decode kernels of kernels/cuda (norm_rms_rows, gdn_conv_rows,
 * gdn_decode_rows, gdn_norm_gated_rows, attn_prep_rows, attn_decode_rows; gdn_conv_runs and
 * gdn_decode_runs, the prefill runs; norm_rms_gather) over B = 1, 3, 17, 64
 * and 256 rows, at the shapes of small models and of the 4B and 27B. Row i sits on slot
 * slot[i], the first B of a random permutation of more slots than rows, and (attention) at its
 * own position: 33 (in the second chunk), 0, 31 and 32 (either side of the first chunk
 * boundary), n_ctx - 1, then random. Activations have row strides longer than a row, slots a
 * stride longer than a slot's state; the batched attention reads a paged KV cache (every block
 * of every slot at a random place of one pool, kernels/cuda/attn.h "KV blocks"), the B = 1
 * launches a contiguous one. Checked:
 *  - every row against the CPU twins (kernels/cpu ref_*) with kernels_parity's bounds, and the
 *    Q8 forms against the F32 outputs they were made from;
 *  - every row's outputs, Q8 forms, state and cache bit-identical (memcmp) to the same row run
 *    alone through the B = 1 launcher (norm_rms, gdn_conv, ..., attn_decode: the same kernel at
 *    B = 1 with no slot map) on its own copy of the states; every slot no row names, the
 *    padding after each slot and between rows left as they were; the conv in place on the
 *    projection rows (as the forward runs it) equal to the conv out of place;
 *  - with or without a GPU: the launch grids of every rows kernel (*_rows_dims, what the
 *    launchers use) against the device limits for B up to 256 (and 65535) at the 0.8B, 4B and
 *    27B shapes and n_ctx up to 256K, and the super-chunks (attn.h) that bound the partials.
 * Cases that perturb one row's output, or a byte of a slot no row names, assert the checks
 * fail. */
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
#include "kernels/cuda/attn.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/norm.h"
#include "tests/gpu/gpu_dev.h"
#include "tests/gpu/gpu_parity.h"

static bool g_have_gpu;
static gpu_rng g_rng;

static const int g_Bs[] = {1, 3, 17, 64, 256};
#define N_BS ((int)(sizeof g_Bs / sizeof g_Bs[0]))
#define ROWS_MAX 256
#define SENTINEL 0xA5

enum perturb { PERTURB_NONE, PERTURB_OUTPUT, PERTURB_STATE };

/* ---- host and device buffers: every failure is a test failure with the message printed ---- */
static void *dev_fill(int byte, size_t bytes)
{
    status st;
    void *p = dev(bytes);
    CU_ASSERT_EQUAL(cuda_memset(p, byte, bytes, &st), STATUS_OK);
    return p;
}
/* ---- the row map ---- */
typedef struct rows {
    int B, n_slots;
    int32_t slot[ROWS_MAX], pos[ROWS_MAX];
    int32_t *d_slot, *d_pos; /* device copies, [B] */
} rows;

/* B rows on distinct slots: the first B of a random permutation of n_slots = B + B/4 + 3;
 * positions (n_ctx > 0): 33, 0, 31, 32, n_ctx - 1 for rows 0..4, random below n_ctx after. */
static void rows_make(rows *r, int B, int n_ctx)
{
    DS_ASSERT(B >= 1 && B <= ROWS_MAX);
    r->B = B;
    r->n_slots = B + B / 4 + 3;
    int32_t *perm = gpu_xmalloc((size_t)r->n_slots * sizeof *perm);
    gpu_rng_permutation(&g_rng, perm, r->n_slots);
    static const int fixed[] = {33, 0, 31, 32, -1};
    for (int i = 0; i < B; i++) {
        r->slot[i] = perm[i];
        int p = 0;
        if (n_ctx > 0) {
            p = i < 5 ? fixed[i] : (int)(gpu_rng_u64(&g_rng) % (uint64_t)n_ctx);
            if (p < 0 || p >= n_ctx) p = n_ctx - 1;
        }
        r->pos[i] = p;
    }
    free(perm);
    r->d_slot = dev_from(r->slot, (size_t)B * 4);
    r->d_pos = dev_from(r->pos, (size_t)B * 4);
}
static void rows_free(rows *r) { cuda_free(r->d_slot), cuda_free(r->d_pos); }
static int rows_of_slot(const rows *r, int s)
{
    for (int i = 0; i < r->B; i++)
        if (r->slot[i] == s) return i;
    return -1;
}

/* ---- the bitwise checks ---- */
/* Rows i < B of two [B] buffers of row stride ld bytes: the first `bytes` of each equal. */
static bool same_rows(const char *what, const void *batched, const void *alone, int B,
                      size_t bytes, size_t ld)
{
    int n_bad = 0, first = -1;
    for (int i = 0; i < B; i++)
        if (memcmp((const uint8_t *)batched + i * ld, (const uint8_t *)alone + i * ld, bytes)) {
            n_bad++;
            if (first < 0) first = i;
        }
    if (n_bad)
        printf("  %s: %d of %d rows differ from the row run alone at B = 1 (first: row %d)\n",
               what, n_bad, B, first);
    return n_bad == 0;
}

/* Bytes [bytes, ld) of every row of a [B] buffer still SENTINEL (nothing written between rows). */
static bool pad_untouched(const char *what, const void *buf, int B, size_t bytes, size_t ld)
{
    for (int i = 0; i < B; i++)
        for (size_t k = bytes; k < ld; k++)
            if (((const uint8_t *)buf)[i * ld + k] != SENTINEL) {
                printf("  %s: written between rows (row %d, byte %zu)\n", what, i, k);
                return false;
            }
    return true;
}

/* Slot buffers of n_slots regions of `stride` bytes: a slot a row names holds the same bytes
 * after the batched launch and after its row ran alone, and its padding (from `bytes` on) is as
 * it was; a slot no row names is as it was, whole. */
static bool same_slots(const char *what, const rows *r, const uint8_t *batched,
                       const uint8_t *alone, const uint8_t *init, size_t bytes, size_t stride)
{
    bool ok = true;
    for (int s = 0; s < r->n_slots; s++) {
        const size_t at = (size_t)s * stride;
        const int i = rows_of_slot(r, s);
        if (i >= 0) {
            if (memcmp(batched + at, alone + at, bytes)) {
                printf("  %s: slot %d (row %d) differs from the row run alone at B = 1\n", what,
                       s, i);
                ok = false;
            }
            if (memcmp(batched + at + bytes, init + at + bytes, stride - bytes) ||
                memcmp(alone + at + bytes, init + at + bytes, stride - bytes)) {
                printf("  %s: the padding after slot %d was written\n", what, s);
                ok = false;
            }
        } else if (memcmp(batched + at, init + at, stride) || memcmp(alone + at, init + at, stride)) {
            printf("  %s: slot %d, named by no row, was written\n", what, s);
            ok = false;
        }
    }
    return ok;
}

/* The element-wise check over the B rows of a [B][ld] output against ref [B][n]: prints the
 * rows that fail (gpu_parity_check prints their mismatches) and one line for the case. */
static bool rows_parity(const char *name, const float *got, int64_t ld, const float *ref,
                        int64_t n, int B, double atol, double rtol, double nmse)
{
    int n_bad = 0;
    char row_name[160];
    for (int i = 0; i < B; i++) {
        snprintf(row_name, sizeof row_name, "  %s row %d", name, i);
        if (!gpu_parity_check(row_name, got + i * ld, ref + i * n, n, atol, rtol, nmse, true, NULL))
            n_bad++;
    }
    printf("%s: %d rows%s\n", name, B, n_bad ? " FAILED" : " ok");
    return n_bad == 0;
}

/* ---- RMSNorm ---- */
static bool norm_rows_case(int n, int B, enum perturb perturb)
{
    const float eps = 1e-6f;
    const int64_t ld = n + 3;
    const size_t qb = gemv_xq_bytes(n), yb = (size_t)B * ld * 4;
    float *x = gpu_rand_vec(&g_rng, (int64_t)B * ld, 3.0f), *w = gpu_rand_vec(&g_rng, n, 1.0f);
    float *d_x = dev_from(x, (size_t)B * ld * 4), *d_w = dev_from(w, (size_t)n * 4);
    float *d_y = dev_fill(SENTINEL, yb), *d_y1 = dev_fill(SENTINEL, yb);
    uint8_t *d_q = dev_fill(SENTINEL, B * qb), *d_q1 = dev_fill(SENTINEL, B * qb);
    norm_rms_rows(d_x, ld, d_w, n, eps, d_y, ld, d_q, B, NULL);
    for (int i = 0; i < B; i++)
        norm_rms(d_x + i * ld, d_w, n, eps, d_y1 + i * ld, d_q1 + i * qb, NULL);
    float *y = gpu_host_of(d_y, yb), *y1 = gpu_host_of(d_y1, yb);
    int8_t *q = gpu_host_of(d_q, B * qb), *q1 = gpu_host_of(d_q1, B * qb);
    if (perturb == PERTURB_OUTPUT) y[(B / 2) * ld + n / 3] += 0.01f;

    char name[96];
    snprintf(name, sizeof name, "norm_rms_rows n %d B %d%s", n, B, perturb ? " (perturbed)" : "");
    float *ref = gpu_xmalloc((size_t)B * n * 4);
    for (int i = 0; i < B; i++) ref_rmsnorm(x + i * ld, w, n, eps, ref + (size_t)i * n);
    bool ok = rows_parity(name, y, ld, ref, n, B, 1e-5, 1e-5, 1e-10);
    for (int i = 0; i < B; i++) ok &= gpu_check_q8_of(name, y + i * ld, q + i * qb, n);
    ok &= same_rows(name, y, y1, B, (size_t)n * 4, ld * 4);
    ok &= same_rows("  its Q8", q, q1, B, qb, qb);
    ok &= pad_untouched(name, y, B, (size_t)n * 4, ld * 4);
    /* gathered (the lm_head's rows): row i from row src[i], bit-identical to that row above */
    int32_t *src = gpu_xmalloc((size_t)B * 4);
    for (int i = 0; i < B; i++) src[i] = (int32_t)((B - 1 - i + (i % 3 == 1)) % B);
    int32_t *d_src = dev_from(src, (size_t)B * 4);
    float *d_g = dev_fill(SENTINEL, yb);
    norm_rms_gather(d_x, ld, d_src, d_w, n, eps, d_g, ld, NULL, B, NULL);
    float *g = gpu_host_of(d_g, yb);
    int bad_g = 0;
    for (int i = 0; i < B; i++)
        bad_g += memcmp(g + i * ld, y1 + (int64_t)src[i] * ld, (size_t)n * 4) != 0;
    if (bad_g) printf("  %s: %d gathered rows differ from their source rows\n", name, bad_g);
    ok &= bad_g == 0;
    cuda_free(d_src), cuda_free(d_g);
    free(src), free(g);
    cuda_free(d_x), cuda_free(d_w), cuda_free(d_y), cuda_free(d_y1), cuda_free(d_q), cuda_free(d_q1);
    free(x), free(w), free(y), free(y1), free(q), free(q1), free(ref);
    return ok;
}

static void test_norm_rows(void)
{
    if (!g_have_gpu) return;
    static const int ns[] = {1024, 5120, 8192 + 1024}; /* the last: the two-pass kernel */
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++)
        for (int b = 0; b < N_BS; b++) CU_ASSERT_TRUE(norm_rows_case(ns[c], g_Bs[b], PERTURB_NONE));
}

/* ---- DeltaNet: conv, delta rule, gated norm ---- */
typedef struct gdn_shape {
    int n_k, n_v, d_k, d_v;
} gdn_shape;

/* One step of B rows through gdn_conv_rows, gdn_decode_rows and gdn_norm_gated_rows, the
 * projection rows laid out as the forward's: [mixed (C) | z (D_v) | b (n_v) | a (n_v)]. bf16: S
 * stored as bf16 (gdn.h "State storage"; the twin rounds it where the kernel stores it, and the
 * state bound is a bf16 step, 2^-7 relative at most). */
static bool gdn_rows_case(gdn_shape sh, int B, bool bf16, enum perturb perturb)
{
    const int K = 4, C = 2 * sh.n_k * sh.d_k + sh.n_v * sh.d_v, D_v = sh.n_v * sh.d_v;
    const float eps = 1e-6f;
    const int64_t nS = (int64_t)sh.n_v * sh.d_v * sh.d_k, nCS = (int64_t)C * (K - 1);
    const int64_t S_stride = nS + 64, CS_stride = nCS + 16; /* elements */
    const int eb = bf16 ? 2 : 4; /* bytes of an S element on the device */
    const int64_t ld_p = C + D_v + 2 * sh.n_v + 3, ld_c = C + 1, ld_o = D_v + 2, ld_y = D_v + 3;
    const size_t qb = gemv_xq_bytes(D_v);
    rows r;
    rows_make(&r, B, 0);
    float *conv_w = gpu_rand_vec(&g_rng, (int64_t)C * K, 0.5f), *dt = gpu_rand_vec(&g_rng, sh.n_v, 1.0f);
    float *ssm_a = gpu_rand_vec(&g_rng, sh.n_v, 1.0f), *norm_w = gpu_rand_vec(&g_rng, sh.d_v, 1.0f);
    for (int h = 0; h < sh.n_v; h++) ssm_a[h] = -expf(0.5f * ssm_a[h]); /* -exp(A_log) */
    float *S0 = gpu_rand_vec(&g_rng, r.n_slots * S_stride, 0.05f), *cs0 = gpu_rand_vec(&g_rng, r.n_slots * CS_stride, 1.0f);
    float *p = gpu_rand_vec(&g_rng, B * ld_p, 1.0f);
    const size_t CSb = (size_t)r.n_slots * CS_stride * 4;

    float *d_cw = dev_from(conv_w, (size_t)C * K * 4), *d_dt = dev_from(dt, sh.n_v * 4);
    float *d_sa = dev_from(ssm_a, sh.n_v * 4), *d_nw = dev_from(norm_w, sh.d_v * 4);
    float *d_p = dev_from(p, (size_t)B * ld_p * 4);
    uint8_t *d_S = gpu_state_dev(S0, r.n_slots * S_stride, bf16);
    uint8_t *d_S1 = gpu_state_dev(S0, r.n_slots * S_stride, bf16);
    float *d_cs = dev_from(cs0, CSb), *d_cs1 = dev_from(cs0, CSb);
    float *d_c = dev_fill(SENTINEL, B * ld_c * 4), *d_c1 = dev_fill(SENTINEL, B * ld_c * 4);
    float *d_o = dev_fill(SENTINEL, B * ld_o * 4), *d_o1 = dev_fill(SENTINEL, B * ld_o * 4);
    float *d_y = dev_fill(SENTINEL, B * ld_y * 4), *d_y1 = dev_fill(SENTINEL, B * ld_y * 4);
    uint8_t *d_q = dev_fill(SENTINEL, B * qb), *d_q1 = dev_fill(SENTINEL, B * qb);
    const float *d_z = d_p + C, *d_b = d_z + D_v, *d_a = d_b + sh.n_v;

    gdn_conv_rows(d_p, ld_p, d_cw, d_cs, CS_stride, r.d_slot, C, K, d_c, ld_c, B, NULL);
    /* the forward's way: in place on the projection rows, on a third copy of the conv states */
    float *d_pin = dev_from(p, (size_t)B * ld_p * 4), *d_csin = dev_from(cs0, CSb);
    gdn_conv_rows(d_pin, ld_p, d_cw, d_csin, CS_stride, r.d_slot, C, K, d_pin, ld_p, B, NULL);
    gdn_decode_rows(d_c, ld_c, d_b, d_a, ld_p, d_dt, d_sa, sh.n_k, sh.n_v, sh.d_k, sh.d_v, eps, d_S,
                    bf16, S_stride, r.d_slot, d_o, ld_o, B, NULL);
    gdn_norm_gated_rows(d_o, ld_o, d_z, ld_p, d_nw, sh.n_v, sh.d_v, eps, d_y, ld_y, d_q, B, NULL);
    for (int i = 0; i < B; i++) {
        const int64_t s = r.slot[i];
        gdn_conv(d_p + i * ld_p, d_cw, d_cs1 + s * CS_stride, C, K, d_c1 + i * ld_c, NULL);
        gdn_decode(d_c1 + i * ld_c, d_b + i * ld_p, d_a + i * ld_p, d_dt, d_sa, sh.n_k, sh.n_v,
                   sh.d_k, sh.d_v, eps, d_S1 + s * S_stride * eb, bf16, d_o1 + i * ld_o, NULL);
        gdn_norm_gated(d_o1 + i * ld_o, d_z + i * ld_p, d_nw, sh.n_v, sh.d_v, eps, d_y1 + i * ld_y,
                       d_q1 + i * qb, NULL);
    }
    float *c = gpu_host_of(d_c, B * ld_c * 4), *c1 = gpu_host_of(d_c1, B * ld_c * 4);
    float *o = gpu_host_of(d_o, B * ld_o * 4), *o1 = gpu_host_of(d_o1, B * ld_o * 4);
    float *y = gpu_host_of(d_y, B * ld_y * 4), *y1 = gpu_host_of(d_y1, B * ld_y * 4);
    int8_t *q = gpu_host_of(d_q, B * qb), *q1 = gpu_host_of(d_q1, B * qb);
    float *S = gpu_state_host(d_S, r.n_slots * S_stride, bf16);
    float *S1 = gpu_state_host(d_S1, r.n_slots * S_stride, bf16);
    float *cs = gpu_host_of(d_cs, CSb), *cs1 = gpu_host_of(d_cs1, CSb);
    float *pin = gpu_host_of(d_pin, (size_t)B * ld_p * 4), *csin = gpu_host_of(d_csin, CSb);
    if (perturb == PERTURB_OUTPUT) y[(B / 2) * ld_y + D_v / 3] += 0.01f;
    if (perturb == PERTURB_STATE) { /* a byte of a slot no row names */
        for (int s = 0; s < r.n_slots; s++)
            if (rows_of_slot(&r, s) < 0) {
                ((uint8_t *)S)[(size_t)s * S_stride * 4 + 5] ^= 1;
                break;
            }
    }

    /* the CPU twin, row by row on its slot's states */
    float *y_ref = gpu_xmalloc((size_t)B * D_v * 4), *S_ref = gpu_xmalloc(nS * 4),
          *cs_ref = gpu_xmalloc(nCS * 4), *scratch = gpu_xmalloc(ref_gdn_decode_scratch_floats(C, sh.n_v) * 4);
    char name[128];
    snprintf(name, sizeof name, "gdn rows n_k %d n_v %d d_k %d d_v %d%s B %d%s", sh.n_k, sh.n_v,
             sh.d_k, sh.d_v, bf16 ? " bf16 state" : "", B, perturb == PERTURB_OUTPUT ? " (output perturbed)"
                                : perturb == PERTURB_STATE ? " (state perturbed)" : "");
    bool ok = true;
    int bad_S = 0, bad_cs = 0;
    for (int i = 0; i < B; i++) {
        const int64_t s = r.slot[i];
        const float *pi = p + i * ld_p;
        memcpy(S_ref, S0 + s * S_stride, nS * 4);
        memcpy(cs_ref, cs0 + s * CS_stride, nCS * 4);
        ref_gdn_decode(pi, pi + C, pi + C + D_v, pi + C + D_v + sh.n_v, conv_w, dt, ssm_a, norm_w,
                       sh.n_k, sh.n_v, sh.d_k, sh.d_v, K, eps, cs_ref, S_ref, bf16,
                       y_ref + (size_t)i * D_v, scratch);
        bad_S += !gpu_parity_check("  state S", S + s * S_stride, S_ref, nS, 1e-5,
                                   bf16 ? 1e-2 : 1e-4, bf16 ? 1e-7 : 1e-9, true, NULL);
        bad_cs += !gpu_parity_check("  conv state", cs + s * CS_stride, cs_ref, nCS, 0, 0, 0, true, NULL);
    }
    if (bad_S || bad_cs) printf("  %s: S of %d rows, conv state of %d rows off the twin\n", name, bad_S, bad_cs);
    ok &= !bad_S && !bad_cs;
    ok &= rows_parity(name, y, ld_y, y_ref, D_v, B, 2e-4, 2e-4, 1e-8);
    for (int i = 0; i < B; i++) ok &= gpu_check_q8_of(name, y + i * ld_y, q + i * qb, D_v);
    ok &= same_rows("  conv out", c, c1, B, (size_t)C * 4, ld_c * 4);
    int bad_in = memcmp(csin, cs, CSb) != 0; /* in place: the same outputs and states */
    for (int i = 0; i < B; i++)
        bad_in += memcmp(pin + i * ld_p, c + i * ld_c, (size_t)C * 4) != 0 ||
                  memcmp(pin + i * ld_p + C, p + i * ld_p + C, (size_t)(ld_p - C) * 4) != 0;
    if (bad_in) printf("  %s: the conv in place differs from out of place (%d)\n", name, bad_in);
    ok &= bad_in == 0;
    ok &= same_rows("  delta-rule out", o, o1, B, (size_t)D_v * 4, ld_o * 4);
    ok &= same_rows("  gated norm out", y, y1, B, (size_t)D_v * 4, ld_y * 4);
    ok &= same_rows("  its Q8", q, q1, B, qb, qb);
    ok &= pad_untouched("  conv out", c, B, (size_t)C * 4, ld_c * 4);
    ok &= pad_untouched("  delta-rule out", o, B, (size_t)D_v * 4, ld_o * 4);
    ok &= pad_untouched("  gated norm out", y, B, (size_t)D_v * 4, ld_y * 4);
    float *S_init = S0, *cs_init = cs0;
    ok &= same_slots("  state S", &r, (uint8_t *)S, (uint8_t *)S1, (uint8_t *)S_init, nS * 4, S_stride * 4);
    ok &= same_slots("  conv state", &r, (uint8_t *)cs, (uint8_t *)cs1, (uint8_t *)cs_init, nCS * 4,
                     CS_stride * 4);

    cuda_free(d_cw), cuda_free(d_dt), cuda_free(d_sa), cuda_free(d_nw), cuda_free(d_p);
    cuda_free(d_S), cuda_free(d_S1), cuda_free(d_cs), cuda_free(d_cs1), cuda_free(d_c);
    cuda_free(d_c1), cuda_free(d_o), cuda_free(d_o1), cuda_free(d_y), cuda_free(d_y1);
    cuda_free(d_q), cuda_free(d_q1), cuda_free(d_pin), cuda_free(d_csin);
    free(pin), free(csin);
    free(conv_w), free(dt), free(ssm_a), free(norm_w), free(S0), free(cs0), free(p), free(c);
    free(c1), free(o), free(o1), free(y), free(y1), free(q), free(q1), free(S), free(S1), free(cs);
    free(cs1), free(y_ref), free(S_ref), free(cs_ref), free(scratch);
    rows_free(&r);
    return ok;
}

static void test_gdn_rows(void)
{
    if (!g_have_gpu) return;
    static const gdn_shape shapes[] = {{2, 4, 64, 64}, {4, 4, 32, 32}, {16, 32, 128, 128},
                                       {16, 48, 128, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int b = 0; b < N_BS; b++) {
            CU_ASSERT_TRUE(gdn_rows_case(shapes[i], g_Bs[b], false, PERTURB_NONE));
            CU_ASSERT_TRUE(gdn_rows_case(shapes[i], g_Bs[b], true, PERTURB_NONE));
        }
}

/* Runs (prefill): rows in runs of one slot through gdn_conv_runs (in place, as the forward) and
 * gdn_decode_runs, one launch of R runs (R >= n_runs: the rest empty, as a bucket's padding),
 * against the same rows fed one at a time, in order, through the B = 1 launchers: every conv and
 * delta-rule output row and every slot's final state bit-identical, slots no run names untouched.
 * With keep (verify runs, gdn.h "Keep"): every row but the last of each run of two or more rows
 * also writes its state into a keep slot of its own, which must equal the run's slot as the one
 * at a time feed left it after that row. The B = 1 launchers are checked against the CPU twin
 * above, so runs are too. */
static bool gdn_runs_case(gdn_shape sh, const int *len, int n_runs, int R, bool bf16, bool keep,
                          enum perturb perturb)
{
    const int K = 4, C = 2 * sh.n_k * sh.d_k + sh.n_v * sh.d_v, D_v = sh.n_v * sh.d_v;
    const float eps = 1e-6f;
    const int64_t nS = (int64_t)sh.n_v * sh.d_v * sh.d_k, nCS = (int64_t)C * (K - 1);
    const int64_t S_stride = nS + 64, CS_stride = nCS + 16, ld_p = C + D_v + 2 * sh.n_v + 3;
    const int64_t ld_o = D_v + 2;
    const int eb = bf16 ? 2 : 4; /* bytes of an S element on the device (gdn.h "State storage") */
    int B = 0;
    for (int r = 0; r < n_runs; r++) B += len[r];
    int32_t *slot = gpu_xmalloc((size_t)B * 4), *run = gpu_xmalloc((size_t)2 * R * 4);
    int32_t *kp = gpu_xmalloc((size_t)B * 4);
    int n_keep = 0;
    for (int r = 0, i = 0; r < n_runs; i += len[r++])
        for (int j = 0; j < len[r]; j++) kp[i + j] = keep && j + 1 < len[r] ? n_keep++ : -1;
    const int n_slots = n_runs + 3 + n_keep; /* the keep slots last */
    for (int i = 0; i < B; i++) kp[i] += kp[i] >= 0 ? n_runs + 3 : 0;
    int32_t *perm = gpu_xmalloc((size_t)n_slots * 4);
    gpu_rng_permutation(&g_rng, perm, n_runs + 3);
    gpu_runs_make(len, n_runs, R, perm, slot, run);
    float *conv_w = gpu_rand_vec(&g_rng, (int64_t)C * K, 0.5f), *dt = gpu_rand_vec(&g_rng, sh.n_v, 1.0f);
    float *ssm_a = gpu_rand_vec(&g_rng, sh.n_v, 1.0f);
    for (int h = 0; h < sh.n_v; h++) ssm_a[h] = -expf(0.5f * ssm_a[h]);
    float *S0 = gpu_rand_vec(&g_rng, n_slots * S_stride, 0.05f), *cs0 = gpu_rand_vec(&g_rng, n_slots * CS_stride, 1.0f);
    float *p = gpu_rand_vec(&g_rng, (int64_t)B * ld_p, 1.0f);
    const size_t CSb = (size_t)n_slots * CS_stride * 4;
    const size_t Pb = (size_t)B * ld_p * 4, Ob = (size_t)B * ld_o * 4;
    float *d_cw = dev_from(conv_w, (size_t)C * K * 4), *d_dt = dev_from(dt, sh.n_v * 4);
    float *d_sa = dev_from(ssm_a, sh.n_v * 4);
    int32_t *d_slot = dev_from(slot, (size_t)B * 4), *d_run = dev_from(run, (size_t)2 * R * 4);
    int32_t *d_keep = keep ? dev_from(kp, (size_t)B * 4) : NULL;
    float *d_p = dev_from(p, Pb), *d_p1 = dev_from(p, Pb);
    uint8_t *d_S = gpu_state_dev(S0, n_slots * S_stride, bf16);
    uint8_t *d_S1 = gpu_state_dev(S0, n_slots * S_stride, bf16);
    float *d_cs = dev_from(cs0, CSb), *d_cs1 = dev_from(cs0, CSb);
    float *d_o = dev_fill(SENTINEL, Ob), *d_o1 = dev_fill(SENTINEL, Ob);
    /* the conv's two builds (8 or 32 rows a run loaded ahead): the 32 one beside prompt chunks,
     * here whenever R is a multiple of 4 */
    gdn_conv_runs(d_p, ld_p, d_cw, d_cs, CS_stride, d_slot, d_run, d_keep, R % 4 == 0 ? 16 : 0, C,
                  K, d_p, ld_p, R, NULL);
    gdn_decode_runs(d_p, ld_p, d_p + C + D_v, d_p + C + D_v + sh.n_v, ld_p, d_dt, d_sa, sh.n_k,
                    sh.n_v, sh.d_k, sh.d_v, eps, d_S, bf16, S_stride, d_slot, d_run, d_keep, 0,
                    d_o, ld_o, R, NULL);
    for (int i = 0; i < B; i++) {
        const int64_t s = slot[i];
        float *pi = d_p1 + i * ld_p;
        gdn_conv(pi, d_cw, d_cs1 + s * CS_stride, C, K, pi, NULL);
        gdn_decode(pi, pi + C + D_v, pi + C + D_v + sh.n_v, d_dt, d_sa, sh.n_k, sh.n_v, sh.d_k,
                   sh.d_v, eps, d_S1 + s * S_stride * eb, bf16, d_o1 + i * ld_o, NULL);
        if (kp[i] < 0) continue; /* the reference of a kept row: the slot as it now stands */
        cuda_copy_async(d_cs1 + kp[i] * CS_stride, d_cs1 + s * CS_stride, (size_t)nCS * 4, NULL);
        cuda_copy_async(d_S1 + kp[i] * S_stride * eb, d_S1 + s * S_stride * eb, (size_t)nS * eb,
                        NULL);
    }
    float *P = gpu_host_of(d_p, Pb), *P1 = gpu_host_of(d_p1, Pb), *o = gpu_host_of(d_o, Ob);
    float *o1 = gpu_host_of(d_o1, Ob), *S = gpu_state_host(d_S, n_slots * S_stride, bf16);
    float *S1 = gpu_state_host(d_S1, n_slots * S_stride, bf16);
    float *cs = gpu_host_of(d_cs, CSb), *cs1 = gpu_host_of(d_cs1, CSb);
    if (perturb == PERTURB_OUTPUT) o[(B - 1) * ld_o + D_v / 2] += 1e-3f;
    if (perturb == PERTURB_STATE) S[(n_slots - 1) * S_stride + nS / 2] += 1e-3f; /* the last slot */
    char name[160];
    snprintf(name, sizeof name, "gdn runs n_k %d n_v %d d_k %d d_v %d%s: %d runs (%d rows, %d "
             "kept) in %d%s", sh.n_k, sh.n_v, sh.d_k, sh.d_v, bf16 ? " bf16 state" : "", n_runs, B,
             n_keep, R, perturb == PERTURB_OUTPUT  ? " (output perturbed)"
                        : perturb == PERTURB_STATE ? " (a state perturbed)"
                                                   : "");
    int bad_rows = 0, bad_slots = 0;
    for (int i = 0; i < B; i++)
        bad_rows += memcmp(P + i * ld_p, P1 + i * ld_p, (size_t)ld_p * 4) != 0 ||
                    memcmp(o + i * ld_o, o1 + i * ld_o, (size_t)D_v * 4) != 0;
    for (int s = 0; s < n_slots; s++) {
        bool named = false;
        for (int r = 0; r < n_runs; r++) named |= perm[r] == s;
        named |= s >= n_runs + 3; /* a keep slot */
        const bool same = !memcmp(S + s * S_stride, S1 + s * S_stride, (size_t)nS * 4) &&
                          !memcmp(cs + s * CS_stride, cs1 + s * CS_stride, (size_t)nCS * 4);
        const bool kept = !memcmp(S + s * S_stride, S0 + s * S_stride, (size_t)nS * 4) &&
                          !memcmp(cs + s * CS_stride, cs0 + s * CS_stride, (size_t)nCS * 4);
        bad_slots += !same || (!named && !kept);
    }
    if (bad_rows || bad_slots)
        printf("  %s: %d rows and %d slots differ from the rows fed one at a time\n", name,
               bad_rows, bad_slots);
    else
        printf("  %s: bit-identical to the rows fed one at a time\n", name);
    cuda_free(d_cw), cuda_free(d_dt), cuda_free(d_sa), cuda_free(d_slot), cuda_free(d_run);
    cuda_free(d_p), cuda_free(d_p1), cuda_free(d_S), cuda_free(d_S1), cuda_free(d_cs);
    cuda_free(d_cs1), cuda_free(d_o), cuda_free(d_o1), cuda_free(d_keep);
    free(slot), free(run), free(kp), free(perm), free(conv_w), free(dt), free(ssm_a), free(S0), free(cs0);
    free(p), free(P), free(P1), free(o), free(o1), free(S), free(S1), free(cs), free(cs1);
    return !bad_rows && !bad_slots;
}

static void test_gdn_runs(void)
{
    if (!g_have_gpu) return;
    static const int prefill[] = {200}, mixed[] = {1, 7, 1, 64, 3, 1, 65, 1},
                     decode[] = {1, 1, 1, 1, 1};
    static const int verify[] = {5, 1, 2, 4, 8, 1}; /* verify runs (k + 1 rows) beside decode rows */
    for (int bf16 = 0; bf16 < 2; bf16++) { /* S as F32, then as bf16: runs still equal rows */
        CU_ASSERT_TRUE(gdn_runs_case((gdn_shape){16, 32, 128, 128}, prefill, 1, 1, bf16, false, PERTURB_NONE));
        CU_ASSERT_TRUE(gdn_runs_case((gdn_shape){16, 32, 128, 128}, mixed, 8, 16, bf16, false, PERTURB_NONE));
        CU_ASSERT_TRUE(gdn_runs_case((gdn_shape){2, 4, 64, 64}, mixed, 8, 8, bf16, false, PERTURB_NONE));
        CU_ASSERT_TRUE(gdn_runs_case((gdn_shape){4, 4, 32, 32}, decode, 5, 8, bf16, false, PERTURB_NONE));
        CU_ASSERT_TRUE(gdn_runs_case((gdn_shape){16, 48, 128, 128}, prefill, 1, 4, bf16, false, PERTURB_NONE));
        CU_ASSERT_TRUE(gdn_runs_case((gdn_shape){16, 48, 128, 128}, verify, 6, 8, bf16, true, PERTURB_NONE));
        CU_ASSERT_TRUE(gdn_runs_case((gdn_shape){2, 4, 64, 64}, verify, 6, 8, bf16, true, PERTURB_NONE));
        CU_ASSERT_TRUE(gdn_runs_case((gdn_shape){4, 4, 32, 32}, verify, 6, 6, bf16, true, PERTURB_NONE));
    }
}

/* ---- attention: prep (norms, RoPE, KV append) and the split softmax ---- */
typedef struct attn_shape {
    int n_h, n_kv, d_h, n_rot;
} attn_shape;

static size_t kv_elem(attn_kv_type t) { return t == ATTN_KV_F32 ? 4 : 2; }
static const char *kv_name(attn_kv_type t) { return t == ATTN_KV_F32 ? "F32" : "F16"; }
static float kv_get(const uint8_t *cache, int64_t i, attn_kv_type t)
{
    return t == ATTN_KV_F32 ? ((const float *)cache)[i] : quant_f16_to_f32(((const ggml_half *)cache)[i]);
}

/* Random cache contents for every position of every slot, and random padding bytes. */
static uint8_t *random_caches(int n_slots, int64_t per_slot, size_t stride, attn_kv_type t)
{
    uint8_t *c = gpu_xmalloc((size_t)n_slots * stride);
    const size_t used = (size_t)per_slot * kv_elem(t);
    for (int s = 0; s < n_slots; s++) {
        uint8_t *at = c + (size_t)s * stride;
        for (int64_t i = 0; i < per_slot; i++) {
            const float v = 2.0f * gpu_rng_uniform(&g_rng) - 1.0f;
            if (t == ATTN_KV_F32)
                ((float *)at)[i] = v;
            else
                ((ggml_half *)at)[i] = quant_f32_to_f16(v);
        }
        for (size_t k = used; k < stride; k++) at[k] = (uint8_t)gpu_rng_u64(&g_rng);
    }
    return c;
}

/* A pool of n_blk blocks of blk bytes: to_paged: block i of the contiguous layout (slot
 * i / table_ld, block i % table_ld) goes to block table[i]; else back. A new buffer. */
static uint8_t *paged(const uint8_t *src, const int32_t *table, int n_blk, size_t blk, bool to_paged)
{
    uint8_t *dst = gpu_xmalloc((size_t)n_blk * blk);
    for (int i = 0; i < n_blk; i++) {
        if (to_paged)
            memcpy(dst + (size_t)table[i] * blk, src + (size_t)i * blk, blk);
        else
            memcpy(dst + (size_t)i * blk, src + (size_t)table[i] * blk, blk);
    }
    return dst;
}

/* attn_prep's twin checks of one row (kernels_parity's prep_case bounds, from the same
 * analysis): q out, the K and V rows at pos, every other row of the slot's cache unchanged. */
static bool prep_row_ok(const char *name, attn_shape sh, int pos, attn_kv_type kv,
                        const float *q_got, const float *q_ref, const uint8_t *kc_got,
                        const uint8_t *kc_ref, const uint8_t *vc_got, const uint8_t *vc_ref,
                        size_t slot_bytes)
{
    const int KVA = sh.n_kv * sh.d_h, HA = sh.n_h * sh.d_h;
    const size_t row = (size_t)KVA * kv_elem(kv), at = (size_t)pos * row;
    const double atol = 2e-5 + 2e-6 * pos, nmse_pos = 1e-13 * (double)pos * pos;
    float *kg = gpu_xmalloc(KVA * 4), *kr = gpu_xmalloc(KVA * 4), *vg = gpu_xmalloc(KVA * 4), *vr = gpu_xmalloc(KVA * 4);
    for (int i = 0; i < KVA; i++) {
        kg[i] = kv_get(kc_got + at, i, kv), kr[i] = kv_get(kc_ref + at, i, kv);
        vg[i] = kv_get(vc_got + at, i, kv), vr[i] = kv_get(vc_ref + at, i, kv);
    }
    bool ok = gpu_parity_check(name, q_got, q_ref, HA, atol, 1e-4, 1e-10 + nmse_pos, true, NULL);
    if (kv == ATTN_KV_F32)
        ok &= gpu_parity_check("  K row (F32)", kg, kr, KVA, atol, 1e-4, 1e-10 + nmse_pos, true, NULL);
    else /* each element within one F16 step of the twin's; one element a step (2^-10) off in
            a 96-wide row is nmse 1.1e-8 (an H100 run): a few such in the row */
        ok &= gpu_parity_check("  K row (F16)", kg, kr, KVA, 1.5 * atol, 1.1e-3,
                               5e-8 + 10 * nmse_pos, true, NULL);
    ok &= gpu_parity_check("  V row", vg, vr, KVA, 0, 0, 0, true, NULL);
    const bool rest = memcmp(kc_got, kc_ref, at) == 0 && memcmp(vc_got, vc_ref, at) == 0 &&
                      memcmp(kc_got + at + row, kc_ref + at + row, slot_bytes - at - row) == 0 &&
                      memcmp(vc_got + at + row, vc_ref + at + row, slot_bytes - at - row) == 0;
    if (!rest) printf("  %s: cache written outside row %d\n", name, pos);
    free(kg), free(kr), free(vg), free(vr);
    return ok && rest;
}

/* One step of B rows through attn_prep_rows and attn_decode_rows, the projection rows laid out
 * as the forward's: [qg (2·n_h·d_h) | k (n_kv·d_h) | v (n_kv·d_h)]. */
static bool attn_rows_case(attn_shape sh, int B, int n_ctx, attn_kv_type kv, enum perturb perturb)
{
    const int HA = sh.n_h * sh.d_h, KVA = sh.n_kv * sh.d_h;
    const float base = 1e7f, eps = 1e-6f;
    /* a slot's cache: table_ld blocks (n_ctx positions and the rest of the last block) */
    const int table_ld = (n_ctx + ATTN_KV_BLOCK - 1) / ATTN_KV_BLOCK;
    const size_t blk = (size_t)ATTN_KV_BLOCK * KVA * kv_elem(kv);
    const size_t slot_bytes = (size_t)n_ctx * KVA * kv_elem(kv), stride = table_ld * blk;
    const int64_t ld_in = 2 * HA + 2 * KVA + 3, ld_q = HA + 1, ld_o = HA + 2;
    const size_t qb = gemv_xq_bytes(HA);
    rows r;
    rows_make(&r, B, n_ctx);
    const size_t cb = (size_t)r.n_slots * stride;
    /* the batched launches read a paged cache: every block of every slot at a random place of
     * the pool (table); the B = 1 launches the contiguous one. The paged pool is made from, and
     * read back into, the contiguous layout, so every check below compares slot by slot. */
    const int n_blk = r.n_slots * table_ld;
    int32_t *table = gpu_xmalloc((size_t)n_blk * 4);
    gpu_rng_permutation(&g_rng, table, n_blk);
    int32_t *d_table = dev_from(table, (size_t)n_blk * 4);
    float *qw = gpu_rand_vec(&g_rng, sh.d_h, 0.5f), *kw = gpu_rand_vec(&g_rng, sh.d_h, 0.5f);
    for (int i = 0; i < sh.d_h; i++) qw[i] += 1.0f, kw[i] += 1.0f; /* GGUF norms hold 1 + w */
    float *p = gpu_rand_vec(&g_rng, B * ld_in, 1.0f);
    uint8_t *kc0 = random_caches(r.n_slots, (int64_t)n_ctx * KVA, stride, kv);
    uint8_t *vc0 = random_caches(r.n_slots, (int64_t)n_ctx * KVA, stride, kv);

    float *d_qw = dev_from(qw, sh.d_h * 4), *d_kw = dev_from(kw, sh.d_h * 4);
    float *d_p = dev_from(p, (size_t)B * ld_in * 4);
    uint8_t *kcp = paged(kc0, table, n_blk, blk, true), *vcp = paged(vc0, table, n_blk, blk, true);
    uint8_t *d_kc = dev_from(kcp, cb), *d_vc = dev_from(vcp, cb);
    uint8_t *d_kc1 = dev_from(kc0, cb), *d_vc1 = dev_from(vc0, cb);
    float *d_q = dev_fill(SENTINEL, B * ld_q * 4), *d_q1 = dev_fill(SENTINEL, B * ld_q * 4);
    float *d_o = dev_fill(SENTINEL, B * ld_o * 4), *d_o1 = dev_fill(SENTINEL, B * ld_o * 4);
    uint8_t *d_oq = dev_fill(SENTINEL, B * qb), *d_oq1 = dev_fill(SENTINEL, B * qb);
    float *d_part = dev(attn_partial_floats_rows(sh.n_h, sh.d_h, n_ctx, B) * 4);
    float *d_part1 = dev(attn_partial_floats(sh.n_h, sh.d_h, n_ctx) * 4);
    const float *d_k = d_p + 2 * HA, *d_v = d_k + KVA;

    attn_prep_rows(d_p, d_k, d_v, ld_in, d_qw, d_kw, sh.n_h, sh.n_kv, sh.d_h, sh.n_rot, base, eps,
                   r.d_pos, r.d_slot, d_table, table_ld, d_kc, d_vc, d_q, ld_q, kv, B, NULL);
    attn_decode_rows(d_q, ld_q, d_p, ld_in, d_kc, d_vc, r.d_slot, d_table, table_ld, r.d_pos,
                     NULL, sh.n_h, sh.n_kv, sh.d_h, n_ctx, d_part, d_o, ld_o, d_oq, kv, B, NULL);
    for (int i = 0; i < B; i++) {
        uint8_t *kc1 = d_kc1 + (size_t)r.slot[i] * stride, *vc1 = d_vc1 + (size_t)r.slot[i] * stride;
        attn_prep(d_p + i * ld_in, d_k + i * ld_in, d_v + i * ld_in, d_qw, d_kw, sh.n_h, sh.n_kv,
                  sh.d_h, sh.n_rot, base, eps, r.d_pos + i, NULL, kc1, vc1, d_q1 + i * ld_q, kv,
                  NULL);
        attn_decode(d_q1 + i * ld_q, d_p + i * ld_in, NULL, kc1, vc1, sh.n_h, sh.n_kv, sh.d_h,
                    n_ctx, r.d_pos + i, d_part1, d_o1 + i * ld_o, d_oq1 + i * qb, kv, NULL);
    }
    float *q = gpu_host_of(d_q, B * ld_q * 4), *q1 = gpu_host_of(d_q1, B * ld_q * 4);
    float *o = gpu_host_of(d_o, B * ld_o * 4), *o1 = gpu_host_of(d_o1, B * ld_o * 4);
    int8_t *oq = gpu_host_of(d_oq, B * qb), *oq1 = gpu_host_of(d_oq1, B * qb);
    uint8_t *kcp_got = gpu_host_of(d_kc, cb), *vcp_got = gpu_host_of(d_vc, cb);
    uint8_t *kc = paged(kcp_got, table, n_blk, blk, false), *vc = paged(vcp_got, table, n_blk, blk, false);
    uint8_t *kc1 = gpu_host_of(d_kc1, cb), *vc1 = gpu_host_of(d_vc1, cb);
    if (perturb == PERTURB_OUTPUT) o[(B / 2) * ld_o + HA / 3] += 0.01f;
    if (perturb == PERTURB_STATE) { /* a byte of a slot no row names */
        for (int s = 0; s < r.n_slots; s++)
            if (rows_of_slot(&r, s) < 0) {
                vc[(size_t)s * stride + 7] ^= 1;
                break;
            }
    }

    char name[160];
    snprintf(name, sizeof name, "attn rows n_h %d n_kv %d d_h %d n_ctx %d %s B %d%s", sh.n_h,
             sh.n_kv, sh.d_h, n_ctx, kv_name(kv), B,
             perturb == PERTURB_OUTPUT ? " (output perturbed)"
             : perturb == PERTURB_STATE ? " (cache perturbed)" : "");
    /* prep: the twin on a copy of the row's slot as it was */
    uint8_t *kc_ref = gpu_xmalloc(slot_bytes), *vc_ref = gpu_xmalloc(slot_bytes);
    float *q_ref = gpu_xmalloc(HA * 4);
    int bad_prep = 0;
    for (int i = 0; i < B; i++) {
        const size_t at = (size_t)r.slot[i] * stride;
        memcpy(kc_ref, kc0 + at, slot_bytes), memcpy(vc_ref, vc0 + at, slot_bytes);
        const float *pi = p + i * ld_in;
        ref_attn_prep(pi, pi + 2 * HA, pi + 2 * HA + KVA, qw, kw, sh.n_h, sh.n_kv, sh.d_h, sh.n_rot,
                      base, eps, &r.pos[i], kc_ref, vc_ref, q_ref, kv);
        char row_name[192];
        snprintf(row_name, sizeof row_name, "  %s: attn_prep row %d (pos %d)", name, i, r.pos[i]);
        bad_prep += !prep_row_ok(row_name, sh, r.pos[i], kv, q + i * ld_q, q_ref, kc + at, kc_ref,
                                 vc + at, vc_ref, slot_bytes);
    }
    if (bad_prep) printf("  %s: attn_prep off the twin in %d rows\n", name, bad_prep);
    bool ok = bad_prep == 0;
    /* decode: the twin on the GPU's q and cache (what prep wrote is checked above) */
    float *o_ref = gpu_xmalloc((size_t)B * HA * 4), *scores = gpu_xmalloc(REF_ATTN_BLOCK * 4);
    float *kf = gpu_xmalloc((size_t)n_ctx * KVA * 4), *vf = gpu_xmalloc((size_t)n_ctx * KVA * 4);
    for (int i = 0; i < B; i++) {
        const int n = r.pos[i] + 1;
        const uint8_t *ks = kc + (size_t)r.slot[i] * stride, *vs = vc + (size_t)r.slot[i] * stride;
        for (int64_t e = 0; e < (int64_t)n * KVA; e++) kf[e] = kv_get(ks, e, kv), vf[e] = kv_get(vs, e, kv);
        float *oi = o_ref + (size_t)i * HA;
        ref_attn_decode(q + i * ld_q, kf, vf, n, sh.n_h, sh.n_kv, sh.d_h,
                        1.0f / sqrtf((float)sh.d_h), scores, oi);
        for (int h = 0; h < sh.n_h; h++)
            ref_sigmoid_gate(oi + h * sh.d_h, p + i * ld_in + h * 2 * sh.d_h + sh.d_h, sh.d_h);
    }
    const double f = kv == ATTN_KV_F32 ? 0.5 : 1.0;
    ok &= rows_parity(name, o, ld_o, o_ref, HA, B, f * 1e-4, f * 1e-3, f * 1e-8);
    for (int i = 0; i < B; i++) ok &= gpu_check_q8_of(name, o + i * ld_o, oq + i * qb, HA);
    ok &= same_rows("  q out", q, q1, B, (size_t)HA * 4, ld_q * 4);
    ok &= same_rows("  o", o, o1, B, (size_t)HA * 4, ld_o * 4);
    ok &= same_rows("  its Q8", oq, oq1, B, qb, qb);
    ok &= pad_untouched("  q out", q, B, (size_t)HA * 4, ld_q * 4);
    ok &= pad_untouched("  o", o, B, (size_t)HA * 4, ld_o * 4);
    ok &= same_slots("  K cache", &r, kc, kc1, kc0, slot_bytes, stride);
    ok &= same_slots("  V cache", &r, vc, vc1, vc0, slot_bytes, stride);

    cuda_free(d_table), free(table), free(kcp), free(vcp), free(kcp_got), free(vcp_got);
    cuda_free(d_qw), cuda_free(d_kw), cuda_free(d_p), cuda_free(d_kc), cuda_free(d_vc);
    cuda_free(d_kc1), cuda_free(d_vc1), cuda_free(d_q), cuda_free(d_q1), cuda_free(d_o);
    cuda_free(d_o1), cuda_free(d_oq), cuda_free(d_oq1), cuda_free(d_part), cuda_free(d_part1);
    free(qw), free(kw), free(p), free(kc0), free(vc0), free(q), free(q1), free(o), free(o1);
    free(oq), free(oq1), free(kc), free(vc), free(kc1), free(vc1), free(kc_ref), free(vc_ref);
    free(q_ref), free(o_ref), free(scores), free(kf), free(vf);
    rows_free(&r);
    return ok;
}

static void test_attn_rows(void)
{
    if (!g_have_gpu) return;
    /* G = n_h / n_kv 2, 1, 8; the 27B; the 4B (and 0.8B-9B: G 4, d_h 256) */
    static const attn_shape shapes[] = {{4, 2, 64, 16}, {3, 3, 32, 16}, {8, 1, 256, 64},
                                        {24, 4, 256, 64}, {16, 4, 256, 64}};
    for (int t = 0; t < 2; t++) {
        const attn_kv_type kv = t ? ATTN_KV_F32 : ATTN_KV_F16;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int b = 0; b < N_BS; b++)
                CU_ASSERT_TRUE(attn_rows_case(shapes[i], g_Bs[b], shapes[i].d_h == 256 ? 640 : 300,
                                              kv, PERTURB_NONE));
    }
    /* the 27B with more chunks than a row's chunk CTAs (each loops over several): 4K at B 17,
     * 32K at B 5 (rows at 33, 0, 31, 32 and 32767) */
    CU_ASSERT_TRUE(attn_rows_case(shapes[3], 17, 4096, ATTN_KV_F16, PERTURB_NONE));
    /* n_h · n_split odd (3 x 9) at d_h 128: each row's partials still 16-byte aligned for the
     * merge's float4 loads */
    CU_ASSERT_TRUE(attn_rows_case((attn_shape){3, 1, 128, 32}, 17, 270, ATTN_KV_F16, PERTURB_NONE));
    CU_ASSERT_TRUE(attn_rows_case((attn_shape){3, 1, 128, 32}, 3, 270, ATTN_KV_F32, PERTURB_NONE));
    CU_ASSERT_TRUE(attn_rows_case(shapes[3], 5, 32768, ATTN_KV_F16, PERTURB_NONE));
    /* super-chunks of 160 positions (70,000: 2,188 chunks, 5 a super-chunk, 438 partials; one
     * spans KV blocks) and of 512 (262,144: the 27B's whole context; rows at 33, 0, 31, 32 and
     * 262,143) */
    CU_ASSERT_TRUE(attn_rows_case(shapes[0], 17, 70000, ATTN_KV_F16, PERTURB_NONE));
    CU_ASSERT_TRUE(attn_rows_case(shapes[0], 3, 70000, ATTN_KV_F32, PERTURB_NONE));
    CU_ASSERT_TRUE(attn_rows_case((attn_shape){8, 2, 64, 16}, 5, 262144, ATTN_KV_F16, PERTURB_NONE));
}

static void test_perturbed_fails(void)
{
    if (!g_have_gpu) return;
    CU_ASSERT_FALSE(norm_rows_case(1024, 17, PERTURB_OUTPUT));
    CU_ASSERT_FALSE(gdn_rows_case((gdn_shape){2, 4, 64, 64}, 17, false, PERTURB_OUTPUT));
    CU_ASSERT_FALSE(gdn_rows_case((gdn_shape){2, 4, 64, 64}, 17, false, PERTURB_STATE));
    CU_ASSERT_FALSE(gdn_rows_case((gdn_shape){2, 4, 64, 64}, 17, true, PERTURB_STATE));
    static const int runs[] = {3, 9};
    CU_ASSERT_FALSE(gdn_runs_case((gdn_shape){2, 4, 64, 64}, runs, 2, 2, false, false, PERTURB_OUTPUT));
    CU_ASSERT_FALSE(gdn_runs_case((gdn_shape){2, 4, 64, 64}, runs, 2, 2, true, false, PERTURB_OUTPUT));
    CU_ASSERT_FALSE(gdn_runs_case((gdn_shape){2, 4, 64, 64}, runs, 2, 2, false, true, PERTURB_STATE));
    CU_ASSERT_FALSE(attn_rows_case((attn_shape){4, 2, 64, 16}, 17, 300, ATTN_KV_F16, PERTURB_OUTPUT));
    CU_ASSERT_FALSE(attn_rows_case((attn_shape){4, 2, 64, 16}, 17, 300, ATTN_KV_F32, PERTURB_STATE));
}

/* ---- launch grids against the device limits (no GPU needed) ---- */
static bool dims_ok(const char *what, cuda_launch_dims d, int B, unsigned row_dim)
{
    const bool ok = d.grid_x >= 1 && d.grid_x <= 2147483647u && d.grid_y >= 1 &&
                    d.grid_y <= 65535 && d.grid_z >= 1 && d.grid_z <= 65535 && d.block >= 32 &&
                    d.block <= 1024 && d.block % 32 == 0 && row_dim == (unsigned)B;
    if (!ok)
        printf("  %s B %d: grid (%u, %u, %u) x %u threads outside the limits or not B rows\n", what,
               B, d.grid_x, d.grid_y, d.grid_z, d.block);
    return ok;
}

typedef struct model_shape {
    const char *name;
    int H, n_k, n_v, d_k, d_v, n_h, n_kv, d_h;
} model_shape;

static void test_launch_dims(void)
{
    static const model_shape models[] = {
        {"0.8B", 1024, 16, 16, 128, 128, 8, 2, 256},
        {"4B", 2560, 16, 32, 128, 128, 16, 4, 256},
        {"27B", 5120, 16, 48, 128, 128, 24, 4, 256},
    };
    static const int Bs[] = {1, 2, 3, 17, 64, 255, 256, 65535};
    static const int ctxs[] = {1, 31, 32, 33, 4096, 32768, 262144};
    int n_bad = 0;
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        const model_shape *s = &models[m];
        const int C = 2 * s->n_k * s->d_k + s->n_v * s->d_v;
        for (size_t b = 0; b < sizeof Bs / sizeof Bs[0]; b++) {
            const int B = Bs[b];
            cuda_launch_dims d = norm_rms_rows_dims(s->H, B);
            n_bad += !dims_ok("norm_rms_rows", d, B, d.grid_x);
            d = gdn_conv_rows_dims(C, B);
            n_bad += !dims_ok("gdn_conv_rows", d, B, d.grid_y);
            d = gdn_decode_rows_dims(s->n_v, s->d_v, B);
            n_bad += !dims_ok("gdn_decode_rows", d, B, d.grid_z);
            n_bad += d.grid_x != (unsigned)s->n_v || s->d_v % d.grid_y != 0; /* whole heads, columns */
            d = gdn_norm_gated_rows_dims(s->n_v, s->d_v, B);
            n_bad += !dims_ok("gdn_norm_gated_rows", d, B, d.grid_y);
            d = attn_prep_rows_dims(s->n_h, s->n_kv, s->d_h, B);
            n_bad += !dims_ok("attn_prep_rows", d, B, d.grid_y);
            for (size_t c = 0; c < sizeof ctxs / sizeof ctxs[0]; c++) {
                const int n_ctx = ctxs[c], n_split = attn_n_split(n_ctx);
                /* the partials bounded (super-chunks, attn.h); plain chunks up to 16K */
                n_bad += n_split < 1 || n_split > ATTN_MAX_SPLITS ||
                         (int64_t)n_split * attn_split_positions(n_ctx) < n_ctx ||
                         (n_ctx <= 16384) != (attn_split_positions(n_ctx) == ATTN_CHUNK);
                cuda_launch_dims ds, dc;
                attn_decode_rows_dims(s->n_h, s->n_kv, s->d_h, n_ctx, B, &ds, &dc);
                n_bad += !dims_ok("attn_decode_rows (split)", ds, B, ds.grid_z);
                n_bad += !dims_ok("attn_decode_rows (combine)", dc, B, dc.grid_y);
                /* every chunk at B = 1 (the launch B = 1 always had), never more chunk CTAs than
                 * chunks, and at large B a bounded grid whatever n_ctx */
                const bool split_ok =
                    ds.grid_x == (unsigned)s->n_kv && ds.grid_y <= (unsigned)n_split &&
                    (B > 1 || ds.grid_y == (unsigned)n_split) &&
                    (B == 1 || (uint64_t)ds.grid_x * ds.grid_y * ds.grid_z <=
                                   (uint64_t)16384 + (uint64_t)s->n_kv * B) &&
                    dc.grid_x == (unsigned)(B == 1 ? s->n_h * (s->d_h / 32) : s->n_h) &&
                    dc.block == (unsigned)s->d_h;
                if (!split_ok)
                    printf("  %s attn_decode_rows B %d n_ctx %d: split grid (%u, %u, %u)\n",
                           s->name, B, n_ctx, ds.grid_x, ds.grid_y, ds.grid_z);
                n_bad += !split_ok;
                n_bad += attn_partial_floats_rows(s->n_h, s->d_h, n_ctx, B) !=
                         (int64_t)B * attn_partial_floats(s->n_h, s->d_h, n_ctx);
            }
        }
    }
    n_bad += attn_split_positions(16385) != 64 || attn_split_positions(70000) != 160 ||
             attn_split_positions(262144) != 512 || attn_n_split(262144) != 512 ||
             attn_n_split(70000) != 438;
    printf("launch grids of the rows kernels: %d outside the limits\n", n_bad);
    CU_ASSERT_EQUAL(n_bad, 0);
    /* the check itself can fail */
    CU_ASSERT_FALSE(dims_ok("(deliberately out of range)", (cuda_launch_dims){1, 65536, 1, 256}, 1, 1));
    CU_ASSERT_FALSE(dims_ok("(deliberately not B rows)", (cuda_launch_dims){1, 1, 3, 256}, 4, 3));
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("rows kernel parity on the GPU");
    gpu_rng_seed(&g_rng, 13);
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("rows_parity", NULL, NULL);
    CU_add_test(s, "launch_dims", test_launch_dims);
    CU_add_test(s, "norm_rows", test_norm_rows);
    CU_add_test(s, "gdn_rows", test_gdn_rows);
    CU_add_test(s, "gdn_runs", test_gdn_runs);
    CU_add_test(s, "attn_rows", test_attn_rows);
    CU_add_test(s, "perturbed_fails", test_perturbed_fails);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
