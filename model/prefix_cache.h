/* The prefix cache: which token prefixes a forward can resume from without computing them. A
 * Qwen3.5 sequence at position n is its attention KV for positions [0, n) and the recurrent
 * (DeltaNet) state after n tokens; the cache keeps both for prefixes of finished and running
 * sequences so that a new sequence whose prompt starts with one continues from there
 * (fwd_seq_resume, model/fwd.h) and prefills only the rest.
 *
 * The index is a trie of KV blocks: a node is one block of the pool (model/kv_pool.h) with the
 * tokens whose KV it holds. A full node holds block_tokens tokens and may have children (the
 * next block's tokens); a partial node holds fewer and is a leaf. A node's path from the root is
 * a token prefix; the node holds one reference on its block (full blocks are shared with every
 * sequence reading them; a partial one is copied when a sequence resumes from it, fwd_prefix).
 * A node may own a snapshot: the forward's snapshot buffer (fwd_snap_save) holding the
 * recurrent state after the last token of its path. A sequence resumes only where a snapshot
 * is, at any token: the cache keeps snapshots where the engine takes them (the end of a
 * prompt, the end of a request, where prompts diverge).
 *
 * Memory: nodes and their tokens are allocated at create (one per pool block and snapshot: the
 * most that can be held); the snapshots are the forward's n_snaps buffers. Eviction is
 * GreedyDual by value per byte: every node with a snapshot has a priority H = L + value, value =
 * tokens its snapshot saves / (bytes its eviction frees), raised again on every hit; eviction
 * takes the lowest H and sets L to it, so that entries not used for a while sink below new ones
 * whatever their value. Only leaves and snapshots are evicted: a leaf with its block (and
 * snapshot), or an inner node's snapshot alone; a node left without a snapshot or children goes
 * with it.
 *
 *   prefix_cache *pc;
 *   prefix_cache_create(&(prefix_cache_opts){.kv = f->kv, .n_snaps = f->n_snaps, ...}, &pc, &st);
 *   prefix_match m;
 *   prefix_cache_match(pc, prompt, n_prompt - 1, now, &m);     the deepest snapshot it can use
 *   if (m.n_pos) fwd_seq_resume(f, slot, &p, &(fwd_prefix){m.snap, m.n_pos, m.blocks, prompt}, &st);
 *   ... steps ...
 *   int snap = prefix_cache_insert(pc, slot, tokens, n_fed, now);  after a step: keep the prefix
 *   if (snap >= 0) fwd_snap_save(f, slot, snap, &st);
 *
 * Threading: one thread (the engine's), as the kv_pool; prefix_cache_get_stats from any
 * thread. */
#ifndef DS_MODEL_PREFIX_CACHE_H
#define DS_MODEL_PREFIX_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "model/kv_pool.h"

typedef struct prefix_cache_opts {
    kv_pool *kv;          /* borrowed: the forward's pool (fwd.kv); its block_tokens is a node's */
    int n_snaps;          /* snapshot ids [0, n_snaps) the cache hands out (>= 1) */
    uint64_t snap_bytes;  /* bytes of one snapshot (fwd.snap_bytes) */
    uint64_t block_bytes; /* bytes of one KV block (every layer, K and V, every rank) */
} prefix_cache_opts;

typedef struct prefix_cache prefix_cache;

/* The deepest cached prefix of tokens[0 .. n) with a snapshot. */
typedef struct prefix_match {
    int n_pos;             /* its length: tokens[0 .. n_pos) are cached; 0 when nothing is */
    int snap;              /* the snapshot after tokens[n_pos - 1] (-1 when n_pos is 0) */
    const int32_t *blocks; /* [kv_pool_blocks_for(kv, n_pos)]: the blocks holding its KV
                              (cache memory: valid until the cache next changes) */
    int n_kv;              /* the longest prefix of tokens[0 .. n) the cache holds KV for, with
                              or without a snapshot (>= n_pos): where tokens leave the cache */
} prefix_match;

typedef struct prefix_cache_stats {
    uint64_t queries;        /* prefix_cache_match calls */
    uint64_t hits;           /* ... that found a snapshot */
    uint64_t queried_tokens; /* tokens they asked about (n) */
    uint64_t hit_tokens;     /* tokens they found (n_pos) */
    uint64_t inserts;        /* snapshots handed out by prefix_cache_insert */
    uint64_t evictions;      /* snapshots and nodes evicted */
    uint32_t snapshots;      /* snapshots held now */
    uint64_t snapshot_bytes; /* snapshots * snap_bytes */
    uint32_t blocks;         /* blocks the cache holds a reference on */
    uint32_t blocks_only;    /* ... that nothing else holds (eviction would free them) */
} prefix_cache_stats;

/* STATUS_INVALID for bad options (named), STATUS_NOMEM. Empty. */
int prefix_cache_create(const prefix_cache_opts *o, prefix_cache **out, status *st);
/* Drops every reference the cache holds (its blocks go back to the pool). */
void prefix_cache_destroy(prefix_cache *c);

/* Finds the deepest snapshot on tokens[0 .. n) (n_pos <= n) and how far the cache holds their
 * KV; a hit counts as a use at time now (any increasing clock) for eviction. Counted in the
 * stats. Nothing is pinned: the caller resumes from it before changing the cache. */
void prefix_cache_match(prefix_cache *c, const int32_t *tokens, int n, int64_t now,
                        prefix_match *m);

/* Keeps the prefix tokens[0 .. n) (n >= 1) of the sequence in seq, whose table holds its KV
 * for those positions: nodes for the blocks not cached yet (a reference on seq's block each)
 * and a snapshot at n. Returns the snapshot id the caller fills now with fwd_snap_save(seq,
 * id), or -1 when there is nothing to save (a snapshot at that prefix exists: it counts as
 * used) or no room (no snapshot id and none evictable; nodes run out). Evicts others as needed
 * (never the path being inserted). */
int prefix_cache_insert(prefix_cache *c, int seq, const int32_t *tokens, int n, int64_t now);

/* Frees pool blocks by evicting cached entries (lowest priority first) until at least want
 * blocks of the pool are free or nothing the cache alone holds is left. Returns the pool's free
 * blocks after. Running sequences win over the cache: the engine calls this before it
 * preempts anyone. */
uint32_t prefix_cache_reclaim(prefix_cache *c, uint32_t want);

/* Blocks only the cache holds: what prefix_cache_reclaim could free at most. */
uint32_t prefix_cache_reclaimable(const prefix_cache *c);

/* Drops everything (every snapshot free, every reference dropped). */
void prefix_cache_clear(prefix_cache *c);

/* Hashes of the first n_tokens tokens (splitmix64_tokens, common/splitmix64.h) of
 * up to max cached paths at least that long, most recently used first; returns how many. The
 * router routes a request whose prompt starts the same way to the worker holding it. */
int prefix_cache_heads(const prefix_cache *c, int n_tokens, uint64_t *out, int max);

/* Any thread. */
void prefix_cache_get_stats(const prefix_cache *c, prefix_cache_stats *s);

/* Tests: STATUS_INTERNAL (named) when an invariant does not hold: the trie's links, counts and
 * hashes; every leaf and partial node with a snapshot; every block's pool count equal to the
 * tables listing it plus the cache's nodes holding it (true while nothing else holds blocks). */
int prefix_cache_check(const prefix_cache *c, status *st);

#endif
