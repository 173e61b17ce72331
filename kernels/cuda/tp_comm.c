/* NCCL through dlopen (tp_comm.h). */
#include "kernels/cuda/tp_comm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <nccl.h>

#include "common/dynlib.h"
#include "kernels/cuda/cuda_device.h"

struct tp_comm {
    ncclComm_t comm;
};

static struct {
    pthread_once_t once;
    void *lib;
    __typeof__(&ncclCommInitAll) init_all;
    __typeof__(&ncclAllReduce) all_reduce;
    __typeof__(&ncclGroupStart) group_start;
    __typeof__(&ncclGroupEnd) group_end;
    __typeof__(&ncclCommDestroy) destroy;
    __typeof__(&ncclGetErrorString) error_string;
    __typeof__(&ncclGetVersion) version;
    char what[160];
} g_nccl = {PTHREAD_ONCE_INIT};

static void load(void)
{
    const dynlib_sym syms[] = {
        {"ncclCommInitAll", (void **)&g_nccl.init_all},
        {"ncclAllReduce", (void **)&g_nccl.all_reduce},
        {"ncclGroupStart", (void **)&g_nccl.group_start},
        {"ncclGroupEnd", (void **)&g_nccl.group_end},
        {"ncclCommDestroy", (void **)&g_nccl.destroy},
        {"ncclGetErrorString", (void **)&g_nccl.error_string},
        {"ncclGetVersion", (void **)&g_nccl.version},
    };
    g_nccl.lib = dynlib_open("libnccl.so.2", syms, (int)(sizeof syms / sizeof syms[0]),
                             g_nccl.what, sizeof g_nccl.what);
    if (!g_nccl.lib) return;
    int v = 0;
    if (g_nccl.version(&v) != ncclSuccess) {
        snprintf(g_nccl.what, sizeof g_nccl.what, "libnccl.so.2 gives no version");
        dynlib_close(g_nccl.lib);
        g_nccl.lib = NULL;
        return;
    }
    snprintf(g_nccl.what, sizeof g_nccl.what, "NCCL %d.%d.%d (libnccl.so.2)", v / 10000,
             v / 100 % 100, v % 100);
}

bool tp_comm_available(void)
{
    pthread_once(&g_nccl.once, load);
    return g_nccl.lib != NULL;
}

const char *tp_comm_describe(void)
{
    pthread_once(&g_nccl.once, load);
    return g_nccl.what;
}

/* NCCL connects a communicator's peers at its first collective, and that may not happen inside a
 * stream capture (on two H200s: "failed to peer with device 1: operation not permitted when
 * stream is capturing", then every step graph's capture failed). So one small all-reduce on
 * every communicator first, from this thread in one NCCL group, before any rank captures: a
 * rank that fails later cannot leave the others waiting in it. */
#define CONNECT_FLOATS 64

static int connect_all(int n, const int *devs, ncclComm_t *comms, status *st)
{
    float *buf[64] = {0};
    cuda_stream s[64] = {0};
    cuda_device_props p;
    int rc = STATUS_OK;
    for (int i = 0; i < n && !rc; i++)
        rc = cuda_device_props_get(devs[i], &p, st) ||
             cuda_alloc((void **)&buf[i], CONNECT_FLOATS * 4, "tensor parallel: connect", st) ||
             cuda_memset(buf[i], 0, CONNECT_FLOATS * 4, st) || cuda_stream_create(&s[i], st);
    if (!rc) {
        ncclResult_t r = g_nccl.group_start();
        for (int i = 0; i < n && r == ncclSuccess; i++)
            r = g_nccl.all_reduce(buf[i], buf[i], CONNECT_FLOATS, ncclFloat32, ncclSum, comms[i],
                                  (cudaStream_t)s[i]);
        const ncclResult_t e = g_nccl.group_end();
        if (r == ncclSuccess) r = e;
        if (r != ncclSuccess)
            rc = status_fail(st, STATUS_DEVICE, "tensor parallel: connecting %d GPUs: %s", n,
                             g_nccl.error_string(r));
    }
    for (int i = 0; i < n; i++) {
        if (!buf[i] && !s[i]) continue;
        status ignored;
        if (cuda_device_props_get(devs[i], &p, &ignored)) continue;
        if (s[i] && !rc) rc = cuda_sync(s[i], "tensor parallel: connecting the GPUs", st);
        if (s[i]) cuda_stream_destroy(s[i]);
        cuda_free(buf[i]);
    }
    return rc;
}

int tp_comm_init_all(int n, const int *devs, tp_comm **out, status *st)
{
    pthread_once(&g_nccl.once, load);
    if (!g_nccl.lib) return status_fail(st, STATUS_UNSUPPORTED, "tensor parallel: %s", g_nccl.what);
    ncclComm_t comms[64];
    if (n < 1 || n > 64) return status_fail(st, STATUS_INVALID, "tensor parallel: %d ranks", n);
    const ncclResult_t r = g_nccl.init_all(comms, n, devs);
    if (r != ncclSuccess)
        return status_fail(st, STATUS_DEVICE, "tensor parallel: ncclCommInitAll over %d GPUs: %s",
                           n, g_nccl.error_string(r));
    if (connect_all(n, devs, comms, st)) {
        for (int j = 0; j < n; j++) g_nccl.destroy(comms[j]);
        return st->code;
    }
    for (int i = 0; i < n; i++) {
        out[i] = calloc(1, sizeof **out);
        if (!out[i]) {
            for (int j = 0; j < n; j++) g_nccl.destroy(comms[j]);
            for (int j = 0; j < i; j++) free(out[j]), out[j] = NULL;
            return status_fail(st, STATUS_NOMEM, "tensor parallel: communicators");
        }
        out[i]->comm = comms[i];
    }
    return STATUS_OK;
}

int tp_comm_sum(tp_comm *c, float *buf, size_t count, cuda_stream s, status *st)
{
    const ncclResult_t r = g_nccl.all_reduce(buf, buf, count, ncclFloat32, ncclSum, c->comm,
                                             (cudaStream_t)s);
    if (r != ncclSuccess)
        return status_fail(st, STATUS_DEVICE, "tensor parallel: all-reduce of %zu floats: %s",
                           count, g_nccl.error_string(r));
    return STATUS_OK;
}

void tp_comm_destroy(tp_comm *c)
{
    if (!c) return;
    if (g_nccl.lib) g_nccl.destroy(c->comm);
    free(c);
}
