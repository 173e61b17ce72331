// The multi-column GEMV (gemv.h gemv_cols): a short batched pass (a verify run, a few decoding
// sequences) multiplies each weight block once for all of its B <= GEMV_MAX_COLS rows. The walk
// is the warp kernel's at one row a warp (gemv_warp.cuh): lane slice c of blocks
// b = lr / TPB + i * (nl / TPB) of its row, the wpr warps of a row group splitting the blocks;
// each weight slice is loaded once and dotted with the slice of every column's x. Per column the
// sum is the warp kernel's for that x alone: the same products in the same order (warp sums,
// then the group's warps in order), so a column does not depend on B or on the other columns.
// Builds for 1, 2 and 4 columns (R = 1, 2, 4 rows a warp: the x loads of a column serve R
// rows); B between them takes the next build up, its extra column reading row B-1 again and
// storing nothing. Measured on an H100 (bench/cuda/gemv_bench --cols, docs/GPU.md §4): at 8
// rows the batched GEMM is as fast or faster on the 4B's and the 27B's matrices, so passes of
// more than GEMV_MAX_COLS rows take it. gemv_cols_swiglu runs gate and up (M = 2 matrices of one
// shape) in one walk, each x load serving both, with the SwiGLU as its epilogue.
#include "kernels/cuda/gemv_warp.cuh"

static constexpr int k_cols_builds[] = {1, 2, 4};
static_assert(GEMV_MAX_COLS == 4, "the largest build");

// column j's row of x: row min(j, B-1)
static __device__ __forceinline__ int64_t col_row(int j, int B) { return j < B ? j : B - 1; }

// NC columns of R rows of M matrices (1, or 2: gate and up): acc[m][r][j] = this lane's partial
// dot of row rows[r] of matrix m with column j. Each column's x slice is loaded once and used for
// the M * R rows.
template <typename TT, int NC, int R, int M>
static __device__ __forceinline__ void cols_dot_q(const uint8_t *const *W, const int64_t *rows,
                                                  int nb, uint64_t nblk, int64_t n_in,
                                                  const int8_t *xq, int64_t ld_xq, int B,
                                                  int lr, int nl, float (*acc)[R][NC])
{
    const int bpi = nl / TT::TPB;
    const int c = lr % TT::TPB;
    uint32_t base[R]; // 32-bit block indices (gemv_matrix_plan)
#pragma unroll
    for (int r = 0; r < R; r++) base[r] = (uint32_t)rows[r] * (uint32_t)nb;
    const int8_t *xqs[NC];
#pragma unroll
    for (int j = 0; j < NC; j++) xqs[j] = xq + col_row(j, B) * ld_xq;
#pragma unroll(NC * R * M <= 4 ? 2 : 1)
    for (int b = lr / TT::TPB; b < nb; b += bpi) {
        decltype(slice_load(TT(), W[0], nblk, 0, c)) w[M][R];
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int r = 0; r < R; r++)
                w[m][r] = slice_load(TT(), W[m], nblk, (uint64_t)(base[r] + (uint32_t)b), c);
#pragma unroll
        for (int j = 0; j < NC; j++) {
            const auto xv = load_x(TT(), b, c, xqs[j], (const float2 *)(xqs[j] + n_in));
#pragma unroll
            for (int m = 0; m < M; m++)
#pragma unroll
                for (int r = 0; r < R; r++) acc[m][r][j] += slice_compute(TT(), w[m][r], c, xv);
        }
    }
}

template <int NC, int R, int M>
static __device__ __forceinline__ void cols_dot_f(f32_t, const uint8_t *const *W,
                                                  const int64_t *rows, int64_t n_in,
                                                  const float *x, int64_t ld_x, int B, int lane,
                                                  float (*acc)[R][NC])
{
#pragma unroll(NC * R * M <= 4 ? 2 : 1)
    for (int64_t i = 4 * lane; i < n_in; i += 128) {
        float4 a[M][R];
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int r = 0; r < R; r++)
                a[m][r] = ldg<float4>((const float *)W[m] + rows[r] * n_in + i);
#pragma unroll
        for (int j = 0; j < NC; j++) {
            const float4 v = ldx4(x + col_row(j, B) * ld_x, i);
#pragma unroll
            for (int m = 0; m < M; m++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[m][r][j] += a[m][r].x * v.x + a[m][r].y * v.y + a[m][r].z * v.z +
                                    a[m][r].w * v.w;
        }
    }
}

