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
        /* position t0 + t lies at row `at` of table entry `blk`; both walk forward */
        int blk = t0 / block_tokens, at = t0 % block_tokens;
        for (int t = 0; t < nb; t++) {
            scores[t] = ref_dot_f32(q, k + (long)table[blk] * block_ld + (long)at * ld, d_h) * scale;
            if (scores[t] > bm) bm = scores[t];
            if (++at == block_tokens) at = 0, blk++;
        }
        if (bm > m) { /* rescale what was accumulated under the old max */
            float r = expf(m - bm);
            l *= r;
            for (int c = 0; c < d_h; c++) o[c] *= r;
            m = bm;
        }
        blk = t0 / block_tokens, at = t0 % block_tokens;
        for (int t = 0; t < nb; t++) {
            float p = expf(scores[t] - m);
            l += p;
            const float *vt = v + (long)table[blk] * block_ld + (long)at * ld;
            for (int c = 0; c < d_h; c++) o[c] += p * vt[c];
            if (++at == block_tokens) at = 0, blk++;
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
