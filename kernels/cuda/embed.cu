// The embedding step of the GEMV family (gemv.h): the first kernel of a decode step takes the
// token (forced, or gemv_argmax's), advances the position and dequantises one row of the
// embedding from the packed GEMV layout; and gemv_argmax_reset.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gemv_slices.cuh"
#include "kernels/cuda/quant_blocks.cuh"

extern "C" void gemv_argmax_reset(unsigned long long *d_best, const cuda_launch *l)
{
    cudaMemsetAsync(d_best, 0, sizeof *d_best, ds_stream(l));
}

// ---- one row dequantised from the packed layout (embedding lookup) ----

static __device__ float packed_elem(uint32_t type, const uint8_t *W, int64_t n_in, int64_t n_out,
                                    int64_t row, int64_t e)
{
    switch (type) {
    case GGML_TYPE_F32: return ((const float *)W)[row * n_in + e];
    case GGML_TYPE_F16: return qb_half(((const uint16_t *)W)[row * n_in + e]);
    case GGML_TYPE_BF16: return qb_bf16(((const uint16_t *)W)[row * n_in + e]);
    case GGML_TYPE_Q8_0: {
        const uint64_t nblk = (uint64_t)n_out * (n_in / 32), ib = row * (n_in / 32) + e / 32;
        return qb_half(((const uint16_t *)(W + q8_d_off(nblk)))[ib]) *
               (float)((const int8_t *)W)[ib * 32 + e % 32];
    }
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: {
        const int64_t ib = row * (n_in / 256) + e / 256;
        const int l = (int)(e % 256), g = l / 64, hi = (l % 64) >= 32, ll = l % 32;
        const uint8_t *blk = W + ib * (type == GGML_TYPE_Q4_K ? 144 : 176);
        const block_q4_K *b4 = (const block_q4_K *)blk;
        uint8_t sc, m;
        qb_scale_min_k4(2 * g + hi, b4->scales, &sc, &m);
        int q;
        if (type == GGML_TYPE_Q4_K) {
            const uint8_t byte = b4->qs[32 * g + ll];
            q = hi ? byte >> 4 : byte & 0xF;
        } else {
            const block_q5_K *b5 = (const block_q5_K *)blk;
            const uint8_t byte = b5->qs[32 * g + ll];
            q = (hi ? byte >> 4 : byte & 0xF) + ((b5->qh[ll] >> (2 * g + hi)) & 1 ? 16 : 0);
        }
        return qb_half(b4->d) * sc * q - qb_half(b4->dmin) * m;
    }
    case GGML_TYPE_Q6_K: {
        const uint64_t nblk = (uint64_t)n_out * (n_in / 256), ib = row * (n_in / 256) + e / 256;
        const int l = (int)(e % 256), n = l / 128, r = l % 128, k = r / 32, ll = r % 32;
        const uint8_t *qlh = W + ib * 192;
        const uint8_t ql = qlh[64 * n + ll + (k & 1) * 32];
        const int nib = (k & 2) ? ql >> 4 : ql & 0xF;
        const int h = (qlh[128 + 32 * n + ll] >> (2 * k)) & 3;
        const int8_t sc = ((const int8_t *)(W + q6_sc_off(nblk)))[ib * 16 + 8 * n + ll / 16 + 2 * k];
        const float d = qb_half(((const uint16_t *)(W + q6_d_off(nblk)))[ib]);
        return d * sc * ((nib | (h << 4)) - 32);
    }
    default: return 0.0f;
    }
}