template <bool BF, int NC, int R, int M>
static __device__ __forceinline__ void cols_dot_h(const uint8_t *const *W, const int64_t *rows,
                                                  int64_t n_in, const float *x, int64_t ld_x,
                                                  int B, int lane, float (*acc)[R][NC])
{
#pragma unroll(NC * R * M <= 4 ? 2 : 1)
    for (int64_t i = 8 * lane; i < n_in; i += 256) {
        float w[M][R][8];
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint4 a = ldg<uint4>((const uint16_t *)W[m] + rows[r] * n_in + i);
                const uint32_t u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (BF) {
                        w[m][r][2 * k] = __uint_as_float(u[k] << 16);
                        w[m][r][2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
                    } else {
                        const float2 f = __half22float2(*(const __half2 *)&u[k]);
                        w[m][r][2 * k] = f.x;
                        w[m][r][2 * k + 1] = f.y;
                    }
                }
            }
#pragma unroll
        for (int j = 0; j < NC; j++) {
            const float *xr = x + col_row(j, B) * ld_x;
            const float4 v0 = ldx4(xr, i), v1 = ldx4(xr, i + 4);
            const float xs[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
            for (int m = 0; m < M; m++)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        acc[m][r][j] += w[m][r][2 * k] * xs[2 * k] + w[m][r][2 * k + 1] * xs[2 * k + 1];
        }
    }
}

// F16 and BF16 rows: cols_dot_h (F32 rows take the overload above)
template <int NC, int R, int M, typename TT>
static __device__ __forceinline__ void cols_dot_f(TT, const uint8_t *const *W,
                                                  const int64_t *rows, int64_t n_in,
                                                  const float *x, int64_t ld_x, int B, int lane,
                                                  float (*acc)[R][NC])
{
    cols_dot_h<std::is_same<TT, bf16_t>::value, NC, R, M>(W, rows, n_in, x, ld_x, B, lane, acc);
}

// The CTA's GEMV_WARPS warps form GEMV_WARPS / wpr row groups of R rows; group g of CTA k takes
// rows [R * (k * G + g), +R), then strides by the grid. Every warp of a CTA runs the same
// iterations (the wpr warps of a group meet in shared memory); rows past n_out are computed on
// row n_out - 1 and not stored. M = 2: gate (W0) and up (W1), y = silu(gate) * up.
template <typename TT, int NC, int R, int M>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_cols_kernel(const uint8_t *__restrict__ W0, const uint8_t *__restrict__ W1, int64_t n_in,
                     int64_t n_out, const float *__restrict__ x, int64_t ld_x,
                     const int8_t *__restrict__ xq, int64_t ld_xq, float *__restrict__ y,
                     int64_t ld_y, int B, int wpr, int add)
{
    __shared__ float s_part[GEMV_WARPS][M * R * NC];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int groups = GEMV_WARPS / wpr, grp = warp / wpr, wk = warp % wpr;
    const int lr = wk * 32 + lane, nl = wpr * 32;
    const uint8_t *W[2] = {W0, W1};
    uint64_t nblk = 0;
    if constexpr (!is_float_type<TT>::v) nblk = (uint64_t)n_out * (uint64_t)(n_in / TT::QK);
    ds_grid_dep();
    const int64_t cta_rows = (int64_t)groups * R;
    for (int64_t c0 = (int64_t)blockIdx.x * cta_rows; c0 < n_out; c0 += (int64_t)gridDim.x * cta_rows) {
        const int64_t r0 = c0 + (int64_t)grp * R;
        int64_t rows[R];
#pragma unroll
        for (int r = 0; r < R; r++) rows[r] = r0 + r < n_out ? r0 + r : n_out - 1;
        float y_old[R][NC];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < NC; j++)
                y_old[r][j] = add && lane == 0 && wk == 0 && j < B && r0 + r < n_out
                                  ? y[j * ld_y + r0 + r]
                                  : 0.0f;
        float acc[M][R][NC];
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int j = 0; j < NC; j++) acc[m][r][j] = 0.0f;
        if constexpr (is_float_type<TT>::v)
            cols_dot_f<NC, R, M>(TT(), W, rows, n_in, x, ld_x, B, lr, acc);
        else
            cols_dot_q<TT, NC, R, M>(W, rows, (int)(n_in / TT::QK), nblk, n_in, xq, ld_xq, B, lr,
                                     nl, acc);
        constexpr int NA = M * R * NC;
        float *const af = &acc[0][0][0]; // [m][r][j] in order
