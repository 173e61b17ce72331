// Internal to kernels/cuda: the one checking macro for CUDA runtime calls in host code. It
// records the failing statement and CUDA's message into the status and returns from the
// function (STATUS_DEVICE). Never used inside kernels or on the launch path.
#ifndef DS_KERNELS_CUDA_CUDA_CHECK_CUH
#define DS_KERNELS_CUDA_CUDA_CHECK_CUH

#include <cuda_runtime.h>

extern "C" { // common/status.h has no C++ guards of its own
#include "common/status.h"
}
#include "kernels/cuda/cuda_device.h"

#define CUDA_TRY(st, call)                                                                 \
    do {                                                                                   \
        cudaError_t cuda_try_err_ = (call);                                                \
        if (cuda_try_err_ != cudaSuccess)                                                  \
            return status_fail((st), STATUS_DEVICE, "%s: %s (%s:%d)", #call,               \
                               cudaGetErrorString(cuda_try_err_), __FILE__, __LINE__);     \
    } while (0)

static inline unsigned ds_div_up(long long a, long long b) { return (unsigned)((a + b - 1) / b); }

// Programmatic dependent launch (cuda_launch.pdl, cuda_device.h). Every kernel that can run in
// the engine's step calls ds_grid_dep() first: it waits until the preceding kernel in the
// stream has completed and its writes are visible (so reads and writes after it are ordered
// exactly as without PDL), then lets the next kernel's CTAs be scheduled early, so their launch
// overlaps this kernel. Without the launch attribute both instructions are no-ops.
static __device__ __forceinline__ void ds_grid_dep()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Batched ("rows") kernels: row r of an optional [B] buffer of row stride ld (elements of T),
// NULL staying NULL.
template <typename T> static __device__ __forceinline__ T *ds_row(T *p, int64_t r, int64_t ld)
{
    return p ? p + r * ld : p;
}
static __device__ __forceinline__ void *ds_row_bytes(void *p, int64_t r, int64_t ld_bytes)
{
    return p ? (void *)((uint8_t *)p + r * ld_bytes) : p;
}

static inline dim3 ds_grid(const cuda_launch_dims &d) { return dim3(d.grid_x, d.grid_y, d.grid_z); }

static inline cudaStream_t ds_stream(const cuda_launch *l) { return l ? l->stream : nullptr; }

// kernel<<<grid, block, smem, l->stream>>>(args...), with the programmatic-serialization
// attribute when l->pdl (the kernel must call ds_grid_dep() before touching memory).
template <typename... KArgs, typename... Args>
static inline void ds_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             const cuda_launch *l, Args... args)
{
    if (!l || !l->pdl) {
        kernel<<<grid, block, smem, ds_stream(l)>>>(args...);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = l->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kernel, args...);
}

#endif
