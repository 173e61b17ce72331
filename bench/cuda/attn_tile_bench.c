/* attn_tile_bench: the candidate prefill attention tile (bench/cuda/attn_tile.h) against the
 * product's attn_prefill_runs on one prompt chunk of 256 rows at positions P .. P + 255 of a
 * paged F16 cache (random contents, the blocks at random places of the pool), at the 0.8B / 4B
 * / 27B head shapes. Both write the rows' partials; attn_decode_rows (every row skipped: only
 * the merge and the gate) turns each into outputs, which must agree within 2e-4 + 2e-3·|ref|
 * per element (both are F32 softmax over F16 products with F16 remainders). Prints each
 * kernel's time (CUDA events, the mean of 20 launches after 3) and the speed-up.
 *   attn_tile_bench [P ...]      (default: 0 1792 6912 31744)
 * Exit status 1 when an output disagrees. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/cuda/attn_tile.h"
#include "common/status.h"
#include "common/splitmix64.h"
#include "gguf/quant.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/cuda_device.h"

#define ROWS 256

typedef struct shape {
    const char *name;
    int n_h, n_kv, d_h;
} shape;

static float frand(uint64_t *s) { return (float)((splitmix64_next(s) >> 40) * (1.0 / (1 << 24))) * 2.0f - 1.0f; }

typedef void (*tile_fn)(const float *, int64_t, const void *, const void *, const int32_t *,
                        const int32_t *, int, const int32_t *, const int32_t *, const int32_t *,
                        int, int, int, int, float *, int, int, int, const cuda_launch *);

static double time_ms(tile_fn f, const float *d_q, int64_t ld_q, const void *kc, const void *vc,
                      const int32_t *d_slot, const int32_t *d_table, int table_ld,
                      const int32_t *d_pos, const int32_t *d_run, const int32_t *d_long,
                      const shape *sh, int n_ctx, float *d_part, status *st)
{
    cuda_event e0, e1;
    if (cuda_event_create(&e0, st) || cuda_event_create(&e1, st)) return -1;
    for (int i = 0; i < 3; i++)
        f(d_q, ld_q, kc, vc, d_slot, d_table, table_ld, d_pos, d_run, d_long, sh->n_h, sh->n_kv,
          sh->d_h, n_ctx, d_part, ROWS, ROWS, 16, NULL);
    cuda_event_record(e0, NULL);
    for (int i = 0; i < 20; i++)
        f(d_q, ld_q, kc, vc, d_slot, d_table, table_ld, d_pos, d_run, d_long, sh->n_h, sh->n_kv,
          sh->d_h, n_ctx, d_part, ROWS, ROWS, 16, NULL);
    cuda_event_record(e1, NULL);
    double ms = -1;
    if (!cuda_sync(NULL, "timing", st)) ms = cuda_event_elapsed_ms(e0, e1) / 20.0;
    cuda_event_destroy(e0);
    cuda_event_destroy(e1);
    return ms;
}

/* one shape at one P: returns 0 when the outputs agree */
static int one(const shape *sh, int P, status *st)
{
    const int HA = sh->n_h * sh->d_h, KVA = sh->n_kv * sh->d_h;
    const int n_ctx = (P + ROWS + ATTN_KV_BLOCK - 1) / ATTN_KV_BLOCK * ATTN_KV_BLOCK;
    const int table_ld = n_ctx / ATTN_KV_BLOCK, n_blk = table_ld + 1;
    uint64_t rng = 0xa77e0000u + (uint64_t)P * 31 + (uint64_t)sh->n_h;
    int32_t slot[ROWS], pos[ROWS], run[2 * ROWS], lng[1 + ROWS], skip[ROWS];
    memset(run, 0, sizeof run);
    run[0] = 0, run[ROWS] = ROWS;
    lng[0] = 1, lng[1] = 0;
    for (int i = 0; i < ROWS; i++) slot[i] = 0, pos[i] = P + i, skip[i] = 1;
    int32_t *table = malloc((size_t)n_blk * 4);
    for (int b = 0; b < n_blk; b++) table[b] = b;
    for (int b = n_blk - 1; b > 0; b--) { /* the slot's blocks at random places */
        const int k = (int)(splitmix64_next(&rng) % (uint64_t)(b + 1));
        const int32_t x = table[b];
        table[b] = table[k], table[k] = x;
    }
    const size_t cb = (size_t)n_blk * ATTN_KV_BLOCK * KVA * 2;
    uint16_t *cache = malloc(cb);
    float *q = malloc((size_t)ROWS * HA * 4), *qg = malloc((size_t)ROWS * 2 * HA * 4);
    float *o1 = malloc((size_t)ROWS * HA * 4), *o2 = malloc((size_t)ROWS * HA * 4);
    if (!table || !cache || !q || !qg || !o1 || !o2) {
        fprintf(stderr, "attn_tile_bench: out of host memory\n");
        exit(2);
    }
    for (size_t i = 0; i < cb / 2; i++) cache[i] = quant_f32_to_f16(frand(&rng));
    for (int64_t i = 0; i < (int64_t)ROWS * HA; i++) q[i] = 2.0f * frand(&rng);
    for (int64_t i = 0; i < (int64_t)ROWS * 2 * HA; i++) qg[i] = frand(&rng);
    void *d_kc = NULL, *d_vc = NULL, *d_q = NULL, *d_qg = NULL, *d_part = NULL, *d_o = NULL;
    int32_t *d_slot = NULL, *d_pos = NULL, *d_run = NULL, *d_long = NULL, *d_skip = NULL,
            *d_table = NULL;
    const size_t pb = (size_t)attn_partial_floats_rows(sh->n_h, sh->d_h, n_ctx, ROWS) * 4;
    int bad = -1;
    if (cuda_alloc(&d_kc, cb, "k", st) || cuda_alloc(&d_vc, cb, "v", st) ||
        cuda_alloc(&d_q, (size_t)ROWS * HA * 4, "q", st) ||
        cuda_alloc(&d_qg, (size_t)ROWS * 2 * HA * 4, "qg", st) ||
        cuda_alloc(&d_part, pb, "partials", st) ||
        cuda_alloc(&d_o, (size_t)ROWS * HA * 4, "o", st) ||
        cuda_alloc((void **)&d_slot, sizeof slot, "slot", st) ||
        cuda_alloc((void **)&d_pos, sizeof pos, "pos", st) ||
        cuda_alloc((void **)&d_run, sizeof run, "run", st) ||
        cuda_alloc((void **)&d_long, sizeof lng, "long", st) ||
        cuda_alloc((void **)&d_skip, sizeof skip, "skip", st) ||
        cuda_alloc((void **)&d_table, (size_t)n_blk * 4, "table", st) ||
        cuda_upload(d_kc, cache, cb, st) || cuda_upload(d_vc, cache, cb, st) ||
        cuda_upload(d_q, q, (size_t)ROWS * HA * 4, st) ||
        cuda_upload(d_qg, qg, (size_t)ROWS * 2 * HA * 4, st) ||
        cuda_upload(d_slot, slot, sizeof slot, st) || cuda_upload(d_pos, pos, sizeof pos, st) ||
        cuda_upload(d_run, run, sizeof run, st) || cuda_upload(d_long, lng, sizeof lng, st) ||
        cuda_upload(d_skip, skip, sizeof skip, st) ||
        cuda_upload(d_table, table, (size_t)n_blk * 4, st))
        goto done;
    tile_fn fns[2] = {attn_prefill_runs, attn_tile_runs};
    float *outs[2] = {o1, o2};
    double ms[2];
    for (int k = 0; k < 2; k++) {
        fns[k](d_q, HA, d_kc, d_vc, d_slot, d_table, table_ld, d_pos, d_run, d_long, sh->n_h,
               sh->n_kv, sh->d_h, n_ctx, d_part, ROWS, ROWS, 16, NULL);
        attn_decode_rows(d_q, HA, d_qg, 2 * HA, d_kc, d_vc, d_slot, d_table, table_ld, d_pos,
                         d_skip, sh->n_h, sh->n_kv, sh->d_h, n_ctx, d_part, d_o, HA, NULL,
                         ATTN_KV_F16, ROWS, NULL);
        if (cuda_sync(NULL, "attention", st) ||
            cuda_download(outs[k], d_o, (size_t)ROWS * HA * 4, st))
            goto done;
        ms[k] = time_ms(fns[k], d_q, HA, d_kc, d_vc, d_slot, d_table, table_ld, d_pos, d_run,
                        d_long, sh, n_ctx, d_part, st);
        if (ms[k] < 0) goto done;
    }
    bad = 0;
    double worst = 0, num = 0, den = 0;
    for (int64_t i = 0; i < (int64_t)ROWS * HA; i++) {
        const double d = fabs((double)o2[i] - o1[i]);
        if (!(d <= 2e-4 + 2e-3 * fabs(o1[i]))) bad++;
        worst = fmax(worst, d);
        num += d * d, den += (double)o1[i] * o1[i];
    }
    printf("| %-4s | %6d | %9.1f | %9.1f | %5.2fx | %s (worst %.3g, nmse %.3g) |\n", sh->name,
           P, ms[0] * 1e3, ms[1] * 1e3, ms[0] / ms[1], bad ? "DIFFER" : "agree", worst,
           num / (den > 0 ? den : 1));
done:
    cuda_free(d_kc), cuda_free(d_vc), cuda_free(d_q), cuda_free(d_qg), cuda_free(d_part);
    cuda_free(d_o), cuda_free(d_slot), cuda_free(d_pos), cuda_free(d_run), cuda_free(d_long);
    cuda_free(d_skip), cuda_free(d_table);
    free(table), free(cache), free(q), free(qg), free(o1), free(o2);
    return bad != 0;
}

int main(int argc, char **argv)
{
    status st;
    status_clear(&st);
    if (!cuda_device_available(&st) || attn_prefill_init(&st) || attn_tile_init(&st)) {
        fprintf(stderr, "attn_tile_bench: %s\n", st.msg);
        return 2;
    }
    int P[16], n_p = 0;
    for (int i = 1; i < argc && n_p < 16; i++) P[n_p++] = atoi(argv[i]);
    if (!n_p) P[0] = 0, P[1] = 1792, P[2] = 6912, P[3] = 31744, n_p = 4;
    static const shape shapes[] = {{"0.8B", 8, 2, 256}, {"4B", 16, 4, 256}, {"27B", 24, 4, 256}};
    printf("| model | P | attn_prefill_runs µs | candidate µs | speed-up | outputs |\n");
    printf("|---|---|---|---|---|---|\n");
    int fails = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int i = 0; i < n_p; i++) {
            status_clear(&st);
            fails += one(&shapes[s], P[i], &st);
            if (st.code) fprintf(stderr, "attn_tile_bench: %s\n", st.msg);
        }
    return fails ? 1 : 0;
}