#pragma unroll
        for (int i = 0; i < NA; i++) af[i] = warp_sum(af[i]);
        if (wpr > 1) { // the group's warps: partial sums through shared memory, added in order
            if (lane == 0)
#pragma unroll
                for (int i = 0; i < NA; i++) s_part[warp][i] = af[i];
            __syncthreads();
            if (wk == 0)
#pragma unroll
                for (int i = 0; i < NA; i++)
                    for (int k = 1; k < wpr; k++) af[i] += s_part[warp + k][i];
            __syncthreads();
        }
        if (lane == 0 && wk == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int j = 0; j < NC; j++) {
                    if (j >= B || r0 + r >= n_out) continue;
                    float v = acc[0][r][j];
                    if constexpr (M == 2) v = v / (1.0f + __expf(-v)) * acc[M - 1][r][j];
                    y[j * ld_y + r0 + r] = add ? y_old[r][j] + v : v;
                }
    }
}

// ---- planning: one shape per build ----

// rows a warp by build (1, 2, 4 columns), unless the matrix forces one (cols_rows): the fastest
// on most of gemv_bench --cols' shapes; the SwiGLU builds (two matrices) at most 2. Long rows
// of few outputs (a down projection: n_in >= 3 n_out, n_out >= 2048) take 4 rows a warp at 2
// columns too (H200, gemv_bench --cols: the 27B's ffn_down 19.3 us against 24.6, the 4B's 8.0
// against 8.4; the 0.8B's, 1024 outputs, is faster at 1).
static constexpr int k_cols_rows[3] = {1, 2, 4};
static int cols_rows(const gemv_matrix *m, int build)
{
    if (m->cols_rows) return m->cols_rows;
    if (build == 1 && m->n_in >= 3 * m->n_out && m->n_out >= 2048) return 4;
    return k_cols_rows[build];
}

template <typename TT, int NC, int R, int M>
static int plan_nc(gemv_matrix *m, gemv_shape *sh, const cuda_device_props *p, status *st)
{
    int per_sm = 0;
    CUDA_TRY(st, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                     &per_sm, gemv_cols_kernel<TT, NC, R, M>, GEMV_WARPS * 32, 0));
    const int64_t full = (int64_t)p->sm_count * (per_sm < 1 ? 1 : per_sm);
    int wpr;
    int64_t cta_rows, need;
    warp_shape<TT, R>(m->n_in, m->n_out, full, &wpr, &cta_rows, &need);
    sh->grid = (uint32_t)(need < full ? need : full);
    sh->smem = 0;
    sh->wpr = (uint8_t)wpr;
    sh->prefetch = 0;
    sh->rows = (uint8_t)R;
    return STATUS_OK;
}

