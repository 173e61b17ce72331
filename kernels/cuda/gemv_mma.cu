// Passes of B <= GEMV_MMA_ROWS rows of Q4_K, Q5_K and Q6_K matrices on the int8 tensor cores
// (gemv.h gemv_mma), against the rows' Q8_K forms (one x scale a 256-value super-block: the CPU
// forward's own rounding and dot), so the integer dots of a super-block's sub-blocks times their
// 6-bit (Q6_K: int8) scales add up as integers and an output costs one conversion and a couple
// of FMAs a super-block. Up to 8 rows a CTA owns 16 weight rows; its warps split the row's
// blocks (warp w takes blocks w, w + WARPS, ...), each copying its 16-row block into a ring of
// shared-memory stages by cp.async a stage ahead of the MMAs, and the warps' partial sums meet in
// shared memory at the end. The MMA multiplies 16 weight rows by the x of the pass's rows (n = 8
// columns; the rows past B repeat row B - 1 and are not stored). From GEMV_MMA_TILED_FROM rows
// the 64-row tiles below.
#include "kernels/cuda/gemv_warp.cuh"
#include "kernels/cuda/cp_async.cuh"

#define MMA_WARPS 8
#define MMA_STAGES 2

static __device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// a warp's C fragments (rows r0 + g, r0 + g + 8; columns 8 nt + 2 t, + 1) to y, or (split K over
// gridDim.y) to this split's partials [split][B][n_out]
template <int NT>
static __device__ __forceinline__ void gm_store(const float (&acc)[NT][4], int64_t r0, int64_t n_out,
                                                float *y, int64_t ld_y, float *part, int B, int add)
{
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t r = r0 + g + 8 * (i >> 1);
            const int col = 8 * nt + 2 * t + (i & 1);
            if (r >= n_out || col >= B) continue;
            if (gridDim.y > 1) {
                part[((int64_t)blockIdx.y * B + col) * n_out + r] = acc[nt][i];
            } else {
                float *out = y + (int64_t)col * ld_y + r;
                *out = add ? *out + acc[nt][i] : acc[nt][i];
            }
        }
    }
}

// the B fragments of super-block b of the one-tile kernels' x column xb: bytes 32 j + 4 t and
// 32 j + 16 + 4 t of each 32-weight group j
static __device__ __forceinline__ void x_frags(const int8_t *xb, int b, int t, uint32_t (&xv)[16])
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        xv[2 * j] = ldx<uint32_t>(xb + (int64_t)b * 256 + 32 * j + 4 * t);
        xv[2 * j + 1] = ldx<uint32_t>(xb + (int64_t)b * 256 + 32 * j + 16 + 4 * t);
    }
}

// ---- Q4_K and Q5_K: mma m16n8k32, one 32-weight sub-block a step. Per sub-block a lane adds
// the 6-bit scale times the exact integer dot to the block's integer sum; the mins take a second
// MMA, the sub-block's min byte broadcast as the A operand against the same x, which sums
// m_j * sum(x of sub-block j) in the accumulator. A block then costs per output one conversion
// of each sum and d * sum - dmin * mins times the block's x scale: |sum| <= 8 * 63 * 32 * 31 *
// 127 < 2^31. The scales of a block are unpacked word-wise (4 at a time) and picked by byte
// permutes; the copy offsets are computed once. Q5_K is the same walk over 176-byte blocks, the
// fifth bit of each weight from qh[l] bit j.
static __device__ __forceinline__ int mma2_b2i(uint32_t w, int k)
{
    return (int)__byte_perm(w, 0u, 0x4440 + k);
}

// Q5 false: Q4_K (144-byte blocks: header, qs); true: Q5_K (176: header, qh[32], qs)
template <bool Q5> struct mma45 {
    static constexpr int BU = Q5 ? 11 : 9; // uint4 a block row
    static constexpr int U4 = 16 * BU;      // a block of 16 rows
    static constexpr int QS = Q5 ? 3 : 1;   // the qs' first uint4
};

