// What runs for a GEMV (gemv.h): gemv_init, the per-matrix plan from the tuning table
// (gemv_plan.cuh) and the device, and the launchers that follow the plan to the warp or the
// flat kernel. Nothing here is queried or decided at launch.
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gemv_plan.cuh"
#include "kernels/cuda/gemv_slices.cuh"

extern "C" int gemv_init(const cuda_device_props *p, status *st)
{
    // the kernels are sm_90 code (cuda.bzl): an older device would fail at the first launch
    if (p->cc_major < 9)
        return status_fail(st, STATUS_UNSUPPORTED,
                           "gemv: %s is compute capability %d.%d; the kernels are built for 9.0",
                           p->name, p->cc_major, p->cc_minor);
    if (p->sm_count < 1)
        return status_fail(st, STATUS_INVALID, "gemv: %s reports no multiprocessors", p->name);
    return gemv_mma_init(st);
}

static int64_t flat_qk(uint32_t type)
{
    switch (type) {
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: return 256;
    case GGML_TYPE_Q8_0: case GGML_TYPE_F32: return 32;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return 64;
    default: return 0;
    }
}

extern "C" bool gemv_flat_supported(uint32_t type, int64_t n_in)
{
    const int64_t qk = flat_qk(type);
    return qk > 0 && n_in > 0 && n_in % qk == 0 && (n_in / qk) * 2 <= FLAT_PART_CAP;
}

// The first row of the tuning table for m (kernel: the one wanted, or GEMV_KERNEL_AUTO);
// flat rows only where the flat kernel takes the shape.
static const gemv_tune_row *tune_row(const gemv_matrix *m, int kernel)
{
    const int64_t nw = m->n_in * m->n_out;
    for (const gemv_tune_row &r : k_gemv_tune) {
        if (r.type != m->type && r.type != GEMV_ANY_TYPE) continue;
        if (nw < r.w_min || nw >= r.w_max || m->n_out < r.out_min || m->n_out > r.out_max)
            continue;
        if (kernel != GEMV_KERNEL_AUTO && r.kernel != kernel) continue;
        if (r.kernel == GEMV_KERNEL_FLAT && !gemv_flat_supported(m->type, m->n_in)) continue;
        return &r;
    }
    return nullptr; // the last row takes every shape on the warp kernel
}

extern "C" int gemv_matrix_plan(gemv_matrix *m, const cuda_device_props *p, status *st)
{
    m->plan = gemv_plan{};
    if (gemv_packed_bytes(m->type, m->n_in, m->n_out) == 0)
        return status_fail(st, STATUS_UNSUPPORTED, "gemv: type %u with %lld x %lld elements",
                           m->type, (long long)m->n_out, (long long)m->n_in);
    if ((uint64_t)m->n_out * (uint64_t)m->n_in / 32 >= (1ull << 32)) /* 32-bit block indices */
        return status_fail(st, STATUS_UNSUPPORTED, "gemv: %lld x %lld elements: too many blocks",
                           (long long)m->n_out, (long long)m->n_in);
    if (m->kernel != GEMV_KERNEL_AUTO && m->kernel != GEMV_KERNEL_WARP &&
        m->kernel != GEMV_KERNEL_FLAT)
        return status_fail(st, STATUS_INVALID, "gemv: kernel %d", m->kernel);
    if (m->rows_per_warp != 0 && m->rows_per_warp != 1 && m->rows_per_warp != 2 &&
        m->rows_per_warp != 4)
        return status_fail(st, STATUS_INVALID, "gemv: %d rows per warp", m->rows_per_warp);
    m->plan.sm_count = p->sm_count;
    if (m->kernel == GEMV_KERNEL_FLAT) { /* forced (tests, benches): the flat kernel has no tuned
                                            parameters, the table's rows do not bound it */
        m->plan.kernel = GEMV_KERNEL_FLAT;
        return gemv_flat_plan(m, p, st) || gemv_cols_plan(m, p, st) ? st->code : STATUS_OK;
    }
    const gemv_tune_row *r = tune_row(m, m->kernel);
    if (!r)
        return status_fail(st, STATUS_UNSUPPORTED, "gemv: no %s kernel for type %u, %lld x %lld",
                           m->kernel == GEMV_KERNEL_FLAT ? "flat" : "warp", m->type,
                           (long long)m->n_out, (long long)m->n_in);
    m->plan.kernel = r->kernel;
    if (r->kernel == GEMV_KERNEL_FLAT)
        return gemv_flat_plan(m, p, st) || gemv_cols_plan(m, p, st) ? st->code : STATUS_OK;
    m->plan.rows_per_warp = m->rows_per_warp ? m->rows_per_warp : r->rows;
    m->plan.prefetch = r->prefetch;
    return gemv_warp_plan(m, r->prefetch, p, st) || gemv_pair_plan(m, p, st) ||
                   gemv_cols_plan(m, p, st)
               ? st->code
               : STATUS_OK;
}

// ---- the launchers: the plan's kernel ----

static void launch(int ep, const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                   const void *xq, float *y, const gemv_ep_out &o, const cuda_launch *l)
{
    DS_ASSERT(w0->plan.kernel != 0); // gemv_matrix_plan
    DS_ASSERT(!w1 || (w1->type == w0->type && w1->n_in == w0->n_in && w1->n_out == w0->n_out));
    if (w0->plan.kernel == GEMV_KERNEL_FLAT)
        gemv_flat_launch(ep, w0, w1, x, xq, y, o, l);
    else
        gemv_warp_launch(ep, w0, w1, x, xq, y, o, l);
}

extern "C" void gemv(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
                     gemv_epilogue ep, const cuda_launch *l)
{
    launch(ep == GEMV_ADD ? EP_ADD : EP_STORE, w, nullptr, d_x, d_xq, d_y, gemv_ep_out{}, l);
}

extern "C" void gemv_swiglu(const gemv_matrix *gate, const gemv_matrix *up, const float *d_x,
                            const void *d_xq, float *d_y, const cuda_launch *l)
{
    launch(EP_SWIGLU, gate, up, d_x, d_xq, d_y, gemv_ep_out{}, l);
}

extern "C" void gemv_argmax(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
                            unsigned long long *d_best, const cuda_launch *l)
{
    gemv_ep_out o = {};
    o.best = d_best;
    launch(EP_ARGMAX, w, nullptr, d_x, d_xq, d_y, o, l);
}

extern "C" void gemv_conv(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
                          const float *d_conv_w, float *d_conv_state, int64_t n_conv, int K_conv,
                          const cuda_launch *l)
{
    DS_ASSERT(n_conv >= 0 && n_conv <= w->n_out && K_conv >= 1);
    const gemv_ep_out o = {nullptr, d_conv_w, d_conv_state, n_conv, K_conv};
    launch(EP_CONV, w, nullptr, d_x, d_xq, d_y, o, l);
}
