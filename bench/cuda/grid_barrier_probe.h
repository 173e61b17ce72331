/* Probe of a phase boundary's cost (bench/cuda/grid_barrier_probe.cu, grid_barrier_bench).
 * mode 0: n_phases grid barriers inside one persistent kernel of nblocks CTAs (all resident);
 * mode 1: a graph of n_phases kernels; mode 2: the same with programmatic dependent launch.
 * chain = 1: each phase reads another CTA's value of the previous phase (one dependent L2 round
 * trip), and *check gets CTA 0's value at the end: the chain runs on across launches, so with
 * n_phases even it equals n_phases * (reps + 1) exactly when every read saw the previous write.
 * Returns 0 and the mean µs per phase over reps graph launches. */
#ifndef DS_BENCH_CUDA_GRID_BARRIER_PROBE_H
#define DS_BENCH_CUDA_GRID_BARRIER_PROBE_H

#ifdef __cplusplus
extern "C" {
#endif

int grid_barrier_probe(int nblocks, int threads, int n_phases, int mode, int chain, int reps,
                       float *us_per_phase, unsigned *check);

#ifdef __cplusplus
}
#endif

#endif