// a warp's view of one staged 16-row block (rows g and g + 8 of its MMA): the qs words of its
// A fragments, Q5_K's qh words, the unpacked scales and mins (a byte each, sub-blocks 0-3 and
// 4-7) and d, dmin
template <bool Q5> struct k45_regs {
    uint32_t qa[8], qb[8], hA2[2], hB2[2], scA[2], mnA[2], scB[2], mnB[2];
    float2 dA, dB;
};
template <bool Q5>
static __device__ __forceinline__ void k45_load(const uint4 *sw, int g, int t, k45_regs<Q5> &k)
{
    typedef mma45<Q5> T;
    const uint4 hA = sw[g * T::BU], hB = sw[(g + 8) * T::BU];
    const uint32_t *qA = (const uint32_t *)(sw + g * T::BU + T::QS);
    const uint32_t *qB = (const uint32_t *)(sw + (g + 8) * T::BU + T::QS);
#pragma unroll
    for (int p = 0; p < 4; p++) {
        k.qa[2 * p] = qA[8 * p + t], k.qa[2 * p + 1] = qA[8 * p + 4 + t];
        k.qb[2 * p] = qB[8 * p + t], k.qb[2 * p + 1] = qB[8 * p + 4 + t];
    }
    k.hA2[0] = k.hA2[1] = k.hB2[0] = k.hB2[1] = 0;
    if (Q5) { // qh bytes l = 4t.. and 16 + 4t..
        const uint32_t *hqA = (const uint32_t *)(sw + g * T::BU + 1);
        const uint32_t *hqB = (const uint32_t *)(sw + (g + 8) * T::BU + 1);
        k.hA2[0] = hqA[t], k.hA2[1] = hqA[4 + t];
        k.hB2[0] = hqB[t], k.hB2[1] = hqB[4 + t];
    }
    // get_scale_min_k4, word-wise
    k.scA[0] = hA.y & 0x3F3F3F3Fu, k.scA[1] = (hA.w & 0x0F0F0F0Fu) | ((hA.y >> 2) & 0x30303030u);
    k.mnA[0] = hA.z & 0x3F3F3F3Fu, k.mnA[1] = ((hA.w >> 4) & 0x0F0F0F0Fu) | ((hA.z >> 2) & 0x30303030u);
    k.scB[0] = hB.y & 0x3F3F3F3Fu, k.scB[1] = (hB.w & 0x0F0F0F0Fu) | ((hB.y >> 2) & 0x30303030u);
    k.mnB[0] = hB.z & 0x3F3F3F3Fu, k.mnB[1] = ((hB.w >> 4) & 0x0F0F0F0Fu) | ((hB.z >> 2) & 0x30303030u);
    k.dA = __half22float2(*(const __half2 *)&hA.x);
    k.dB = __half22float2(*(const __half2 *)&hB.x);
}
// the A fragment of sub-block j
template <bool Q5>
static __device__ __forceinline__ void k45_frag(const k45_regs<Q5> &k, int j, uint32_t (&a)[4])
{
    const int p = j >> 1, sh = 4 * (j & 1);
    const uint32_t M = 0x0F0F0F0Fu, M1 = 0x01010101u;
    a[0] = (k.qa[2 * p] >> sh) & M, a[1] = (k.qb[2 * p] >> sh) & M;
    a[2] = (k.qa[2 * p + 1] >> sh) & M, a[3] = (k.qb[2 * p + 1] >> sh) & M;
    if (Q5) {
        a[0] |= ((k.hA2[0] >> j) & M1) << 4, a[1] |= ((k.hB2[0] >> j) & M1) << 4;
        a[2] |= ((k.hA2[1] >> j) & M1) << 4, a[3] |= ((k.hB2[1] >> j) & M1) << 4;
    }
}

// a lane's share of copying a 16-row block (rows r0..r0 + 15, clamped to the matrix) into a
// stage: uint4 i = lane + 32 kk of the block, row i / BU, word i % BU
template <bool Q5> struct k45_copy {
    static constexpr int NK = (mma45<Q5>::U4 + 31) / 32;
    const uint8_t *src[NK];
    __device__ __forceinline__ k45_copy(const uint8_t *W, int64_t r0, int64_t n_out, int nb, int lane)
    {
        typedef mma45<Q5> T;
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            const int i = min(lane + 32 * kk, T::U4 - 1), row = i / T::BU, q = i % T::BU;
            src[kk] = W + min(r0 + row, n_out - 1) * nb * (16 * T::BU) + 16 * q;
        }
    }
    // block b of the rows into dst
    __device__ __forceinline__ void issue(uint4 *dst, int b, int lane) const
    {
        typedef mma45<Q5> T;
#pragma unroll
        for (int kk = 0; kk < NK; kk++)
            if (lane + 32 * kk < T::U4)
                cp_async16(dst + lane + 32 * kk, src[kk] + (int64_t)b * (16 * T::BU), true);
    }
};

