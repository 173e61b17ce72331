// Test-only host twins of the GEMV family (gemv_emulate.h): gemv_pack on host memory, and the
// flat kernel's STORE path run serially on the host with the kernel's own slice code
// (kernels/cuda/gemv_slices.cuh), so gemv_parity checks the flat kernel's indexing and slices
// without a GPU.
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gemv_slices.cuh"
#include "kernels/cuda/quant_blocks.cuh"
#include "tests/gpu/gemv_emulate.h"

// The host emulator of gemv_flat_kernel's STORE epilogue: the same partition, the same walk
// (group, block, lane) and the same slice code, run serially. Used by gemv_parity's CPU-side
// part to check the flat kernel's indexing and the new slices without a GPU.
template <typename TT>
static void flat_emulate(const uint8_t *W, int64_t n_in, int64_t n_out, const float *x,
                         const int8_t *xqs, const float2 *xds, float *y, int grid)
{
    constexpr int TPB = TT::TPB, G = FLAT_THREADS / TPB, U = FLAT_U, STEP = U * G;
    const int nb = (int)(n_in / TT::QK);
    for (int k = 0; k < grid; k++) {
        const int64_t r0 = (int64_t)k * n_out / grid, r1 = (int64_t)(k + 1) * n_out / grid;
        const int nr = (int)(r1 - r0), nf = nr * nb;
        const uint64_t nblk = (uint64_t)n_out * (uint64_t)nb, fb = (uint64_t)r0 * (uint64_t)nb;
        float *part = (float *)calloc((size_t)nf + 1, sizeof(float));
        const int dr = STEP % nb;
        for (int grp = 0; grp < G; grp++) {
            const int grp_w = ((grp * TPB) / 32) * 32 / TPB;
            int bb[U];
            for (int u = 0; u < U; u++) bb[u] = (grp + u * G) % nb;
            for (int f = grp, fw = grp_w; fw < nf; f += STEP, fw += STEP) {
                for (int u = 0; u < U; u++) {
                    const int fu = f + u * G;
                    const uint64_t ib = fb + (uint64_t)(fu < nf ? fu : nf - 1);
                    float v = 0.0f;
                    for (int c = 0; c < TPB; c++) {
                        const auto xv = flat_load_x<TT>(bb[u], c, x, xqs, xds);
                        v += slice_dot(TT(), W, nblk, ib, c, xv);
                    }
                    if (fu < nf) part[fu] = v;
                    bb[u] += dr;
                    if (bb[u] >= nb) bb[u] -= nb;
                }
            }
        }
        for (int i = 0; i < nr; i++) {
            float a = 0.0f;
            for (int j = 0; j < nb; j++) a += part[i * nb + j];
            y[r0 + i] = a;
        }
        free(part);
    }
}


extern "C" void gemv_pack_host(uint32_t type, const void *src, void *dst, int64_t n_in,
                               int64_t n_out)
{
    const uint64_t n = (uint64_t)n_in * (uint64_t)n_out;
    if (type == GGML_TYPE_Q6_K) {
        const uint64_t nblk = n / 256;
        for (uint64_t i = 0; i < nblk; i++) {
            const block_q6_K *b = (const block_q6_K *)src + i;
            uint8_t *d = (uint8_t *)dst;
            memcpy(d + i * 192, b->ql, 128);
            memcpy(d + i * 192 + 128, b->qh, 64);
            memcpy(d + q6_sc_off(nblk) + i * 16, b->scales, 16);
            memcpy(d + q6_d_off(nblk) + i * 2, &b->d, 2);
        }
    } else if (type == GGML_TYPE_Q8_0) {
        const uint64_t nblk = n / 32;
        for (uint64_t i = 0; i < nblk; i++) {
            const block_q8_0 *b = (const block_q8_0 *)src + i;
            memcpy((uint8_t *)dst + i * 32, b->qs, 32);
            memcpy((uint8_t *)dst + q8_d_off(nblk) + i * 2, &b->d, 2);
        }
    } else {
        memcpy(dst, src, gemv_packed_bytes(type, n_in, n_out));
    }
}

extern "C" int gemv_flat_emulate(uint32_t type, const void *h_w, int64_t n_in, int64_t n_out,
                                 const float *x, const void *xq, float *y, int grid)
{
    if (!gemv_flat_supported(type, n_in) || grid < 1 || grid > n_out) return -1;
    const uint8_t *W = (const uint8_t *)h_w;
    const int8_t *xqs = (const int8_t *)xq;
    const float2 *xds = xq ? (const float2 *)(xqs + n_in) : nullptr;
    switch (type) {
    case GGML_TYPE_F32: flat_emulate<f32f_t>(W, n_in, n_out, x, xqs, xds, y, grid); break;
    case GGML_TYPE_F16: flat_emulate<f16f_t>(W, n_in, n_out, x, xqs, xds, y, grid); break;
    case GGML_TYPE_BF16: flat_emulate<bf16f_t>(W, n_in, n_out, x, xqs, xds, y, grid); break;
    case GGML_TYPE_Q8_0: flat_emulate<q80_t>(W, n_in, n_out, x, xqs, xds, y, grid); break;
    case GGML_TYPE_Q4_K: flat_emulate<q4k4_t>(W, n_in, n_out, x, xqs, xds, y, grid); break;
    case GGML_TYPE_Q5_K: flat_emulate<q5k_t>(W, n_in, n_out, x, xqs, xds, y, grid); break;
    case GGML_TYPE_Q6_K: flat_emulate<q6k4_t>(W, n_in, n_out, x, xqs, xds, y, grid); break;
    default: return -1;
    }
    return 0;
}
