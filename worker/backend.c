/* Backend selection by device name. The CUDA backend is found at link time: binaries that link
 * //worker:cuda_worker (alwayslink) define worker_backend_cuda_create, which this file references
 * weakly, so //worker:engine and CPU-only binaries need no CUDA and simply fall back. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/backend.h"

/* Defined by worker/backend_cuda.c when linked; NULL otherwise. */
extern int worker_backend_cuda_create(const qwen35_model *m, const worker_backend_opts *o,
                                      worker_backend **out, status *st) __attribute__((weak));

bool worker_backend_have_cuda(void) { return worker_backend_cuda_create != NULL; }

/* The CUDA runtime's device count, in binaries that link it (//worker:cuda_worker links cudart
 * statically); referenced weakly like the backend, so CPU-only binaries need no CUDA. Declared
 * here with int for cudaError_t (an enum, 0 = cudaSuccess) to keep CUDA headers out. */
extern int cudaGetDeviceCount(int *count) __attribute__((weak));

/* "cuda", "cuda:N" or "cuda:A,B,...": the device list (n = 0 for "cuda"); -1 on a malformed one */
static int parse_cuda_devices(const char *device, int *devs, int max)
{
    if (strcmp(device, "cuda") == 0) return 0;
    if (strncmp(device, "cuda:", 5) != 0) return -1;
    int n = 0;
    for (const char *p = device + 5;;) {
        char *end = NULL;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1023 || n == max) return -1;
        devs[n++] = (int)v;
        if (*end == ',') {
            p = end + 1;
            continue;
        }
        return *end ? -1 : n;
    }
}

int worker_backend_check_tp(const char *device, int tp, status *st)
{
    if (tp < 0 || tp > 64) return status_fail(st, STATUS_INVALID, "--tp %d: expected 1..64", tp);
    if (!device || strcmp(device, "cpu") == 0) return STATUS_OK;
    int devs[64];
    const int nd = parse_cuda_devices(device, devs, 64);
    if (nd < 0 && strncmp(device, "cuda", 4) == 0)
        return status_fail(st, STATUS_INVALID, "--device: '%s': expected cuda, cuda:N or "
                           "cuda:A,B,... with device indices", device);
    if (nd < 0) return STATUS_OK; /* worker_backend_create names the unknown device */
    if (tp <= 1) {
        if (nd > 1)
            return status_fail(st, STATUS_INVALID, "--device %s lists %d GPUs: give --tp %d", device,
                               nd, nd);
        return STATUS_OK;
    }
    if (nd > 1 && nd != tp)
        return status_fail(st, STATUS_INVALID, "--device %s lists %d GPUs for --tp %d", device, nd,
                           tp);
    int n = 0;
    if (!worker_backend_have_cuda() || !cudaGetDeviceCount || cudaGetDeviceCount(&n) != 0) n = 0;
    int need = tp;
    for (int i = 0; i < nd; i++) need = devs[i] + 1 > need ? devs[i] + 1 : need;
    if (nd == 1) need = devs[0] + tp;
    if (n < need)
        return status_fail(st, STATUS_UNSUPPORTED, "--tp %d needs %d GPUs, this host has %d", tp,
                           need, n);
    return STATUS_OK;
}

int worker_backend_create(const char *device, const qwen35_model *m, const worker_backend_opts *o,
                          worker_backend **out, status *st)
{
    *out = NULL;
    if (worker_backend_check_tp(device, o->tp, st)) return st->code;
    worker_backend_opts cpu_o = *o; /* slots 0 (sized by the device) is 8 on the CPU */
    if (cpu_o.n_slots == 0) cpu_o.n_slots = 8;
    if (!device || strcmp(device, "cpu") == 0) return worker_backend_cpu_create(m, &cpu_o, out, st);
    if (strcmp(device, "cuda") == 0 || strncmp(device, "cuda:", 5) == 0) {
        worker_backend_opts co = *o;
        const int nd = parse_cuda_devices(device, co.tp_devices, 64);
        if (nd < 0)
            return status_fail(st, STATUS_INVALID, "--device: '%s': expected cuda, cuda:N or "
                               "cuda:A,B,... with device indices", device);
        co.device = nd ? co.tp_devices[0] : 0;
        co.n_tp_devices = nd > 1 ? nd : 0;
        o = &co;
        if (!worker_backend_have_cuda()) {
            LOG_WARN("no GPU, using CPU (this build has no CUDA backend)");
            return worker_backend_cpu_create(m, &cpu_o, out, st);
        }
        status cst;
        status_clear(&cst);
        if (worker_backend_cuda_create(m, o, out, &cst) == STATUS_OK) return STATUS_OK;
        if (cst.code == STATUS_UNAVAILABLE) { /* no driver or no device: serve on the CPU */
            LOG_WARN("no GPU, using CPU (%s)", cst.msg);
            return worker_backend_cpu_create(m, &cpu_o, out, st);
        }
        /* a GPU is there but the model does not fit or is not supported: say so, do not hide it */
        return status_fail(st, cst.code, "--device cuda: %s", cst.msg);
    }
    return status_fail(st, STATUS_INVALID, "--device: unknown device '%s' (cpu, cuda, cuda:N or "
                       "cuda:A,B,...)",
                       device);
}
