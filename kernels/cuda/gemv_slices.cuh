// Internal to kernels/cuda, GEMV family (gemv.h): the packed layouts and the per-type slice dots
// the warp and flat kernels are built from. Lane slice c of block b of a row, TPB lanes per
// block; each type's x part (load_x) and weight part (slice_load / slice_compute, or slice_dot).
// Everything here is __host__ __device__: the host emulator of the flat kernel
// (tests/gpu/gemv_emulate.cu) runs the very same code without a GPU.
#ifndef DS_KERNELS_CUDA_GEMV_SLICES_CUH
#define DS_KERNELS_CUDA_GEMV_SLICES_CUH

#include <cuda_fp16.h>
#include <stdint.h>

// the flat kernel's CTA (threads) and blocks in flight per lane group; the emulator replays it
#define FLAT_THREADS 256
#define FLAT_U 2
// shared partials (floats) of one flat CTA at most: 48000 bytes, with the static shared arrays
// under the 48 KiB default (no opt-in attribute needed)
#define FLAT_PART_CAP 12000

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

// The slice helpers below are __host__ __device__ so the host emulator of the flat kernel
// (tests/gpu/gemv_emulate.cu, run by gemv_parity's CPU-side part) executes the very same code.
template <typename T> static __host__ __device__ __forceinline__ T ldg(const void *p)
{
#ifdef __CUDA_ARCH__
    return __ldg((const T *)p);
#else
    return *(const T *)p;
#endif
}

// x loads of the warp kernel: plain loads (not __ldg), as the warp kernel of record reads x
template <typename T> static __host__ __device__ __forceinline__ T ldx(const void *p)
{
    return *(const T *)p;
}

static __host__ __device__ __forceinline__ int dp4a(int a, int b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> 8 * i) * (int)(int8_t)(b >> 8 * i);
    return c;
#endif
}

static __host__ __device__ __forceinline__ int dot4(int4 a, int4 b, int c = 0)
{
    return dp4a(a.w, b.w, dp4a(a.z, b.z, dp4a(a.y, b.y, dp4a(a.x, b.x, c))));
}

// a's bytes unsigned, b's signed (PTX dp4a.u32.s32)
static __host__ __device__ __forceinline__ int dp4a_us(int a, int b, int c)
{
#ifdef __CUDA_ARCH__
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int i = 0; i < 4; i++) c += (int)(uint8_t)(a >> 8 * i) * (int)(int8_t)(b >> 8 * i);
    return c;
#endif
}

// Scales and mins of sub-blocks 2g and 2g+1 of a K-quant block from its scales bytes
// s0|s1|s2 (ggml get_scale_min_k4 for the pair, branch-free and without indexing a byte array,
// so nothing goes to local memory). g is fixed per lane, so the selects are loop-invariant.
static __host__ __device__ __forceinline__ void scale_min_pair(int g, uint32_t s0, uint32_t s1,
                                                      uint32_t s2, float *sc0, float *sc1,
                                                      float *m0, float *m1)
{
    const int sh = 16 * (g & 1);
    const uint32_t t0 = s0 >> sh, t1 = s1 >> sh, t2 = s2 >> sh;
    const bool hi = g >= 2;
    const uint32_t sc = hi ? ((t2 & 0x0f0f) | ((t0 & 0xc0c0) >> 2)) : (t0 & 0x3f3f);
    const uint32_t m = hi ? (((t2 >> 4) & 0x0f0f) | ((t1 & 0xc0c0) >> 2)) : (t1 & 0x3f3f);
    *sc0 = (float)(sc & 0xff);
    *sc1 = (float)((sc >> 8) & 0xff);
    *m0 = (float)(m & 0xff);
    *m1 = (float)((m >> 8) & 0xff);
}

// ---- per-type slice dots: lane slice c of block b of a row; TPB lanes per block. The x part
// of a slice (load_x) is loaded once per block and shared by the R rows a warp computes.

struct q4k_t { static constexpr int TPB = 8, QK = 256; };
struct q5k_t { static constexpr int TPB = 8, QK = 256; };
struct q6k_t { static constexpr int TPB = 8, QK = 256; };
struct q80_t { static constexpr int TPB = 2, QK = 32; };

