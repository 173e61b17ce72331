// Load time and activations of the GEMV family (gemv.h): which types it takes, the packed layout
// (gemv_pack) and the Q8 activation quantiser (gemv_quantize_x, CPU twin gpu_twin_q8_quantize).
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gemv_slices.cuh"
#include "kernels/cuda/quant_blocks.cuh"

extern "C" bool gemv_supported(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

static int64_t type_block(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_Q8_0: return 32;
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: return 256;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return 8; // 16-byte loads
    case GGML_TYPE_F32: return 4;
    default: return 0;
    }
}

extern "C" uint64_t gemv_packed_bytes(uint32_t type, int64_t n_in, int64_t n_out)
{
    const int64_t bs = type_block(type);
    if (bs == 0 || n_in <= 0 || n_out <= 0 || n_in % bs) return 0;
    const uint64_t n = (uint64_t)n_in * (uint64_t)n_out, nblk = n / (bs > 8 ? bs : 1);
    switch (type) {
    case GGML_TYPE_F32: return 4 * n;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return 2 * n;
    case GGML_TYPE_Q4_K: return nblk * 144;
    case GGML_TYPE_Q5_K: return nblk * 176;
    case GGML_TYPE_Q6_K: return q6_d_off(nblk) + nblk * 2;
    case GGML_TYPE_Q8_0: return q8_d_off(nblk) + nblk * 2;
    default: return 0;
    }
}

static __global__ void pack_q6_K_kernel(const block_q6_K *__restrict__ src, uint8_t *__restrict__ dst,
                                        uint64_t nblk)
{
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nblk) return;
    const block_q6_K *b = src + i;
    uint8_t *qlh = dst + i * 192;
    for (int k = 0; k < 128; k++) qlh[k] = b->ql[k];
    for (int k = 0; k < 64; k++) qlh[128 + k] = b->qh[k];
    int8_t *sc = (int8_t *)(dst + q6_sc_off(nblk) + i * 16);
    for (int k = 0; k < 16; k++) sc[k] = b->scales[k];
    ((uint16_t *)(dst + q6_d_off(nblk)))[i] = b->d;
}

static __global__ void pack_q8_0_kernel(const block_q8_0 *__restrict__ src, uint8_t *__restrict__ dst,
                                        uint64_t nblk)
{
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nblk) return;
    const block_q8_0 *b = src + i;
    int8_t *qs = (int8_t *)(dst + i * 32);
    for (int k = 0; k < 32; k++) qs[k] = b->qs[k];
    ((uint16_t *)(dst + q8_d_off(nblk)))[i] = b->d;
}

extern "C" void gemv_pack(uint32_t type, const void *d_src, void *d_dst, int64_t n_in,
                          int64_t n_out, cuda_stream stream)
{
    const uint64_t bytes = gemv_packed_bytes(type, n_in, n_out);
    DS_ASSERT(bytes > 0);
    const uint64_t n = (uint64_t)n_in * (uint64_t)n_out;
    if (type == GGML_TYPE_Q6_K) {
        const uint64_t nblk = n / 256;
        pack_q6_K_kernel<<<ds_div_up(nblk, 256), 256, 0, stream>>>((const block_q6_K *)d_src,
                                                                   (uint8_t *)d_dst, nblk);
    } else if (type == GGML_TYPE_Q8_0) {
        const uint64_t nblk = n / 32;
        pack_q8_0_kernel<<<ds_div_up(nblk, 256), 256, 0, stream>>>((const block_q8_0 *)d_src,
                                                                   (uint8_t *)d_dst, nblk);
    } else {
        cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, stream);
    }
}

extern "C" uint64_t gemv_xq_bytes(int64_t n) { return (uint64_t)n + (uint64_t)n / 32 * 8; }