template <bool Q5>
static __global__ void __launch_bounds__(MMA_WARPS * 32)
    gemv_mma45_kernel(const uint8_t *__restrict__ W, int64_t n_in, int64_t n_out,
                      const int8_t *__restrict__ xq, int64_t ld_xq, float *__restrict__ y,
                      int64_t ld_y, int B, int add)
{
    typedef mma45<Q5> T;
    __shared__ uint4 s_w[MMA_WARPS][MMA_STAGES][T::U4]; // the partial sums reuse it at the end
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int64_t r0 = 16 * (int64_t)blockIdx.x;
    const int nb = (int)(n_in / 256);
    const int8_t *xb = xq + (int64_t)min(g, B - 1) * ld_xq; // the B fragment's column
    const int c0 = min(2 * t, B - 1), c1 = min(2 * t + 1, B - 1); // the C fragment's columns
    const float *xd0 = (const float *)(xq + c0 * ld_xq + n_in); // the columns' x scales
    const float *xd1 = (const float *)(xq + c1 * ld_xq + n_in);
    const k45_copy<Q5> cp(W, r0, n_out, nb, lane);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int mine = nb > warp ? (nb - warp + MMA_WARPS - 1) / MMA_WARPS : 0;
    for (int k = 0; k < MMA_STAGES - 1; k++) {
        if (k < mine) cp.issue(s_w[warp][k], warp + k * MMA_WARPS, lane);
        cp_async_commit();
    }
    ds_grid_dep();
    for (int k = 0; k < mine; k++) {
        const int kn = k + MMA_STAGES - 1;
        if (kn < mine) cp.issue(s_w[warp][kn % MMA_STAGES], warp + kn * MMA_WARPS, lane);
        cp_async_commit();
        const int b = warp + k * MMA_WARPS;
        uint32_t xv[16];
        x_frags(xb, b, t, xv);
        cp_async_wait<MMA_STAGES - 1>();
        __syncwarp();
        k45_regs<Q5> q;
        k45_load<Q5>(s_w[warp][k % MMA_STAGES], g, t, q);
        __syncwarp(); // the stage is read: the next copy may land in it
        int isum[4] = {0, 0, 0, 0}, imin[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int h = j >> 2, e = j & 3;
            uint32_t a[4];
            k45_frag<Q5>(q, j, a);
            int c[4] = {0, 0, 0, 0};
            mma_s8(c, a[0], a[1], a[2], a[3], xv[2 * j], xv[2 * j + 1]);
            const uint32_t mA = __byte_perm(q.mnA[h], 0u, 0x1111 * e), mB = __byte_perm(q.mnB[h], 0u, 0x1111 * e);
            mma_s8(imin, mA, mB, mA, mB, xv[2 * j], xv[2 * j + 1]);
            const int sA = mma2_b2i(q.scA[h], e), sB = mma2_b2i(q.scB[h], e);
            isum[0] += sA * c[0], isum[1] += sA * c[1], isum[2] += sB * c[2], isum[3] += sB * c[3];
        }
        const float x0 = ldx<float>(xd0 + b), x1 = ldx<float>(xd1 + b);
        acc[0] += x0 * (q.dA.x * (float)isum[0] - q.dA.y * (float)imin[0]);
        acc[1] += x1 * (q.dA.x * (float)isum[1] - q.dA.y * (float)imin[1]);
        acc[2] += x0 * (q.dB.x * (float)isum[2] - q.dB.y * (float)imin[2]);
        acc[3] += x1 * (q.dB.x * (float)isum[3] - q.dB.y * (float)imin[3]);
    }
    cp_async_wait_all();
    __syncthreads(); // every warp is done with its stages: the partial sums take them over
    float4 *part = (float4 *)&s_w[0][0][0];
    part[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (warp != 0) return;
    for (int w = 1; w < MMA_WARPS; w++) {
        const float4 v = part[w * 32 + lane];
        acc[0] += v.x, acc[1] += v.y, acc[2] += v.z, acc[3] += v.w;
    }
    const float(&a1)[1][4] = *reinterpret_cast<const float(*)[1][4]>(&acc);
    gm_store<1>(a1, r0, n_out, y, ld_y, nullptr, B, add);
}

static void gemv_mma_k45(const gemv_matrix *w, const void *d_xq, float *d_y, int64_t ld_y,
                         gemv_epilogue ep, int B, const cuda_launch *l)
{
    const unsigned grid = (unsigned)((w->n_out + 15) / 16);
    if (w->type == GGML_TYPE_Q5_K)
        ds_launch(gemv_mma45_kernel<true>, grid, MMA_WARPS * 32, 0, l, (const uint8_t *)w->d_w,
                  w->n_in, w->n_out, (const int8_t *)d_xq, (int64_t)gemv_xq_bytes(w->n_in), d_y,
                  ld_y, B, (int)(ep == GEMV_ADD));
    else
        ds_launch(gemv_mma45_kernel<false>, grid, MMA_WARPS * 32, 0, l, (const uint8_t *)w->d_w,
                  w->n_in, w->n_out, (const int8_t *)d_xq, (int64_t)gemv_xq_bytes(w->n_in), d_y,
                  ld_y, B, (int)(ep == GEMV_ADD));
}

// ---- Q6_K (the packed layout, gemv_slices.cuh: ql|qh 192 bytes a block, the 16 int8 scales and
// d in their own arrays). One m16n8k16 a 16-weight sub-block (its own scale): the 6-bit q as
// unsigned bytes, plus a second MMA of the constant -32 bytes with the same x, so the integer dot
// is sum (q - 32) x exactly; the two halves of a 32-weight x group meet as sc_lo * c_lo +
// sc_hi * c_hi in the block's integer sum, converted once and scaled by d times the block's x
// scale. Weight 32 j + l (j = 4 n + k, l < 32) of a block: ql byte
// 64 n + 32 (k & 1) + l (low nibble for k < 2, high for k >= 2), qh byte 32 n + l bits 2k.
#define Q6M_WARPS 4
#define Q6M_STAGES 3
#define Q6M_QLH 192 // uint4 of 16 rows' ql|qh
#define Q6M_U4 (Q6M_QLH + 16)

static __device__ __forceinline__ void mma_s8_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}
// byte e (0..3) of w, sign-extended
static __device__ __forceinline__ int sbyte(uint32_t w, int e)
{
    return (int)(w << (24 - 8 * e)) >> 24;
}