// K4/K5 slice c = 2g + h: weights 64g + 16h + [0,16) (sub-block 2g) and 64g + 32 + 16h + [0,16)
// (sub-block 2g + 1)
struct xk45 {
    int4 xl, xh;
    float2 dl, dh;
};
static __host__ __device__ __forceinline__ xk45 load_xk45(int b, int c, const int8_t *xqs,
                                                 const float2 *xds)
{
    const int g = c >> 1, h = c & 1, e = b * 256 + 64 * g + 16 * h;
    return {ldx<int4>(xqs + e), ldx<int4>(xqs + e + 32), ldx<float2>(xds + b * 8 + 2 * g),
            ldx<float2>(xds + b * 8 + 2 * g + 1)};
}
static __host__ __device__ __forceinline__ xk45 load_x(q4k_t, int b, int c, const int8_t *q,
                                              const float2 *d)
{
    return load_xk45(b, c, q, d);
}
static __host__ __device__ __forceinline__ xk45 load_x(q5k_t, int b, int c, const int8_t *q,
                                              const float2 *d)
{
    return load_xk45(b, c, q, d);
}

// The slice's value from the integer dots of its two sub-blocks (dlo: sub-block 2g, dhi: 2g + 1).
// The 6-bit scales multiply the dots as integers (at most 63 * 60960 < 2^24: exact), so each
// dot costs one int-to-float conversion; the mins go to the h == 0 lane only.
static __host__ __device__ __forceinline__ float k45_finish(uint4 hdr, int c, int dlo, int dhi,
                                                            const xk45 &x)
{
    const int g = c >> 1, h = c & 1;
    const float2 dm = __half22float2(*(const __half2 *)&hdr.x);
    const int sh = 16 * (g & 1);
    const uint32_t t0 = hdr.y >> sh, t1 = hdr.z >> sh, t2 = hdr.w >> sh;
    const bool hi = g >= 2;
    const uint32_t sc = hi ? ((t2 & 0x0f0f) | ((t0 & 0xc0c0) >> 2)) : (t0 & 0x3f3f);
    const uint32_t m = hi ? (((t2 >> 4) & 0x0f0f) | ((t1 & 0xc0c0) >> 2)) : (t1 & 0x3f3f);
    const float r = dm.x * (x.dl.x * (float)((int)(sc & 0xff) * dlo) +
                            x.dh.x * (float)((int)(sc >> 8) * dhi));
    return h == 0 ? r - dm.y * ((float)(m & 0xff) * x.dl.y + (float)(m >> 8) * x.dh.y) : r;
}

// Each warp-kernel slice is its loads (slice_load: the raw weight words) and its arithmetic
// (slice_compute); slice_dot is both.

// Q4_K: qs bytes [32g + 16h, +16): low nibbles then high nibbles
struct w4k {
    uint4 hdr;
    int4 q;
};
static __host__ __device__ __forceinline__ w4k slice_load(q4k_t, const uint8_t *W, uint64_t nblk,
                                                          uint64_t ib, int c)
{
    (void)nblk;
    const uint8_t *blk = W + ib * 144;
    return {ldg<uint4>(blk), ldg<int4>(blk + 16 + 16 * c)};
}
static __host__ __device__ __forceinline__ float slice_compute(q4k_t, const w4k &w, int c,
                                                               const xk45 &x)
{
    const int4 q = w.q;
    const int4 lo = {q.x & 0x0F0F0F0F, q.y & 0x0F0F0F0F, q.z & 0x0F0F0F0F, q.w & 0x0F0F0F0F};
    // the high nibbles in place (16x their value, bytes unsigned): one shift of the dot instead
    // of one per word; exact, the dot being a multiple of 16
    const int M = (int)0xF0F0F0F0u;
    const int dhi16 = dp4a_us(q.w & M, x.xh.w,
                              dp4a_us(q.z & M, x.xh.z,
                                      dp4a_us(q.y & M, x.xh.y, dp4a_us(q.x & M, x.xh.x, 0))));
    return k45_finish(w.hdr, c, dot4(lo, x.xl), dhi16 >> 4, x);
}

