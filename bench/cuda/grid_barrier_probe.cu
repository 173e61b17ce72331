// Measures what a phase boundary costs on this GPU: a grid barrier inside one persistent
// kernel against a kernel boundary in a CUDA graph with programmatic dependent launch (the
// step graph's). See grid_barrier_probe.h.
#include "kernels/cuda/cuda_check.cuh"
#include "bench/cuda/grid_barrier.cuh"
#include "bench/cuda/grid_barrier_probe.h"

// Phase p: CTA b reads the value CTA b+1 wrote in phase p-1 (from L2), adds one, writes its own.
// With chain = 0 the phases only synchronise.
static __global__ void probe_persistent(grid_sync g, int n_phases, int chain, unsigned *buf)
{
    const unsigned nb = gridDim.x, b = blockIdx.x;
    for (int p = 1; p <= n_phases; p++) {
        if (chain && threadIdx.x == 0) {
            const unsigned *src = buf + ((p - 1) & 1) * nb * 32;
            unsigned *dst = buf + (p & 1) * nb * 32;
            dst[b * 32] = __ldcg(src + ((b + 1) % nb) * 32) + 1;
        }
        grid_barrier(g, (unsigned)p);
    }
    grid_exit(g);
}

static __global__ void probe_step(int p, int chain, unsigned *buf)
{
    ds_grid_dep();
    const unsigned nb = gridDim.x, b = blockIdx.x;
    if (chain && threadIdx.x == 0) {
        const unsigned *src = buf + ((p - 1) & 1) * nb * 32;
        unsigned *dst = buf + (p & 1) * nb * 32;
        dst[b * 32] = __ldcg(src + ((b + 1) % nb) * 32) + 1;
    }
}

extern "C" int grid_barrier_probe(int nblocks, int threads, int n_phases, int mode, int chain,
                                  int reps, float *us_per_phase, unsigned *check)
{
    unsigned *d_sync = NULL, *d_buf = NULL;
    cudaStream_t s;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0, e1;
    int rc = 1;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    if (cudaMalloc(&d_sync, 256) != cudaSuccess ||
        cudaMalloc(&d_buf, 2ull * nblocks * 32 * sizeof(unsigned)) != cudaSuccess)
        goto out;
    cudaMemset(d_sync, 0, 256);
    cudaMemset(d_buf, 0, 2ull * nblocks * 32 * sizeof(unsigned));
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (mode == 0) {
        const grid_sync g = {d_sync, (unsigned)nblocks};
        probe_persistent<<<nblocks, threads, 0, s>>>(g, n_phases, chain, d_buf);
    } else {
        const cuda_launch l = {s, mode == 2};
        for (int p = 1; p <= n_phases; p++)
            ds_launch(probe_step, nblocks, threads, 0, &l, p, chain, d_buf);
    }
    if (cudaStreamEndCapture(s, &graph) != cudaSuccess) goto out;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) goto out;
    cudaGraphLaunch(exec, s); // warm-up
    cudaEventRecord(e0, s);
    for (int r = 0; r < reps; r++) cudaGraphLaunch(exec, s);
    cudaEventRecord(e1, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) goto out;
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    *us_per_phase = ms * 1000.0f / (float)reps / (float)n_phases;
    // the chain's value: CTA 0 after the last phase (n_phases when every read saw the last write)
    cudaMemcpy(check, d_buf + (n_phases & 1) * nblocks * 32, sizeof(unsigned), cudaMemcpyDeviceToHost);
    rc = cudaGetLastError() != cudaSuccess;
out:
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaFree(d_sync);
    cudaFree(d_buf);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(s);
    return rc;
}
