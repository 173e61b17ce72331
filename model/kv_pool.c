/* The KV cache's block manager: see kv_pool.h. Free blocks are a stack; a block's count is the
 * number of tables that list it. */
#include "model/kv_pool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct kv_pool {
    int n_seqs, block_tokens, n_blocks, ld;
    int32_t *table;     /* [n_seqs][ld] */
    bool own_table;
    int *held;          /* [n_seqs] */
    uint32_t *version;  /* [n_seqs] */
    int32_t *free_ids;  /* [n_blocks]: a stack of n_free */
    int32_t *refs;      /* [n_blocks] */
    int n_free;
    _Atomic uint32_t free_count; /* n_free, for other threads */
};

int kv_pool_create(const kv_pool_opts *o, kv_pool **out, status *st)
{
    *out = NULL;
    if (o->n_seqs < 1 || o->block_tokens < 1 || o->n_blocks < 1 || o->max_blocks_per_seq < 1)
        return status_fail(st, STATUS_INVALID,
                           "kv pool: need sequences, block positions, blocks and blocks per "
                           "sequence >= 1 (got %d, %d, %d, %d)",
                           o->n_seqs, o->block_tokens, o->n_blocks, o->max_blocks_per_seq);
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) return status_fail(st, STATUS_NOMEM, "kv pool: out of memory");
    p->n_seqs = o->n_seqs;
    p->block_tokens = o->block_tokens;
    p->n_blocks = o->n_blocks;
    p->ld = o->max_blocks_per_seq;
    const size_t nt = (size_t)p->n_seqs * (size_t)p->ld;
    p->own_table = !o->table;
    p->table = o->table ? o->table : malloc(nt * sizeof *p->table);
    p->held = calloc((size_t)p->n_seqs, sizeof *p->held);
    p->version = calloc((size_t)p->n_seqs, sizeof *p->version);
    p->free_ids = malloc((size_t)p->n_blocks * sizeof *p->free_ids);
    p->refs = calloc((size_t)p->n_blocks, sizeof *p->refs);
    if (!p->table || !p->held || !p->version || !p->free_ids || !p->refs) {
        kv_pool_destroy(p);
        return status_fail(st, STATUS_NOMEM, "kv pool: out of memory for %d blocks, %d tables",
                           o->n_blocks, o->n_seqs);
    }
    memset(p->table, 0, nt * sizeof *p->table);
    /* the stack pops block 0 first, then 1, ...: a fresh pool fills from the front */
    for (int i = 0; i < p->n_blocks; i++) p->free_ids[i] = p->n_blocks - 1 - i;
    p->n_free = p->n_blocks;
    atomic_store(&p->free_count, (uint32_t)p->n_free);
    *out = p;
    return STATUS_OK;
}

void kv_pool_destroy(kv_pool *p)
{
    if (!p) return;
    if (p->own_table) free(p->table);
    free(p->held);
    free(p->version);
    free(p->free_ids);
    free(p->refs);
    free(p);
}

int kv_pool_block_tokens(const kv_pool *p) { return p->block_tokens; }
int kv_pool_n_seqs(const kv_pool *p) { return p->n_seqs; }
int kv_pool_max_blocks_per_seq(const kv_pool *p) { return p->ld; }
uint32_t kv_pool_total_blocks(const kv_pool *p) { return (uint32_t)p->n_blocks; }
uint32_t kv_pool_free_blocks(const kv_pool *p)
{
    return atomic_load(&((kv_pool *)p)->free_count);
}

uint32_t kv_pool_blocks_for(const kv_pool *p, int64_t n_pos)
{
    return n_pos <= 0 ? 0 : (uint32_t)((n_pos + p->block_tokens - 1) / p->block_tokens);
}

uint32_t kv_pool_need(const kv_pool *p, int seq, int64_t n_pos)
{
    const uint32_t want = kv_pool_blocks_for(p, n_pos);
    return want > (uint32_t)p->held[seq] ? want - (uint32_t)p->held[seq] : 0;
}