// row blockIdx.y of x ([rows][ld_x]) into its Q8 form at xq + blockIdx.y * ld_xq
static __global__ void quantize_x_kernel(const float *__restrict__ x, int64_t ld_x,
                                         int8_t *__restrict__ xq, int64_t ld_xq, int64_t n)
{
    ds_grid_dep();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return; // n % 32 == 0: whole warps leave together
    x += blockIdx.y * ld_x;
    int8_t *qs = xq + blockIdx.y * ld_xq;
    float2 *ds = (float2 *)(qs + n);
    const float v = x[i];
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : (int)roundf(v / d);
    qs[i] = (int8_t)q;
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) ds[i / 32] = make_float2(d, d * (float)sum);
}

extern "C" void gemv_quantize_x(const float *d_x, void *d_xq, int64_t n, const cuda_launch *l)
{
    DS_ASSERT(n > 0 && n % 32 == 0);
    ds_launch(quantize_x_kernel, dim3((unsigned)ds_div_up(n, 256), 1), 256, 0, l, d_x, n,
              (int8_t *)d_xq, (int64_t)0, n);
}

extern "C" void gemv_quantize_rows(const float *d_x, int64_t ld_x, void *d_xq, int64_t n, int B,
                                   const cuda_launch *l)
{
    DS_ASSERT(n > 0 && n % 32 == 0 && B >= 1 && B <= 65535);
    ds_launch(quantize_x_kernel, dim3((unsigned)ds_div_up(n, 256), (unsigned)B), 256, 0, l, d_x,
              ld_x, (int8_t *)d_xq, (int64_t)gemv_xq_bytes(n), n);
}

// 256-value block blockIdx.x * 8 + warp of row blockIdx.y into its Q8_K form, a warp a block
// (lane l: values 8 l .. 8 l + 7): quant_quantize_row_q8_K_ref's levels and scale
static __global__ void quantize_k_kernel(const float *__restrict__ x, int64_t ld_x,
                                         int8_t *__restrict__ xq, int64_t ld_xq, int64_t n)
{
    ds_grid_dep();
    const int lane = threadIdx.x % 32;
    const int64_t blk = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (blk * 256 >= n) return;
    const float *xb = x + blockIdx.y * ld_x + blk * 256 + 8 * lane;
    int8_t *qs = xq + blockIdx.y * ld_xq;
    float *ds = (float *)(qs + n);
    float v[8], amax = 0.0f, mx = 0.0f;
    int idx = 8 * lane;
    bool fin = true;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[i];
        const float ax = fabsf(v[i]);
        fin &= ax <= 3.40282347e38f;
        if (ax > amax) amax = ax, mx = v[i], idx = 8 * lane + i;
    }
    // the first value of the largest |x|: the larger, or on a tie the lower index
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, o), m2 = __shfl_xor_sync(0xffffffffu, mx, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) amax = a2, mx = m2, idx = i2;
    }
    fin = __all_sync(0xffffffffu, fin);
    const float iscale = -127.f / mx;
    const bool zero = !fin || amax == 0.0f || !(fabsf(iscale) <= 3.40282347e38f);
    uint32_t w[2] = {0u, 0u};
    if (!zero)
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = min(127, (int)rintf(iscale * v[i]));
            w[i / 4] |= (uint32_t)(q & 0xff) << (8 * (i % 4));
        }
    *(uint2 *)(qs + blk * 256 + 8 * lane) = make_uint2(w[0], w[1]);
    if (lane == 0) ds[blk] = !fin ? __int_as_float(0x7fc00000) : zero ? 0.0f : 1.0f / iscale;
}

extern "C" void gemv_quantize_rows_k(const float *d_x, int64_t ld_x, void *d_xq, int64_t n, int B,
                                     const cuda_launch *l)
{
    DS_ASSERT(n > 0 && n % 256 == 0 && B >= 1 && B <= 65535);
    ds_launch(quantize_k_kernel, dim3((unsigned)ds_div_up(n / 256, 8), (unsigned)B), 256, 0, l,
              d_x, ld_x, (int8_t *)d_xq, (int64_t)gemv_xq_bytes(n), n);
}
