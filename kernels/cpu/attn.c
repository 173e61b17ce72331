#include "kernels/cpu/attn.h"

#include <math.h>

#include "common/status.h"
#include "kernels/cpu/matmul.h"

void ref_attn_head_paged(const float *q, const float *k, const float *v, const int32_t *table,
                         int block_tokens, long block_ld, long ld, int n, int d_h, float scale,
                         float *scores, float *o)
{
    DS_ASSERT(n >= 1 && block_tokens >= 1);
    float m = -INFINITY; /* running max of the scores seen */
    double l = 0;        /* running Σ e^{s - m} */
    for (int c = 0; c < d_h; c++) o[c] = 0;
    for (int t0 = 0; t0 < n; t0 += REF_ATTN_BLOCK) {
        int nb = n - t0 < REF_ATTN_BLOCK ? n - t0 : REF_ATTN_BLOCK;
        float bm = -INFINITY;
        for (int t = 0; t < nb; t++) {
            const int p = t0 + t;
            const long row = (long)table[p / block_tokens] * block_ld + (long)(p % block_tokens) * ld;
            scores[t] = ref_dot_f32(q, k + row, d_h) * scale;
            if (scores[t] > bm) bm = scores[t];
        }
        if (bm > m) { /* rescale what was accumulated under the old max */
            float r = expf(m - bm);
            l *= r;
            for (int c = 0; c < d_h; c++) o[c] *= r;
            m = bm;
        }
        for (int t = 0; t < nb; t++) {
            const int p = t0 + t;
            float pr = expf(scores[t] - m);
            l += pr;
            const float *vt = v + (long)table[p / block_tokens] * block_ld +
                              (long)(p % block_tokens) * ld;
            for (int c = 0; c < d_h; c++) o[c] += pr * vt[c];
        }
    }
    float inv = (float)(1.0 / l);
    for (int c = 0; c < d_h; c++) o[c] *= inv;
}

void ref_attn_head(const float *q, const float *k, const float *v, long ld, int n, int d_h,
                   float scale, float *scores, float *o)
{
    const int32_t one_block = 0;
    ref_attn_head_paged(q, k, v, &one_block, n, 0, ld, n, d_h, scale, scores, o);
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
