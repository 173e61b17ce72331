// Internal to kernels/cuda: the DeltaNet state as stored (gdn.h "State storage"), F32 or bf16:
// EPL consecutive elements of a lane loaded into F32 registers and stored back (F32 moves them
// as one float4 where EPL is 4; bf16 as one 8-, 4- or 2-byte word), and the value a store then
// a load gives back (gdn_state_round: x for F32, x rounded to bf16, nearest even, for bf16).
#ifndef DS_KERNELS_CUDA_GDN_STATE_CUH
#define DS_KERNELS_CUDA_GDN_STATE_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

template <int EPL>
static __device__ __forceinline__ void gdn_state_load(const float *p, float (&x)[EPL])
{
    if constexpr (EPL == 4) {
        const float4 t = *(const float4 *)p;
        x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) x[e] = p[e];
    }
}
template <int EPL>
static __device__ __forceinline__ void gdn_state_store(float *p, const float (&x)[EPL])
{
    if constexpr (EPL == 4) {
        *(float4 *)p = make_float4(x[0], x[1], x[2], x[3]);
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) p[e] = x[e];
    }
}
template <int EPL>
static __device__ __forceinline__ void gdn_state_load(const __nv_bfloat16 *p, float (&x)[EPL])
{
    if constexpr (EPL == 4) {
        const uint2 t = *(const uint2 *)p;
        x[0] = __uint_as_float(t.x << 16), x[1] = __uint_as_float(t.x & 0xffff0000u);
        x[2] = __uint_as_float(t.y << 16), x[3] = __uint_as_float(t.y & 0xffff0000u);
    } else if constexpr (EPL == 2) {
        const uint32_t t = *(const uint32_t *)p;
        x[0] = __uint_as_float(t << 16), x[1] = __uint_as_float(t & 0xffff0000u);
    } else {
        x[0] = __bfloat162float(p[0]);
    }
}
static __device__ __forceinline__ uint32_t gdn_bf16x2(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}
template <int EPL>
static __device__ __forceinline__ void gdn_state_store(__nv_bfloat16 *p, const float (&x)[EPL])
{
    if constexpr (EPL == 4) {
        *(uint2 *)p = make_uint2(gdn_bf16x2(x[0], x[1]), gdn_bf16x2(x[2], x[3]));
    } else if constexpr (EPL == 2) {
        *(uint32_t *)p = gdn_bf16x2(x[0], x[1]);
    } else {
        p[0] = __float2bfloat16_rn(x[0]);
    }
}
// the value a store and a load give back: x for F32, x rounded to bf16 (nearest even) for bf16
template <class ST> static __device__ __forceinline__ float gdn_state_round(float x)
{
    if constexpr (std::is_same<ST, __nv_bfloat16>::value)
        return __bfloat162float(__float2bfloat16_rn(x));
    else
        return x;
}
static __device__ __forceinline__ float gdn_state_get(const float *p) { return *p; }
static __device__ __forceinline__ float gdn_state_get(const __nv_bfloat16 *p)
{
    return __bfloat162float(*p);
}
static __device__ __forceinline__ void gdn_state_put(float *p, float x) { *p = x; }
static __device__ __forceinline__ void gdn_state_put(__nv_bfloat16 *p, float x)
{
    *p = __float2bfloat16_rn(x);
}

#endif