int kv_pool_ensure(kv_pool *p, int seq, int64_t n_pos, status *st)
{
    DS_ASSERT(seq >= 0 && seq < p->n_seqs);
    const uint32_t want = kv_pool_blocks_for(p, n_pos);
    if (want > (uint32_t)p->ld)
        return status_fail(st, STATUS_RANGE, "kv pool: sequence %d: %lld positions exceed its "
                           "table of %d blocks of %d", seq, (long long)n_pos, p->ld,
                           p->block_tokens);
    const uint32_t need = kv_pool_need(p, seq, n_pos);
    if (need > (uint32_t)p->n_free)
        return status_fail(st, STATUS_EXHAUSTED, "kv pool: sequence %d needs %u more blocks, %d "
                           "are free", seq, need, p->n_free);
    int32_t *row = p->table + (size_t)seq * (size_t)p->ld;
    for (uint32_t i = 0; i < need; i++) {
        const int32_t b = p->free_ids[--p->n_free];
        DS_ASSERT(p->refs[b] == 0);
        p->refs[b] = 1;
        row[p->held[seq]++] = b;
    }
    atomic_store(&p->free_count, (uint32_t)p->n_free);
    return STATUS_OK;
}

void kv_pool_release(kv_pool *p, int seq)
{
    DS_ASSERT(seq >= 0 && seq < p->n_seqs);
    int32_t *row = p->table + (size_t)seq * (size_t)p->ld;
    for (int i = p->held[seq] - 1; i >= 0; i--) { /* last first: the stack pops them in order */
        const int32_t b = row[i];
        DS_ASSERT(p->refs[b] > 0);
        if (--p->refs[b] == 0) p->free_ids[p->n_free++] = b;
        row[i] = 0;
    }
    p->held[seq] = 0;
    p->version[seq]++;
    atomic_store(&p->free_count, (uint32_t)p->n_free);
}

int kv_pool_share(kv_pool *p, int dst, int src, int n_blocks, status *st)
{
    DS_ASSERT(dst >= 0 && dst < p->n_seqs && src >= 0 && src < p->n_seqs);
    if (dst == src || p->held[dst] != 0 || n_blocks < 0 || n_blocks > p->held[src])
        return status_fail(st, STATUS_INVALID, "kv pool: sequence %d (holding %d) cannot share "
                           "%d blocks of sequence %d (holding %d)", dst, p->held[dst], n_blocks,
                           src, p->held[src]);
    const int32_t *from = p->table + (size_t)src * (size_t)p->ld;
    int32_t *to = p->table + (size_t)dst * (size_t)p->ld;
    for (int i = 0; i < n_blocks; i++) {
        to[i] = from[i];
        p->refs[from[i]]++;
    }
    p->held[dst] = n_blocks;
    p->version[dst]++;
    return STATUS_OK;
}

int kv_pool_adopt(kv_pool *p, int seq, const int32_t *blocks, int n, status *st)
{
    DS_ASSERT(seq >= 0 && seq < p->n_seqs);
    if (p->held[seq] != 0 || n < 0 || n > p->ld)
        return status_fail(st, STATUS_INVALID, "kv pool: sequence %d (holding %d) cannot adopt %d "
                           "blocks (table of %d)", seq, p->held[seq], n, p->ld);
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= p->n_blocks || p->refs[blocks[i]] == 0)
            return status_fail(st, STATUS_INVALID, "kv pool: sequence %d cannot adopt block %d "
                               "(entry %d): not a held block", seq, blocks[i], i);
    int32_t *row = p->table + (size_t)seq * (size_t)p->ld;
    for (int i = 0; i < n; i++) {
        row[i] = blocks[i];
        p->refs[blocks[i]]++;
    }
    p->held[seq] = n;
    p->version[seq]++;
    return STATUS_OK;
}

void kv_pool_retain(kv_pool *p, const int32_t *blocks, int n)
{
    for (int i = 0; i < n; i++) {
        DS_ASSERT(blocks[i] >= 0 && blocks[i] < p->n_blocks && p->refs[blocks[i]] > 0);
        p->refs[blocks[i]]++;
    }
}

void kv_pool_drop(kv_pool *p, const int32_t *blocks, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        const int32_t b = blocks[i];
        DS_ASSERT(b >= 0 && b < p->n_blocks && p->refs[b] > 0);
        if (--p->refs[b] == 0) p->free_ids[p->n_free++] = b;
    }
    atomic_store(&p->free_count, (uint32_t)p->n_free);
}

const int32_t *kv_pool_table(const kv_pool *p, int seq)
{
    return p->table + (size_t)seq * (size_t)p->ld;
}

int kv_pool_held(const kv_pool *p, int seq) { return p->held[seq]; }
uint32_t kv_pool_version(const kv_pool *p, int seq) { return p->version[seq]; }

int kv_pool_refs(const kv_pool *p, int32_t block)
{
    return block >= 0 && block < p->n_blocks ? p->refs[block] : 0;
}
