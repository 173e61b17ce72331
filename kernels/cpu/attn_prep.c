/* ref_attn_prep: the CPU twin of attn_prep (kernels/cuda/attn.h), built from the steps the CPU
 * forward (model/forward_attn.c) takes for one row, so the two can only differ by an F16
 * cache: ref_rmsnorm per q head, ref_rmsnorm + ref_rope per k head, ref_rope on the queries,
 * K and V into row *pos, as computed (F32) or rounded to F16 (round to nearest even, as
 * __float2half). */
#include "kernels/cpu/attn.h"

#include <stdint.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

void ref_attn_prep(const float *qg, const float *k, const float *v, const float *q_norm_w,
                   const float *k_norm_w, int n_h, int n_kv, int d_h, int n_rot,
                   float rope_base, float eps, const int32_t *pos, void *k_cache, void *v_cache,
                   float *q_out, attn_kv_type kv_type)
{
    DS_ASSERT(d_h > 0 && d_h <= REF_ATTN_PREP_MAX_D_H && n_rot <= d_h && n_rot % 2 == 0);
    DS_ASSERT(*pos >= 0);
    DS_ASSERT(kv_type == ATTN_KV_F16 || kv_type == ATTN_KV_F32);
    const int p = *pos;
    /* queries: the first d_h of each head's [q | gate] rows */
    for (int h = 0; h < n_h; h++)
        ref_rmsnorm(qg + (long)h * 2 * d_h, q_norm_w, d_h, eps, q_out + (long)h * d_h);
    ref_rope(q_out, n_h, d_h, n_rot, p, rope_base);
    /* keys and values of row p: [n_kv][d_h] */
    const int64_t row = (int64_t)p * n_kv * d_h;
    float kh[REF_ATTN_PREP_MAX_D_H]; /* one key head after norm + rope (k is the caller's) */
    for (int j = 0; j < n_kv; j++) {
        const long off = (long)j * d_h;
        ref_rmsnorm(k + off, k_norm_w, d_h, eps, kh);
        ref_rope(kh, 1, d_h, n_rot, p, rope_base);
        if (kv_type == ATTN_KV_F32) {
            memcpy((float *)k_cache + row + off, kh, sizeof(float) * d_h);
            memcpy((float *)v_cache + row + off, v + off, sizeof(float) * d_h);
            continue;
        }
        ggml_half *kc = (ggml_half *)k_cache + row + off, *vc = (ggml_half *)v_cache + row + off;
        for (int t = 0; t < d_h; t++) {
            kc[t] = quant_f32_to_f16(kh[t]);
            vc[t] = quant_f32_to_f16(v[off + t]);
        }
    }
}
