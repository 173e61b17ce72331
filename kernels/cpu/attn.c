#include "kernels/cpu/attn.h"

#include <math.h>

#include "common/status.h"
#include "kernels/cpu/matmul.h"

void ref_attn_head(const float *q, const float *k, const float *v, long ld, int n, int d_h,
                   float scale, float *scores, float *o)
{
    DS_ASSERT(n >= 1);
    float m = -INFINITY; /* running max of the scores seen */
    double l = 0;        /* running Σ e^{s - m} */
    for (int c = 0; c < d_h; c++) o[c] = 0;
    for (int t0 = 0; t0 < n; t0 += REF_ATTN_BLOCK) {
        int nb = n - t0 < REF_ATTN_BLOCK ? n - t0 : REF_ATTN_BLOCK;
        float bm = -INFINITY;
        for (int t = 0; t < nb; t++) {
            scores[t] = ref_dot_f32(q, k + (t0 + t) * ld, d_h) * scale;
            if (scores[t] > bm) bm = scores[t];
        }
        if (bm > m) { /* rescale what was accumulated under the old max */
            float r = expf(m - bm);
            l *= r;
            for (int c = 0; c < d_h; c++) o[c] *= r;
            m = bm;
        }
        for (int t = 0; t < nb; t++) {
            float p = expf(scores[t] - m);
            l += p;
            const float *vt = v + (t0 + t) * ld;
            for (int c = 0; c < d_h; c++) o[c] += p * vt[c];
        }
    }
    float inv = (float)(1.0 / l);
    for (int c = 0; c < d_h; c++) o[c] *= inv;
}

void ref_attn_decode(const float *q, const float *k_cache, const float *v_cache, int n, int n_h,
                     int n_kv, int d_h, float scale, float *scores, float *o)
{
    int group = n_h / n_kv;
    long ld = (long)n_kv * d_h;
    for (int h = 0; h < n_h; h++) {
        int kvh = h / group;
        ref_attn_head(q + (long)h * d_h, k_cache + (long)kvh * d_h, v_cache + (long)kvh * d_h,
                      ld, n, d_h, scale, scores, o + (long)h * d_h);
    }
}