// a warp's view of one staged 16-row Q6_K block (rows g and g + 8): ql words [n][k & 1][half],
// qh words [n][half], the 16 scale bytes of each row
struct q6_regs {
    uint32_t qlA[2][2][2], qlB[2][2][2], qhA[2][2], qhB[2][2];
    uint4 scA, scB;
};
static __device__ __forceinline__ void q6_load(const uint4 *sw, int g, int t, q6_regs &k)
{
    const uint32_t *wA = (const uint32_t *)(sw + g * 12), *wB = (const uint32_t *)(sw + (g + 8) * 12);
#pragma unroll
    for (int n = 0; n < 2; n++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            k.qlA[n][0][h] = wA[(64 * n + 16 * h + 4 * t) / 4];
            k.qlA[n][1][h] = wA[(64 * n + 32 + 16 * h + 4 * t) / 4];
            k.qlB[n][0][h] = wB[(64 * n + 16 * h + 4 * t) / 4];
            k.qlB[n][1][h] = wB[(64 * n + 32 + 16 * h + 4 * t) / 4];
            k.qhA[n][h] = wA[(128 + 32 * n + 16 * h + 4 * t) / 4];
            k.qhB[n][h] = wB[(128 + 32 * n + 16 * h + 4 * t) / 4];
        }
    }
    k.scA = sw[Q6M_QLH + g], k.scB = sw[Q6M_QLH + g + 8];
}
// x group j's A fragments, {row A low 16, row B low, row A high, row B high}, and the scales of
// sub-blocks 2 j and 2 j + 1 (bytes 2j, 2j+1 of the row's 16), {A low, A high, B low, B high}
static __device__ __forceinline__ void q6_frag(const q6_regs &k, int j, uint32_t (&a)[4], int (&sc)[4])
{
    const int n = j >> 2, kq = j & 3, shq = 4 * (kq >> 1), shh = 2 * kq;
    const uint32_t M4 = 0x0F0F0F0Fu, M2 = 0x03030303u;
#define Q6V(ql, qh) ((((ql) >> shq) & M4) | ((((qh) >> shh) & M2) << 4))
    a[0] = Q6V(k.qlA[n][kq & 1][0], k.qhA[n][0]), a[1] = Q6V(k.qlB[n][kq & 1][0], k.qhB[n][0]);
    a[2] = Q6V(k.qlA[n][kq & 1][1], k.qhA[n][1]), a[3] = Q6V(k.qlB[n][kq & 1][1], k.qhB[n][1]);
#undef Q6V
    const uint32_t wsA = j < 2 ? k.scA.x : j < 4 ? k.scA.y : j < 6 ? k.scA.z : k.scA.w;
    const uint32_t wsB = j < 2 ? k.scB.x : j < 4 ? k.scB.y : j < 6 ? k.scB.z : k.scB.w;
    const int e = 2 * (j & 1);
    sc[0] = sbyte(wsA, e), sc[1] = sbyte(wsA, e + 1), sc[2] = sbyte(wsB, e), sc[3] = sbyte(wsB, e + 1);
}

// a lane's share of copying a 16-row Q6_K block (rows r0..r0 + 15, clamped) into a stage: ql|qh
// uint4 i = lane + 32 kk (row i / 12, word i % 12), then the scales of row lane (lanes < 16)
struct q6_copy {
    const uint8_t *src[6], *src_sc;
    __device__ __forceinline__ q6_copy(const uint8_t *W, int64_t r0, int64_t n_out, int nb, int lane)
    {
        const uint8_t *Wsc = W + q6_sc_off((uint64_t)nb * (uint64_t)n_out);
#pragma unroll
        for (int kk = 0; kk < 6; kk++) {
            const int i = lane + 32 * kk, row = i / 12, q = i % 12;
            src[kk] = W + (uint64_t)min(r0 + row, n_out - 1) * nb * 192 + 16 * q;
        }
        src_sc = Wsc + (uint64_t)min(r0 + (lane & 15), n_out - 1) * nb * 16;
    }
    __device__ __forceinline__ void issue(uint4 *dst, int b, int lane) const
    {
#pragma unroll
        for (int kk = 0; kk < 6; kk++) cp_async16(dst + lane + 32 * kk, src[kk] + (int64_t)b * 192, true);
        if (lane < 16) cp_async16(dst + Q6M_QLH + lane, src_sc + (int64_t)b * 16, true);
    }
};

