// Quantised GEMV kernels (gemv.h). One warp per output row, GEMV_WARPS rows per CTA, a grid
// that strides over rows (sized to fill the GPU once, so no tail wave); each lane owns a fixed
// 16-byte slice of a block and walks the row block by block. Integer dp4a against the Q8 x for
// quantised types, FP32 FMA for float types. Formulas: shared/QWEN35.md §5.2.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/quant_blocks.cuh"

#define GEMV_WARPS 4

enum { EP_STORE = 0, EP_ADD = 1, EP_SWIGLU = 2, EP_ARGMAX = 3 };

static __host__ __device__ __forceinline__ uint64_t gemv_align256(uint64_t n)
{
    return (n + 255) & ~(uint64_t)255;
}
// packed Q6_K: [nblk][192] ql|qh, [nblk][16] scales, [nblk] d;  packed Q8_0: [nblk][32], [nblk] d
static __host__ __device__ __forceinline__ uint64_t q6_sc_off(uint64_t nblk)
{
    return gemv_align256(nblk * 192);
}
static __host__ __device__ __forceinline__ uint64_t q6_d_off(uint64_t nblk)
{
    return gemv_align256(q6_sc_off(nblk) + nblk * 16);
}
static __host__ __device__ __forceinline__ uint64_t q8_d_off(uint64_t nblk)
{
    return gemv_align256(nblk * 32);
}

template <typename T> static __device__ __forceinline__ T ldg(const void *p)
{
    return __ldg((const T *)p);
}

static __device__ __forceinline__ int dot4(int4 a, int4 b)
{
    return __dp4a(a.w, b.w, __dp4a(a.z, b.z, __dp4a(a.y, b.y, __dp4a(a.x, b.x, 0))));
}

// scale and min of sub-block j of a K-quant block, from scales bytes s0|s1|s2 (ggml
// get_scale_min_k4 without indexing a byte array: no local memory)
static __device__ __forceinline__ void scale_min(int j, uint32_t s0, uint32_t s1, uint32_t s2,
                                                 float *sc, float *m)
{
    if (j < 4) {
        *sc = (float)((s0 >> (8 * j)) & 63);
        *m = (float)((s1 >> (8 * j)) & 63);
    } else {
        const int k = 8 * (j - 4);
        *sc = (float)(((s2 >> k) & 0xF) | (((s0 >> k) >> 6 & 3) << 4));
        *m = (float)(((s2 >> k) >> 4 & 0xF) | (((s1 >> k) >> 6 & 3) << 4));
    }
}

// ---- per-type slice dots: lane slice c of block b of a row; TPB lanes per block ----

struct q4k_t { static constexpr int TPB = 8, QK = 256; };
struct q5k_t { static constexpr int TPB = 8, QK = 256; };
struct q6k_t { static constexpr int TPB = 8, QK = 256; };
struct q80_t { static constexpr int TPB = 2, QK = 32; };

// Q4_K slice c = 2g + h: qs bytes [32g + 16h, +16): weights 64g + 16h + [0,16) (low nibbles,
// sub-block 2g) and 64g + 32 + 16h + [0,16) (high nibbles, sub-block 2g + 1).
static __device__ __forceinline__ float slice_dot(q4k_t, const uint8_t *W, uint64_t nblk,
                                                  uint64_t ib, int b, int c, const int8_t *xqs,
                                                  const float2 *xds)
{
    (void)nblk;
    const uint8_t *blk = W + ib * 144;
    const uint4 hdr = ldg<uint4>(blk);
    const int4 q = ldg<int4>(blk + 16 + 16 * c);
    const int g = c >> 1, h = c & 1;
    const int e = b * 256 + 64 * g + 16 * h;
    const int4 xl = ldg<int4>(xqs + e), xh = ldg<int4>(xqs + e + 32);
    const float2 dl = ldg<float2>(xds + b * 8 + 2 * g), dh = ldg<float2>(xds + b * 8 + 2 * g + 1);
    const int4 lo = {q.x & 0x0F0F0F0F, q.y & 0x0F0F0F0F, q.z & 0x0F0F0F0F, q.w & 0x0F0F0F0F};
    const int4 hi = {(q.x >> 4) & 0x0F0F0F0F, (q.y >> 4) & 0x0F0F0F0F, (q.z >> 4) & 0x0F0F0F0F,
                     (q.w >> 4) & 0x0F0F0F0F};
    const float2 dm = __half22float2(*(const __half2 *)&hdr.x);
    float sc0, m0, sc1, m1;
    scale_min(2 * g, hdr.y, hdr.z, hdr.w, &sc0, &m0);
    scale_min(2 * g + 1, hdr.y, hdr.z, hdr.w, &sc1, &m1);
    const float r = dm.x * (sc0 * dl.x * (float)dot4(lo, xl) + sc1 * dh.x * (float)dot4(hi, xh));
    return h == 0 ? r - dm.y * (m0 * dl.y + m1 * dh.y) : r;
}

