/* The prefix cache: see prefix_cache.h. Nodes live in one array (node 0 the root: no tokens, no
 * block) with their tokens in another; a node's children are a list, and the full ones are also
 * in an open-addressing table keyed by (parent, hash of the tokens) so that a walk down a prompt
 * costs one probe per block. Every leaf owns a snapshot (a node left without one and without
 * children is pruned), so the cache holds at most one full node per pool block (a full block
 * holds one path's KV: its rows are never written again while the cache holds it) and one
 * partial node per snapshot: the arrays sized at create are never short. */
#include "model/prefix_cache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/splitmix64.h"

#define PC_NONE (-1)
#define PC_ROOT 0

typedef struct pc_node {
    int32_t parent;       /* node id (PC_NONE for the root) */
    int32_t first_child;  /* node ids of the child list (PC_NONE: none) */
    int32_t next_sib, prev_sib;
    int32_t n_children;
    int32_t block;        /* the pool block holding its tokens' KV (one reference held) */
    int32_t n_tok;        /* block_tokens (full) or fewer (partial: a leaf); 0: a free node */
    int32_t end;          /* the path's length: the position after its last token */
    int32_t snap;         /* the snapshot after end tokens, or PC_NONE */
    uint32_t mark;        /* == the cache's mark: on the path an insert is working on */
    uint64_t key;         /* splitmix64_tokens of its tokens (the child table's key) */
    uint64_t path_hash;   /* splitmix64_tokens' state after the path's tokens */
    double h;             /* GreedyDual priority (nodes with a snapshot) */
    int64_t used;         /* the last hit or insert at or below it */
} pc_node;

struct prefix_cache {
    kv_pool *kv;          /* borrowed */
    int bt;               /* tokens per block (kv_pool_block_tokens) */
    int n_snaps, n_nodes, n_blocks, ld;
    uint64_t snap_bytes, block_bytes;
    pc_node *nodes;       /* owned, [n_nodes]: pool blocks + snapshots + the root */
    int32_t *tokens;      /* owned, [n_nodes][bt] */
    int32_t *free_nodes;  /* owned, [n_nodes]: a stack of n_free_nodes ids */
    int n_free_nodes;
    int32_t *table;       /* owned, [table_mask + 1]: full nodes by (parent, key); PC_NONE empty */
    uint32_t table_mask;
    int32_t *snap_node;   /* owned, [n_snaps]: the node owning each snapshot, or PC_NONE */
    int32_t *free_snaps;  /* owned, [n_snaps]: a stack of n_free_snaps ids */
    int n_free_snaps;
    int32_t *block_refs;  /* owned, [n_blocks]: references the cache's nodes hold on each block */
    int32_t *held;        /* owned, [n_blocks]: the n_held blocks with block_refs > 0 */
    int32_t *held_at;     /* owned, [n_blocks]: a held block's index in held */
    int n_held;
    int32_t *path;        /* owned, [ld]: the blocks of the last match */
    double inflation;     /* GreedyDual's L: the priority of the last eviction */
    uint32_t mark;        /* the current insert's path mark (never on a node otherwise) */
    prefix_cache_stats st;  /* the engine thread's */
    pthread_mutex_t mu;     /* guards pub */
    prefix_cache_stats pub; /* st as of the last call, for other threads */
};

/* ---- nodes, the child table, block references ---- */

static const int32_t *node_tokens(const prefix_cache *c, int32_t id)
{
    return c->tokens + (size_t)id * (size_t)c->bt;
}

static uint64_t hash_more(uint64_t h, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++) h = splitmix64_mix(h ^ (uint32_t)ids[i]);
    return h;
}

static uint32_t table_home(const prefix_cache *c, int32_t parent, uint64_t key)
{
    return (uint32_t)splitmix64_mix(key ^ ((uint64_t)(uint32_t)parent * SPLITMIX64_GOLDEN)) &
           c->table_mask;
}

/* The full child of parent holding t[0 .. bt), or PC_NONE. */
static int32_t find_full(const prefix_cache *c, int32_t parent, const int32_t *t)
{
    const uint64_t key = splitmix64_tokens(t, (size_t)c->bt);
    for (uint32_t i = table_home(c, parent, key);; i = (i + 1) & c->table_mask) {
        const int32_t id = c->table[i];
        if (id == PC_NONE) return PC_NONE;
        const pc_node *x = &c->nodes[id];
        if (x->parent == parent && x->key == key &&
            !memcmp(node_tokens(c, id), t, (size_t)c->bt * sizeof *t))
            return id;
    }
}

