/* The GPU libraries a binary loads at run time, for `deltaserve version` (cli/cmd_version.c):
 * whether the dense prefill path (cuBLAS: libcublas.so.13 with its libcublasLt.so.13) and
 * tensor parallelism (`--tp`, NCCL: libnccl.so.2) are available, and the file each was loaded
 * from. One source, gpu_libs.c, two libraries: //model:gpu_libs_cuda (kernels/cuda/blas.h,
 * tp_comm.h) in binaries built with the CUDA toolkit, //model:gpu_libs_none in CPU-only builds.
 * Loading needs no GPU: it is dlopen and symbol lookup only. */
#ifndef DS_MODEL_GPU_LIBS_H
#define DS_MODEL_GPU_LIBS_H

#include <stdbool.h>
#include <stddef.h>

#define GPU_LIBS_MAX 3

typedef struct gpu_lib {
    const char *what;     /* "dense path (cuBLAS)", "dense path (cuBLASLt)",
                             "tensor parallel --tp (NCCL)" */
    bool available;       /* the library loaded and has every symbol deltaserve calls */
    const char *describe; /* "cuBLAS 13.1.0 (libcublas.so.13)", or why it did not load */
    char path[512];       /* the file it was loaded from; "" when not loaded */
} gpu_lib;

/* Whether this binary was built with the CUDA backend. */
bool gpu_libs_built(void);
/* Loads (once) and fills out[0 .. n) with each library's report, in the order above; returns
 * how many it filled (at most GPU_LIBS_MAX; 0 in a CPU-only build). */
int gpu_libs_report(gpu_lib *out, int n);

#endif
