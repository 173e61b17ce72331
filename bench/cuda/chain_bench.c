/* The launch-gap probe (kernels/cuda/chain_probe.h): a chain of dependent int8 products with the
 * 0.8B's FFN shapes, as a graph of kernels (without and with PDL) and as one persistent kernel
 * with grid barriers; prints µs a chain and an op, the weights' GB/s, and whether every variant's
 * output matches the chain computed on the CPU (the kernels' C twin, chain_cpu).
 * Usage: chain_bench [n_ops (even, default 96)] [reps (default 50)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/chain_probe.h"
#include "kernels/cuda/cuda_device.h"

/* the chain on the CPU: the checksum every variant must report */
static unsigned long long chain_cpu(int n_ops)
{
    int8_t x[CHAIN_WIDE], y[CHAIN_WIDE];
    for (int i = 0; i < CHAIN_NARROW; i++) x[i] = chain_fill_byte(i, CHAIN_SEED_X);
    for (int op = 0; op < n_ops; op++) {
        const int n_out = op % 2 ? CHAIN_NARROW : CHAIN_WIDE, n_in = op % 2 ? CHAIN_WIDE : CHAIN_NARROW;
        const int64_t base = op * CHAIN_MATRIX;
        for (int r = 0; r < n_out; r++) {
            int32_t acc = 0;
            for (int k = 0; k < n_in; k++)
                acc += chain_fill_byte(base + (int64_t)r * n_in + k, CHAIN_SEED_W) * x[k];
            y[r] = chain_fold(acc);
        }
        memcpy(x, y, (size_t)n_out);
    }
    return chain_checksum(x);
}

int main(int argc, char **argv)
{
    const int n_ops = argc > 1 ? atoi(argv[1]) : 96, reps = argc > 2 ? atoi(argv[2]) : 50;
    if (n_ops < 2 || n_ops > 512 || n_ops % 2 || reps < 1) {
        fprintf(stderr, "chain_bench: n_ops %s (even, 2..512) or reps %s (>= 1) out of range\n",
                argc > 1 ? argv[1] : "", argc > 2 ? argv[2] : "");
        return 2;
    }
    status st = {0};
    if (!cuda_device_available(&st)) {
        fprintf(stderr, "chain_bench: %s\n", st.msg);
        return 1;
    }
    printf("chain of %d ops (3584x1024 and 1024x3584 int8), %d reps\n", n_ops, reps);
    printf("| variant | CTAs | us a chain | us an op | GB/s | output |\n|---|---|---|---|---|---|\n");
    const unsigned long long ref = chain_cpu(n_ops);
    int bad = 0;
    /* the persistent variants with 1 and 2 CTAs an SM, then as many as are resident */
    static const int k_per_sm[] = {0, 0, 0, 1, 2, 0, 1, 2, 0};
    static const int k_variant[] = {CHAIN_GRAPH,   CHAIN_GRAPH_PDL,   CHAIN_GRAPH_PDL_REG,
                                    CHAIN_PERSIST, CHAIN_PERSIST,     CHAIN_PERSIST,
                                    CHAIN_PERSIST_REG, CHAIN_PERSIST_REG, CHAIN_PERSIST_REG};
    for (int i = 0; i < (int)(sizeof k_variant / sizeof *k_variant); i++) {
        const int v = k_variant[i];
        chain_result r = {0};
        if (chain_probe_run((chain_variant)v, n_ops, reps, k_per_sm[i], &r, &st)) {
            fprintf(stderr, "chain_bench: %s: %s\n", chain_variant_name((chain_variant)v), st.msg);
            return 1;
        }
        bad |= r.sum != ref;
        printf("| %s | %d | %.1f | %.2f | %.0f | %s |\n", chain_variant_name((chain_variant)v),
               r.ctas, r.us, r.us / n_ops, r.bytes / (r.us * 1e3), r.sum == ref ? "same" : "DIFFERS");
    }
    return bad;
}
