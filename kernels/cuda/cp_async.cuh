// Internal to kernels/cuda: asynchronous 16-byte copies global -> shared (cp.async, sm_80+), as
// the GEMM's stages, the prefill attention tile and the chunked delta rule load their tiles.
#ifndef DS_KERNELS_CUDA_CP_ASYNC_CUH
#define DS_KERNELS_CUDA_CP_ASYNC_CUH

static __device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}
// 16 bytes from src to dst (shared memory), or 16 zero bytes when !ok (src not read)
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(ok ? 16 : 0));
}
// the copies issued so far as one group
static __device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
// until every group has landed (this thread's copies; a barrier makes them the CTA's)
static __device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// until at most N of this thread's most recent groups are still in flight
template <int N> static __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif
