/* gpu_libs.h: with DS_GPU_LIBS_CUDA (//model:gpu_libs_cuda, binaries with the CUDA backend)
 * cuBLAS and NCCL as kernels/cuda loads them; without it (//model:gpu_libs_none, CPU-only
 * binaries built with no CUDA toolkit) there is no GPU library to load. */
#include "model/gpu_libs.h"

#ifdef DS_GPU_LIBS_CUDA

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/tp_comm.h"

/* The path of an already loaded library `soname` (RTLD_NOLOAD: nothing is loaded here). */
static void loaded_path(const char *soname, char *path, size_t size)
{
    path[0] = '\0';
    void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return;
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name)
        snprintf(path, size, "%s", lm->l_name);
    dlclose(h);
}

bool gpu_libs_built(void)
{
    return true;
}

int gpu_libs_report(gpu_lib *out, int n)
{
    int k = 0;
    if (k < n) {
        gpu_lib *l = &out[k++];
        l->what = "dense path (cuBLAS)";
        l->describe = blas_describe();
        loaded_path("libcublas.so.13", l->path, sizeof l->path);
        l->available = l->path[0] != '\0';
    }
    if (k < n) { /* cuBLAS's own dependency, loaded with it */
        gpu_lib *l = &out[k++];
        l->what = "dense path (cuBLASLt)";
        loaded_path("libcublasLt.so.13", l->path, sizeof l->path);
        l->available = l->path[0] != '\0';
        l->describe = l->available ? "libcublasLt.so.13" : "not loaded (cuBLAS did not load)";
    }
    if (k < n) {
        gpu_lib *l = &out[k++];
        l->what = "tensor parallel --tp (NCCL)";
        l->available = tp_comm_available();
        l->describe = tp_comm_describe();
        loaded_path("libnccl.so.2", l->path, sizeof l->path);
    }
    return k;
}

#else

bool gpu_libs_built(void)
{
    return false;
}

int gpu_libs_report(gpu_lib *out, int n)
{
    (void)out;
    (void)n;
    return 0;
}

#endif