// Q5_K: as Q4_K plus the fifth bit from qh[16h + l], bit 2g (low) / 2g + 1 (high)
struct w5k {
    uint4 hdr;
    int4 qh, q;
};
static __host__ __device__ __forceinline__ w5k slice_load(q5k_t, const uint8_t *W, uint64_t nblk,
                                                          uint64_t ib, int c)
{
    (void)nblk;
    const uint8_t *blk = W + ib * 176;
    return {ldg<uint4>(blk), ldg<int4>(blk + 16 + 16 * (c & 1)), ldg<int4>(blk + 48 + 16 * c)};
}
static __host__ __device__ __forceinline__ float slice_compute(q5k_t, const w5k &w, int c,
                                                               const xk45 &x)
{
    const uint4 hdr = w.hdr;
    const int g = c >> 1;
    const int4 qh = w.qh, q = w.q;
    const int sl = 2 * g, sh = 2 * g + 1;
#define Q5LO(v, u) (((v) & 0x0F0F0F0F) | ((((u) >> sl) & 0x01010101) << 4))
#define Q5HI(v, u) ((((v) >> 4) & 0x0F0F0F0F) | ((((u) >> sh) & 0x01010101) << 4))
    const int4 lo = {Q5LO(q.x, qh.x), Q5LO(q.y, qh.y), Q5LO(q.z, qh.z), Q5LO(q.w, qh.w)};
    const int4 hi = {Q5HI(q.x, qh.x), Q5HI(q.y, qh.y), Q5HI(q.z, qh.z), Q5HI(q.w, qh.w)};
#undef Q5LO
#undef Q5HI
    return k45_finish(hdr, c, dot4(lo, x.xl), dot4(hi, x.xh), x);
}

// Q6_K (packed) slice c: half n = c/4, l0 = 8*(c%4): ql[64n + l0 + [0,8)], ql[64n + 32 + l0 ..],
// qh[32n + l0 ..] give weights 128n + 32k + l0 + [0,8) for k = 0..3, scale sc[8n + l0/16 + 2k].
struct xk6 {
    int2 xv[4];
    int sumx[4];
    float dx[4];
};
static __host__ __device__ __forceinline__ xk6 load_x(q6k_t, int b, int c, const int8_t *xqs,
                                             const float2 *xds)
{
    const int n = c >> 2, l0 = 8 * (c & 3), e = b * 256 + 128 * n + l0;
    xk6 x;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        x.xv[k] = ldx<int2>(xqs + e + 32 * k);
        x.sumx[k] = 32 * dp4a(0x01010101, x.xv[k].y, dp4a(0x01010101, x.xv[k].x, 0));
        x.dx[k] = ldx<float2>(xds + b * 8 + 4 * n + k).x;
    }
    return x;
}
struct w6k {
    uint2 qa, qb, qh, sw;
    __half d;
};
static __host__ __device__ __forceinline__ w6k slice_load(q6k_t, const uint8_t *W, uint64_t nblk,
                                                          uint64_t ib, int c)
{
    const int n = c >> 2, l0 = 8 * (c & 3);
    const uint8_t *qlh = W + ib * 192;
    return {ldg<uint2>(qlh + 64 * n + l0), ldg<uint2>(qlh + 64 * n + 32 + l0),
            ldg<uint2>(qlh + 128 + 32 * n + l0), ldg<uint2>(W + q6_sc_off(nblk) + ib * 16 + 8 * n),
            ldg<__half>(W + q6_d_off(nblk) + ib * 2)};
}
static __host__ __device__ __forceinline__ float slice_compute(q6k_t, const w6k &w, int c,
                                                               const xk6 &x)
{
    const int l0 = 8 * (c & 3);
    const uint2 qa = w.qa, qb = w.qb, qh = w.qh, sw = w.sw;
    const float d = __half2float(w.d);
    const int ss = 8 * (l0 >> 4);
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t a0 = (k & 1) ? qb.x : qa.x, a1 = (k & 1) ? qb.y : qa.y;
        const int shq = (k & 2) ? 4 : 0, shh = 2 * k;
        const int v0 = (int)(((a0 >> shq) & 0x0F0F0F0F) | (((qh.x >> shh) & 0x03030303) << 4));
        const int v1 = (int)(((a1 >> shq) & 0x0F0F0F0F) | (((qh.y >> shh) & 0x03030303) << 4));
        const int sumq = dp4a(v1, x.xv[k].y, dp4a(v0, x.xv[k].x, 0));
        const uint32_t w = (k & 2) ? sw.y : sw.x;
        const float sc = (float)(int8_t)(w >> (ss + 16 * (k & 1)));
        acc += sc * x.dx[k] * (float)(sumq - x.sumx[k]);
    }
    return d * acc;
}

