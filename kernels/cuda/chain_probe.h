/* The launch-gap probe (bench/cuda/chain_bench): how fast a chain of small dependent matrix
 * products can go, as separate kernels in a graph against one persistent kernel with grid
 * barriers. It decides whether a persistent batch-1 forward is worth building (docs/GPU.md §5:
 * the 0.8B's token is ~200 dependent kernels of a few µs each).
 *
 * The chain: n_ops int8 products alternating 3,584×1,024 and 1,024×3,584 (the 0.8B's FFN
 * shapes), each op's output (the int32 dot of a row folded to int8) the next op's input, every
 * op's weights distinct (more bytes than the L2 holds). The variants:
 *   CHAIN_GRAPH         one kernel an op, a graph, no PDL;
 *   CHAIN_GRAPH_PDL     one kernel an op, PDL: each kernel prefetches its rows into L2 before
 *                       waiting for its predecessor (what the engine's GEMVs do today);
 *   CHAIN_GRAPH_PDL_REG the same, each warp's row loaded into registers before the wait;
 *   CHAIN_PERSIST       one kernel for the chain (as many CTAs as are resident), a grid barrier
 *                       between ops, the next op's rows prefetched into L2 before each barrier;
 *   CHAIN_PERSIST_REG   the same, each warp's next row loaded into registers before the barrier.
 * Every variant computes the same integers; the bench checks the final outputs agree. */
#ifndef DS_KERNELS_CUDA_CHAIN_PROBE_H
#define DS_KERNELS_CUDA_CHAIN_PROBE_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdint.h>

#include "common/status.h"

#ifdef __CUDACC__
#define CHAIN_HD __host__ __device__
#else
#define CHAIN_HD
#endif

/* The chain's shapes: op i multiplies CHAIN_WIDE x CHAIN_NARROW weights for even i, CHAIN_NARROW
 * x CHAIN_WIDE for odd i; its weights are CHAIN_MATRIX bytes from op i - 1's. */
#define CHAIN_WIDE 3584
#define CHAIN_NARROW 1024
#define CHAIN_MATRIX ((int64_t)CHAIN_WIDE * CHAIN_NARROW)

/* byte i of the weights (seed CHAIN_SEED_W) or of the first op's input (CHAIN_SEED_X) */
#define CHAIN_SEED_W 12345u
#define CHAIN_SEED_X 777u
static inline CHAIN_HD int8_t chain_fill_byte(int64_t i, uint32_t seed)
{
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (int8_t)h;
}

/* an output: the int32 dot of a row and the input, folded to int8 */
static inline CHAIN_HD int8_t chain_fold(int32_t acc) { return (int8_t)((acc >> 7) ^ acc); }

/* The checksum the variants report, of the last op's CHAIN_NARROW outputs. */
static inline unsigned long long chain_checksum(const int8_t *out)
{
    unsigned long long sum = 0;
    for (int i = 0; i < CHAIN_NARROW; i++) sum = sum * 1099511628211ull + (uint8_t)out[i];
    return sum;
}

typedef enum chain_variant {
    CHAIN_GRAPH,
    CHAIN_GRAPH_PDL,
    CHAIN_GRAPH_PDL_REG,
    CHAIN_PERSIST,
    CHAIN_PERSIST_REG,
    CHAIN_VARIANTS
} chain_variant;

typedef struct chain_result {
    double us;             /* µs a chain, the mean over reps after one warm-up */
    double bytes;          /* weight bytes a chain */
    unsigned long long sum; /* a checksum of the last op's output */
    int ctas;              /* CTAs of the launch (the persistent variants: resident CTAs) */
} chain_result;

/* Runs variant v over a chain of n_ops (even, 2..512) products reps times; *r its figures.
 * per_sm: the persistent variants' CTAs an SM (0: as many as are resident). */
int chain_probe_run(chain_variant v, int n_ops, int reps, int per_sm, chain_result *r, status *st);

/* The variant's name as the bench prints it. */
const char *chain_variant_name(chain_variant v);

#ifdef __cplusplus
}
#endif

#endif