template <typename TT, int NC, int M>
static int plan_rows(gemv_matrix *m, gemv_shape *sh, int rows, const cuda_device_props *p,
                     status *st)
{
    if constexpr (M == 1)
        if (rows == 4) return plan_nc<TT, NC, 4, M>(m, sh, p, st);
    switch (rows) {
    case 4: // two matrices: at most 2 rows a warp (registers)
    case 2: return plan_nc<TT, NC, 2, M>(m, sh, p, st);
    default: return plan_nc<TT, NC, 1, M>(m, sh, p, st);
    }
}

template <typename TT>
static int plan_cols_t(gemv_matrix *m, const cuda_device_props *p, status *st)
{
    gemv_shape *c = m->plan.cols, *g = m->plan.cols_swiglu;
    return plan_rows<TT, 1, 1>(m, &c[0], cols_rows(m, 0), p, st) ||
                   plan_rows<TT, 2, 1>(m, &c[1], cols_rows(m, 1), p, st) ||
                   plan_rows<TT, 4, 1>(m, &c[2], cols_rows(m, 2), p, st) ||
                   plan_rows<TT, 1, 2>(m, &g[0], cols_rows(m, 0), p, st) ||
                   plan_rows<TT, 2, 2>(m, &g[1], cols_rows(m, 1), p, st) ||
                   plan_rows<TT, 4, 2>(m, &g[2], cols_rows(m, 2), p, st)
               ? st->code
               : STATUS_OK;
}

extern "C" bool gemv_cols_supported(uint32_t type, int64_t n_in)
{
    switch (type) {
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
        return true; // gemv_packed_bytes took the width (a multiple of 256)
    case GGML_TYPE_Q8_0: return n_in % 64 == 0; // Q8 rows 16-byte aligned (gemv_xq_bytes)
    case GGML_TYPE_F32: return n_in % 4 == 0;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return n_in % 8 == 0;
    default: return false;
    }
}

int gemv_cols_plan(gemv_matrix *m, const cuda_device_props *p, status *st)
{
    if (!gemv_cols_supported(m->type, m->n_in)) return STATUS_OK; // plan.cols stays zero
    if (m->cols_rows != 0 && m->cols_rows != 1 && m->cols_rows != 2 && m->cols_rows != 4)
        return status_fail(st, STATUS_INVALID, "gemv_cols: %d rows per warp", m->cols_rows);
    switch (m->type) {
    case GGML_TYPE_F32: return plan_cols_t<f32_t>(m, p, st);
    case GGML_TYPE_F16: return plan_cols_t<f16_t>(m, p, st);
    case GGML_TYPE_BF16: return plan_cols_t<bf16_t>(m, p, st);
    case GGML_TYPE_Q8_0: return plan_cols_t<q80_t>(m, p, st);
    case GGML_TYPE_Q4_K: return plan_cols_t<q4k_t>(m, p, st);
    case GGML_TYPE_Q5_K: return plan_cols_t<q5k_t>(m, p, st);
    case GGML_TYPE_Q6_K: return plan_cols_t<q6k_t>(m, p, st);
    default: return STATUS_OK;
    }
}

// ---- launch ----

template <typename TT, int NC, int R, int M>
static void launch_r(const gemv_matrix *w, const gemv_matrix *w1, const gemv_shape &sh,
                     const float *x, int64_t ld_x, const void *xq, float *y, int64_t ld_y,
                     bool add, int B, const cuda_launch *l)
{
    ds_launch(gemv_cols_kernel<TT, NC, R, M>, sh.grid, GEMV_WARPS * 32, 0, l,
              (const uint8_t *)w->d_w, (const uint8_t *)(w1 ? w1->d_w : nullptr), w->n_in,
              w->n_out, x, ld_x, (const int8_t *)xq, (int64_t)gemv_xq_bytes(w->n_in), y, ld_y, B,
              (int)sh.wpr, (int)add);
}

