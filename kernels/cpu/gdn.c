/* Gated DeltaNet reference kernels; see gdn.h. */
#include "kernels/cpu/gdn.h"

#include <math.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cpu/act.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"

#define MAX_K_CONV 16

void ref_gdn_conv(const float *x, long ldx, int T, int C, int K_conv, const float *w,
                  float *state, float *y)
{
    DS_ASSERT(K_conv >= 1 && K_conv <= MAX_K_CONV && T >= 1);
    int ks = K_conv - 1; /* state columns */
    /* window index m in [0, ks + T): m < ks -> state column m, else token m - ks. Token-major
     * loops so that x and y rows are read and written contiguously. */
    for (int t = 0; t < T; t++) {
        float *yt = y + (long)t * C;
        for (int c = 0; c < C; c++) yt[c] = 0;
        for (int i = 0; i < K_conv; i++) {
            int m = t + i;
            if (m < ks) {
                for (int c = 0; c < C; c++) yt[c] += w[(long)c * K_conv + i] * state[(long)c * ks + m];
            } else {
                const float *xm = x + (long)(m - ks) * ldx;
                for (int c = 0; c < C; c++) yt[c] += w[(long)c * K_conv + i] * xm[c];
            }
        }
        for (int c = 0; c < C; c++) yt[c] = ref_silu(yt[c]);
    }
    for (int c = 0; c < C; c++) {
        float *sc = state + (long)c * ks, ns[MAX_K_CONV];
        for (int m = 0; m < ks; m++) {
            int src = T + m;
            ns[m] = src < ks ? sc[src] : x[(long)(src - ks) * ldx + c];
        }
        memcpy(sc, ns, sizeof(float) * (size_t)ks);
    }
}

void ref_gdn_qk_norm(float *y, int n_k, int d_k, float eps)
{
    float qs = 1.0f / sqrtf((float)d_k);
    for (int h = 0; h < n_k; h++) {
        ref_l2norm(y + (long)h * d_k, d_k, eps, qs);
        ref_l2norm(y + (long)(n_k + h) * d_k, d_k, eps, 1.0f);
    }
}

void ref_gdn_gates(const float *b, const float *a, const float *dt_bias, const float *ssm_a,
                   int n_v, float *beta, float *g)
{
    for (int h = 0; h < n_v; h++) {
        beta[h] = ref_sigmoid(b[h]);
        g[h] = ssm_a[h] * ref_softplus(a[h] + dt_bias[h]);
    }
}

void ref_gdn_step(const float *q, const float *k, const float *v, float beta, float g, int d_k,
                  int d_v, float *S, float *o)
{
    float decay = expf(g);
    for (int j = 0; j < d_v; j++) {
        float *s = S + (long)j * d_k;               /* column j of HF's S: s[i] = S[i][j] */
        float u = ref_scale_dot_f32(s, decay, k, d_k); /* s *= e^g; u = s·k */
        float delta = beta * (v[j] - u);
        o[j] = ref_axpy_dot_f32(s, delta, k, q, d_k); /* s += δ k; o = s·q */
    }
}

void ref_gdn_round_bf16(float *S, long n)
{
    for (long i = 0; i < n; i++) S[i] = quant_bf16_to_f32(quant_f32_to_bf16(S[i]));
}

void ref_gdn_recurrent(int T, const float *q, const float *k, long ld_qk, const float *v,
                       long ld_v, const float *beta, const float *g, long ld_g, int d_k, int d_v,
                       float *S, bool bf16, float *o, long ld_o)
{
    for (int t = 0; t < T; t++) {
        ref_gdn_step(q + t * ld_qk, k + t * ld_qk, v + t * ld_v, beta[t * ld_g], g[t * ld_g],
                     d_k, d_v, S, o + t * ld_o);
        if (bf16) ref_gdn_round_bf16(S, (long)d_v * d_k);
    }
}

long ref_gdn_chunked_scratch_floats(int d_k, int d_v)
{
    const long L = REF_GDN_CHUNK;
    return L + 2 * L * L + L * d_v + L * d_k;
}