// Q5_K: as Q4_K plus the fifth bit from qh[16h + l], bit 2g (low) / 2g + 1 (high).
static __device__ __forceinline__ float slice_dot(q5k_t, const uint8_t *W, uint64_t nblk,
                                                  uint64_t ib, int b, int c, const int8_t *xqs,
                                                  const float2 *xds)
{
    (void)nblk;
    const uint8_t *blk = W + ib * 176;
    const uint4 hdr = ldg<uint4>(blk);
    const int g = c >> 1, h = c & 1;
    const int4 qh = ldg<int4>(blk + 16 + 16 * h);
    const int4 q = ldg<int4>(blk + 48 + 16 * c);
    const int e = b * 256 + 64 * g + 16 * h;
    const int4 xl = ldg<int4>(xqs + e), xh = ldg<int4>(xqs + e + 32);
    const float2 dl = ldg<float2>(xds + b * 8 + 2 * g), dh = ldg<float2>(xds + b * 8 + 2 * g + 1);
    const int sl = 2 * g, sh = 2 * g + 1;
#define Q5LO(v, u) (((v) & 0x0F0F0F0F) | ((((u) >> sl) & 0x01010101) << 4))
#define Q5HI(v, u) ((((v) >> 4) & 0x0F0F0F0F) | ((((u) >> sh) & 0x01010101) << 4))
    const int4 lo = {Q5LO(q.x, qh.x), Q5LO(q.y, qh.y), Q5LO(q.z, qh.z), Q5LO(q.w, qh.w)};
    const int4 hi = {Q5HI(q.x, qh.x), Q5HI(q.y, qh.y), Q5HI(q.z, qh.z), Q5HI(q.w, qh.w)};
#undef Q5LO
#undef Q5HI
    const float2 dm = __half22float2(*(const __half2 *)&hdr.x);
    float sc0, m0, sc1, m1;
    scale_min(2 * g, hdr.y, hdr.z, hdr.w, &sc0, &m0);
    scale_min(2 * g + 1, hdr.y, hdr.z, hdr.w, &sc1, &m1);
    const float r = dm.x * (sc0 * dl.x * (float)dot4(lo, xl) + sc1 * dh.x * (float)dot4(hi, xh));
    return h == 0 ? r - dm.y * (m0 * dl.y + m1 * dh.y) : r;
}

// Q6_K (packed) slice c: half n = c/4, l0 = 8*(c%4): ql[64n + l0 + [0,8)], ql[64n + 32 + l0 ..],
// qh[32n + l0 ..] give weights 128n + 32k + l0 + [0,8) for k = 0..3, scale sc[8n + l0/16 + 2k].
static __device__ __forceinline__ float slice_dot(q6k_t, const uint8_t *W, uint64_t nblk,
                                                  uint64_t ib, int b, int c, const int8_t *xqs,
                                                  const float2 *xds)
{
    const int n = c >> 2, l0 = 8 * (c & 3);
    const uint8_t *qlh = W + ib * 192;
    const uint2 qa = ldg<uint2>(qlh + 64 * n + l0);
    const uint2 qb = ldg<uint2>(qlh + 64 * n + 32 + l0);
    const uint2 qh = ldg<uint2>(qlh + 128 + 32 * n + l0);
    const uint2 sw = ldg<uint2>(W + q6_sc_off(nblk) + ib * 16 + 8 * n);
    const float d = __half2float(ldg<__half>(W + q6_d_off(nblk) + ib * 2));
    const int ss = 8 * (l0 >> 4);
    const int e = b * 256 + 128 * n + l0;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t a0 = (k & 1) ? qb.x : qa.x, a1 = (k & 1) ? qb.y : qa.y;
        const int shq = (k & 2) ? 4 : 0, shh = 2 * k;
        const int v0 = (int)(((a0 >> shq) & 0x0F0F0F0F) | (((qh.x >> shh) & 0x03030303) << 4));
        const int v1 = (int)(((a1 >> shq) & 0x0F0F0F0F) | (((qh.y >> shh) & 0x03030303) << 4));
        const int2 xv = ldg<int2>(xqs + e + 32 * k);
        const int sumq = __dp4a(v1, xv.y, __dp4a(v0, xv.x, 0));
        const int sumx = __dp4a(0x01010101, xv.y, __dp4a(0x01010101, xv.x, 0));
        const uint32_t w = (k & 2) ? sw.y : sw.x;
        const float sc = (float)(int8_t)(w >> (ss + 16 * (k & 1)));
        acc += sc * ldg<float2>(xds + b * 8 + 4 * n + k).x * (float)(sumq - 32 * sumx);
    }
    return d * acc;
}

