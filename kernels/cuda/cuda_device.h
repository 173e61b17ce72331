/* The CUDA runtime seen from C: is there a GPU, what is it, the few functions that allocate or
 * copy device memory, stream/event helpers, and error checks that turn a CUDA error into a
 * status naming the statement. Kernel launchers (one header per family beside this one) never
 * allocate, never sync and never format text; callers check with cuda_check() afterwards.
 *
 * Without a GPU or a driver, cuda_device_available() returns false with the reason in st; the
 * binaries then print "no GPU, using CPU" and run the CPU backend. */
#ifndef DS_KERNELS_CUDA_CUDA_DEVICE_H
#define DS_KERNELS_CUDA_CUDA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h"

/* cudaStream_t / cudaEvent_t / cudaGraphExec_t without including CUDA headers in C code. */
struct CUstream_st;
struct CUevent_st;
typedef struct CUstream_st *cuda_stream;
typedef struct CUevent_st *cuda_event;
struct CUgraphExec_st;
typedef struct CUgraphExec_st *cuda_graph_exec;

typedef struct cuda_device_props {
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    uint64_t mem_total_bytes, mem_free_bytes;
    uint64_t l2_bytes;
} cuda_device_props;

/* How a kernel launcher enqueues its work; every launcher of kernels/cuda takes one (NULL: the
 * legacy default stream without PDL, for setup and tests). */
typedef struct cuda_launch {
    cuda_stream stream;
    bool pdl; /* programmatic dependent launch (the engine sets it while capturing its step graph
                 on sm_90): the kernel may start its CTAs while the previous one drains; every
                 kernel waits for its predecessor before touching memory, so results are the
                 same either way */
} cuda_launch;

/* The grid and CTA size a launcher uses for a given shape (the batched "rows" launchers report
 * theirs through *_rows_dims, computed by the same function the launch uses), so a test without
 * a GPU can check them against the device limits: grid_x < 2^31, grid_y and grid_z < 65536,
 * block <= 1024. */
typedef struct cuda_launch_dims {
    unsigned grid_x, grid_y, grid_z;
    unsigned block;
} cuda_launch_dims;

/* true when at least one CUDA device is usable; false (st says why: no driver, no device) */
bool cuda_device_available(status *st);
/* The CUDA devices visible to this process; 0 without a driver or device. */
int cuda_device_count(void);

/* Properties of device `dev` (also selects it as current). */
int cuda_device_props_get(int dev, cuda_device_props *p, status *st);

/* STATUS_DEVICE naming `what` if a launch or async operation failed (cudaGetLastError). */
int cuda_check(const char *what, status *st);
/* Waits for the stream (NULL: the default stream) and checks for errors. */
int cuda_sync(cuda_stream s, const char *what, status *st);

/* The allocation functions: every device byte of deltaserve is taken here, so grep proves it.
 * cuda_alloc_count() counts successful cuda_alloc/cuda_host_alloc calls of the process (engine
 * counters; thread-safe). */
int cuda_alloc(void **d_ptr, size_t bytes, const char *what, status *st);
void cuda_free(void *d_ptr);
int cuda_host_alloc(void **h_ptr, size_t bytes, const char *what, status *st); /* pinned */
void cuda_host_free(void *h_ptr);
uint64_t cuda_alloc_count(void);

/* Synchronous copies and memset: complete on the device when they return, whatever stream
 * runs next (setup and tests only, never on the per-token path). */
int cuda_upload(void *d_dst, const void *src, size_t bytes, status *st);
int cuda_download(void *dst, const void *d_src, size_t bytes, status *st);
int cuda_memset(void *d_dst, int byte, size_t bytes, status *st);
/* Asynchronous copies on a stream (capturable into a graph); host memory should be pinned. */
void cuda_copy_async(void *d_dst, const void *d_src, size_t bytes, cuda_stream s);
void cuda_memset_async(void *d_dst, int byte, size_t bytes, cuda_stream s); /* graph-capturable */
void cuda_copy_h2d_async(void *d_dst, const void *h_src, size_t bytes, cuda_stream s);
void cuda_copy_d2h_async(void *h_dst, const void *d_src, size_t bytes, cuda_stream s);

int cuda_stream_create(cuda_stream *s, status *st);
void cuda_stream_destroy(cuda_stream s);
int cuda_event_create(cuda_event *e, status *st);
void cuda_event_destroy(cuda_event e);
void cuda_event_record(cuda_event e, cuda_stream s);
/* Milliseconds between two recorded events (waits for `end`). */
float cuda_event_elapsed_ms(cuda_event start, cuda_event end);

/* CUDA graphs: capture the launches issued on stream s (not the legacy default stream) between
 * begin and end into an executable graph; replay it with one call. */
int cuda_graph_capture_begin(cuda_stream s, status *st);
/* n_kernels (may be NULL): the kernel nodes of the captured graph. */
int cuda_graph_capture_end(cuda_stream s, cuda_graph_exec *exec, size_t *n_kernels, status *st);
/* Launches the graph on s; returns STATUS_OK or STATUS_DEVICE (no message: launch path). */
int cuda_graph_launch(cuda_graph_exec exec, cuda_stream s);
void cuda_graph_exec_destroy(cuda_graph_exec exec);

#ifdef __cplusplus
}
#endif

#endif