/* One chunk of n <= REF_GDN_CHUNK tokens (docs/QWEN35.md §3, local indices i, j in [0, n)). */
static void gdn_chunk(int n, const float *q, const float *k, long ld_qk, const float *v,
                      long ld_v, const float *beta, const float *g, long ld_g, int d_k, int d_v,
                      float *S, float *o, long ld_o, float *scratch)
{
    const int L = REF_GDN_CHUNK;
    float *gam = scratch;          /* [L] cumulative log decay γ_i */
    float *M = gam + L;            /* [L][L] β_i (k_i·k_j) e^{γ_i−γ_j}, i > j */
    float *A = M + L * L;          /* [L][L] (q_i·k_j) e^{γ_i−γ_j}, i >= j */
    float *U = A + L * L;          /* [L][d_v] U, then Ũ = U − W·S */
    float *W = U + (long)L * d_v;  /* [L][d_k] W, later e^{γ_last−γ_i} k_i */

    float acc = 0;
    for (int i = 0; i < n; i++) gam[i] = acc += g[i * ld_g];

    for (int i = 0; i < n; i++) {
        const float *ki = k + i * ld_qk, *qi = q + i * ld_qk;
        float bi = beta[i * ld_g];
        for (int j = 0; j < i; j++)
            M[i * L + j] = bi * ref_dot_f32(ki, k + j * ld_qk, d_k) * expf(gam[i] - gam[j]);
        for (int j = 0; j <= i; j++)
            A[i * L + j] = ref_dot_f32(qi, k + j * ld_qk, d_k) * expf(gam[i] - gam[j]);
    }
    /* Forward substitution with the unit lower-triangular (I + M):
     * U_i = β_i v_i − Σ_{j<i} M_ij U_j,   W_i = β_i e^{γ_i} k_i − Σ_{j<i} M_ij W_j. */
    for (int i = 0; i < n; i++) {
        float bi = beta[i * ld_g], be = bi * expf(gam[i]);
        float *Ui = U + (long)i * d_v, *Wi = W + (long)i * d_k;
        const float *vi = v + i * ld_v, *ki = k + i * ld_qk;
        for (int c = 0; c < d_v; c++) Ui[c] = bi * vi[c];
        for (int c = 0; c < d_k; c++) Wi[c] = be * ki[c];
        for (int j = 0; j < i; j++) {
            float m = M[i * L + j];
            ref_axpy_f32(Ui, -m, U + (long)j * d_v, d_v);
            ref_axpy_f32(Wi, -m, W + (long)j * d_k, d_k);
        }
    }
    /* Ũ_i = U_i − W_i·S and the inter-chunk output e^{γ_i} q_i·S, both with the incoming S. */
    for (int i = 0; i < n; i++) {
        float *Ui = U + (long)i * d_v, *oi = o + i * ld_o;
        const float *Wi = W + (long)i * d_k, *qi = q + i * ld_qk;
        float eg = expf(gam[i]);
        for (int c = 0; c < d_v; c++) {
            const float *s = S + (long)c * d_k;
            Ui[c] -= ref_dot_f32(Wi, s, d_k);
            oi[c] = eg * ref_dot_f32(qi, s, d_k);
        }
    }
    /* Intra-chunk part: O_i += Σ_{j<=i} A_ij Ũ_j. */
    for (int i = 0; i < n; i++) {
        float *oi = o + i * ld_o;
        for (int j = 0; j <= i; j++) ref_axpy_f32(oi, A[i * L + j], U + (long)j * d_v, d_v);
    }
    /* S ← e^{γ_last} S + Σ_i (e^{γ_last−γ_i} k_i) Ũ_iᵀ   (column c of S: s[a] += kd_i[a] Ũ_i[c]) */
    float glast = gam[n - 1], elast = expf(glast);
    for (int i = 0; i < n; i++) {
        float e = expf(glast - gam[i]);
        const float *ki = k + i * ld_qk;
        float *kd = W + (long)i * d_k;
        for (int a = 0; a < d_k; a++) kd[a] = e * ki[a];
    }
    for (int c = 0; c < d_v; c++) {
        float *s = S + (long)c * d_k;
        ref_scale_f32(s, elast, d_k);
        for (int i = 0; i < n; i++) ref_axpy_f32(s, U[(long)i * d_v + c], W + (long)i * d_k, d_k);
    }
}

void ref_gdn_chunked(int T, const float *q, const float *k, long ld_qk, const float *v,
                     long ld_v, const float *beta, const float *g, long ld_g, int d_k, int d_v,
                     float *S, bool bf16, float *o, long ld_o, float *scratch)
{
    for (int t0 = 0; t0 < T; t0 += REF_GDN_CHUNK) {
        int n = T - t0 < REF_GDN_CHUNK ? T - t0 : REF_GDN_CHUNK;
        gdn_chunk(n, q + t0 * ld_qk, k + t0 * ld_qk, ld_qk, v + t0 * ld_v, ld_v,
                  beta + t0 * ld_g, g + t0 * ld_g, ld_g, d_k, d_v, S, o + t0 * ld_o, ld_o,
                  scratch);
        if (bf16) ref_gdn_round_bf16(S, (long)d_v * d_k);
    }
}

long ref_gdn_decode_scratch_floats(int C, int n_v) { return C + 2L * n_v; }

void ref_gdn_decode(const float *mixed, const float *z, const float *b, const float *a,
                    const float *conv_w, const float *dt_bias, const float *ssm_a,
                    const float *norm_w, int n_k, int n_v, int d_k, int d_v, int K_conv,
                    float eps, float *conv_state, float *S, bool bf16, float *y, float *scratch)
{
    int C = 2 * n_k * d_k + n_v * d_v;
    float *cy = scratch, *beta = scratch + C, *g = beta + n_v;
    ref_gdn_conv(mixed, C, 1, C, K_conv, conv_w, conv_state, cy);
    ref_gdn_qk_norm(cy, n_k, d_k, eps);
    ref_gdn_gates(b, a, dt_bias, ssm_a, n_v, beta, g);
    const float *q = cy, *k = cy + n_k * d_k, *v = cy + 2 * n_k * d_k;
    for (int hv = 0; hv < n_v; hv++) {
        int kh = hv % n_k;
        ref_gdn_step(q + kh * d_k, k + kh * d_k, v + hv * d_v, beta[hv], g[hv], d_k, d_v,
                     S + (long)hv * d_v * d_k, y + hv * d_v);
        if (bf16) ref_gdn_round_bf16(S + (long)hv * d_v * d_k, (long)d_v * d_k);
        ref_rmsnorm_gated(y + hv * d_v, z + hv * d_v, norm_w, d_v, eps);
    }
}