static __global__ void __launch_bounds__(Q6M_WARPS * 32)
    gemv_mma_q6k_kernel(const uint8_t *__restrict__ W, int64_t n_in, int64_t n_out,
                        const int8_t *__restrict__ xq, int64_t ld_xq, float *__restrict__ y,
                        int64_t ld_y, int B, int add)
{
    __shared__ uint4 s_w[Q6M_WARPS][Q6M_STAGES][Q6M_U4];
    __shared__ float s_part[Q6M_WARPS][32][4];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int64_t r0 = 16 * (int64_t)blockIdx.x;
    const int nb = (int)(n_in / 256);
    const uint64_t nblk = (uint64_t)nb * (uint64_t)n_out;
    const uint8_t *Wsc = W + q6_sc_off(nblk);
    const __half *Wd = (const __half *)(W + q6_d_off(nblk));
    const int8_t *xb = xq + (int64_t)min(g, B - 1) * ld_xq;
    const int c0 = min(2 * t, B - 1), c1 = min(2 * t + 1, B - 1);
    const float *xd0 = (const float *)(xq + c0 * ld_xq + n_in); // the columns' x scales
    const float *xd1 = (const float *)(xq + c1 * ld_xq + n_in);
    const int64_t rA = min(r0 + g, n_out - 1), rB = min(r0 + g + 8, n_out - 1);
    const q6_copy cp(W, r0, n_out, nb, lane);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int mine = nb > warp ? (nb - warp + Q6M_WARPS - 1) / Q6M_WARPS : 0;
    for (int k = 0; k < Q6M_STAGES - 1; k++) {
        if (k < mine) cp.issue(s_w[warp][k], warp + k * Q6M_WARPS, lane);
        cp_async_commit();
    }
    ds_grid_dep();
    const uint32_t NEG32 = 0xE0E0E0E0u; // -32 in every byte
    for (int k = 0; k < mine; k++) {
        const int kn = k + Q6M_STAGES - 1;
        if (kn < mine) cp.issue(s_w[warp][kn % Q6M_STAGES], warp + kn * Q6M_WARPS, lane);
        cp_async_commit();
        const int b = warp + k * Q6M_WARPS;
        const float dA = __half2float(Wd[rA * nb + b]), dB = __half2float(Wd[rB * nb + b]);
        uint32_t xv[16];
        x_frags(xb, b, t, xv);
        cp_async_wait<Q6M_STAGES - 1>();
        __syncwarp();
        q6_regs q;
        q6_load(s_w[warp][k % Q6M_STAGES], g, t, q);
        __syncwarp(); // the stage is read: the next copy may land in it
        int isum[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t a[4];
            int sc[4];
            q6_frag(q, j, a, sc);
            int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
            mma_s8_k16(cl, a[0], a[1], xv[2 * j]);
            mma_s8_k16(cl, NEG32, NEG32, xv[2 * j]);
            mma_s8_k16(ch, a[2], a[3], xv[2 * j + 1]);
            mma_s8_k16(ch, NEG32, NEG32, xv[2 * j + 1]);
            isum[0] += sc[0] * cl[0] + sc[1] * ch[0];
            isum[1] += sc[0] * cl[1] + sc[1] * ch[1];
            isum[2] += sc[2] * cl[2] + sc[3] * ch[2];
            isum[3] += sc[2] * cl[3] + sc[3] * ch[3];
        }
        const float x0 = ldx<float>(xd0 + b), x1 = ldx<float>(xd1 + b);
        acc[0] += (dA * x0) * (float)isum[0];
        acc[1] += (dA * x1) * (float)isum[1];
        acc[2] += (dB * x0) * (float)isum[2];
        acc[3] += (dB * x1) * (float)isum[3];
    }
#pragma unroll
    for (int i = 0; i < 4; i++) s_part[warp][lane][i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < 4; i++)
        for (int w = 1; w < Q6M_WARPS; w++) acc[i] += s_part[w][lane][i];
    const float(&a1)[1][4] = *reinterpret_cast<const float(*)[1][4]>(&acc);
    gm_store<1>(a1, r0, n_out, y, ld_y, nullptr, B, add);
}

static void gemv_mma_q6k(const gemv_matrix *w, const void *d_xq, float *d_y, int64_t ld_y,
                         gemv_epilogue ep, int B, const cuda_launch *l)
{
    ds_launch(gemv_mma_q6k_kernel, (unsigned)((w->n_out + 15) / 16), Q6M_WARPS * 32, 0, l,
              (const uint8_t *)w->d_w, w->n_in, w->n_out, (const int8_t *)d_xq,
              (int64_t)gemv_xq_bytes(w->n_in), d_y, ld_y, B, (int)(ep == GEMV_ADD));
}

// ---- Passes of GEMV_MMA_TILED_FROM..GEMV_MMA_ROWS rows: the rows' Q8_K forms (gemv.h
// gemv_quantize_rows_k: per 256 values one scale, quant_quantize_row_q8_K_ref's levels), the
// CPU forward's own dot (gguf/quant.h): per super-block the integer sums of every sub-block
// times its 6-bit scale stay integers, so a super-block costs one conversion and two FMAs an
// output. A CTA of GM_WARPS warps owns 16 * GM_WARPS weight rows (16 a warp) and every column of
// the pass (NT tiles of 8), and walks its super-blocks in order; the pass's Q8_K x of a
// super-block (256 int8 and the 16-byte group holding its scale, a column) is staged once for
// the CTA's warps, its weights a warp's own 16 rows, both by cp.async GM_STAGES - 1 super-blocks
// ahead. A column's smem row is GM_XU = 17 uint4 (68 words: the B fragments, rows g and words
// 8 j + t, fall in distinct banks). Q4_K/Q5_K mins: a second MMA a sub-block, the min byte
// broadcast as the A operand, accumulates sum_j m_j * sum(x of sub-block j) in integers. Q6_K:
// the levels' -32 offset as the one-tile kernel does it (a second MMA of -32 bytes). Matrices
// with too few CTAs to fill the GPU split K over gridDim.y into partials (gemv_reduce_splits
// sums them in split order).
#define GM_WARPS 4
#define GM_STAGES 3
#define GM_XU 17
#define GM_ROWS (16 * GM_WARPS) // weight rows a CTA

// stage copies of super-block b's Q8_K x: NC columns (past B: column B - 1); uint4 16 of a
// column's row holds the scales of super-blocks 4 (b / 4) .. + 3
template <int NC>
static __device__ __forceinline__ void gm_copy_x(uint4 *sx, const int8_t *xq, int64_t ld_xq,
                                                 int64_t n_in, int B, int b)
{
    for (int i = threadIdx.x; i < NC * GM_XU; i += GM_WARPS * 32) {
        const int col = i / GM_XU, q = i % GM_XU;
        const int8_t *row = xq + (int64_t)min(col, B - 1) * ld_xq;
        const int8_t *src = q < 16 ? row + (int64_t)b * 256 + 16 * q : row + n_in + 16 * (b / 4);
        cp_async16(sx + col * GM_XU + q, src, true);
    }
}
// the Q8_K scale of the stage's column col (super-block b)
static __device__ __forceinline__ float gm_dx(const uint4 *sx, int col, int b)
{
    return ((const float *)(sx + col * GM_XU + 16))[b & 3];
}

