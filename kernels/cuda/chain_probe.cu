// The launch-gap probe: a chain of dependent int8 products as a graph of kernels or as one
// persistent kernel (chain_probe.h). A bench, not the engine: it allocates and syncs.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/chain_probe.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.h"

namespace {

constexpr int CP_WARPS = 8;                   // warps a CTA, one row a warp at a time
constexpr int CP_WIDE = CHAIN_WIDE, CP_NARROW = CHAIN_NARROW;
constexpr int CP_CHUNKS = CP_WIDE / 16 / 32;  // 16-byte loads a lane for the longest row
constexpr int64_t CP_MATRIX = CHAIN_MATRIX;
constexpr int CP_XS = 4096;                   // bytes between two ops' activations

enum { MODE_PLAIN, MODE_L2, MODE_REG };

__device__ __forceinline__ int op_out(int op) { return op % 2 ? CP_NARROW : CP_WIDE; }
__device__ __forceinline__ int op_in(int op) { return op % 2 ? CP_WIDE : CP_NARROW; }

__device__ __forceinline__ void load_row(const int8_t *W, int n_in, int row, int lane, uint4 *w)
{
    const uint4 *p = reinterpret_cast<const uint4 *>(W + (int64_t)row * n_in);
    const int n = n_in / 16;
#pragma unroll
    for (int j = 0; j < CP_CHUNKS; j++) {
        const int i = lane + 32 * j;
        w[j] = i < n ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
    }
}

__device__ __forceinline__ void prefetch_row(const int8_t *W, int n_in, int row, int lane)
{
    const int8_t *p = W + (int64_t)row * n_in;
    for (int o = lane * 128; o < n_in; o += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}

// the row's dot with x (read through L2: another CTA wrote it), folded to int8
__device__ __forceinline__ int8_t dot_row(const uint4 *w, const int8_t *x, int n_in, int lane)
{
    const uint4 *xp = reinterpret_cast<const uint4 *>(x);
    const int n = n_in / 16;
    int acc = 0;
#pragma unroll
    for (int j = 0; j < CP_CHUNKS; j++) {
        const int i = lane + 32 * j;
        if (i < n) {
            const uint4 b = __ldcg(xp + i);
            acc = __dp4a((int)w[j].x, (int)b.x, acc);
            acc = __dp4a((int)w[j].y, (int)b.y, acc);
            acc = __dp4a((int)w[j].z, (int)b.z, acc);
            acc = __dp4a((int)w[j].w, (int)b.w, acc);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return chain_fold(acc);
}

// One op, one kernel: warp w of CTA k computes row k * CP_WARPS + w.
template <int MODE>
__global__ void __launch_bounds__(CP_WARPS * 32)
    chain_op_kernel(const int8_t *__restrict__ W, int n_out, int n_in,
                    const int8_t *__restrict__ x, int8_t *__restrict__ y)
{
    const int lane = threadIdx.x % 32, row = blockIdx.x * CP_WARPS + threadIdx.x / 32;
    const bool live = row < n_out;
    uint4 w[CP_CHUNKS];
    if (MODE == MODE_L2 && live) prefetch_row(W, n_in, row, lane);
    if (MODE == MODE_REG && live) load_row(W, n_in, row, lane, w);
    ds_grid_dep();
    if (!live) return;
    if (MODE != MODE_REG) load_row(W, n_in, row, lane, w);
    const int8_t v = dot_row(w, x, n_in, lane);
    if (lane == 0) y[row] = v;
}

// Every CTA arrives (after its writes, made visible at GPU scope) and waits until all of the
// grid's have arrived `target` times in all.
__device__ __forceinline__ void grid_barrier(unsigned *bar, unsigned target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

// The chain in one kernel: global warp g takes rows g, g + G, ... of each op; before each
// barrier the next op's rows are prefetched (MODE_L2) or the first loaded (MODE_REG).
template <int MODE>
__global__ void __launch_bounds__(CP_WARPS * 32)
    chain_persist_kernel(const int8_t *__restrict__ W, int8_t *xs, int n_ops, unsigned *bar)
{
    const int lane = threadIdx.x % 32;
    const int g = blockIdx.x * CP_WARPS + threadIdx.x / 32, G = gridDim.x * CP_WARPS;
    uint4 w[CP_CHUNKS];
    if (MODE == MODE_REG && g < op_out(0)) load_row(W, op_in(0), g, lane, w);
    for (int op = 0; op < n_ops; op++) {
        const int n_out = op_out(op), n_in = op_in(op);
        const int8_t *Wo = W + op * CP_MATRIX, *x = xs + (int64_t)op * CP_XS;
        int8_t *y = xs + (int64_t)(op + 1) * CP_XS;
        for (int r = g; r < n_out; r += G) {
            if (MODE != MODE_REG || r != g) load_row(Wo, n_in, r, lane, w);
            const int8_t v = dot_row(w, x, n_in, lane);
            if (lane == 0) y[r] = v;
        }
        if (op + 1 == n_ops) break;
        const int8_t *Wn = Wo + CP_MATRIX;
        const int no = op_out(op + 1), ni = op_in(op + 1);
        if (MODE == MODE_REG && g < no) load_row(Wn, ni, g, lane, w);
        if (MODE != MODE_PLAIN)
            for (int r = MODE == MODE_REG ? g + G : g; r < no; r += G) prefetch_row(Wn, ni, r, lane);
        grid_barrier(bar, (unsigned)(op + 1) * gridDim.x);
    }
}

__global__ void fill_kernel(int8_t *p, int64_t n, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        p[i] = chain_fill_byte(i, seed);
}

template <int MODE> void launch_op(cudaStream_t s, bool pdl, const int8_t *W, int n_out, int n_in,
                                   const int8_t *x, int8_t *y)
{
    const cuda_launch l = {s, pdl};
    ds_launch(chain_op_kernel<MODE>, dim3((unsigned)ds_div_up(n_out, CP_WARPS)), dim3(CP_WARPS * 32), 0,
              &l, W, n_out, n_in, x, y);
}

} // namespace

extern "C" const char *chain_variant_name(chain_variant v)
{
    static const char *const names[CHAIN_VARIANTS] = {
        "graph", "graph+PDL (L2 prefetch)", "graph+PDL (rows in registers)",
        "persistent (L2 prefetch)", "persistent (rows in registers)"};
    return v >= 0 && v < CHAIN_VARIANTS ? names[v] : "?";
}

extern "C" int chain_probe_run(chain_variant v, int n_ops, int reps, int per_sm, chain_result *r,
                               status *st)
{
    if (n_ops < 2 || n_ops > 512 || n_ops % 2 || reps < 1 || per_sm < 0 || v < 0 ||
        v >= CHAIN_VARIANTS)
        return status_fail(st, STATUS_INVALID, "chain_probe: n_ops %d (even, 2..512), reps %d",
                           n_ops, reps);
    int8_t *W = nullptr, *xs = nullptr;
    unsigned *bar = nullptr;
    cudaStream_t s = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    int rc = 0;
    const int64_t wbytes = (int64_t)n_ops * CP_MATRIX, xbytes = (int64_t)(n_ops + 1) * CP_XS;
#define CP_TRY(call)                                                                           \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            rc = status_fail(st, STATUS_DEVICE, "chain_probe: %s: %s", #call,                  \
                             cudaGetErrorString(e_));                                          \
            goto done;                                                                         \
        }                                                                                      \
    } while (0)
    if (cuda_alloc((void **)&W, (size_t)wbytes, "chain weights", st) ||
        cuda_alloc((void **)&xs, (size_t)xbytes, "chain activations", st) ||
        cuda_alloc((void **)&bar, sizeof(unsigned), "chain barrier", st)) {
        rc = st->code;
        goto done;
    }
    CP_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CP_TRY(cudaEventCreate(&e0));
    CP_TRY(cudaEventCreate(&e1));
    fill_kernel<<<1024, 256, 0, s>>>(W, wbytes, CHAIN_SEED_W);
    fill_kernel<<<16, 256, 0, s>>>(xs, CP_XS, CHAIN_SEED_X);
    CP_TRY(cudaGetLastError());
    r->bytes = (double)wbytes;
    if (v <= CHAIN_GRAPH_PDL_REG) {
        const bool pdl = v != CHAIN_GRAPH;
        CP_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int op = 0; op < n_ops; op++) {
            const int n_out = op % 2 ? CP_NARROW : CP_WIDE, n_in = op % 2 ? CP_WIDE : CP_NARROW;
            const int8_t *Wo = W + op * CP_MATRIX, *x = xs + (int64_t)op * CP_XS;
            int8_t *y = xs + (int64_t)(op + 1) * CP_XS;
            if (v == CHAIN_GRAPH_PDL_REG)
                launch_op<MODE_REG>(s, pdl, Wo, n_out, n_in, x, y);
            else
                launch_op<MODE_L2>(s, pdl, Wo, n_out, n_in, x, y);
        }
        CP_TRY(cudaStreamEndCapture(s, &graph));
        CP_TRY(cudaGraphInstantiate(&exec, graph, 0));
        r->ctas = (int)ds_div_up(CP_WIDE, CP_WARPS);
        CP_TRY(cudaGraphLaunch(exec, s));
        CP_TRY(cudaEventRecord(e0, s));
        for (int i = 0; i < reps; i++) CP_TRY(cudaGraphLaunch(exec, s));
        CP_TRY(cudaEventRecord(e1, s));
    } else {
        void (*k)(const int8_t *, int8_t *, int, unsigned *) =
            v == CHAIN_PERSIST ? chain_persist_kernel<MODE_L2> : chain_persist_kernel<MODE_REG>;
        int resident = 0, dev = 0, sms = 0;
        CP_TRY(cudaGetDevice(&dev));
        CP_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        CP_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, k, CP_WARPS * 32, 0));
        r->ctas = (per_sm > 0 && per_sm < resident ? per_sm : resident) * sms;
        const int8_t *cW = W;
        void *args[] = {(void *)&cW, (void *)&xs, (void *)&n_ops, (void *)&bar};
        for (int i = 0; i <= reps; i++) {
            if (i == 1) CP_TRY(cudaEventRecord(e0, s));
            CP_TRY(cudaMemsetAsync(bar, 0, sizeof(unsigned), s));
            CP_TRY(cudaLaunchCooperativeKernel((const void *)k, dim3((unsigned)r->ctas),
                                               dim3(CP_WARPS * 32), args, 0, s));
        }
        CP_TRY(cudaEventRecord(e1, s));
    }
    CP_TRY(cudaStreamSynchronize(s));
    {
        float ms = 0;
        CP_TRY(cudaEventElapsedTime(&ms, e0, e1));
        r->us = ms * 1e3 / reps;
        int8_t out[CP_NARROW];
        CP_TRY(cudaMemcpy(out, xs + (int64_t)n_ops * CP_XS, sizeof out, cudaMemcpyDeviceToHost));
        r->sum = chain_checksum(out);
    }
done:
#undef CP_TRY
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    cuda_free(W);
    cuda_free(xs);
    cuda_free(bar);
    return rc;
}
