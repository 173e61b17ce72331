/* The KV cache's block manager: the one bookkeeper of which attention-cache blocks each
 * sequence holds. A pool of n_blocks blocks of block_tokens positions each, shared by n_seqs
 * sequences (the forward's slots); every sequence has a block table (its positions
 * [b * block_tokens, (b + 1) * block_tokens) live in block table[b]) and every block a reference
 * count, so that blocks can be shared between sequences (a common prompt prefix) and go back to
 * the pool when the last holder lets go.
 *
 * Who uses it: the forward creates the pool with its cache (it knows the memory), lays the
 * cache out by block id and reads the tables in its attention; the scheduler (worker/engine.c)
 * reads how many blocks are free to admit requests and grows each running sequence's table
 * before a step (kv_pool_ensure), preempting a sequence when the pool runs dry; callers without
 * a scheduler (eval, generate, the benches) let the forward's step grow the tables itself.
 *
 *   kv_pool *p;
 *   kv_pool_create(&(kv_pool_opts){.n_seqs = 8, .block_tokens = 64, .n_blocks = 512,
 *                                   .max_blocks_per_seq = 64}, &p, &st);
 *   kv_pool_ensure(p, seq, n_past + n_new, &st);   blocks for positions [0, n_past + n_new)
 *   kv_pool_table(p, seq)[pos / 64]                the block of a position
 *   kv_pool_release(p, seq);                       the sequence ended: its blocks back
 *
 * Threading: every call but kv_pool_free_blocks / kv_pool_total_blocks from one thread (the
 * engine thread, the forward's one caller); those two may be read from any thread (GetLoad,
 * /metrics). Nothing is allocated after create. */
#ifndef DS_MODEL_KV_POOL_H
#define DS_MODEL_KV_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kv_pool_opts {
    int n_seqs;             /* sequences with a block table (>= 1) */
    int block_tokens;       /* positions per block (>= 1) */
    int n_blocks;           /* blocks in the pool (>= 1) */
    int max_blocks_per_seq; /* table length: a sequence's positions are < this * block_tokens */
    int32_t *table;         /* NULL, or caller memory [n_seqs][max_blocks_per_seq] for the tables
                               (the CUDA forward passes pinned memory it mirrors to the device);
                               must outlive the pool */
} kv_pool_opts;

typedef struct kv_pool kv_pool;

/* STATUS_INVALID for a bad size (named), STATUS_NOMEM. Every block free, every table empty. */
int kv_pool_create(const kv_pool_opts *o, kv_pool **out, status *st);
void kv_pool_destroy(kv_pool *p);

int kv_pool_block_tokens(const kv_pool *p);
int kv_pool_n_seqs(const kv_pool *p);
int kv_pool_max_blocks_per_seq(const kv_pool *p);
uint32_t kv_pool_total_blocks(const kv_pool *p);
/* Blocks no sequence holds (any thread: an atomic read). */
uint32_t kv_pool_free_blocks(const kv_pool *p);

/* Blocks that cover n_pos positions: ceil(n_pos / block_tokens). */
uint32_t kv_pool_blocks_for(const kv_pool *p, int64_t n_pos);
/* More blocks seq needs so that its table covers positions [0, n_pos) (0 when it already does). */
uint32_t kv_pool_need(const kv_pool *p, int seq, int64_t n_pos);

/* seq's table covers positions [0, n_pos): new blocks taken from the pool at the table's end.
 * STATUS_EXHAUSTED (nothing taken) when fewer than kv_pool_need blocks are free;
 * STATUS_RANGE when n_pos is past the table's length (max_blocks_per_seq * block_tokens). */
int kv_pool_ensure(kv_pool *p, int seq, int64_t n_pos, status *st);

/* seq lets go of every block it holds (each block's count drops; at zero it is free again) and
 * its table is empty. */
void kv_pool_release(kv_pool *p, int seq);

/* dst (holding nothing) takes src's first n_blocks blocks as its own first ones, each block's
 * count up by one: the two sequences then read the same cache for those positions. Writing
 * into a shared block is the caller's to avoid (the positions a sequence appends to lie past
 * the shared ones). STATUS_INVALID when dst holds blocks or src holds fewer than n_blocks. */
int kv_pool_share(kv_pool *p, int dst, int src, int n_blocks, status *st);

/* seq (holding nothing) takes blocks[0 .. n) as its first n blocks, each block's count up by one:
 * a sequence continuing a cached prefix (model/prefix_cache.h) reads the cache's blocks for
 * those positions. Every block must be held (count >= 1). STATUS_INVALID when seq holds blocks,
 * n is past its table or a block is free or out of range; nothing changes then. */
int kv_pool_adopt(kv_pool *p, int seq, const int32_t *blocks, int n, status *st);

/* Holders outside the tables (the prefix cache): kv_pool_retain counts one more holder of each
 * of blocks[0 .. n) (each must be held already); kv_pool_drop one fewer (a block at zero is free
 * again). */
void kv_pool_retain(kv_pool *p, const int32_t *blocks, int n);
void kv_pool_drop(kv_pool *p, const int32_t *blocks, int n);

/* seq's table: its first kv_pool_held(p, seq) entries are valid block ids. */
const int32_t *kv_pool_table(const kv_pool *p, int seq);
int kv_pool_held(const kv_pool *p, int seq);
/* Counts up by one each time seq's table changes other than by appending (release, share):
 * a forward that mirrors the tables elsewhere re-copies a table whose version moved, and only
 * the appended entries otherwise. */
uint32_t kv_pool_version(const kv_pool *p, int seq);
/* Holders of block b (0: free). */
int kv_pool_refs(const kv_pool *p, int32_t block);

#endif
