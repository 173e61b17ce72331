// Two GEMVs of one input in one launch (gemv_pair, gemv.h): the warp kernel's body (gemv_warp.cuh)
// on two parts of one grid. The pair kernel's occupancy is planned per matrix (gemv_pair_plan);
// the split of the wave between the two matrices is arithmetic on the two plans at launch.
#include <string.h>

#include "kernels/cuda/gemv_warp.cuh"

// CTAs [0, split) run matrix 0 (epilogue E0: store, or the GDN in-projection's conv), the others
// matrix 1 (store), each striding over its own part of the grid. For a layer whose
// in-projections are of two weight types (Q4_K_M: the 0.8B's Q6_K qkv and Q4_K z|beta|alpha):
// one dependent step instead of two. One row a warp, registers capped for 8 CTAs per SM (64:
// Q6_K fits without spills, ptxas -v).
struct gemv_side {
    const uint8_t *W;
    int64_t n_in, n_out;
    float *y;
    ep_args ep;
};

template <typename T0, int E0, typename T1>
static __global__ void __launch_bounds__(GEMV_WARPS * 32, 8)
    gemv_pair_kernel(const float *__restrict__ x, const int8_t *__restrict__ xqs,
                     const float2 *__restrict__ xds, unsigned split, gemv_side a, gemv_side b)
{
    if (blockIdx.x < split)
        gemv_body<T0, E0, 1>(blockIdx.x, split, a.W, nullptr, a.n_in, a.n_out, x, xqs, xds, a.y,
                             a.ep);
    else
        gemv_body<T1, EP_STORE, 1>(blockIdx.x - split, gridDim.x - split, b.W, nullptr, b.n_in,
                                   b.n_out, x, xqs, xds, b.y, b.ep);
}

static bool pair_type(uint32_t t) { return t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q6_K; }

// ---- planning: the pair kernel's occupancy with this matrix first ----

template <typename T0, int E0, typename T1>
static int plan_k(gemv_matrix *m, int e, int t, status *st)
{
    int per_sm = 0;
    CUDA_TRY(st, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                     &per_sm, gemv_pair_kernel<T0, E0, T1>, GEMV_WARPS * 32, 0));
    m->plan.pair_per_sm[e][t] = (uint8_t)(per_sm < 1 ? 1 : per_sm > 255 ? 255 : per_sm);
    return STATUS_OK;
}

template <typename T0> static int plan_t(gemv_matrix *m, status *st)
{
    return plan_k<T0, EP_STORE, q4k_t>(m, 0, 0, st) || plan_k<T0, EP_STORE, q6k_t>(m, 0, 1, st) ||
                   plan_k<T0, EP_CONV, q4k_t>(m, 1, 0, st) || plan_k<T0, EP_CONV, q6k_t>(m, 1, 1, st)
               ? st->code
               : STATUS_OK;
}

int gemv_pair_plan(gemv_matrix *m, const cuda_device_props *p, status *st)
{
    (void)p;
    memset(m->plan.pair_per_sm, 0, sizeof m->plan.pair_per_sm);
    if (!pair_type(m->type)) return STATUS_OK;
    return m->type == GGML_TYPE_Q4_K ? plan_t<q4k_t>(m, st) : plan_t<q6k_t>(m, st);
}

extern "C" bool gemv_pair_supported(const gemv_matrix *w0, const gemv_matrix *w1)
{
    return w0 && w1 && pair_type(w0->type) && pair_type(w1->type) && w0->n_in == w1->n_in &&
           w0->plan.kernel == GEMV_KERNEL_WARP && w1->plan.kernel == GEMV_KERNEL_WARP &&
           w0->n_out > 0 && w1->n_out > 0;
}

extern "C" bool gemv_pair_planned(const gemv_matrix *w0, const gemv_matrix *w1)
{
    return gemv_pair_supported(w0, w1) &&
           gemv_packed_bytes(w0->type, w0->n_in, w0->n_out) +
                   gemv_packed_bytes(w1->type, w1->n_in, w1->n_out) <=
               GEMV_PAIR_MAX_BYTES;
}

// ---- launch ----

