/* deltaserve version: the forward backends this binary links and, for a CUDA build, whether the
 * GPU libraries it loads at run time are found (model/gpu_libs.h): the dense prefill path
 * (cuBLAS) and tensor parallelism (NCCL, --tp). Needs no GPU. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "model/fwd.h"
#include "model/gpu_libs.h"

int cmd_version(int argc, char **argv)
{
    if (argc > 1) {
        bool help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
        fprintf(help ? stdout : stderr,
                "usage: deltaserve version\n\n"
                "Prints the forward backends this binary links and whether the GPU libraries\n"
                "it loads at run time are found: cuBLAS (the dense prefill path) and NCCL\n"
                "(--tp), with the file each was loaded from. Exit status 0 either way.\n");
        return help ? 0 : 2;
    }
    printf("backends:");
    for (const fwd_backend *const *b = fwd_backends; *b; b++) printf(" %s", (*b)->name);
    printf("\n");
    if (!gpu_libs_built()) {
        printf("cuda: not built (no CUDA toolkit at build time; CPU forward only)\n");
        return 0;
    }
    gpu_lib libs[GPU_LIBS_MAX];
    int n = gpu_libs_report(libs, GPU_LIBS_MAX);
    for (int i = 0; i < n; i++) {
        if (libs[i].available)
            printf("%s: available: %s from %s\n", libs[i].what, libs[i].describe, libs[i].path);
        else
            printf("%s: unavailable: %s\n", libs[i].what, libs[i].describe);
    }
    return 0;
}
