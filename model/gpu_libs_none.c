/* gpu_libs.h for CPU-only binaries (built with no CUDA toolkit): no GPU library to load. */
#include "model/gpu_libs.h"

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
