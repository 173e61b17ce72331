/* SplitMix64 (Steele, Lea and Flood 2014; Vigna's splitmix64.c): the 64-bit finaliser and the
 * generator. One copy for seeds, hashes and counter-based streams. */
#ifndef DS_COMMON_SPLITMIX64_H
#define DS_COMMON_SPLITMIX64_H

#include <stddef.h>
#include <stdint.h>

/* The generator's increment (2^64 / golden ratio). */
#define SPLITMIX64_GOLDEN 0x9e3779b97f4a7c15ull

/* The finaliser: a bijective mix of all 64 bits. */
static inline uint64_t splitmix64_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The generator: advances *state and returns the next output. */
static inline uint64_t splitmix64_next(uint64_t *state)
{
    *state += SPLITMIX64_GOLDEN;
    return splitmix64_mix(*state);
}

/* The output following state x without keeping the state (a one-shot seed mix). */
static inline uint64_t splitmix64(uint64_t x) { return splitmix64_mix(x + SPLITMIX64_GOLDEN); }

/* A hash of token ids ids[0 .. n): the router's prefix affinity key (router/router_policy.h) and
 * the heads a worker's prefix cache reports (model/prefix_cache.h) are this one. */
static inline uint64_t splitmix64_tokens(const int32_t *ids, size_t n)
{
    uint64_t h = SPLITMIX64_GOLDEN;
    for (size_t i = 0; i < n; i++) h = splitmix64_mix(h ^ (uint32_t)ids[i]);
    return h;
}

#endif
