// The warp GEMV kernel (gemv_warp.cuh) launched on its own: one matrix (two for SwiGLU) a launch,
// every epilogue. Its shape per epilogue is planned once (gemv_warp_plan: occupancy of each
// kernel build, the tuning table's rows per warp and register build); a launch reads the plan.
#include "kernels/cuda/gemv_warp.cuh"

// MINB: CTAs per SM the registers are capped for, from the tuning table (gemv_plan.cuh): Q4_K
// one row a warp 10 (48 registers, no spills), Q6_K four rows a warp 4 (128; the
// argmax epilogue takes 130 uncapped, which leaves 3), else uncapped.
template <typename TT, int EP, int R, int MINB = gemv_tune_minb(warp_ggml_type<TT>(), R)>
static __global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
    gemv_kernel(const uint8_t *__restrict__ W0, const uint8_t *__restrict__ W1, int64_t n_in,
                int64_t n_out, const float *__restrict__ x, const int8_t *__restrict__ xqs,
                const float2 *__restrict__ xds, float *__restrict__ y, ep_args ep)
{
    gemv_body<TT, EP, R>(blockIdx.x, gridDim.x, W0, W1, n_in, n_out, x, xqs, xds, y, ep);
}

// ---- planning: one shape per epilogue ----

// plan.shape[EP] of m: one wave of CTAs (or fewer when they cover every row), at the
// occupancy of this build of the kernel
template <typename TT, int EP, int R>
static int plan_ep(gemv_matrix *m, int prefetch, const cuda_device_props *p, status *st)
{
    int per_sm = 0;
    CUDA_TRY(st, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<TT, EP, R>,
                                                               GEMV_WARPS * 32, 0));
    const int64_t full = (int64_t)p->sm_count * (per_sm < 1 ? 1 : per_sm);
    int wpr;
    int64_t cta_rows, need;
    warp_shape<TT, R>(m->n_in, m->n_out, full, &wpr, &cta_rows, &need);
    gemv_shape *sh = &m->plan.shape[EP];
    sh->grid = (uint32_t)(need < full ? need : full);
    sh->smem = 0;
    sh->wpr = (uint8_t)wpr;
    sh->prefetch = (uint8_t)warp_pf(m, prefetch, sh->grid, cta_rows, EP == EP_SWIGLU ? 2 : 1);
    return STATUS_OK;
}

template <typename TT, int R>
static int plan_r(gemv_matrix *m, int prefetch, const cuda_device_props *p, status *st)
{
    return plan_ep<TT, EP_STORE, R>(m, prefetch, p, st) ||
           plan_ep<TT, EP_ADD, R>(m, prefetch, p, st) ||
           plan_ep<TT, EP_SWIGLU, R>(m, prefetch, p, st) ||
           plan_ep<TT, EP_ARGMAX, R>(m, prefetch, p, st) ||
           plan_ep<TT, EP_CONV, R>(m, prefetch, p, st)
               ? st->code
               : STATUS_OK;
}

template <typename TT>
static int plan_t(gemv_matrix *m, int prefetch, const cuda_device_props *p, status *st)
{
    switch (m->plan.rows_per_warp) {
    case 4: return plan_r<TT, 4>(m, prefetch, p, st);
    case 2: return plan_r<TT, 2>(m, prefetch, p, st);
    default: return plan_r<TT, 1>(m, prefetch, p, st);
    }
}

int gemv_warp_plan(gemv_matrix *m, int prefetch, const cuda_device_props *p, status *st)
{
    switch (m->type) {
    case GGML_TYPE_F32: return plan_t<f32_t>(m, prefetch, p, st);
    case GGML_TYPE_F16: return plan_t<f16_t>(m, prefetch, p, st);
    case GGML_TYPE_BF16: return plan_t<bf16_t>(m, prefetch, p, st);
    case GGML_TYPE_Q8_0: return plan_t<q80_t>(m, prefetch, p, st);
    case GGML_TYPE_Q4_K: return plan_t<q4k_t>(m, prefetch, p, st);
    case GGML_TYPE_Q5_K: return plan_t<q5k_t>(m, prefetch, p, st);
    case GGML_TYPE_Q6_K: return plan_t<q6k_t>(m, prefetch, p, st);
    default: return status_fail(st, STATUS_UNSUPPORTED, "gemv: type %u", m->type);
    }
}

// ---- launch: the planned shape, nothing else ----

template <typename TT, int EP, int R>
static void launch_r(const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                     const void *xq, float *y, const gemv_ep_out &o, const cuda_launch *l)
{
    const gemv_shape &sh = w0->plan.shape[EP];
    const int8_t *xqs = (const int8_t *)xq;
    const float2 *xds = xq ? (const float2 *)(xqs + w0->n_in) : nullptr;
    const ep_args ep = {sh.prefetch, sh.wpr, o.best, o.conv_w, o.conv_state, o.n_conv, o.K};
    ds_launch(gemv_kernel<TT, EP, R>, sh.grid, GEMV_WARPS * 32, 0, l, (const uint8_t *)w0->d_w,
              (const uint8_t *)(w1 ? w1->d_w : nullptr), w0->n_in, w0->n_out, x, xqs, xds, y,
              ep);
}

template <typename TT, int EP>
static void launch_e(const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                     const void *xq, float *y, const gemv_ep_out &o, const cuda_launch *l)
{
    switch (w0->plan.rows_per_warp) {
    case 4: launch_r<TT, EP, 4>(w0, w1, x, xq, y, o, l); break;
    case 2: launch_r<TT, EP, 2>(w0, w1, x, xq, y, o, l); break;
    default: launch_r<TT, EP, 1>(w0, w1, x, xq, y, o, l); break;
    }
}

template <typename TT>
static void launch_t(int ep, const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                     const void *xq, float *y, const gemv_ep_out &o, const cuda_launch *l)
{
    switch (ep) {
    case EP_STORE: launch_e<TT, EP_STORE>(w0, w1, x, xq, y, o, l); break;
    case EP_ADD: launch_e<TT, EP_ADD>(w0, w1, x, xq, y, o, l); break;
    case EP_SWIGLU: launch_e<TT, EP_SWIGLU>(w0, w1, x, xq, y, o, l); break;
    case EP_ARGMAX: launch_e<TT, EP_ARGMAX>(w0, w1, x, xq, y, o, l); break;
    case EP_CONV: launch_e<TT, EP_CONV>(w0, w1, x, xq, y, o, l); break;
    default: DS_ASSERT(!"gemv: unknown epilogue");
    }
}

void gemv_warp_launch(int ep, const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                      const void *xq, float *y, const gemv_ep_out &o, const cuda_launch *l)
{
    switch (w0->type) {
    case GGML_TYPE_F32: DS_ASSERT(x); launch_t<f32_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_F16: DS_ASSERT(x); launch_t<f16_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_BF16: DS_ASSERT(x); launch_t<bf16_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_Q8_0: DS_ASSERT(xq); launch_t<q80_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_Q4_K: DS_ASSERT(xq); launch_t<q4k_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_Q5_K: DS_ASSERT(xq); launch_t<q5k_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_Q6_K: DS_ASSERT(xq); launch_t<q6k_t>(ep, w0, w1, x, xq, y, o, l); break;
    default: DS_ASSERT(!"gemv: unsupported type");
    }
}