// Q8_0 (packed) slice c: qs[16c, +16)
static __device__ __forceinline__ float slice_dot(q80_t, const uint8_t *W, uint64_t nblk,
                                                  uint64_t ib, int b, int c, const int8_t *xqs,
                                                  const float2 *xds)
{
    const int4 q = ldg<int4>(W + ib * 32 + 16 * c);
    const float d = __half2float(ldg<__half>(W + q8_d_off(nblk) + ib * 2));
    const int4 xv = ldg<int4>(xqs + b * 32 + 16 * c);
    return d * ldg<float2>(xds + b).x * (float)dot4(q, xv);
}

template <typename TT>
static __device__ __forceinline__ float row_dot_q(const uint8_t *W, int64_t row, int nb,
                                                  uint64_t nblk, const int8_t *xqs,
                                                  const float2 *xds, int lane)
{
    constexpr int BPI = 32 / TT::TPB;
    const int c = lane % TT::TPB;
    float acc = 0.0f;
#pragma unroll 4
    for (int b = lane / TT::TPB; b < nb; b += BPI)
        acc += slice_dot(TT(), W, nblk, (uint64_t)row * nb + b, b, c, xqs, xds);
    return acc;
}

struct f32_t {};
struct f16_t {};
struct bf16_t {};

static __device__ __forceinline__ float row_dot_f(f32_t, const uint8_t *W, int64_t row,
                                                  int64_t n_in, const float *x, int lane)
{
    const float *w = (const float *)W + row * n_in;
    float acc = 0.0f;
#pragma unroll 4
    for (int64_t i = 4 * lane; i < n_in; i += 128) {
        const float4 a = ldg<float4>(w + i), v = ldg<float4>(x + i);
        acc += a.x * v.x + a.y * v.y + a.z * v.z + a.w * v.w;
    }
    return acc;
}

template <bool BF>
static __device__ __forceinline__ float row_dot_h(const uint8_t *W, int64_t row, int64_t n_in,
                                                  const float *x, int lane)
{
    const uint16_t *w = (const uint16_t *)W + row * n_in;
    float acc = 0.0f;
#pragma unroll 2
    for (int64_t i = 8 * lane; i < n_in; i += 256) {
        const uint4 a = ldg<uint4>(w + i);
        const float4 v0 = ldg<float4>(x + i), v1 = ldg<float4>(x + i + 4);
        const uint32_t u[4] = {a.x, a.y, a.z, a.w};
        const float xs[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float lo, hi;
            if (BF) {
                lo = __uint_as_float(u[k] << 16);
                hi = __uint_as_float(u[k] & 0xffff0000u);
            } else {
                const float2 f = __half22float2(*(const __half2 *)&u[k]);
                lo = f.x;
                hi = f.y;
            }
            acc += lo * xs[2 * k] + hi * xs[2 * k + 1];
        }
    }
    return acc;
}

static __device__ __forceinline__ float row_dot_f(f16_t, const uint8_t *W, int64_t row,
                                                  int64_t n_in, const float *x, int lane)
{
    return row_dot_h<false>(W, row, n_in, x, lane);
}
static __device__ __forceinline__ float row_dot_f(bf16_t, const uint8_t *W, int64_t row,
                                                  int64_t n_in, const float *x, int lane)
{
    return row_dot_h<true>(W, row, n_in, x, lane);
}

template <typename TT> struct is_float_type { static constexpr bool v = false; };
template <> struct is_float_type<f32_t> { static constexpr bool v = true; };
template <> struct is_float_type<f16_t> { static constexpr bool v = true; };
template <> struct is_float_type<bf16_t> { static constexpr bool v = true; };

// nblk (blocks in the whole tensor) is only needed by the packed layouts; pass it through.
template <typename TT>
static __device__ __forceinline__ float row_dot_n(const uint8_t *W, int64_t row, int64_t n_in,
                                                  uint64_t nblk, const float *x,
                                                  const int8_t *xqs, const float2 *xds, int lane)
{
    if constexpr (is_float_type<TT>::v) {
        return row_dot_f(TT(), W, row, n_in, x, lane);
    } else {
        return row_dot_q<TT>(W, row, (int)(n_in / TT::QK), nblk, xqs, xds, lane);
    }
}

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ unsigned long long argmax_key(float v, int64_t row)
{
    const uint32_t u = __float_as_uint(v);
    const uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)k << 32) | (uint32_t)~(uint32_t)row;
}