/* The partial child of parent holding exactly t[0 .. r), or PC_NONE. */
static int32_t find_partial(const prefix_cache *c, int32_t parent, const int32_t *t, int r)
{
    for (int32_t id = c->nodes[parent].first_child; id != PC_NONE; id = c->nodes[id].next_sib)
        if (c->nodes[id].n_tok == r && !memcmp(node_tokens(c, id), t, (size_t)r * sizeof *t))
            return id;
    return PC_NONE;
}

static void table_add(prefix_cache *c, int32_t id)
{
    uint32_t i = table_home(c, c->nodes[id].parent, c->nodes[id].key);
    while (c->table[i] != PC_NONE) i = (i + 1) & c->table_mask;
    c->table[i] = id;
}

/* Linear probing's deletion: later entries of the cluster whose home does not lie in (i, j]
 * move back into the hole, so that every entry stays reachable from its home. */
static void table_del(prefix_cache *c, int32_t id)
{
    uint32_t i = table_home(c, c->nodes[id].parent, c->nodes[id].key);
    while (c->table[i] != id) {
        DS_ASSERT(c->table[i] != PC_NONE);
        i = (i + 1) & c->table_mask;
    }
    const uint32_t mask = c->table_mask;
    for (uint32_t j = (i + 1) & mask; c->table[j] != PC_NONE; j = (j + 1) & mask) {
        const pc_node *x = &c->nodes[c->table[j]];
        const uint32_t k = table_home(c, x->parent, x->key);
        if (((j - k) & mask) >= ((j - i) & mask)) { /* k not in (i, j] */
            c->table[i] = c->table[j];
            i = j;
        }
    }
    c->table[i] = PC_NONE;
}

static void block_hold(prefix_cache *c, int32_t b)
{
    kv_pool_retain(c->kv, &b, 1);
    if (c->block_refs[b]++ == 0) {
        c->held_at[b] = c->n_held;
        c->held[c->n_held++] = b;
    }
}

static void block_let_go(prefix_cache *c, int32_t b)
{
    DS_ASSERT(c->block_refs[b] > 0);
    kv_pool_drop(c->kv, &b, 1);
    if (--c->block_refs[b] == 0) {
        const int32_t last = c->held[--c->n_held];
        c->held[c->held_at[b]] = last;
        c->held_at[last] = c->held_at[b];
    }
}

/* A new child of parent (the root or a full node) for t[0 .. n_tok) in block, the block
 * retained. The caller made sure a node is free. */
static int32_t node_new(prefix_cache *c, int32_t parent, const int32_t *t, int n_tok,
                        int32_t block)
{
    DS_ASSERT(c->n_free_nodes > 0);
    pc_node *p = &c->nodes[parent];
    DS_ASSERT(parent == PC_ROOT || p->n_tok == c->bt);
    const int32_t id = c->free_nodes[--c->n_free_nodes];
    pc_node *x = &c->nodes[id];
    *x = (pc_node){.parent = parent, .first_child = PC_NONE, .next_sib = p->first_child,
                   .prev_sib = PC_NONE, .block = block, .n_tok = n_tok,
                   .end = p->end + n_tok, .snap = PC_NONE, .mark = c->mark,
                   .key = splitmix64_tokens(t, (size_t)n_tok),
                   .path_hash = hash_more(p->path_hash, t, n_tok)};
    if (p->first_child != PC_NONE) c->nodes[p->first_child].prev_sib = id;
    p->first_child = id;
    p->n_children++;
    memcpy(c->tokens + (size_t)id * (size_t)c->bt, t, (size_t)n_tok * sizeof *t);
    if (n_tok == c->bt) table_add(c, id);
    block_hold(c, block);
    return id;
}

static void node_free(prefix_cache *c, int32_t id)
{
    pc_node *x = &c->nodes[id], *p = &c->nodes[x->parent];
    DS_ASSERT(id != PC_ROOT && x->n_children == 0 && x->snap == PC_NONE);
    if (x->prev_sib != PC_NONE) c->nodes[x->prev_sib].next_sib = x->next_sib;
    else p->first_child = x->next_sib;
    if (x->next_sib != PC_NONE) c->nodes[x->next_sib].prev_sib = x->prev_sib;
    p->n_children--;
    if (x->n_tok == c->bt) table_del(c, id);
    block_let_go(c, x->block);
    x->n_tok = 0;
    c->free_nodes[c->n_free_nodes++] = id;
}

