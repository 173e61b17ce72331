/* Host-side pieces of the CUDA forward: a batched pass's staged inputs and the KV block
 * allocator (forward_cuda_host.h). */
#include "model/forward_cuda_host.h"

#include <string.h>

#include "common/status.h"

static int bucket_of(const int *bucket, int n_buckets, int n)
{
    int k = 0;
    while (k + 1 < n_buckets && bucket[k] < n) k++;
    DS_ASSERT(bucket[k] >= n);
    return k;
}

/* true when row i's logits are read: eval rows, and the sampled row (the last of its run) */
static bool needs_head(const qwen35_cuda_row *rows, int i, int n)
{
    const bool last = i + 1 == n || rows[i + 1].slot != rows[i].slot;
    return rows[i].logits || (rows[i].sample && last);
}

fc_stage fc_stage_at(int32_t *base, int rows, int nb)
{
    fc_stage s = {.head_rows = base, .nb = nb, .ints = rows + 7 * nb + 1};
    s.tokens = base + rows;
    s.slots = s.tokens + nb;
    s.pos = s.slots + nb;
    s.runs = s.pos + nb;
    s.run_len = s.runs + nb;
    s.long_runs = s.run_len + nb;
    s.long_idx = s.long_runs + 1;
    s.tile_rows = s.long_idx + nb;
    return s;
}

void fc_stage_pass(const qwen35_cuda_row *rows, int n, const int *bucket, int n_buckets,
                   int pad_slot, bool attn_tiles, int32_t *base, int *head, fc_pass_info *info)
{
    const int k = bucket_of(bucket, n_buckets, n), nb = bucket[k];
    const fc_stage s = fc_stage_at(base, bucket[n_buckets - 1], nb);
    int n_runs = 0, nh = 0;
    for (int j = 0; j < nb; j++) {
        const bool real = j < n;
        s.tokens[j] = real ? rows[j].token : 0;
        s.slots[j] = real ? rows[j].slot : pad_slot;
        s.pos[j] = real ? rows[j].pos : 0;
        if (!real) continue;
        if (j == 0 || s.slots[j - 1] != s.slots[j]) {
            s.runs[n_runs] = j;
            s.run_len[n_runs++] = 0;
        }
        s.run_len[n_runs - 1]++;
        head[j] = needs_head(rows, j, n) ? nh : -1;
        if (head[j] >= 0) s.head_rows[nh++] = j;
    }
    for (int j = n_runs; j < nb; j++) s.runs[j] = 0, s.run_len[j] = 0; /* padding: no runs */
    int n_long = 0; /* the long runs (gdn_chunk_runs, attn_prefill_runs) */
    for (int j = 0; j < nb; j++) s.tile_rows[j] = 0;
    for (int x = 0; x < n_runs; x++) {
        if (s.run_len[x] < FC_LONG_RUN_ROWS) continue;
        s.long_idx[n_long++] = x;
        for (int j = s.runs[x]; attn_tiles && j < s.runs[x] + s.run_len[x]; j++)
            s.tile_rows[j] = 1;
    }
    s.long_runs[0] = n_long;
    const int kh = nh ? bucket_of(bucket, n_buckets, nh) : 0;
    for (int j = nh; nh && j < bucket[kh]; j++) s.head_rows[j] = s.head_rows[0]; /* padding */
    *info = (fc_pass_info){.k = k, .nb = nb, .n_runs = n_runs, .n_long = n_long, .nh = nh,
                           .kh = kh, .staged_ints = s.ints};
}

void fc_kv_blocks_reset(fc_kv_blocks *k, int reserved)
{
    k->n_free = 0;
    for (int b = k->n_blocks - 1; b >= 1; b--) k->free_ids[k->n_free++] = b; /* 1 on top */
    memset(k->table, 0, (size_t)k->n_rows * k->ld * sizeof *k->table);
    for (int r = 0; r < k->n_rows; r++) k->held[r] = 0;
    k->held[reserved] = 1;
}

int fc_kv_blocks_grow(fc_kv_blocks *k, int row, int last, int block_positions)
{
    const int need = last / block_positions + 1, first = k->held[row];
    DS_ASSERT(row >= 0 && row < k->n_rows && last >= 0 && need <= k->ld);
    if (need <= first) return 0;
    if (need - first > k->n_free) return -1;
    int32_t *t = k->table + (size_t)row * k->ld;
    for (int b = first; b < need; b++) t[b] = k->free_ids[--k->n_free];
    k->held[row] = need;
    return need - first;
}

void fc_kv_blocks_release(fc_kv_blocks *k, int row)
{
    const int32_t *t = k->table + (size_t)row * k->ld;
    for (int b = k->held[row] - 1; b >= 0; b--) k->free_ids[k->n_free++] = t[b];
    k->held[row] = 0;
}