// Q8_0 (packed) slice c: qs[16c, +16)
struct x80 {
    int4 xv;
    float dx;
};
static __host__ __device__ __forceinline__ x80 load_x(q80_t, int b, int c, const int8_t *xqs,
                                             const float2 *xds)
{
    return {ldx<int4>(xqs + b * 32 + 16 * c), ldx<float2>(xds + b).x};
}
struct w80 {
    int4 q;
    __half d;
};
static __host__ __device__ __forceinline__ w80 slice_load(q80_t, const uint8_t *W, uint64_t nblk,
                                                          uint64_t ib, int c)
{
    return {ldg<int4>(W + ib * 32 + 16 * c), ldg<__half>(W + q8_d_off(nblk) + ib * 2)};
}
static __host__ __device__ __forceinline__ float slice_compute(q80_t, const w80 &w, int c,
                                                               const x80 &x)
{
    (void)c;
    return __half2float(w.d) * x.dx * (float)dot4(w.q, x.xv);
}

// slice_dot of the warp-kernel types: load and compute together (the flat kernel, the emulator)
template <typename TT, typename XT>
static __host__ __device__ __forceinline__ float slice_dot(TT, const uint8_t *W, uint64_t nblk,
                                                           uint64_t ib, int c, const XT &x)
{
    return slice_compute(TT(), slice_load(TT(), W, nblk, ib, c), c, x);
}

// ---- slices of the flat kernel (gemv_flat_kernel) where they differ from the warp kernel's:
// Q4_K and Q6_K with 4 lanes per block (each lane 32 bytes of quants: the header, scales and
// address arithmetic are paid once per 32 bytes instead of per 16), and the float types in
// 128-byte "blocks" of 8 lanes.

struct q4k4_t { static constexpr int TPB = 4, QK = 256; };
struct q6k4_t { static constexpr int TPB = 4, QK = 256; };
struct f32f_t { static constexpr int TPB = 8, QK = 32; };
struct f16f_t { static constexpr int TPB = 8, QK = 64; };
struct bf16f_t { static constexpr int TPB = 8, QK = 64; };

