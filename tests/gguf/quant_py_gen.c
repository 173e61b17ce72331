/* quant_py_gen OUTDIR: writes, for every supported quant type, the inputs and our outputs
 * for tests/gguf/quant_py_parity.py (which recomputes them with gguf-py):
 *   <type>.blocks   random valid blocks (random bytes; d/dmin finite halves), N elements
 *   <type>.deq      our dequantisation of .blocks, N float32
 *   <type>.src      N float32 source values (gaussian, some outliers, a zero block)
 *   <type>.quant    our quantisation of .src
 *   <type>.qdeq     our dequantisation of .quant, N float32
 *   manifest.txt    one line per type: "<name> <ggml id> <N>"
 * N = 64 blocks of the type (plain types: 4096 elements). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "tests/testutil/testutil.h"

static int gen_write(const char *dir, const char *name, const char *ext, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "quant_py_gen: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Random bytes, then scale fields made finite: |d| in 2^-10..2^-4 (random sign where the
 * format allows), dmin positive; plain types get finite values (incl. f16 subnormals). */
static void gen_blocks(uint32_t type, uint8_t *p, int64_t n, uint64_t *s) {
    const quant_traits *t = quant_get(type);
    uint64_t bytes = quant_row_bytes(type, (uint64_t)n);
    for (uint64_t i = 0; i < bytes; i++) p[i] = (uint8_t)testutil_rng_next(s);
    for (int64_t b = 0; b < n / t->block_size; b++) {
        uint8_t *blk = p + b * t->type_size;
        float mag =
            ldexpf(1.0f + 0.5f * testutil_rng_uniform(s), -4 - (int)(testutil_rng_next(s) % 7));
        ggml_half hs = quant_f32_to_f16(testutil_rng_next(s) & 1 ? -mag : mag);
        ggml_half hm = quant_f32_to_f16(mag * (0.5f + 0.5f * testutil_rng_uniform(s)));
        switch (type) {
        case GGML_TYPE_F32: {
            float v = ldexpf(testutil_rng_uniform(s), (int)(testutil_rng_next(s) % 40) - 20);
            memcpy(blk, &v, 4);
            break;
        }
        case GGML_TYPE_F16: { /* any finite half: exponent field != 31 */
            ggml_half h;
            memcpy(&h, blk, 2);
            if ((h & 0x7C00) == 0x7C00) h &= 0xBFFF;
            memcpy(blk, &h, 2);
            break;
        }
        case GGML_TYPE_BF16: {
            ggml_bf16 h;
            memcpy(&h, blk, 2);
            if ((h & 0x7F80) == 0x7F80) h &= 0xBFFF;
            memcpy(blk, &h, 2);
            break;
        }
        case GGML_TYPE_Q8_0: memcpy(blk, &hs, 2); break;
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
            memcpy(blk, &hm, 2); /* d */
            hm = quant_f32_to_f16(mag * 0.25f);
            memcpy(blk + 2, &hm, 2); /* dmin */
            break;
        case GGML_TYPE_Q6_K: memcpy(blk + offsetof(block_q6_K, d), &hs, 2); break;
        default: break;
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: quant_py_gen OUTDIR\n");
        return 2;
    }
    const char *dir = argv[1];
    static const uint32_t types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                                     GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    char mpath[4096];
    snprintf(mpath, sizeof mpath, "%s/manifest.txt", dir);
    FILE *man = fopen(mpath, "w");
    if (!man) {
        fprintf(stderr, "quant_py_gen: %s: %s\n", mpath, strerror(errno));
        return 1;
    }
    uint64_t s = 20240611;
    int rc = 0;
    for (size_t k = 0; k < sizeof types / sizeof types[0] && rc == 0; k++) {
        const quant_traits *t = quant_get(types[k]);
        int64_t n = t->block_size == 1 ? 4096 : 64 * (int64_t)t->block_size;
        size_t qbytes = quant_row_bytes(types[k], (uint64_t)n), fbytes = (size_t)n * sizeof(float);
        uint8_t *blocks = malloc(qbytes), *quant = malloc(qbytes);
        float *deq = malloc(fbytes), *src = malloc(fbytes), *qdeq = malloc(fbytes);
        if (!blocks || !quant || !deq || !src || !qdeq) {
            fprintf(stderr, "quant_py_gen: out of memory\n");
            return 1;
        }
        gen_blocks(types[k], blocks, n, &s);
        t->dequant(blocks, deq, n);
        for (int64_t i = 0; i < n; i++) {
            src[i] = 0.03f * testutil_rng_gauss(&s);
            if (i % 61 == 0) src[i] *= 6.0f;                     /* outliers */
            if (i >= n / 2 && i < n / 2 + 256) src[i] = 0.0f;    /* a zero block */
            if (i >= n / 4 && i < n / 4 + 256) src[i] = fabsf(src[i]); /* all positive */
        }
        t->quantize(src, quant, n);
        t->dequant(quant, qdeq, n);
        rc |= gen_write(dir, t->name, "blocks", blocks, qbytes);
        rc |= gen_write(dir, t->name, "deq", deq, fbytes);
        rc |= gen_write(dir, t->name, "src", src, fbytes);
        rc |= gen_write(dir, t->name, "quant", quant, qbytes);
        rc |= gen_write(dir, t->name, "qdeq", qdeq, fbytes);
        fprintf(man, "%s %u %lld\n", t->name, types[k], (long long)n);
        free(blocks), free(quant), free(deq), free(src), free(qdeq);
    }
    if (fclose(man) != 0) rc = -1;
    return rc ? 1 : 0;
}
