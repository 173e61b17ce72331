/* Host-side pieces of the CUDA forward: a batched pass's staged inputs and the KV block tables'
 * device mirror (forward_cuda_host.h). */
#include "model/forward_cuda_host.h"

#include "common/status.h"

static int bucket_of(const int *bucket, int n_buckets, int n)
{
    int k = 0;
    while (k + 1 < n_buckets && bucket[k] < n) k++;
    DS_ASSERT(bucket[k] >= n);
    return k;
}

/* true when row i's logits or final-norm output are read: eval rows, rows with a hidden output,
 * the sampled row (the last of its run, or any of a verify run) */
static bool needs_head(const fwd_row *rows, int i, int n)
{
    const bool last = i + 1 == n || rows[i + 1].slot != rows[i].slot;
    return rows[i].logits || rows[i].hidden || (rows[i].sample && (last || rows[i].verify));
}

fc_stage fc_stage_at(int32_t *base, int rows, int nb)
{
    fc_stage s = {.head_rows = base, .nb = nb, .ints = rows + 8 * nb + 1};
    s.tokens = base + rows;
    s.slots = s.tokens + nb;
    s.pos = s.slots + nb;
    s.runs = s.pos + nb;
    s.run_len = s.runs + nb;
    s.long_runs = s.run_len + nb;
    s.long_idx = s.long_runs + 1;
    s.tile_rows = s.long_idx + nb;
    s.keep = s.tile_rows + nb;
    return s;
}

void fc_stage_pass(const fwd_row *rows, int n, const int *bucket, int n_buckets,
                   int pad_slot, bool attn_tiles, const int32_t *keep, int32_t *base, int *head,
                   fc_pass_info *info)
{
    const int k = bucket_of(bucket, n_buckets, n), nb = bucket[k];
    const fc_stage s = fc_stage_at(base, bucket[n_buckets - 1], nb);
    int n_runs = 0, nh = 0;
    for (int j = 0; j < nb; j++) {
        const bool real = j < n;
        s.tokens[j] = real ? rows[j].token : 0;
        s.slots[j] = real ? rows[j].slot : pad_slot;
        s.pos[j] = real ? rows[j].pos : 0;
        s.keep[j] = real && keep ? keep[j] : -1;
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

void fc_kv_mirror_sync(const kv_pool *p, int seq, fc_kv_mirror *m, int *from, int *to)
{
    const uint32_t version = kv_pool_version(p, seq);
    *from = version == m->version && m->held <= kv_pool_held(p, seq) ? m->held : 0;
    *to = kv_pool_held(p, seq);
    m->held = *to;
    m->version = version;
}

int fc_snaps_for(int64_t budget, uint64_t snap_bytes, uint64_t left, uint64_t spare,
                 int n_slots)
{
    if (budget == 0 || !snap_bytes) return 0;
    uint64_t n = budget > 0 ? (uint64_t)budget / snap_bytes : left / 8 / snap_bytes;
    if (budget < 0) {
        const uint64_t slots = n_slots > 0 ? (uint64_t)n_slots : 0, fits = left / snap_bytes;
        if (n > 8 * slots) n = 8 * slots;
        if (n < slots) n = fits < slots ? fits : slots; /* one a slot where left holds them */
        if (n > spare / snap_bytes) n = spare / snap_bytes;
    }
    return n > FC_MAX_SNAPS ? FC_MAX_SNAPS : (int)n;
}
