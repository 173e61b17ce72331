/* Routing policies: which worker gets a request.
 *
 * least  — power of two choices: two distinct eligible workers drawn at random, the one with
 *          fewer outstanding tokens wins (ties: the first drawn). With one eligible worker, it.
 * prefix — prefix affinity: the first N prompt tokens are hashed (router_policy_prefix_hash).
 *          A worker whose prefix cache holds a prefix with that head (its last GetLoad listed
 *          the hash among its prefix_heads: holds_prefix) is taken first: the least loaded such
 *          worker that is not overloaded (ties: the rendezvous order below), so a conversation
 *          goes back to the worker that holds its snapshot. Otherwise the hash is
 *          rendezvous-hashed (highest hash of prefix ⊕ worker key) onto the eligible workers,
 *          so requests that share a prompt prefix land on the same worker (its caches stay
 *          warm) and a worker joining or leaving moves only its own share. When that worker is
 *          overloaded too (requests waiting in its queue, or load > balance_rel · least load +
 *          balance_abs) the request falls back to least.
 * Pure functions over a candidate array: no locks, no I/O; the pool (router_pool.h) builds the
 * array under its lock. */
#ifndef DS_ROUTER_ROUTER_POLICY_H
#define DS_ROUTER_ROUTER_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum router_routing { ROUTER_ROUTING_LEAST = 0, ROUTER_ROUTING_PREFIX } router_routing;

typedef struct router_policy {
    router_routing mode;
    int prefix_tokens;   /* N: tokens hashed for prefix affinity (default 32) */
    int64_t balance_abs; /* overload slack in tokens (default 1024) */
    double balance_rel;  /* overload ratio to the least loaded worker (default 2.0) */
} router_policy;

typedef struct router_policy_cand {
    uint64_t key;  /* stable hash of the worker address (router_policy_hash_str) */
    int64_t load;  /* outstanding tokens: prompt + remaining new tokens of in-flight requests */
    int waiting;   /* requests queued at the worker, from its last GetLoad */
    int eligible;  /* healthy and not excluded for this request */
    int holds_prefix; /* its last GetLoad listed the request's prefix hash among its heads */
} router_policy_cand;

/* Defaults above. */
void router_policy_defaults(router_policy *p);

/* Parses "least" / "prefix"; STATUS_INVALID naming the flag otherwise. */
int router_policy_parse_mode(const char *s, router_routing *mode, status *st);

uint64_t router_policy_hash_str(const char *s);

/* Hash of the first min(n, prefix_tokens) ids. */
uint64_t router_policy_prefix_hash(const int32_t *ids, size_t n, int prefix_tokens);

/* A 64-bit random step (splitmix64) over *rng: per-thread or per-request state. */
uint64_t router_policy_rand(uint64_t *rng);

/* Index of the chosen candidate, or -1 when none is eligible. */
int router_policy_pick(const router_policy *p, const router_policy_cand *c, int n,
                       uint64_t prefix_hash, uint64_t *rng);

#endif