template <bool Q5, int NT>
static __global__ void __launch_bounds__(GM_WARPS * 32)
    gemm_mma45_kernel(const uint8_t *__restrict__ W, int64_t n_in, int64_t n_out,
                      const int8_t *__restrict__ xq, int64_t ld_xq, float *__restrict__ y,
                      int64_t ld_y, int B, int add, float *__restrict__ part, int kps)
{
    typedef mma45<Q5> T;
    constexpr int NC = 8 * NT;
    extern __shared__ uint4 gm_smem[];
    uint4 *s_w = gm_smem;                                  // [GM_STAGES][GM_WARPS][T::U4]
    uint4 *s_x = gm_smem + GM_STAGES * GM_WARPS * T::U4;   // [GM_STAGES][NC][GM_XU]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int64_t r0 = (int64_t)GM_ROWS * blockIdx.x + 16 * warp;
    const int nb = (int)(n_in / 256);
    const int kb0 = blockIdx.y * kps, mine = max(0, min(nb, kb0 + kps) - kb0);
    const k45_copy<Q5> cp(W, r0, n_out, nb, lane);
    uint4 *s_wm = s_w + warp * T::U4; // this warp's block of stage 0
    for (int k = 0; k < GM_STAGES - 1 && k < mine; k++) cp.issue(s_wm + k * GM_WARPS * T::U4, kb0 + k, lane);
    ds_grid_dep();
    for (int k = 0; k < GM_STAGES - 1; k++) {
        if (k < mine) gm_copy_x<NC>(s_x + k * NC * GM_XU, xq, ld_xq, n_in, B, kb0 + k);
        cp_async_commit();
    }
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    for (int k = 0; k < mine; k++) {
        cp_async_wait<GM_STAGES - 2>();
        __syncthreads(); // stage k landed for every warp; stage k - 1 is read by every warp
        const int kn = k + GM_STAGES - 1;
        if (kn < mine) {
            cp.issue(s_wm + (kn % GM_STAGES) * GM_WARPS * T::U4, kb0 + kn, lane);
            gm_copy_x<NC>(s_x + (kn % GM_STAGES) * NC * GM_XU, xq, ld_xq, n_in, B, kb0 + kn);
        }
        cp_async_commit();
        const int b = kb0 + k;
        const uint4 *sx = s_x + (k % GM_STAGES) * NC * GM_XU;
        k45_regs<Q5> q;
        k45_load<Q5>(s_w + ((k % GM_STAGES) * GM_WARPS + warp) * T::U4, g, t, q);
        int isum[NT][4], imin[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) isum[nt][i] = imin[nt][i] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int h = j >> 2, e = j & 3;
            uint32_t a[4];
            k45_frag<Q5>(q, j, a);
            const int sA = mma2_b2i(q.scA[h], e), sB = mma2_b2i(q.scB[h], e);
            const uint32_t mA = __byte_perm(q.mnA[h], 0u, 0x1111 * e), mB = __byte_perm(q.mnB[h], 0u, 0x1111 * e);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint32_t *xr = (const uint32_t *)(sx + (8 * nt + g) * GM_XU);
                const uint32_t x0 = xr[8 * j + t], x1 = xr[8 * j + 4 + t];
                int c[4] = {0, 0, 0, 0};
                mma_s8(c, a[0], a[1], a[2], a[3], x0, x1);
                mma_s8(imin[nt], mA, mB, mA, mB, x0, x1);
                isum[nt][0] += sA * c[0];
                isum[nt][1] += sA * c[1];
                isum[nt][2] += sB * c[2];
                isum[nt][3] += sB * c[3];
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float x0 = gm_dx(sx, 8 * nt + 2 * t, b), x1 = gm_dx(sx, 8 * nt + 2 * t + 1, b);
            acc[nt][0] += x0 * (q.dA.x * (float)isum[nt][0] - q.dA.y * (float)imin[nt][0]);
            acc[nt][1] += x1 * (q.dA.x * (float)isum[nt][1] - q.dA.y * (float)imin[nt][1]);
            acc[nt][2] += x0 * (q.dB.x * (float)isum[nt][2] - q.dB.y * (float)imin[nt][2]);
            acc[nt][3] += x1 * (q.dB.x * (float)isum[nt][3] - q.dB.y * (float)imin[nt][3]);
        }
    }
    cp_async_wait_all();
    gm_store<NT>(acc, r0, n_out, y, ld_y, part, B, add);
}

