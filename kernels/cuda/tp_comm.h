/* NCCL for tensor parallel (model/forward_cuda.h): one communicator per rank, all ranks of one
 * process (ncclCommInitAll), and the in-place float sum the ranks' step graphs capture.
 *
 * NCCL is loaded at run time (dlopen of libnccl.so.2, the CUDA install's or PyTorch's on the GPU
 * host), not linked: the library is 218 MB, too large to travel with the binaries to a GPU host
 * (docs/GPU.md), and a binary that never runs tensor parallel must not need it to start. The
 * header (nccl.h) comes from the CUDA install through Bazel, so every call is type-checked. */
#ifndef DS_KERNELS_CUDA_TP_COMM_H
#define DS_KERNELS_CUDA_TP_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"
#include "kernels/cuda/cuda_device.h"

typedef struct tp_comm tp_comm;

/* n communicators over devices devs[0 .. n) (out[r]: rank r's), from one thread, their peers
 * connected (one all-reduce each, outside any capture: NCCL cannot connect inside one). Leaves
 * devs[n-1] the calling thread's current device.
 * STATUS_UNSUPPORTED when libnccl.so.2 cannot be loaded (the message says why), STATUS_DEVICE
 * when NCCL fails (its message). */
int tp_comm_init_all(int n, const int *devs, tp_comm **out, status *st);
/* buf[0 .. count) summed over the ranks, in place, enqueued on s (captured by a CUDA graph when
 * s is capturing). Every rank must make the same calls in the same order. */
int tp_comm_sum(tp_comm *c, float *buf, size_t count, cuda_stream s, status *st);
void tp_comm_destroy(tp_comm *c);
/* Whether libnccl.so.2 loads (the first call loads it). */
bool tp_comm_available(void);
/* "NCCL 2.28.9 (libnccl.so.2)", or why it is not there. */
const char *tp_comm_describe(void);

#endif