template <typename TT, int EP>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const uint8_t *__restrict__ W0, const uint8_t *__restrict__ W1, int64_t n_in,
                int64_t n_out, const float *__restrict__ x, const int8_t *__restrict__ xqs,
                const float2 *__restrict__ xds, float *__restrict__ y,
                unsigned long long *__restrict__ best)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint64_t nblk = 0;
    if constexpr (!is_float_type<TT>::v) nblk = (uint64_t)n_out * (uint64_t)(n_in / TT::QK);
    unsigned long long my_best = 0;
    for (int64_t row = (int64_t)blockIdx.x * GEMV_WARPS + warp; row < n_out;
         row += (int64_t)gridDim.x * GEMV_WARPS) {
        float a = warp_sum(row_dot_n<TT>(W0, row, n_in, nblk, x, xqs, xds, lane));
        if constexpr (EP == EP_SWIGLU) {
            const float u = warp_sum(row_dot_n<TT>(W1, row, n_in, nblk, x, xqs, xds, lane));
            a = a / (1.0f + __expf(-a)) * u;
        }
        if (lane == 0) {
            if constexpr (EP == EP_ADD)
                y[row] += a;
            else
                y[row] = a;
            if constexpr (EP == EP_ARGMAX) {
                const unsigned long long k = argmax_key(a, row);
                my_best = k > my_best ? k : my_best;
            }
        }
    }
    if constexpr (EP == EP_ARGMAX) {
        __shared__ unsigned long long sbest[GEMV_WARPS];
        if (lane == 0) sbest[warp] = my_best;
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long m = sbest[0];
            for (int w = 1; w < GEMV_WARPS; w++) m = sbest[w] > m ? sbest[w] : m;
            atomicMax(best, m);
        }
    }
}

// ---- host side ----

extern "C" bool gemv_supported(uint32_t type)
{
    switch (type) {
    case QB_F32: case QB_F16: case QB_BF16: case QB_Q8_0: case QB_Q4_K: case QB_Q5_K:
    case QB_Q6_K:
        return true;
    default:
        return false;
    }
}

static int64_t type_block(uint32_t type)
{
    switch (type) {
    case QB_Q8_0: return 32;
    case QB_Q4_K: case QB_Q5_K: case QB_Q6_K: return 256;
    case QB_F16: case QB_BF16: return 8; // 16-byte loads
    case QB_F32: return 4;
    default: return 0;
    }
}

extern "C" uint64_t gemv_packed_bytes(uint32_t type, int64_t n_in, int64_t n_out)
{
    const int64_t bs = type_block(type);
    if (bs == 0 || n_in <= 0 || n_out <= 0 || n_in % bs) return 0;
    const uint64_t n = (uint64_t)n_in * (uint64_t)n_out, nblk = n / (bs > 8 ? bs : 1);
    switch (type) {
    case QB_F32: return 4 * n;
    case QB_F16: case QB_BF16: return 2 * n;
    case QB_Q4_K: return nblk * 144;
    case QB_Q5_K: return nblk * 176;
    case QB_Q6_K: return q6_d_off(nblk) + nblk * 2;
    case QB_Q8_0: return q8_d_off(nblk) + nblk * 2;
    default: return 0;
    }
}

static __global__ void pack_q6_K_kernel(const qb_q6_K *__restrict__ src, uint8_t *__restrict__ dst,
                                        uint64_t nblk)
{
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nblk) return;
    const qb_q6_K *b = src + i;
    uint8_t *qlh = dst + i * 192;
    for (int k = 0; k < 128; k++) qlh[k] = b->ql[k];
    for (int k = 0; k < 64; k++) qlh[128 + k] = b->qh[k];
    int8_t *sc = (int8_t *)(dst + q6_sc_off(nblk) + i * 16);
    for (int k = 0; k < 16; k++) sc[k] = b->scales[k];
    ((uint16_t *)(dst + q6_d_off(nblk)))[i] = b->d;
}

static __global__ void pack_q8_0_kernel(const qb_q8_0 *__restrict__ src, uint8_t *__restrict__ dst,
                                        uint64_t nblk)
{
    const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nblk) return;
    const qb_q8_0 *b = src + i;
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
    if (type == QB_Q6_K) {
        const uint64_t nblk = n / 256;
        pack_q6_K_kernel<<<ds_div_up(nblk, 256), 256, 0, stream>>>((const qb_q6_K *)d_src,
                                                                   (uint8_t *)d_dst, nblk);
    } else if (type == QB_Q8_0) {
        const uint64_t nblk = n / 32;
        pack_q8_0_kernel<<<ds_div_up(nblk, 256), 256, 0, stream>>>((const qb_q8_0 *)d_src,
                                                                   (uint8_t *)d_dst, nblk);
    } else {
        cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, stream);
    }
}