// Q6_K: the warp's 16 rows' ql|qh (Q6M_QLH uint4) and scales (16 uint4) a stage; per 32-weight
// x group the one-tile kernel's MMAs (levels and the -32 bytes, each half of the group on its
// own), the halves' sums times their int8 scales added as integers over the super-block
template <int NT>
static __global__ void __launch_bounds__(GM_WARPS * 32)
    gemm_mma_q6k_kernel(const uint8_t *__restrict__ W, int64_t n_in, int64_t n_out,
                        const int8_t *__restrict__ xq, int64_t ld_xq, float *__restrict__ y,
                        int64_t ld_y, int B, int add, float *__restrict__ part, int kps)
{
    constexpr int NC = 8 * NT;
    extern __shared__ uint4 gm_smem[];
    uint4 *s_w = gm_smem;                                  // [GM_STAGES][GM_WARPS][Q6M_U4]
    uint4 *s_x = gm_smem + GM_STAGES * GM_WARPS * Q6M_U4;  // [GM_STAGES][NC][GM_XU]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int64_t r0 = (int64_t)GM_ROWS * blockIdx.x + 16 * warp;
    const int nb = (int)(n_in / 256);
    const int kb0 = blockIdx.y * kps, mine = max(0, min(nb, kb0 + kps) - kb0);
    const uint64_t nblk = (uint64_t)nb * (uint64_t)n_out;
    const __half *Wd = (const __half *)(W + q6_d_off(nblk));
    const int64_t rA = min(r0 + g, n_out - 1), rB = min(r0 + g + 8, n_out - 1);
    const q6_copy cp(W, r0, n_out, nb, lane);
    uint4 *s_wm = s_w + warp * Q6M_U4; // this warp's block of stage 0
    for (int k = 0; k < GM_STAGES - 1 && k < mine; k++) cp.issue(s_wm + k * GM_WARPS * Q6M_U4, kb0 + k, lane);
    ds_grid_dep();
    for (int k = 0; k < GM_STAGES - 1; k++) {
        if (k < mine) gm_copy_x<NC>(s_x + k * NC * GM_XU, xq, ld_xq, n_in, B, kb0 + k);
        cp_async_commit();
    }
    const uint32_t NEG32 = 0xE0E0E0E0u;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    for (int k = 0; k < mine; k++) {
        cp_async_wait<GM_STAGES - 2>();
        __syncthreads();
        const int kn = k + GM_STAGES - 1;
        if (kn < mine) {
            cp.issue(s_wm + (kn % GM_STAGES) * GM_WARPS * Q6M_U4, kb0 + kn, lane);
            gm_copy_x<NC>(s_x + (kn % GM_STAGES) * NC * GM_XU, xq, ld_xq, n_in, B, kb0 + kn);
        }
        cp_async_commit();
        const int b = kb0 + k;
        const float dA = __half2float(Wd[rA * nb + b]), dB = __half2float(Wd[rB * nb + b]);
        const uint4 *sx = s_x + (k % GM_STAGES) * NC * GM_XU;
        q6_regs q;
        q6_load(s_w + ((k % GM_STAGES) * GM_WARPS + warp) * Q6M_U4, g, t, q);
        int isum[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) isum[nt][0] = isum[nt][1] = isum[nt][2] = isum[nt][3] = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t a[4];
            int sc[4];
            q6_frag(q, j, a, sc);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint32_t *xr = (const uint32_t *)(sx + (8 * nt + g) * GM_XU);
                const uint32_t xl = xr[8 * j + t], xh = xr[8 * j + 4 + t];
                int cl[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
                mma_s8_k16(cl, a[0], a[1], xl);
                mma_s8_k16(cl, NEG32, NEG32, xl);
                mma_s8_k16(ch, a[2], a[3], xh);
                mma_s8_k16(ch, NEG32, NEG32, xh);
                isum[nt][0] += sc[0] * cl[0] + sc[1] * ch[0];
                isum[nt][1] += sc[0] * cl[1] + sc[1] * ch[1];
                isum[nt][2] += sc[2] * cl[2] + sc[3] * ch[2];
                isum[nt][3] += sc[2] * cl[3] + sc[3] * ch[3];
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float x0 = gm_dx(sx, 8 * nt + 2 * t, b), x1 = gm_dx(sx, 8 * nt + 2 * t + 1, b);
            acc[nt][0] += (dA * x0) * (float)isum[nt][0];
            acc[nt][1] += (dA * x1) * (float)isum[nt][1];
            acc[nt][2] += (dB * x0) * (float)isum[nt][2];
            acc[nt][3] += (dB * x1) * (float)isum[nt][3];
        }
    }
    cp_async_wait_all();
    gm_store<NT>(acc, r0, n_out, y, ld_y, part, B, add);
}

static int gm_w_u4(uint32_t type)
{
    return type == GGML_TYPE_Q6_K ? Q6M_U4 : type == GGML_TYPE_Q5_K ? mma45<true>::U4 : mma45<false>::U4;
}
static size_t gm_smem_bytes(uint32_t type, int NT)
{
    return (size_t)GM_STAGES * (GM_WARPS * gm_w_u4(type) + 8 * NT * GM_XU) * 16;
}

// super-blocks a split: the GM_ROWS-row tiles alone give the GPU two CTAs an SM, or K splits until
// they do (a function of the matrix and the GPU, never of B)
static int gm_kps(const gemv_matrix *w)
{
    const int64_t tiles = (w->n_out + GM_ROWS - 1) / GM_ROWS, nb = w->n_in / 256;
    const int sm = w->plan.sm_count > 0 ? w->plan.sm_count : 132;
    int64_t splits = (2 * sm + tiles - 1) / tiles;
    splits = splits > nb ? nb : splits < 1 ? 1 : splits;
    return (int)((nb + splits - 1) / splits);
}
static int gm_splits(const gemv_matrix *w)
{
    const int kps = gm_kps(w);
    return (int)((w->n_in / 256 + kps - 1) / kps);
}