/* A fresh mark: the previous insert's path is unmarked. */
static void next_mark(prefix_cache *c)
{
    if (++c->mark == 0) {
        for (int i = 0; i < c->n_nodes; i++) c->nodes[i].mark = 0;
        c->mark = 1;
    }
}

/* ---- GreedyDual ---- */

/* Nodes an eviction of id's snapshot removes: a leaf and the ancestors left with neither a
 * snapshot nor another child. With pool_only, only those whose block would go back to the pool
 * (no sequence and no other node holds it). */
static int chain_blocks(const prefix_cache *c, int32_t id, bool pool_only)
{
    if (c->nodes[id].n_children > 0) return 0;
    int n = 0;
    for (int32_t x = id;;) {
        n += !pool_only || kv_pool_refs(c->kv, c->nodes[x].block) == 1;
        x = c->nodes[x].parent;
        if (x == PC_ROOT || c->nodes[x].snap != PC_NONE || c->nodes[x].n_children != 1) break;
    }
    return n;
}

/* Tokens id's snapshot saves per MiB the cache holds for it alone (its snapshot and the blocks
 * its eviction removes from the cache). */
static double node_value(const prefix_cache *c, int32_t id)
{
    const double bytes = (double)c->snap_bytes +
                         (double)c->block_bytes * (double)chain_blocks(c, id, false);
    return (double)c->nodes[id].end * 1048576.0 / (bytes > 0 ? bytes : 1.0);
}

/* A use of id's snapshot at now: its priority raised, its path's recency too. */
static void touch(prefix_cache *c, int32_t id, int64_t now)
{
    c->nodes[id].h = c->inflation + node_value(c, id);
    for (int32_t x = id; x != PC_NONE; x = c->nodes[x].parent)
        if (c->nodes[x].used < now) c->nodes[x].used = now;
}

/* Removes id and the ancestors left with neither a snapshot nor children (not the marked path
 * of an insert). */
static void prune(prefix_cache *c, int32_t id)
{
    while (id != PC_ROOT && c->nodes[id].snap == PC_NONE && c->nodes[id].n_children == 0 &&
           c->nodes[id].mark != c->mark) {
        const int32_t parent = c->nodes[id].parent;
        node_free(c, id);
        c->st.evictions++;
        id = parent;
    }
}

static void evict(prefix_cache *c, int32_t id)
{
    pc_node *x = &c->nodes[id];
    DS_ASSERT(x->snap != PC_NONE && x->mark != c->mark);
    if (x->h > c->inflation) c->inflation = x->h;
    c->snap_node[x->snap] = PC_NONE;
    c->free_snaps[c->n_free_snaps++] = x->snap;
    x->snap = PC_NONE;
    c->st.evictions++;
    prune(c, id);
}

typedef enum pick_mode {
    PICK_ANY,     /* any snapshot off the marked path */
    PICK_FREES,   /* ... whose eviction gives blocks back to the pool */
    PICK_UNLOCKS, /* a leaf below a block only the cache holds */
} pick_mode;

static bool below_cache_only(const prefix_cache *c, int32_t id)
{
    for (int32_t x = id; x != PC_ROOT; x = c->nodes[x].parent)
        if (kv_pool_refs(c->kv, c->nodes[x].block) == c->block_refs[c->nodes[x].block])
            return true;
    return false;
}

/* The lowest priority snapshot of the mode (ties: the least recently used, then the lowest id),
 * or PC_NONE. */
static int32_t pick_victim(const prefix_cache *c, pick_mode mode)
{
    int32_t best = PC_NONE;
    for (int s = 0; s < c->n_snaps; s++) {
        const int32_t id = c->snap_node[s];
        if (id == PC_NONE) continue;
        const pc_node *x = &c->nodes[id];
        if (x->mark == c->mark) continue;
        if (mode == PICK_FREES && chain_blocks(c, id, true) == 0) continue;
        if (mode == PICK_UNLOCKS && (x->n_children > 0 || !below_cache_only(c, id))) continue;
        if (best != PC_NONE) {
            const pc_node *b = &c->nodes[best];
            if (x->h > b->h || (x->h == b->h && (x->used > b->used ||
                                                  (x->used == b->used && id > best))))
                continue;
        }
        best = id;
    }
    return best;
}

