/* Weight values of synthetic models (synth.h): a counter-based RNG (splitmix64 of key + counter)
 * so any range of rows can be generated independently, and generators that write valid
 * Q8_0 / Q4_K / Q6_K blocks directly with dequantised values of the intended scale. */
#include <math.h>
#include <string.h>

#include "common/splitmix64.h"
#include "gguf/quant.h"
#include "gguf/synth.h"

/* Word number ctr of the stream of key: splitmix64 jumped straight to position ctr. */
static inline uint64_t rng_word(uint64_t key, uint64_t ctr)
{
    return splitmix64_mix(key + (ctr + 1) * SPLITMIX64_GOLDEN);
}

/* Approximately standard normal from one word: Irwin-Hall sum of four 16-bit uniforms
 * (mean 4 * 32767.5, sd sqrt(4 * (65536^2 - 1) / 12) = 37837.23), bounded to +-3.46. */
static inline float rng_gauss(uint64_t w)
{
    uint32_t s = (uint32_t)(w & 0xFFFF) + (uint32_t)((w >> 16) & 0xFFFF) +
                 (uint32_t)((w >> 32) & 0xFFFF) + (uint32_t)(w >> 48);
    return ((float)s - 131070.0f) * (1.0f / 37837.23f);
}

/* Uniform in [0, 1) from the top 24 bits of a word. */
static inline float rng_unit(uint64_t w) { return (float)(w >> 40) * (1.0f / 16777216.0f); }

uint64_t synth_fill_key(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    return splitmix64_mix(splitmix64_mix(seed * SPLITMIX64_GOLDEN + 0x5EED) ^ h);
}

/* Standard deviation intended for a matmul weight with rows of n_in elements. */
static float matmul_sigma(const synth_tensor *t) { return 1.0f / sqrtf((float)t->ne[0]); }

/* Values of elements [e0, e0 + n) of a non-quantised tensor, n <= PLAIN_BATCH. One loop per
 * value class so the per-element work is a hash, a sum and a multiply-add. */
#define PLAIN_BATCH 256

static void plain_values(synth_values v, float sigma, uint64_t key, uint64_t e0, uint64_t n,
                         float *y)
{
    float scale = 0, offset = 0;
    switch (v) {
    case SYNTH_VALUES_MATMUL: scale = sigma; break;
    case SYNTH_VALUES_NORM: scale = 0.05f, offset = 1.0f; break; /* GGUF 1 + w_hf, w_hf ~ 0 */
    case SYNTH_VALUES_CONV: scale = 0.2f; break;                 /* HF init bound 1/sqrt(4) */
    case SYNTH_VALUES_DT_BIAS: scale = 0.1f; break;
    case SYNTH_VALUES_SSM_A: /* -exp(A_log), A_log ~ N(0, 0.5): A in [0.18, 5.6] */
        for (uint64_t i = 0; i < n; i++) y[i] = -expf(0.5f * rng_gauss(rng_word(key, e0 + i)));
        return;
    }
    for (uint64_t i = 0; i < n; i++) y[i] = offset + scale * rng_gauss(rng_word(key, e0 + i));
}

static void fill_plain(const synth_tensor *t, uint64_t key, uint64_t row0, uint64_t n_rows,
                       void *dst)
{
    synth_values v = synth_kind_values(t->kind);
    float sigma = matmul_sigma(t);
    uint64_t n = t->ne[0] * n_rows, e0 = t->ne[0] * row0;
    float tmp[PLAIN_BATCH];
    for (uint64_t i = 0; i < n; i += PLAIN_BATCH) {
        uint64_t k = n - i < PLAIN_BATCH ? n - i : PLAIN_BATCH;
        switch (t->type) {
        case GGML_TYPE_F32: plain_values(v, sigma, key, e0 + i, k, (float *)dst + i); break;
        case GGML_TYPE_F16: {
            ggml_half *y = (ggml_half *)dst + i;
            plain_values(v, sigma, key, e0 + i, k, tmp);
            for (uint64_t j = 0; j < k; j++) y[j] = quant_f32_to_f16(tmp[j]);
            break;
        }
        case GGML_TYPE_BF16: {
            ggml_bf16 *y = (ggml_bf16 *)dst + i;
            plain_values(v, sigma, key, e0 + i, k, tmp);
            for (uint64_t j = 0; j < k; j++) y[j] = quant_f32_to_bf16(tmp[j]);
            break;
        }
        default: DS_ASSERT(0);
        }
    }
}

/* Q8_0: qs = (b0 + b1 - 255) >> 1 of two random bytes (triangular, sd 52.2), clamped to
 * [-127, 127]; d per block = sigma / 52.2 * [0.8, 1.2). Words per block: 8 for qs, 1 for d. */
#define Q8_0_WORDS 16
#define Q8_0_QS_SD 52.2f

