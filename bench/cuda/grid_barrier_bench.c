/* What a phase boundary costs on this GPU: grid barriers inside one persistent kernel against
 * kernel boundaries in a CUDA graph, with and without programmatic dependent launch, bare and
 * with one dependent L2 round trip per phase. Prints one line per case; exits non-zero when a
 * chained case lost an update (a barrier that does not order memory). */
#include <stdio.h>
#include <stdlib.h>

#include "bench/cuda/grid_barrier_probe.h"

int main(int argc, char **argv)
{
    const int n_phases = argc > 1 ? atoi(argv[1]) : 1000, reps = 20;
    static const char *const mode_name[] = {"persistent grid barrier", "graph kernels",
                                            "graph kernels + PDL"};
    const int grids[] = {132, 264, 528}, threads[] = {128, 256};
    int bad = 0;
    printf("%-26s %6s %7s %6s %10s %s\n", "mode", "CTAs", "threads", "chain", "us/phase", "check");
    for (int mode = 0; mode < 3; mode++)
        for (int gi = 0; gi < 3; gi++)
            for (int ti = 0; ti < 2; ti++)
                for (int chain = 0; chain < 2; chain++) {
                    float us = 0;
                    unsigned check = 0;
                    if (grid_barrier_probe(grids[gi], threads[ti], n_phases, mode, chain, reps, &us,
                                           &check)) {
                        printf("%-26s %6d %7d %6d FAILED (CUDA error)\n", mode_name[mode],
                               grids[gi], threads[ti], chain);
                        bad = 1;
                        continue;
                    }
                    const unsigned want = chain ? (unsigned)(n_phases * (reps + 1)) : 0;
                    const int ok = !chain || check == want;
                    printf("%-26s %6d %7d %6d %10.3f %u%s\n", mode_name[mode], grids[gi],
                           threads[ti], chain, us, check, ok ? "" : " WRONG");
                    bad |= !ok;
                }
    return bad;
}