/* ---- stats ---- */

static uint32_t count_cache_only(const prefix_cache *c)
{
    uint32_t n = 0;
    for (int i = 0; i < c->n_held; i++)
        n += kv_pool_refs(c->kv, c->held[i]) == c->block_refs[c->held[i]];
    return n;
}

static void publish(prefix_cache *c)
{
    c->st.snapshots = (uint32_t)(c->n_snaps - c->n_free_snaps);
    c->st.snapshot_bytes = (uint64_t)c->st.snapshots * c->snap_bytes;
    c->st.blocks = (uint32_t)c->n_held;
    c->st.blocks_only = count_cache_only(c);
    pthread_mutex_lock(&c->mu);
    c->pub = c->st;
    pthread_mutex_unlock(&c->mu);
}

/* ---- the API ---- */

/* Every node free, the root alone, every snapshot free. */
static void reset(prefix_cache *c)
{
    for (int i = 0; i < c->n_nodes; i++) c->nodes[i] = (pc_node){.n_tok = 0};
    c->nodes[PC_ROOT] = (pc_node){.parent = PC_NONE, .first_child = PC_NONE,
                                  .next_sib = PC_NONE, .prev_sib = PC_NONE, .block = PC_NONE,
                                  .snap = PC_NONE, .path_hash = SPLITMIX64_GOLDEN};
    c->n_free_nodes = 0;
    for (int i = c->n_nodes - 1; i > PC_ROOT; i--) c->free_nodes[c->n_free_nodes++] = i;
    for (uint32_t i = 0; i <= c->table_mask; i++) c->table[i] = PC_NONE;
    c->n_free_snaps = 0;
    for (int s = c->n_snaps - 1; s >= 0; s--) {
        c->snap_node[s] = PC_NONE;
        c->free_snaps[c->n_free_snaps++] = s;
    }
    c->inflation = 0;
    c->mark = 1;
}

int prefix_cache_create(const prefix_cache_opts *o, prefix_cache **out, status *st)
{
    *out = NULL;
    if (!o->kv || o->n_snaps < 1 || o->snap_bytes < 1)
        return status_fail(st, STATUS_INVALID, "prefix cache: need a kv pool, snapshots >= 1 "
                           "and snapshot bytes >= 1 (got %s, %d, %llu)",
                           o->kv ? "a pool" : "none", o->n_snaps,
                           (unsigned long long)o->snap_bytes);
    prefix_cache *c = calloc(1, sizeof *c);
    if (!c) return status_fail(st, STATUS_NOMEM, "prefix cache: out of memory");
    c->kv = o->kv;
    c->bt = kv_pool_block_tokens(o->kv);
    c->n_snaps = o->n_snaps;
    c->n_blocks = (int)kv_pool_total_blocks(o->kv);
    c->ld = kv_pool_max_blocks_per_seq(o->kv);
    c->n_nodes = c->n_blocks + c->n_snaps + 1;
    c->snap_bytes = o->snap_bytes;
    c->block_bytes = o->block_bytes;
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)c->n_nodes) cap *= 2;
    c->table_mask = cap - 1;
    pthread_mutex_init(&c->mu, NULL);
    const size_t nn = (size_t)c->n_nodes, nb = (size_t)c->n_blocks, ns = (size_t)c->n_snaps;
    c->nodes = calloc(nn, sizeof *c->nodes);
    c->tokens = calloc(nn * (size_t)c->bt, sizeof *c->tokens);
    c->free_nodes = malloc(nn * sizeof *c->free_nodes);
    c->table = malloc((size_t)cap * sizeof *c->table);
    c->snap_node = malloc(ns * sizeof *c->snap_node);
    c->free_snaps = malloc(ns * sizeof *c->free_snaps);
    c->block_refs = calloc(nb, sizeof *c->block_refs);
    c->held = malloc(nb * sizeof *c->held);
    c->held_at = malloc(nb * sizeof *c->held_at);
    c->path = calloc((size_t)c->ld, sizeof *c->path);
    if (!c->nodes || !c->tokens || !c->free_nodes || !c->table || !c->snap_node ||
        !c->free_snaps || !c->block_refs || !c->held || !c->held_at || !c->path) {
        prefix_cache_destroy(c);
        return status_fail(st, STATUS_NOMEM, "prefix cache: out of memory for %d nodes of %d "
                           "tokens", c->n_nodes, c->bt);
    }
    reset(c);
    publish(c);
    *out = c;
    return STATUS_OK;
}