static __global__ void __launch_bounds__(1024)
    embed_step_kernel(const uint8_t *__restrict__ W, uint32_t type, int64_t n_in, int64_t n_out,
                      const int32_t *__restrict__ tok_in, int32_t *__restrict__ cursor,
                      unsigned long long *__restrict__ best, int32_t *__restrict__ tok_out,
                      int32_t *__restrict__ pos, float *__restrict__ x)
{
    ds_grid_dep();
    int64_t tok = tok_in ? tok_in[cursor ? *cursor : 0]
                         : (int64_t)(int32_t)(~(uint32_t)(*best & 0xffffffffu));
    if (tok < 0) tok = 0;
    if (tok >= n_out) tok = n_out - 1;
    __syncthreads(); // every thread has read *best and *cursor
    if (threadIdx.x == 0) {
        *best = 0;
        if (tok_in && cursor) *cursor = *cursor + 1;
        *tok_out = (int32_t)tok;
        pos[0] = pos[1];
        pos[1] = pos[1] + 1;
    }
    for (int64_t e = threadIdx.x; e < n_in; e += blockDim.x)
        x[e] = packed_elem(type, W, n_in, n_out, tok, e);
}

extern "C" void gemv_embed_step(const gemv_matrix *emb, const int32_t *d_tok_in,
                                int32_t *d_cursor, unsigned long long *d_best,
                                int32_t *d_tok_out, int32_t *d_pos, float *d_x,
                                const cuda_launch *l)
{
    DS_ASSERT(gemv_packed_bytes(emb->type, emb->n_in, emb->n_out) > 0);
    // a plain launch whatever l->pdl says: in the forced graph it follows the tokens'
    // host-to-device copy, and the programmatic attribute is for kernel-to-kernel edges only
    embed_step_kernel<<<1, 1024, 0, ds_stream(l)>>>((const uint8_t *)emb->d_w, emb->type,
                                                    emb->n_in, emb->n_out, d_tok_in, d_cursor,
                                                    d_best, d_tok_out, d_pos, d_x);
}

// ---- the embedding of a batched step ----

// CTA i: row i's token (clamped into the vocabulary), the embedding row into x[i], and, when row
// i is the last of its slot's consecutive rows, its slot's device position set to the row's
// (pos[0] = position, pos[1] = position + 1, as gemv_embed_step leaves it) so the slot's
// batch-1 graphs continue from there.
static __global__ void __launch_bounds__(256)
    embed_rows_kernel(const uint8_t *__restrict__ W, uint32_t type, int64_t n_in, int64_t n_out,
                      const int32_t *__restrict__ tok, const int32_t *__restrict__ slot,
                      const int32_t *__restrict__ row_pos, int32_t *__restrict__ pos,
                      int64_t pos_stride, float *__restrict__ x, int64_t ld_x)
{
    ds_grid_dep();
    const int i = blockIdx.x;
    int64_t t = tok[i];
    if (t < 0) t = 0;
    if (t >= n_out) t = n_out - 1;
    if (threadIdx.x == 0 && pos && (i + 1 == (int)gridDim.x || slot[i + 1] != slot[i])) {
        int32_t *p = pos + (int64_t)slot[i] * pos_stride;
        p[0] = row_pos[i];
        p[1] = row_pos[i] + 1;
    }
    float *xi = x + (int64_t)i * ld_x;
    for (int64_t e = threadIdx.x; e < n_in; e += blockDim.x) xi[e] = packed_elem(type, W, n_in, n_out, t, e);
}

extern "C" void gemv_embed_rows(const gemv_matrix *emb, const int32_t *d_tok,
                                const int32_t *d_slot, const int32_t *d_row_pos, int32_t *d_pos,
                                int64_t pos_stride, float *d_x, int64_t ld_x, int B,
                                const cuda_launch *l)
{
    DS_ASSERT(gemv_packed_bytes(emb->type, emb->n_in, emb->n_out) > 0 && B >= 1 && ld_x >= emb->n_in);
    // a plain launch, as gemv_embed_step: it follows the rows' host-to-device copy
    const cuda_launch plain = {ds_stream(l), false};
    ds_launch(embed_rows_kernel, B, 256, 0, &plain, (const uint8_t *)emb->d_w, emb->type, emb->n_in,
              emb->n_out, d_tok, d_slot, d_row_pos, d_pos, pos_stride, d_x, ld_x);
}
