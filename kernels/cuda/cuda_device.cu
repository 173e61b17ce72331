// Host-side CUDA runtime wrappers (cuda_device.h). The only file that calls cudaMalloc.
#include <atomic>
#include <cstdio>
#include <cstring>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device.h"

// The one mutable global of kernels/cuda: successful allocations in this process, for the
// engine's "nothing allocated per token" counters. Device memory is a process-wide resource, so
// its count is too; atomic, as any thread may allocate.
static std::atomic<uint64_t> g_alloc_count{0};

extern "C" bool cuda_device_available(status *st)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        status_fail(st, STATUS_UNAVAILABLE, "no GPU: cudaGetDeviceCount: %s",
                    cudaGetErrorString(e));
        cudaGetLastError(); // clear the sticky-free error so later calls start clean
        return false;
    }
    if (n < 1) {
        status_fail(st, STATUS_UNAVAILABLE, "no GPU: no CUDA device found");
        return false;
    }
    return true;
}

extern "C" int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // as cuda_device_available: leave no error behind
        return 0;
    }
    return n;
}

extern "C" int cuda_device_props_get(int dev, cuda_device_props *p, status *st)
{
    cudaDeviceProp prop;
    CUDA_TRY(st, cudaSetDevice(dev));
    CUDA_TRY(st, cudaGetDeviceProperties(&prop, dev));
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(st, cudaMemGetInfo(&free_b, &total_b));
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", prop.name);
    p->cc_major = prop.major;
    p->cc_minor = prop.minor;
    p->sm_count = prop.multiProcessorCount;
    p->mem_total_bytes = total_b;
    p->mem_free_bytes = free_b;
    p->l2_bytes = (uint64_t)prop.l2CacheSize;
    return STATUS_OK;
}

extern "C" int cuda_check(const char *what, status *st)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return status_fail(st, STATUS_DEVICE, "%s: %s", what, cudaGetErrorString(e));
    return STATUS_OK;
}

extern "C" int cuda_sync(cuda_stream s, const char *what, status *st)
{
    cudaError_t e = cudaStreamSynchronize(s);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess)
        return status_fail(st, STATUS_DEVICE, "%s: %s", what, cudaGetErrorString(e));
    return STATUS_OK;
}

extern "C" int cuda_alloc(void **d_ptr, size_t bytes, const char *what, status *st)
{
    *d_ptr = NULL;
    cudaError_t e = cudaMalloc(d_ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *d_ptr = NULL;
        return status_fail(st, e == cudaErrorMemoryAllocation ? STATUS_NOMEM : STATUS_DEVICE,
                           "device allocation of %zu bytes for %s: %s", bytes, what,
                           cudaGetErrorString(e));
    }
    g_alloc_count++;
    return STATUS_OK;
}

extern "C" void cuda_free(void *d_ptr)
{
    if (d_ptr) cudaFree(d_ptr);
}

extern "C" int cuda_host_alloc(void **h_ptr, size_t bytes, const char *what, status *st)
{
    *h_ptr = NULL;
    cudaError_t e = cudaMallocHost(h_ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *h_ptr = NULL;
        return status_fail(st, STATUS_NOMEM, "pinned allocation of %zu bytes for %s: %s", bytes,
                           what, cudaGetErrorString(e));
    }
    g_alloc_count++;
    return STATUS_OK;
}

extern "C" void cuda_host_free(void *h_ptr)
{
    if (h_ptr) cudaFreeHost(h_ptr);
}

extern "C" uint64_t cuda_alloc_count(void) { return g_alloc_count.load(); }

// Setup copies and memsets are complete when these return (cudaMemcpy from pageable memory may
// return before its DMA lands, and the legacy stream does not order non-blocking streams).
extern "C" int cuda_upload(void *d_dst, const void *src, size_t bytes, status *st)
{
    CUDA_TRY(st, cudaMemcpy(d_dst, src, bytes, cudaMemcpyHostToDevice));
    CUDA_TRY(st, cudaDeviceSynchronize());
    return STATUS_OK;
}