void prefix_cache_destroy(prefix_cache *c)
{
    if (!c) return;
    if (c->nodes && c->tokens && c->free_nodes && c->table && c->snap_node && c->free_snaps &&
        c->block_refs && c->held && c->held_at && c->path)
        prefix_cache_clear(c);
    pthread_mutex_destroy(&c->mu);
    free(c->nodes);
    free(c->tokens);
    free(c->free_nodes);
    free(c->table);
    free(c->snap_node);
    free(c->free_snaps);
    free(c->block_refs);
    free(c->held);
    free(c->held_at);
    free(c->path);
    free(c);
}

void prefix_cache_match(prefix_cache *c, const int32_t *tokens, int n, int64_t now,
                        prefix_match *m)
{
    const int bt = c->bt;
    int32_t node = PC_ROOT, best = PC_NONE;
    for (int d = 0; (int64_t)(d + 1) * bt <= n; d++) {
        const int32_t child = find_full(c, node, tokens + (size_t)d * (size_t)bt);
        if (child == PC_NONE) break;
        node = child;
        if (c->nodes[node].snap != PC_NONE) best = node;
    }
    /* where the full blocks leave tokens: the children of the last node, partial ones (a
     * snapshot inside the next block) and full ones matching in part */
    const int at = c->nodes[node].end, rem = n - at;
    int n_kv = at;
    for (int32_t id = c->nodes[node].first_child; id != PC_NONE; id = c->nodes[id].next_sib) {
        const pc_node *x = &c->nodes[id];
        const int32_t *t = node_tokens(c, id);
        const int lim = x->n_tok < rem ? x->n_tok : rem;
        int l = 0;
        while (l < lim && t[l] == tokens[at + l]) l++;
        if (at + l > n_kv) n_kv = at + l;
        if (l == x->n_tok && x->n_tok < bt && (best == PC_NONE || x->end > c->nodes[best].end))
            best = id;
    }
    c->st.queries++;
    c->st.queried_tokens += (uint64_t)(n > 0 ? n : 0);
    *m = (prefix_match){.n_pos = 0, .snap = -1, .blocks = c->path, .n_kv = n_kv};
    if (best != PC_NONE) {
        for (int32_t x = best; x != PC_ROOT; x = c->nodes[x].parent)
            c->path[(c->nodes[x].end - 1) / bt] = c->nodes[x].block;
        m->n_pos = c->nodes[best].end;
        m->snap = c->nodes[best].snap;
        touch(c, best, now);
        c->st.hits++;
        c->st.hit_tokens += (uint64_t)m->n_pos;
    }
    publish(c);
}

int prefix_cache_insert(prefix_cache *c, int seq, const int32_t *tokens, int n, int64_t now)
{
    const int bt = c->bt, n_full = n / bt, r = n % bt;
    DS_ASSERT(n >= 1 && kv_pool_blocks_for(c->kv, n) <= (uint32_t)kv_pool_held(c->kv, seq));
    next_mark(c);
    int32_t node = PC_ROOT;
    int d = 0;
    for (; d < n_full; d++) {
        const int32_t child = find_full(c, node, tokens + (size_t)d * (size_t)bt);
        if (child == PC_NONE) break;
        node = child;
        c->nodes[node].mark = c->mark;
    }
    int32_t at = PC_NONE; /* the node already at n */
    if (d == n_full) at = r ? find_partial(c, node, tokens + (size_t)n_full * (size_t)bt, r) : node;
    if (at != PC_NONE && c->nodes[at].snap != PC_NONE) {
        touch(c, at, now);
        next_mark(c);
        publish(c);
        return -1;
    }
    const int need = n_full - d + (at == PC_NONE && r ? 1 : 0);
    while (c->n_free_snaps == 0 || c->n_free_nodes < need) {
        const int32_t victim = pick_victim(c, PICK_ANY);
        if (victim == PC_NONE) {
            next_mark(c);
            prune(c, node); /* the path may have lost what hung below it */
            publish(c);
            return -1;
        }
        evict(c, victim);
    }
    const int32_t *table = kv_pool_table(c->kv, seq);
    for (; d < n_full; d++) node = node_new(c, node, tokens + (size_t)d * (size_t)bt, bt, table[d]);
    if (at == PC_NONE)
        at = r ? node_new(c, node, tokens + (size_t)n_full * (size_t)bt, r, table[n_full]) : node;
    const int snap = c->free_snaps[--c->n_free_snaps];
    c->nodes[at].snap = snap;
    c->snap_node[snap] = at;
    touch(c, at, now);
    c->st.inserts++;
    next_mark(c);
    publish(c);
    return snap;
}

