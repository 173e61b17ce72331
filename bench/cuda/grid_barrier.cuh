// A grid-wide barrier for persistent kernels whose CTAs are all resident at once (the grid is
// sized from the occupancy calculator, docs/GPU.md "The whole-token kernel").
//
// count grows by one per CTA per barrier; barrier number p (1, 2, ...) of a launch is passed
// once count >= p * nblocks. Only thread 0 of each CTA touches it: a release add, then acquire
// loads until the target is reached, so every write made by any CTA before its arrival is
// visible to every CTA after the barrier. grid_exit resets the counters for the next launch:
// the last CTA to leave (done reaches nblocks) zeroes both, after every CTA has stopped
// reading count.
#ifndef DS_GRID_BARRIER_CUH
#define DS_GRID_BARRIER_CUH

struct grid_sync {
    unsigned *count; // [0]: arrivals, [32]: exits (separate 128-byte lines)
    unsigned nblocks;
};

static __device__ __forceinline__ unsigned ds_ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// the arrival alone (a CTA may do independent work, e.g. prefetches, before grid_wait)
static __device__ __forceinline__ void grid_arrive(const grid_sync &g)
{
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(g.count) : "memory");
}

static __device__ __forceinline__ void grid_wait(const grid_sync &g, unsigned phase)
{
    if (threadIdx.x == 0) {
        const unsigned target = phase * g.nblocks;
        while ((int)(ds_ld_acquire(g.count) - target) < 0) {
        }
    }
    __syncthreads();
}

static __device__ __forceinline__ void grid_barrier(const grid_sync &g, unsigned phase)
{
    grid_arrive(g);
    grid_wait(g, phase);
}

static __device__ __forceinline__ void grid_exit(const grid_sync &g)
{
    if (threadIdx.x == 0 && atomicAdd(g.count + 32, 1u) == g.nblocks - 1) {
        atomicExch(g.count, 0u);
        atomicExch(g.count + 32, 0u);
    }
}

#endif