extern "C" uint64_t gemv_xq_bytes(int64_t n) { return (uint64_t)n + (uint64_t)n / 32 * 8; }

static __global__ void quantize_x_kernel(const float *__restrict__ x, int8_t *__restrict__ qs,
                                         float2 *__restrict__ ds, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return; // n % 32 == 0: whole warps leave together
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

extern "C" void gemv_quantize_x(const float *d_x, void *d_xq, int64_t n, cuda_stream stream)
{
    DS_ASSERT(n > 0 && n % 32 == 0);
    quantize_x_kernel<<<ds_div_up(n, 256), 256, 0, stream>>>(
        d_x, (int8_t *)d_xq, (float2 *)((int8_t *)d_xq + n), n);
}

template <typename TT, int EP>
static void launch_t(const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                     const void *xq, float *y, unsigned long long *best, cudaStream_t s)
{
    auto k = gemv_kernel<TT, EP>;
    int dev = 0, n_sm = 132, per_sm = 8;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, GEMV_WARPS * 32, 0);
    if (per_sm < 1) per_sm = 1;
    const int64_t need = (w0->n_out + GEMV_WARPS - 1) / GEMV_WARPS;
    const int64_t full = (int64_t)n_sm * per_sm;
    const unsigned grid = (unsigned)(need < full ? need : full);
    const int8_t *xqs = (const int8_t *)xq;
    const float2 *xds = xq ? (const float2 *)(xqs + w0->n_in) : nullptr;
    k<<<grid, GEMV_WARPS * 32, 0, s>>>((const uint8_t *)w0->d_w,
                                       (const uint8_t *)(w1 ? w1->d_w : nullptr), w0->n_in,
                                       w0->n_out, x, xqs, xds, y, best);
}

template <int EP>
static void launch(const gemv_matrix *w0, const gemv_matrix *w1, const float *x, const void *xq,
                   float *y, unsigned long long *best, cudaStream_t s)
{
    DS_ASSERT(gemv_packed_bytes(w0->type, w0->n_in, w0->n_out) > 0);
    DS_ASSERT(!w1 || (w1->type == w0->type && w1->n_in == w0->n_in && w1->n_out == w0->n_out));
    switch (w0->type) {
    case QB_F32: DS_ASSERT(x); launch_t<f32_t, EP>(w0, w1, x, xq, y, best, s); break;
    case QB_F16: DS_ASSERT(x); launch_t<f16_t, EP>(w0, w1, x, xq, y, best, s); break;
    case QB_BF16: DS_ASSERT(x); launch_t<bf16_t, EP>(w0, w1, x, xq, y, best, s); break;
    case QB_Q8_0: DS_ASSERT(xq); launch_t<q80_t, EP>(w0, w1, x, xq, y, best, s); break;
    case QB_Q4_K: DS_ASSERT(xq); launch_t<q4k_t, EP>(w0, w1, x, xq, y, best, s); break;
    case QB_Q5_K: DS_ASSERT(xq); launch_t<q5k_t, EP>(w0, w1, x, xq, y, best, s); break;
    case QB_Q6_K: DS_ASSERT(xq); launch_t<q6k_t, EP>(w0, w1, x, xq, y, best, s); break;
    default: DS_ASSERT(!"gemv: unsupported type");
    }
}

extern "C" void gemv(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
                     gemv_epilogue ep, cuda_stream stream)
{
    if (ep == GEMV_ADD)
        launch<EP_ADD>(w, nullptr, d_x, d_xq, d_y, nullptr, stream);
    else
        launch<EP_STORE>(w, nullptr, d_x, d_xq, d_y, nullptr, stream);
}

extern "C" void gemv_swiglu(const gemv_matrix *gate, const gemv_matrix *up, const float *d_x,
                            const void *d_xq, float *d_y, cuda_stream stream)
{
    launch<EP_SWIGLU>(gate, up, d_x, d_xq, d_y, nullptr, stream);
}

extern "C" void gemv_argmax(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
                            unsigned long long *d_best, cuda_stream stream)
{
    launch<EP_ARGMAX>(w, nullptr, d_x, d_xq, d_y, d_best, stream);
}

extern "C" void gemv_argmax_reset(unsigned long long *d_best, cuda_stream stream)
{
    cudaMemsetAsync(d_best, 0, sizeof *d_best, stream);
}