uint32_t prefix_cache_reclaim(prefix_cache *c, uint32_t want)
{
    while (kv_pool_free_blocks(c->kv) < want) {
        int32_t victim = pick_victim(c, PICK_FREES);
        if (victim == PC_NONE) victim = pick_victim(c, PICK_UNLOCKS);
        if (victim == PC_NONE) break;
        evict(c, victim);
    }
    publish(c);
    return kv_pool_free_blocks(c->kv);
}

uint32_t prefix_cache_reclaimable(const prefix_cache *c) { return count_cache_only(c); }

void prefix_cache_clear(prefix_cache *c)
{
    for (int i = PC_ROOT + 1; i < c->n_nodes; i++)
        if (c->nodes[i].n_tok > 0) block_let_go(c, c->nodes[i].block);
    DS_ASSERT(c->n_held == 0);
    reset(c);
    publish(c);
}

/* The next node after id in a walk of the nodes holding positions before n_tokens and those
 * holding position n_tokens - 1 (not below them), PC_NONE after the last. */
static int32_t heads_next(const prefix_cache *c, int32_t id, int n_tokens)
{
    const pc_node *x = &c->nodes[id];
    if (x->end < n_tokens && x->first_child != PC_NONE) return x->first_child;
    while (id != PC_ROOT && c->nodes[id].next_sib == PC_NONE) id = c->nodes[id].parent;
    return id == PC_ROOT ? PC_NONE : c->nodes[id].next_sib;
}

int prefix_cache_heads(const prefix_cache *c, int n_tokens, uint64_t *out, int max)
{
    if (n_tokens < 1) return 0;
    int k = 0;
    int64_t last_used = INT64_MAX;
    int32_t last = PC_NONE;
    /* the nodes holding position n_tokens - 1, picked most recent first (ties: lowest id);
     * max picks of a walk over the trie's top, without scratch memory */
    while (k < max) {
        int32_t best = PC_NONE;
        for (int32_t id = heads_next(c, PC_ROOT, n_tokens); id != PC_NONE;
             id = heads_next(c, id, n_tokens)) {
            const pc_node *x = &c->nodes[id];
            if (x->end < n_tokens) continue;
            if (x->used > last_used || (x->used == last_used && id <= last)) continue;
            if (best != PC_NONE && (x->used < c->nodes[best].used ||
                                    (x->used == c->nodes[best].used && id > best)))
                continue;
            best = id;
        }
        if (best == PC_NONE) break;
        const pc_node *x = &c->nodes[best];
        const int start = x->end - x->n_tok;
        const uint64_t h = hash_more(c->nodes[x->parent].path_hash, node_tokens(c, best),
                                     n_tokens - start);
        bool seen = false;
        for (int i = 0; i < k && !seen; i++) seen = out[i] == h;
        if (!seen) out[k++] = h;
        last_used = x->used;
        last = best;
    }
    return k;
}

void prefix_cache_get_stats(const prefix_cache *c, prefix_cache_stats *s)
{
    prefix_cache *m = (prefix_cache *)c;
    pthread_mutex_lock(&m->mu);
    *s = m->pub;
    pthread_mutex_unlock(&m->mu);
}

/* ---- tests ---- */

