#include "router/router_policy.h"

#include <string.h>

#include "common/splitmix64.h"

void router_policy_defaults(router_policy *p)
{
    p->mode = ROUTER_ROUTING_LEAST;
    p->prefix_tokens = 32;
    p->balance_abs = 1024;
    p->balance_rel = 2.0;
}

int router_policy_parse_mode(const char *s, router_routing *mode, status *st)
{
    if (s && !strcmp(s, "least")) *mode = ROUTER_ROUTING_LEAST;
    else if (s && !strcmp(s, "prefix")) *mode = ROUTER_ROUTING_PREFIX;
    else return status_fail(st, STATUS_INVALID, "--routing: '%s' is not least or prefix",
                            s ? s : "");
    return 0;
}

uint64_t router_policy_hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a, then a finalizer */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return splitmix64_mix(h);
}

uint64_t router_policy_prefix_hash(const int32_t *ids, size_t n, int prefix_tokens)
{
    size_t m = prefix_tokens > 0 && (size_t)prefix_tokens < n ? (size_t)prefix_tokens : n;
    return splitmix64_tokens(ids, m);
}

uint64_t router_policy_rand(uint64_t *rng)
{
    return splitmix64_next(rng);
}

static int pick_least(const router_policy_cand *c, int n, int n_eligible, uint64_t *rng)
{
    /* the r-th eligible candidate */
    int a = (int)(router_policy_rand(rng) % (uint64_t)n_eligible);
    int b = n_eligible > 1 ? (int)(router_policy_rand(rng) % (uint64_t)(n_eligible - 1)) : -1;
    if (b >= a) b++;
    int ia = -1, ib = -1;
    for (int i = 0, k = 0; i < n; i++) {
        if (!c[i].eligible) continue;
        if (k == a) ia = i;
        if (k == b) ib = i;
        k++;
    }
    if (ib < 0 || c[ia].load <= c[ib].load) return ia;
    return ib;
}

int router_policy_pick(const router_policy *p, const router_policy_cand *c, int n,
                       uint64_t prefix_hash, uint64_t *rng)
{
    int n_eligible = 0;
    int64_t min_load = INT64_MAX;
    for (int i = 0; i < n; i++) {
        if (!c[i].eligible) continue;
        n_eligible++;
        if (c[i].load < min_load) min_load = c[i].load;
    }
    if (n_eligible == 0) return -1;
    if (p->mode == ROUTER_ROUTING_PREFIX) {
        double limit = p->balance_rel * (double)min_load + (double)p->balance_abs;
        int best = -1, holder = -1;
        uint64_t best_score = 0, holder_score = 0;
        for (int i = 0; i < n; i++) {
            if (!c[i].eligible) continue;
            uint64_t score = splitmix64_mix(prefix_hash ^ c[i].key);
            if (best < 0 || score > best_score) {
                best = i;
                best_score = score;
            }
            if (!c[i].holds_prefix || c[i].waiting || (double)c[i].load > limit) continue;
            if (holder < 0 || c[i].load < c[holder].load ||
                (c[i].load == c[holder].load && score > holder_score)) {
                holder = i;
                holder_score = score;
            }
        }
        if (holder >= 0) return holder;
        if (c[best].waiting == 0 && (double)c[best].load <= limit) return best;
    }
    return pick_least(c, n, n_eligible, rng);
}