// Q4_K, lane c: qs bytes [32c, 32c + 32) = sub-block 2c (low nibbles, weights 64c + [0, 32))
// and 2c + 1 (high nibbles, weights 64c + 32 + [0, 32)); x: those 64 int8 and (d, d·Σq) of
// both sub-blocks.
struct xk4w {
    int4 l0, l1, h0, h1;
    float4 ds; // d(2c), s(2c), d(2c+1), s(2c+1)
};
static __host__ __device__ __forceinline__ xk4w load_x(q4k4_t, int b, int c, const int8_t *xqs,
                                                       const float2 *xds)
{
    const int e = b * 256 + 64 * c;
    return {ldg<int4>(xqs + e), ldg<int4>(xqs + e + 16), ldg<int4>(xqs + e + 32),
            ldg<int4>(xqs + e + 48), ldg<float4>(xds + b * 8 + 2 * c)};
}
static __host__ __device__ __forceinline__ int4 nib_lo(int4 q)
{
    return {q.x & 0x0F0F0F0F, q.y & 0x0F0F0F0F, q.z & 0x0F0F0F0F, q.w & 0x0F0F0F0F};
}
static __host__ __device__ __forceinline__ int4 nib_hi(int4 q)
{
    return {(q.x >> 4) & 0x0F0F0F0F, (q.y >> 4) & 0x0F0F0F0F, (q.z >> 4) & 0x0F0F0F0F,
            (q.w >> 4) & 0x0F0F0F0F};
}
static __host__ __device__ __forceinline__ float slice_dot(q4k4_t, const uint8_t *W, uint64_t nblk,
                                                           uint64_t ib, int c, const xk4w &x)
{
    (void)nblk;
    const uint8_t *blk = W + ib * 144;
    const uint4 hdr = ldg<uint4>(blk);
    const int4 q0 = ldg<int4>(blk + 16 + 32 * c), q1 = ldg<int4>(blk + 32 + 32 * c);
    const int dl = dot4(nib_lo(q1), x.l1, dot4(nib_lo(q0), x.l0));
    const int dh = dot4(nib_hi(q1), x.h1, dot4(nib_hi(q0), x.h0));
    const float2 dm = __half22float2(*(const __half2 *)&hdr.x);
    float sc0, sc1, m0, m1;
    scale_min_pair(c, hdr.y, hdr.z, hdr.w, &sc0, &sc1, &m0, &m1);
    return dm.x * (sc0 * x.ds.x * (float)dl + sc1 * x.ds.z * (float)dh) -
           dm.y * (m0 * x.ds.y + m1 * x.ds.w);
}

// Q6_K (packed), lane c: half n = c/2, l0 = 16·(c%2): ql[64n + l0 + [0,16)], ql[64n + 32 + l0 ..],
// qh[32n + l0 ..] give weights 128n + 32k + l0 + [0,16) for k = 0..3 with scale
// sc[8n + c%2 + 2k]; the -32 offset is one more dp4a against -32 per word.
struct xk6w {
    int4 xv[4];
    float4 d01, d23; // (d, s) of the 32-groups 4n + k
};
static __host__ __device__ __forceinline__ xk6w load_x(q6k4_t, int b, int c, const int8_t *xqs,
                                                       const float2 *xds)
{
    const int n = c >> 1, e = b * 256 + 128 * n + 16 * (c & 1);
    xk6w x;
#pragma unroll
    for (int k = 0; k < 4; k++) x.xv[k] = ldg<int4>(xqs + e + 32 * k);
    x.d01 = ldg<float4>(xds + b * 8 + 4 * n);
    x.d23 = ldg<float4>(xds + b * 8 + 4 * n + 2);
    return x;
}
static __host__ __device__ __forceinline__ float slice_dot(q6k4_t, const uint8_t *W, uint64_t nblk,
                                                           uint64_t ib, int c, const xk6w &x)
{
    const int n = c >> 1, l0 = 16 * (c & 1);
    const uint8_t *qlh = W + ib * 192;
    const uint4 qa = ldg<uint4>(qlh + 64 * n + l0);
    const uint4 qb = ldg<uint4>(qlh + 64 * n + 32 + l0);
    const uint4 qh = ldg<uint4>(qlh + 128 + 32 * n + l0);
    const uint2 sw = ldg<uint2>(W + q6_sc_off(nblk) + ib * 16 + 8 * n);
    const float d = __half2float(ldg<__half>(W + q6_d_off(nblk) + ib * 2));
    const uint32_t A[4] = {qa.x, qa.y, qa.z, qa.w}, B[4] = {qb.x, qb.y, qb.z, qb.w};
    const uint32_t H[4] = {qh.x, qh.y, qh.z, qh.w};
    const float dx[4] = {x.d01.x, x.d01.z, x.d23.x, x.d23.z};
    const int ss = 8 * (c & 1);
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int shq = (k & 2) ? 4 : 0, shh = 2 * k;
        const int X[4] = {x.xv[k].x, x.xv[k].y, x.xv[k].z, x.xv[k].w};
        int sumq = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t a = (k & 1) ? B[j] : A[j];
            const int v = (int)(((a >> shq) & 0x0F0F0F0Fu) | (((H[j] >> shh) & 0x03030303u) << 4));
            sumq = dp4a(v, X[j], dp4a((int)0xE0E0E0E0u, X[j], sumq));
        }
        const uint32_t w = (k & 2) ? sw.y : sw.x;
        const float sc = (float)(int8_t)(w >> (ss + 16 * (k & 1)));
        acc += sc * dx[k] * (float)sumq;
    }
    return d * acc;
}