static void fill_q8_0(block_q8_0 *y, uint64_t n_blocks, uint64_t b0, uint64_t key, float sigma)
{
    for (uint64_t k = 0; k < n_blocks; k++) {
        uint64_t ctr = (b0 + k) * Q8_0_WORDS;
        float u = rng_unit(rng_word(key, ctr + 8));
        y[k].d = quant_f32_to_f16(sigma / Q8_0_QS_SD * (0.8f + 0.4f * u));
        for (int w = 0; w < 8; w++) {
            uint64_t x = rng_word(key, ctr + (uint64_t)w);
            for (int j = 0; j < 4; j++, x >>= 16) {
                int q = ((int)(x & 0xFF) + (int)((x >> 8) & 0xFF) - 255) >> 1;
                y[k].qs[4 * w + j] = (int8_t)(q < -127 ? -127 : q);
            }
        }
    }
}

/* Q4_K: random nibbles q in [0, 15] (mean 7.5, sd 4.61); 6-bit sub-block scales sc in
 * [16, 31]; mins m = round(7.5 * sc / 4) with dmin = 4 d, so each sub-block is centred on 0
 * within 2 d; d = sigma / (4.61 * 23.5). Words per block: 16 for qs, 1 for the scales. */
#define QK_WORDS 32

static void pack_scales_k4(uint8_t out[K_SCALE_SIZE], const uint8_t sc[8], const uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        out[j] = sc[j];
        out[j + 4] = m[j];
    }
    for (int j = 4; j < 8; j++) {
        out[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
        out[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
        out[j] |= (uint8_t)((m[j] >> 4) << 6);
    }
}

static void fill_q4_K(block_q4_K *y, uint64_t n_blocks, uint64_t b0, uint64_t key, float sigma)
{
    ggml_half d = quant_f32_to_f16(sigma / (4.61f * 23.5f));
    ggml_half dmin = quant_f32_to_f16(4.0f * quant_f16_to_f32(d));
    for (uint64_t k = 0; k < n_blocks; k++) {
        uint64_t ctr = (b0 + k) * QK_WORDS;
        y[k].d = d;
        y[k].dmin = dmin;
        for (int w = 0; w < 16; w++) {
            uint64_t x = rng_word(key, ctr + (uint64_t)w);
            memcpy(y[k].qs + 8 * w, &x, 8); /* any byte pattern is valid */
        }
        uint64_t s = rng_word(key, ctr + 16);
        uint8_t sc[8], m[8];
        for (int j = 0; j < 8; j++, s >>= 4) {
            sc[j] = (uint8_t)(16 + (s & 0xF));
            m[j] = (uint8_t)((15 * sc[j] + 4) / 8); /* round(1.875 sc) <= 58 */
        }
        pack_scales_k4(y[k].scales, sc, m);
    }
}

/* Q6_K: random 6-bit q (value q - 32: mean -0.5, sd 18.47), int8 sub-block scales in [8, 15],
 * d = sigma / (18.47 * 11.5). Words per block: 16 ql, 8 qh, 2 scales. */
static void fill_q6_K(block_q6_K *y, uint64_t n_blocks, uint64_t b0, uint64_t key, float sigma)
{
    ggml_half d = quant_f32_to_f16(sigma / (18.47f * 11.5f));
    for (uint64_t k = 0; k < n_blocks; k++) {
        uint64_t ctr = (b0 + k) * QK_WORDS;
        for (int w = 0; w < 16; w++) {
            uint64_t x = rng_word(key, ctr + (uint64_t)w);
            memcpy(y[k].ql + 8 * w, &x, 8);
        }
        for (int w = 0; w < 8; w++) {
            uint64_t x = rng_word(key, ctr + 16 + (uint64_t)w);
            memcpy(y[k].qh + 8 * w, &x, 8);
        }
        for (int w = 0; w < 2; w++) {
            uint64_t x = rng_word(key, ctr + 24 + (uint64_t)w);
            for (int j = 0; j < 8; j++, x >>= 8) y[k].scales[8 * w + j] = (int8_t)(8 + (x & 7));
        }
        y[k].d = d;
    }
}

void synth_fill_rows(const synth_tensor *t, uint64_t key, uint64_t row0, uint64_t n_rows,
                     void *dst)
{
    DS_ASSERT(row0 + n_rows <= t->ne[1]);
    const quant_traits *qt = quant_get(t->type);
    DS_ASSERT(qt != NULL);
    uint64_t per_row = t->ne[0] / qt->block_size;
    uint64_t b0 = row0 * per_row, nb = n_rows * per_row;
    float sigma = matmul_sigma(t);
    switch (t->type) {
    case GGML_TYPE_F32:
    case GGML_TYPE_F16:
    case GGML_TYPE_BF16: fill_plain(t, key, row0, n_rows, dst); return;
    case GGML_TYPE_Q8_0: fill_q8_0(dst, nb, b0, key, sigma); return;
    case GGML_TYPE_Q4_K: fill_q4_K(dst, nb, b0, key, sigma); return;
    case GGML_TYPE_Q6_K: fill_q6_K(dst, nb, b0, key, sigma); return;
    default: DS_ASSERT(!"synth: no generator for this type");
    }
}