// One side of a pair: its shape at the pair kernel's occupancy and its epilogue arguments.
template <typename TT>
static gemv_side pair_side(const gemv_matrix *w, float *y, const gemv_ep_out &o, int64_t full,
                           int64_t *cta_rows, int64_t *need)
{
    int wpr;
    warp_shape<TT, 1>(w->n_in, w->n_out, full, &wpr, cta_rows, need);
    return {(const uint8_t *)w->d_w, w->n_in, w->n_out, y,
            ep_args{0, wpr, nullptr, o.conv_w, o.conv_state, o.n_conv, o.K}};
}

template <typename T0, int E0, typename T1>
static void launch_t(const gemv_matrix *w0, const gemv_matrix *w1, const void *xq, float *y0,
                     float *y1, const gemv_ep_out &o0, const cuda_launch *l)
{
    const int64_t full = (int64_t)w0->plan.sm_count *
                         w0->plan.pair_per_sm[E0 == EP_CONV][std::is_same<T1, q6k_t>::value];
    int64_t rows0, rows1, need0, need1;
    gemv_side a = pair_side<T0>(w0, y0, o0, full, &rows0, &need0);
    gemv_side b = pair_side<T1>(w1, y1, gemv_ep_out{}, full, &rows1, &need1);
    // the wave split by bytes: each side gets CTAs in proportion to its weights (at least one,
    // at most what covers its rows once)
    const double b0 = (double)gemv_packed_bytes(w0->type, w0->n_in, w0->n_out);
    const double b1 = (double)gemv_packed_bytes(w1->type, w1->n_in, w1->n_out);
    int64_t g0 = need0, g1 = need1;
    if (g0 + g1 > full) {
        g0 = (int64_t)((double)full * b0 / (b0 + b1) + 0.5);
        g0 = g0 < 1 ? 1 : g0 > need0 ? need0 : g0 > full - 1 ? full - 1 : g0;
        g1 = full - g0 < need1 ? full - g0 : need1;
    }
    a.ep.pf = warp_pf(w0, w0->plan.prefetch, (uint64_t)g0, rows0, 1);
    b.ep.pf = warp_pf(w1, w1->plan.prefetch, (uint64_t)g1, rows1, 1);
    const int8_t *xqs = (const int8_t *)xq;
    const float2 *xds = (const float2 *)(xqs + w0->n_in);
    ds_launch(gemv_pair_kernel<T0, E0, T1>, (unsigned)(g0 + g1), GEMV_WARPS * 32, 0, l,
              (const float *)nullptr, xqs, xds, (unsigned)g0, a, b);
}

template <typename T0, int E0>
static void launch_e(const gemv_matrix *w0, const gemv_matrix *w1, const void *xq, float *y0,
                     float *y1, const gemv_ep_out &o0, const cuda_launch *l)
{
    if (w1->type == GGML_TYPE_Q4_K)
        launch_t<T0, E0, q4k_t>(w0, w1, xq, y0, y1, o0, l);
    else
        launch_t<T0, E0, q6k_t>(w0, w1, xq, y0, y1, o0, l);
}

extern "C" void gemv_pair(const gemv_matrix *w0, const gemv_matrix *w1, const void *d_xq,
                          float *d_y0, float *d_y1, const float *d_conv_w, float *d_conv_state,
                          int64_t n_conv, int K_conv, const cuda_launch *l)
{
    DS_ASSERT(gemv_pair_supported(w0, w1) && d_xq);
    if (d_conv_w) {
        DS_ASSERT(n_conv >= 0 && n_conv <= w0->n_out && K_conv >= 1);
        const gemv_ep_out o0 = {nullptr, d_conv_w, d_conv_state, n_conv, K_conv};
        if (w0->type == GGML_TYPE_Q4_K)
            launch_e<q4k_t, EP_CONV>(w0, w1, d_xq, d_y0, d_y1, o0, l);
        else
            launch_e<q6k_t, EP_CONV>(w0, w1, d_xq, d_y0, d_y1, o0, l);
    } else if (w0->type == GGML_TYPE_Q4_K) {
        launch_e<q4k_t, EP_STORE>(w0, w1, d_xq, d_y0, d_y1, gemv_ep_out{}, l);
    } else {
        launch_e<q6k_t, EP_STORE>(w0, w1, d_xq, d_y0, d_y1, gemv_ep_out{}, l);
    }
}