extern "C" int64_t gemv_mma_work_floats(const gemv_matrix *w, int B)
{
    if (!gemv_mma_supported(w->type) || B < GEMV_MMA_TILED_FROM) return 0;
    const int s = gm_splits(w);
    return s > 1 ? (int64_t)s * B * w->n_out : 0;
}

template <int NT> static cudaError_t gm_init_nt()
{
    cudaError_t e = cudaFuncSetAttribute(gemm_mma45_kernel<false, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gm_smem_bytes(GGML_TYPE_Q4_K, NT));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_mma45_kernel<true, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gm_smem_bytes(GGML_TYPE_Q5_K, NT));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gemm_mma_q6k_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gm_smem_bytes(GGML_TYPE_Q6_K, NT));
    return e;
}

extern "C" int gemv_mma_init(status *st)
{
    CUDA_TRY(st, gm_init_nt<2>());
    CUDA_TRY(st, gm_init_nt<4>());
    CUDA_TRY(st, gm_init_nt<8>());
    return STATUS_OK;
}

template <int NT>
static void gm_launch(const gemv_matrix *w, const void *d_xq, float *d_y, int64_t ld_y, int add,
                      int B, float *part, int kps, int splits, const cuda_launch *l)
{
    const dim3 grid((unsigned)((w->n_out + GM_ROWS - 1) / GM_ROWS), (unsigned)splits);
    const size_t smem = gm_smem_bytes(w->type, NT);
    const int64_t ld_xq = (int64_t)gemv_xq_bytes(w->n_in);
    const int8_t *xq = (const int8_t *)d_xq;
    const uint8_t *W = (const uint8_t *)w->d_w;
    if (w->type == GGML_TYPE_Q6_K)
        ds_launch(gemm_mma_q6k_kernel<NT>, grid, GM_WARPS * 32, smem, l, W, w->n_in, w->n_out, xq,
                  ld_xq, d_y, ld_y, B, add, part, kps);
    else if (w->type == GGML_TYPE_Q5_K)
        ds_launch(gemm_mma45_kernel<true, NT>, grid, GM_WARPS * 32, smem, l, W, w->n_in, w->n_out,
                  xq, ld_xq, d_y, ld_y, B, add, part, kps);
    else
        ds_launch(gemm_mma45_kernel<false, NT>, grid, GM_WARPS * 32, smem, l, W, w->n_in,
                  w->n_out, xq, ld_xq, d_y, ld_y, B, add, part, kps);
}

// y (op)= the splits' partials summed in split order (fixed: the result does not depend on B)
static __global__ void reduce_splits_kernel(const float *__restrict__ part, int splits, int B,
                                          int64_t n_out, float *__restrict__ y, int64_t ld_y,
                                          int add)
{
    ds_grid_dep();
    const int i = blockIdx.y;
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_out) return;
    float c = part[(int64_t)i * n_out + r];
    for (int s = 1; s < splits; s++) c += part[((int64_t)s * B + i) * n_out + r];
    float *out = y + (int64_t)i * ld_y + r;
    *out = add ? *out + c : c;
}

extern "C" void gemv_reduce_splits(const float *d_part, int splits, int B, int64_t n_out,
                                   float *d_y, int64_t ld_y, gemv_epilogue ep, const cuda_launch *l)
{
    ds_launch(reduce_splits_kernel, dim3((unsigned)((n_out + 255) / 256), B), 256, 0, l, d_part,
              splits, B, n_out, d_y, ld_y, (int)(ep == GEMV_ADD));
}

extern "C" bool gemv_mma_supported(uint32_t type)
{
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K;
}

extern "C" void gemv_mma(const gemv_matrix *w, const void *d_xq, float *d_y, int64_t ld_y,
                         gemv_epilogue ep, int B, float *d_work, const cuda_launch *l)
{
    DS_ASSERT(gemv_mma_supported(w->type) && B >= 1 && B <= GEMV_MMA_ROWS && w->n_in % 256 == 0);
    DS_ASSERT(d_work || gemv_mma_work_floats(w, B) == 0);
    if (B < GEMV_MMA_TILED_FROM) {
        if (w->type == GGML_TYPE_Q6_K)
            gemv_mma_q6k(w, d_xq, d_y, ld_y, ep, B, l);
        else
            gemv_mma_k45(w, d_xq, d_y, ld_y, ep, B, l);
        return;
    }
    const int add = ep == GEMV_ADD, kps = gm_kps(w), splits = gm_splits(w);
    if (B <= 16) gm_launch<2>(w, d_xq, d_y, ld_y, add, B, d_work, kps, splits, l);
    else if (B <= 32) gm_launch<4>(w, d_xq, d_y, ld_y, add, B, d_work, kps, splits, l);
    else gm_launch<8>(w, d_xq, d_y, ld_y, add, B, d_work, kps, splits, l);
    if (splits > 1) gemv_reduce_splits(d_work, splits, B, w->n_out, d_y, ld_y, ep, l);
}

extern "C" void gemv_mma_quantize(const float *d_x, int64_t ld_x, void *d_xq, int64_t n, int B,
                                  const cuda_launch *l)
{
    if (n % 256 == 0) // no K-quant matrix reads a row of another width: nothing to write
        gemv_quantize_rows_k(d_x, ld_x, d_xq, n, B, l);
}