int prefix_cache_check(const prefix_cache *c, status *st)
{
    const int bt = c->bt;
    int in_use = 0, n_full = 0, n_snaps = 0;
    for (int32_t id = PC_ROOT + 1; id < c->n_nodes; id++) {
        const pc_node *x = &c->nodes[id];
        if (x->n_tok == 0) continue;
        in_use++;
        const pc_node *p = &c->nodes[x->parent];
        if (x->parent != PC_ROOT && p->n_tok != bt)
            return status_fail(st, STATUS_INTERNAL, "prefix cache: node %d's parent %d is not "
                               "full", id, x->parent);
        if (x->n_tok > bt || x->end != p->end + x->n_tok)
            return status_fail(st, STATUS_INTERNAL, "prefix cache: node %d: %d tokens ending at "
                               "%d under a parent ending at %d", id, x->n_tok, x->end, p->end);
        if (x->n_children == 0 && x->snap == PC_NONE)
            return status_fail(st, STATUS_INTERNAL, "prefix cache: leaf %d has no snapshot", id);
        if (x->n_tok < bt && x->n_children != 0)
            return status_fail(st, STATUS_INTERNAL, "prefix cache: partial node %d has "
                               "children", id);
        if (x->key != splitmix64_tokens(node_tokens(c, id), (size_t)x->n_tok) ||
            x->path_hash != hash_more(p->path_hash, node_tokens(c, id), x->n_tok))
            return status_fail(st, STATUS_INTERNAL, "prefix cache: node %d's hashes", id);
        if (x->n_tok == bt) {
            n_full++;
            if (find_full(c, x->parent, node_tokens(c, id)) != id)
                return status_fail(st, STATUS_INTERNAL, "prefix cache: full node %d not found "
                                   "in the child table", id);
        }
        int n_children = 0;
        for (int32_t ch = x->first_child; ch != PC_NONE; ch = c->nodes[ch].next_sib) {
            if (c->nodes[ch].parent != id || c->nodes[ch].n_tok == 0)
                return status_fail(st, STATUS_INTERNAL, "prefix cache: node %d lists child %d",
                                   id, ch);
            n_children++;
        }
        if (n_children != x->n_children)
            return status_fail(st, STATUS_INTERNAL, "prefix cache: node %d has %d children, "
                               "counts %d", id, n_children, x->n_children);
        if (x->snap != PC_NONE) {
            n_snaps++;
            if (x->snap < 0 || x->snap >= c->n_snaps || c->snap_node[x->snap] != id)
                return status_fail(st, STATUS_INTERNAL, "prefix cache: node %d's snapshot %d",
                                   id, x->snap);
        }
        if (x->mark == c->mark)
            return status_fail(st, STATUS_INTERNAL, "prefix cache: node %d still marked", id);
    }
    if (in_use + c->n_free_nodes + 1 != c->n_nodes || n_snaps + c->n_free_snaps != c->n_snaps)
        return status_fail(st, STATUS_INTERNAL, "prefix cache: %d nodes + %d free of %d, %d "
                           "snapshots + %d free of %d", in_use, c->n_free_nodes, c->n_nodes - 1,
                           n_snaps, c->n_free_snaps, c->n_snaps);
    int n_table = 0;
    for (uint32_t i = 0; i <= c->table_mask; i++) n_table += c->table[i] != PC_NONE;
    if (n_table != n_full)
        return status_fail(st, STATUS_INTERNAL, "prefix cache: %d table entries, %d full nodes",
                           n_table, n_full);
    /* every block's count: the tables that list it and the cache's nodes, nothing else */
    int held = 0;
    for (int32_t b = 0; b < c->n_blocks; b++) {
        int refs = 0, tables = 0;
        for (int32_t id = PC_ROOT + 1; id < c->n_nodes; id++)
            refs += c->nodes[id].n_tok > 0 && c->nodes[id].block == b;
        for (int s = 0; s < kv_pool_n_seqs(c->kv); s++)
            for (int i = 0; i < kv_pool_held(c->kv, s); i++)
                tables += kv_pool_table(c->kv, s)[i] == b;
        if (refs != c->block_refs[b] || kv_pool_refs(c->kv, b) != refs + tables)
            return status_fail(st, STATUS_INTERNAL, "prefix cache: block %d: %d nodes (counted "
                               "%d), %d tables, pool count %d", b, refs, c->block_refs[b], tables,
                               kv_pool_refs(c->kv, b));
        if (refs > 0 && (c->held_at[b] >= c->n_held || c->held[c->held_at[b]] != b))
            return status_fail(st, STATUS_INTERNAL, "prefix cache: block %d not in the held "
                               "list", b);
        held += refs > 0;
    }
    if (held != c->n_held || c->st.snapshots != (uint32_t)n_snaps ||
        c->st.blocks != (uint32_t)held)
        return status_fail(st, STATUS_INTERNAL, "prefix cache: %d blocks held (listed %d, stats "
                           "%u), %d snapshots (stats %u)", held, c->n_held, c->st.blocks, n_snaps,
                           c->st.snapshots);
    return STATUS_OK;
}