extern "C" int cuda_download(void *dst, const void *d_src, size_t bytes, status *st)
{
    CUDA_TRY(st, cudaMemcpy(dst, d_src, bytes, cudaMemcpyDeviceToHost));
    return STATUS_OK;
}

extern "C" int cuda_memset(void *d_dst, int byte, size_t bytes, status *st)
{
    CUDA_TRY(st, cudaMemset(d_dst, byte, bytes));
    CUDA_TRY(st, cudaDeviceSynchronize());
    return STATUS_OK;
}

extern "C" void cuda_memset_async(void *d_dst, int byte, size_t bytes, cuda_stream s)
{
    cudaMemsetAsync(d_dst, byte, bytes, s);
}

extern "C" void cuda_copy_async(void *d_dst, const void *d_src, size_t bytes, cuda_stream s)
{
    cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, s);
}

extern "C" void cuda_copy_h2d_async(void *d_dst, const void *h_src, size_t bytes, cuda_stream s)
{
    cudaMemcpyAsync(d_dst, h_src, bytes, cudaMemcpyHostToDevice, s);
}

extern "C" void cuda_copy_d2h_async(void *h_dst, const void *d_src, size_t bytes, cuda_stream s)
{
    cudaMemcpyAsync(h_dst, d_src, bytes, cudaMemcpyDeviceToHost, s);
}

extern "C" int cuda_stream_create(cuda_stream *s, status *st)
{
    CUDA_TRY(st, cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    return STATUS_OK;
}

extern "C" void cuda_stream_destroy(cuda_stream s)
{
    if (s) cudaStreamDestroy(s);
}

extern "C" int cuda_event_create(cuda_event *e, status *st)
{
    CUDA_TRY(st, cudaEventCreate(e));
    return STATUS_OK;
}

extern "C" void cuda_event_destroy(cuda_event e)
{
    if (e) cudaEventDestroy(e);
}

extern "C" void cuda_event_record(cuda_event e, cuda_stream s) { cudaEventRecord(e, s); }

extern "C" float cuda_event_elapsed_ms(cuda_event start, cuda_event end)
{
    float ms = 0.0f;
    cudaEventSynchronize(end);
    cudaEventElapsedTime(&ms, start, end);
    return ms;
}

extern "C" int cuda_graph_capture_begin(cuda_stream s, status *st)
{
    CUDA_TRY(st, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    return STATUS_OK;
}

extern "C" int cuda_graph_capture_end(cuda_stream s, cuda_graph_exec *exec, size_t *n_kernels,
                                      status *st)
{
    cudaGraph_t g = NULL;
    *exec = NULL;
    CUDA_TRY(st, cudaStreamEndCapture(s, &g));
    size_t n = 0, kernels = 0;
    cudaGraphGetNodes(g, NULL, &n);
    if (n > 0 && n_kernels) {
        cudaGraphNode_t *nodes = new cudaGraphNode_t[n];
        cudaGraphGetNodes(g, nodes, &n);
        for (size_t i = 0; i < n; i++) {
            cudaGraphNodeType t;
            if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeKernel)
                kernels++;
        }
        delete[] nodes;
    }
    if (n_kernels) *n_kernels = kernels;
    cudaError_t e = cudaGraphInstantiate(exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess)
        return status_fail(st, STATUS_DEVICE, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
    return STATUS_OK;
}

extern "C" int cuda_graph_launch(cuda_graph_exec exec, cuda_stream s)
{
    return cudaGraphLaunch(exec, s) == cudaSuccess ? STATUS_OK : STATUS_DEVICE;
}

extern "C" void cuda_graph_exec_destroy(cuda_graph_exec exec)
{
    if (exec) cudaGraphExecDestroy(exec);
}
