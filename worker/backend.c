/* Backend selection by device name. The CUDA backend registers here when it is built. */
#include <string.h>

#include "common/log.h"
#include "worker/backend.h"

int worker_backend_create(const char *device, const qwen35_model *m, const worker_backend_opts *o,
                          worker_backend **out, status *st)
{
    if (!device || strcmp(device, "cpu") == 0) return worker_backend_cpu_create(m, o, out, st);
    if (strcmp(device, "cuda") == 0) {
        /* No CUDA backend in this build yet: the service still runs, on the CPU. */
        LOG_WARN("no GPU, using CPU (this build has no CUDA backend)");
        return worker_backend_cpu_create(m, o, out, st);
    }
    return status_fail(st, STATUS_INVALID, "--device: unknown device '%s' (cpu or cuda)", device);
}