// floats: "block" b = elements [QK·b, QK·(b+1)) of a row, lane c its 16 bytes
static __host__ __device__ __forceinline__ float4 load_x(f32f_t, int b, int c, const float *x)
{
    return ldg<float4>(x + b * 32 + 4 * c);
}
static __host__ __device__ __forceinline__ float slice_dot(f32f_t, const uint8_t *W, uint64_t nblk,
                                                           uint64_t ib, int c, const float4 &v)
{
    (void)nblk;
    const float4 a = ldg<float4>((const float *)W + ib * 32 + 4 * c);
    return a.x * v.x + a.y * v.y + a.z * v.z + a.w * v.w;
}
struct xf8 {
    float4 a, b;
};
static __host__ __device__ __forceinline__ xf8 load_x(f16f_t, int b, int c, const float *x)
{
    return {ldg<float4>(x + b * 64 + 8 * c), ldg<float4>(x + b * 64 + 8 * c + 4)};
}
static __host__ __device__ __forceinline__ xf8 load_x(bf16f_t, int b, int c, const float *x)
{
    return load_x(f16f_t(), b, c, x);
}
template <bool BF>
static __host__ __device__ __forceinline__ float dot_h8(const uint8_t *W, uint64_t ib, int c,
                                                        const xf8 &v)
{
    const uint4 a = ldg<uint4>((const uint16_t *)W + ib * 64 + 8 * c);
    const uint32_t u[4] = {a.x, a.y, a.z, a.w};
    const float xs[8] = {v.a.x, v.a.y, v.a.z, v.a.w, v.b.x, v.b.y, v.b.z, v.b.w};
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float lo, hi;
        if (BF) {
            union { uint32_t u; float f; } l = {u[k] << 16}, h = {u[k] & 0xffff0000u};
            lo = l.f;
            hi = h.f;
        } else {
#ifdef __CUDA_ARCH__
            const float2 f = __half22float2(*(const __half2 *)&u[k]);
            lo = f.x;
            hi = f.y;
#else // no type punning through __half2 on the host (the emulator)
            lo = __half2float(__ushort_as_half((unsigned short)(u[k] & 0xffffu)));
            hi = __half2float(__ushort_as_half((unsigned short)(u[k] >> 16)));
#endif
        }
        acc += lo * xs[2 * k] + hi * xs[2 * k + 1];
    }
    return acc;
}
static __host__ __device__ __forceinline__ float slice_dot(f16f_t, const uint8_t *W, uint64_t nblk,
                                                           uint64_t ib, int c, const xf8 &v)
{
    (void)nblk;
    return dot_h8<false>(W, ib, c, v);
}
static __host__ __device__ __forceinline__ float slice_dot(bf16f_t, const uint8_t *W, uint64_t nblk,
                                                           uint64_t ib, int c, const xf8 &v)
{
    (void)nblk;
    return dot_h8<true>(W, ib, c, v);
}

// the x part of a flat slice: quantised types read the Q8 x, float types the F32 x
template <typename TT> struct flat_is_float { static constexpr bool v = false; };
template <> struct flat_is_float<f32f_t> { static constexpr bool v = true; };
template <> struct flat_is_float<f16f_t> { static constexpr bool v = true; };
template <> struct flat_is_float<bf16f_t> { static constexpr bool v = true; };
template <typename TT>
static __host__ __device__ __forceinline__ auto flat_load_x(int b, int c, const float *x,
                                                            const int8_t *xqs, const float2 *xds)
{
    if constexpr (flat_is_float<TT>::v)
        return load_x(TT(), b, c, x);
    else
        return load_x(TT(), b, c, xqs, xds);
}

#endif
