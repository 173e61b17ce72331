// Internal to kernels/cuda: the one checking macro for CUDA runtime calls in host code. It
// records the failing statement and CUDA's message into the status and returns from the
// function (STATUS_DEVICE). Never used inside kernels or on the launch path.
#ifndef DS_KERNELS_CUDA_CUDA_CHECK_CUH
#define DS_KERNELS_CUDA_CUDA_CHECK_CUH

#include <cuda_runtime.h>

extern "C" { // common/status.h has no C++ guards of its own
#include "common/status.h"
}

#define CUDA_TRY(st, call)                                                                 \
    do {                                                                                   \
        cudaError_t cuda_try_err_ = (call);                                                \
        if (cuda_try_err_ != cudaSuccess)                                                  \
            return status_fail((st), STATUS_DEVICE, "%s: %s (%s:%d)", #call,               \
                               cudaGetErrorString(cuda_try_err_), __FILE__, __LINE__);     \
    } while (0)

static inline unsigned ds_div_up(long long a, long long b) { return (unsigned)((a + b - 1) / b); }

#endif