template <typename TT, int NC, int M>
static void launch_nc(const gemv_matrix *w, const gemv_matrix *w1, const gemv_shape &sh,
                      const float *x, int64_t ld_x, const void *xq, float *y, int64_t ld_y,
                      bool add, int B, const cuda_launch *l)
{
    switch (sh.rows) {
    case 4:
        if constexpr (M == 1) launch_r<TT, NC, 4, M>(w, w1, sh, x, ld_x, xq, y, ld_y, add, B, l);
        break;
    case 2: launch_r<TT, NC, 2, M>(w, w1, sh, x, ld_x, xq, y, ld_y, add, B, l); break;
    default: launch_r<TT, NC, 1, M>(w, w1, sh, x, ld_x, xq, y, ld_y, add, B, l); break;
    }
}

template <typename TT, int M>
static void launch_cols_t(const gemv_matrix *w, const gemv_matrix *w1, const float *x,
                          int64_t ld_x, const void *xq, float *y, int64_t ld_y, bool add, int B,
                          const cuda_launch *l)
{
    const int k = B <= 1 ? 0 : B <= 2 ? 1 : 2;
    const gemv_shape &sh = M == 2 ? w->plan.cols_swiglu[k] : w->plan.cols[k];
    DS_ASSERT(sh.grid > 0 && k_cols_builds[k] >= B && (M == 1 || sh.rows <= 2));
    switch (k) {
    case 0: launch_nc<TT, 1, M>(w, w1, sh, x, ld_x, xq, y, ld_y, add, B, l); break;
    case 1: launch_nc<TT, 2, M>(w, w1, sh, x, ld_x, xq, y, ld_y, add, B, l); break;
    default: launch_nc<TT, 4, M>(w, w1, sh, x, ld_x, xq, y, ld_y, add, B, l); break;
    }
}

template <int M>
static void launch_cols(const gemv_matrix *w, const gemv_matrix *w1, const float *d_x,
                        int64_t ld_x, const void *d_xq, float *d_y, int64_t ld_y, bool add,
                        int B, const cuda_launch *l)
{
    DS_ASSERT(w->plan.kernel != 0 && B >= 1 && B <= GEMV_MAX_COLS);
    const bool fl = w->type == GGML_TYPE_F32 || w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_BF16;
    DS_ASSERT(fl ? d_x != nullptr : d_xq != nullptr);
    (void)fl;
    switch (w->type) {
    case GGML_TYPE_F32: launch_cols_t<f32_t, M>(w, w1, d_x, ld_x, d_xq, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_F16: launch_cols_t<f16_t, M>(w, w1, d_x, ld_x, d_xq, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_BF16: launch_cols_t<bf16_t, M>(w, w1, d_x, ld_x, d_xq, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_Q8_0: launch_cols_t<q80_t, M>(w, w1, d_x, ld_x, d_xq, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_Q4_K: launch_cols_t<q4k_t, M>(w, w1, d_x, ld_x, d_xq, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_Q5_K: launch_cols_t<q5k_t, M>(w, w1, d_x, ld_x, d_xq, d_y, ld_y, add, B, l); break;
    case GGML_TYPE_Q6_K: launch_cols_t<q6k_t, M>(w, w1, d_x, ld_x, d_xq, d_y, ld_y, add, B, l); break;
    default: DS_ASSERT(!"gemv_cols: unsupported type");
    }
}

extern "C" void gemv_cols(const gemv_matrix *w, const float *d_x, int64_t ld_x, const void *d_xq,
                          float *d_y, int64_t ld_y, gemv_epilogue ep, int B, const cuda_launch *l)
{
    launch_cols<1>(w, nullptr, d_x, ld_x, d_xq, d_y, ld_y, ep == GEMV_ADD, B, l);
}

extern "C" void gemv_cols_swiglu(const gemv_matrix *gate, const gemv_matrix *up, const float *d_x,
                                 int64_t ld_x, const void *d_xq, float *d_y, int64_t ld_y, int B,
                                 const cuda_launch *l)
{
    DS_ASSERT(up->type == gate->type && up->n_in == gate->n_in && up->n_out == gate->n_out);
    launch_cols<2>(gate, up, d_x, ld_x, d_xq, d_y, ld_y, false, B, l);
}
