// The flat GEMV kernel (gemv.h): every epilogue, planned once (gemv_flat_plan: one wave at the
// occupancy its shared partials allow), launched from the plan.
#include "kernels/cuda/gemv_warp.cuh" // the slices, warp_sum, argmax_key

// ---- the flat kernel: CTA k owns rows [k·n_out/grid, (k+1)·n_out/grid) (a contiguous stretch
// of the packed matrix) and its groups of TPB lanes walk the stretch's blocks in order, group g
// taking blocks g, g + G, g + 2G, ... whatever row they belong to. Every CTA gets the same work
// to one row, every group the same to one block, so the grid (one wave) finishes together.
// Each block's partial goes to shared memory (s_part[f], f = block within the stretch); then a
// warp per row sums its partials in a fixed order (deterministic) and applies the epilogue.
// U = FLAT_U blocks per group are in flight per step (U = 1 measured slower).

template <typename TT, int EP>
static __global__ void __launch_bounds__(FLAT_THREADS)
    gemv_flat_kernel(const uint8_t *__restrict__ W0, const uint8_t *__restrict__ W1, int64_t n_in,
                     int64_t n_out, const float *__restrict__ x, const int8_t *__restrict__ xqs,
                     const float2 *__restrict__ xds, float *__restrict__ y, gemv_ep_out ep)
{
    constexpr int U = FLAT_U;
    constexpr int TPB = TT::TPB, G = FLAT_THREADS / TPB, STEP = U * G, NW = FLAT_THREADS / 32;
    if constexpr (EP == EP_CONV) { // the stretch's conv channels, ahead of the epilogue
        const int64_t c0 = (int64_t)blockIdx.x * n_out / gridDim.x;
        const int64_t c1 = min((int64_t)(blockIdx.x + 1) * n_out / gridDim.x, ep.n_conv);
        for (int64_t row = c0 + threadIdx.x; row < c1; row += FLAT_THREADS)
            gdn_conv_prefetch(ep.conv_w, ep.conv_state, row, ep.K);
    }
    ds_grid_dep();
    constexpr bool TWO = EP == EP_SWIGLU;
    extern __shared__ float s_part[]; // [nf] partials (then [nf] of W1 when TWO)
    __shared__ unsigned long long s_best[NW];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nb = (int)(n_in / TT::QK);
    const int64_t r0 = (int64_t)blockIdx.x * n_out / gridDim.x;
    const int64_t r1 = (int64_t)(blockIdx.x + 1) * n_out / gridDim.x;
    const int nr = (int)(r1 - r0), nf = nr * nb;
    const uint64_t nblk = (uint64_t)n_out * (uint64_t)nb, fb = (uint64_t)r0 * (uint64_t)nb;
    float *s_up = s_part + nf;

    // What the epilogue reads besides the partials, loaded before the dot loop (one value a
    // thread) and put in shared memory after it, so the epilogue does not wait for it: EP_ADD,
    // y of the stretch's first FLAT_THREADS rows (thread i: row r0 + i); EP_CONV, the 2K-1 conv
    // inputs of its first FLAT_THREADS / (2K-1) rows (thread i: value i % (2K-1) of row i /
    // (2K-1)). The rows past those read their own.
    constexpr bool PRE = EP == EP_ADD || EP == EP_CONV;
    __shared__ float s_pre[PRE ? FLAT_THREADS : 1];
    const int nv = EP == EP_CONV ? 2 * ep.K - 1 : 1;
    const int n_pre = min(nr, FLAT_THREADS / nv) * nv; // values loaded
    float pre = 0.0f;
    if constexpr (EP == EP_ADD)
        if (tid < n_pre) pre = y[r0 + tid];
    if constexpr (EP == EP_CONV)
        if (tid < n_pre && r0 + tid / nv < ep.n_conv)
            pre = gdn_conv_value(ep.conv_w, ep.conv_state, r0 + tid / nv, ep.K, tid % nv);
    const int grp = tid / TPB, c = tid % TPB;
    const int grp_w = (warp * 32) / TPB; // the warp's first group: keeps the loop warp-uniform
    const int dr = STEP % nb;
    int bb[U]; // block within its row of this group's u-th block
#pragma unroll
    for (int u = 0; u < U; u++) bb[u] = (grp + u * G) % nb;
    for (int f = grp, fw = grp_w; fw < nf; f += STEP, fw += STEP) {
        float v[U], w[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int fu = f + u * G;
            const uint64_t ib = fb + (uint64_t)(fu < nf ? fu : nf - 1); // past the end: redo the last
            const auto xv = flat_load_x<TT>(bb[u], c, x, xqs, xds);
            v[u] = slice_dot(TT(), W0, nblk, ib, c, xv);
            if constexpr (TWO) w[u] = slice_dot(TT(), W1, nblk, ib, c, xv);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int o = TPB / 2; o > 0; o >>= 1) {
                v[u] += __shfl_xor_sync(0xffffffffu, v[u], o);
                if constexpr (TWO) w[u] += __shfl_xor_sync(0xffffffffu, w[u], o);
            }
            const int fu = f + u * G;
            if (c == 0 && fu < nf) {
                s_part[fu] = v[u];
                if constexpr (TWO) s_up[fu] = w[u];
            }
            bb[u] += dr;
            if (bb[u] >= nb) bb[u] -= nb;
        }
    }
    if constexpr (PRE)
        if (tid < n_pre) s_pre[tid] = pre;
    __syncthreads();

    unsigned long long my_best = 0;
    for (int i = warp; i < nr; i += NW) {
        float a = 0.0f, up = 0.0f;
        for (int j = lane; j < nb; j += 32) {
            a += s_part[i * nb + j];
            if constexpr (TWO) up += s_up[i * nb + j];
        }
        a = warp_sum(a);
        if constexpr (TWO) up = warp_sum(up);
        if (lane == 0) {
            const int64_t row = r0 + i;
            if constexpr (EP == EP_ADD) {
                y[row] = (i < n_pre ? s_pre[i] : y[row]) + a;
            } else if constexpr (TWO) {
                y[row] = a / (1.0f + __expf(-a)) * up;
            } else if constexpr (EP == EP_CONV) {
                float *st = ep.conv_state + row * (ep.K - 1);
                const float *cv = s_pre + i * nv;
                y[row] = row >= ep.n_conv ? a
                         : (i + 1) * nv <= n_pre
                             ? gdn_conv_channel_from(a, cv, cv + ep.K, st, ep.K)
                             : gdn_conv_channel(a, ep.conv_w + row * ep.K, st, ep.K);
            } else {
                y[row] = a;
            }
            if constexpr (EP == EP_ARGMAX) {
                const unsigned long long k = argmax_key(a, row);
                my_best = k > my_best ? k : my_best;
            }
        }
    }

    if constexpr (EP == EP_ARGMAX) {
        if (lane == 0) s_best[warp] = my_best;
        __syncthreads();
        if (tid == 0) {
            unsigned long long m = s_best[0];
            for (int k = 1; k < NW; k++) m = s_best[k] > m ? s_best[k] : m;
            atomicMax(ep.best, m);
        }
    }
}

// ---- planning: one shape per epilogue ----

// One wave of CTAs (as many as fit at the occupancy their shared partials allow; the
// partials depend on the grid, hence the few rounds), unless the partials of a stretch would
// exceed FLAT_PART_CAP (very tall matrices): then more.
template <typename TT, int EP>
static int plan_ep(gemv_matrix *m, const cuda_device_props *p, status *st)
{
    constexpr int64_t arrays = EP == EP_SWIGLU ? 2 : 1;
    const int64_t n_out = m->n_out, nb = m->n_in / TT::QK;
    const int64_t cap_rows = FLAT_PART_CAP / (nb * arrays);
    DS_ASSERT(cap_rows >= 1); // gemv_flat_supported
    int64_t grid = n_out;
    for (int it = 0; it < 4; it++) {
        const int64_t rows = (n_out + grid - 1) / grid;
        int per_sm = 1;
        CUDA_TRY(st, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                         &per_sm, gemv_flat_kernel<TT, EP>, FLAT_THREADS,
                         (size_t)(rows * nb * arrays * 4)));
        if (per_sm < 1) per_sm = 1;
        int64_t g = (int64_t)p->sm_count * per_sm;
        if (g > n_out) g = n_out;
        if ((n_out + g - 1) / g > cap_rows) g = (n_out + cap_rows - 1) / cap_rows;
        if (g == grid) break;
        grid = g;
    }
    gemv_shape *sh = &m->plan.shape[EP];
    sh->grid = (uint32_t)grid;
    sh->smem = (uint32_t)(((n_out + grid - 1) / grid) * nb * arrays * 4);
    sh->wpr = 0;
    sh->prefetch = 0;
    return STATUS_OK;
}

template <typename TT>
static int plan_t(gemv_matrix *m, const cuda_device_props *p, status *st)
{
    return plan_ep<TT, EP_STORE>(m, p, st) || plan_ep<TT, EP_ADD>(m, p, st) ||
                   plan_ep<TT, EP_SWIGLU>(m, p, st) || plan_ep<TT, EP_ARGMAX>(m, p, st) ||
                   plan_ep<TT, EP_CONV>(m, p, st)
               ? st->code
               : STATUS_OK;
}

int gemv_flat_plan(gemv_matrix *m, const cuda_device_props *p, status *st)
{
    if (!gemv_flat_supported(m->type, m->n_in))
        return status_fail(st, STATUS_UNSUPPORTED, "gemv: the flat kernel cannot take type %u, "
                           "%lld-wide rows", m->type, (long long)m->n_in);
    switch (m->type) {
    case GGML_TYPE_F32: return plan_t<f32f_t>(m, p, st);
    case GGML_TYPE_F16: return plan_t<f16f_t>(m, p, st);
    case GGML_TYPE_BF16: return plan_t<bf16f_t>(m, p, st);
    case GGML_TYPE_Q8_0: return plan_t<q80_t>(m, p, st);
    case GGML_TYPE_Q4_K: return plan_t<q4k4_t>(m, p, st);
    case GGML_TYPE_Q5_K: return plan_t<q5k_t>(m, p, st);
    case GGML_TYPE_Q6_K: return plan_t<q6k4_t>(m, p, st);
    default: return status_fail(st, STATUS_UNSUPPORTED, "gemv: type %u", m->type);
    }
}

// ---- launch: the planned shape, nothing else ----

template <typename TT, int EP>
static void launch_e(const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                     const void *xq, float *y, const gemv_ep_out &o, const cuda_launch *l)
{
    const gemv_shape &sh = w0->plan.shape[EP];
    const int8_t *xqs = (const int8_t *)xq;
    const float2 *xds = xq ? (const float2 *)(xqs + w0->n_in) : nullptr;
    ds_launch(gemv_flat_kernel<TT, EP>, sh.grid, FLAT_THREADS, sh.smem, l,
              (const uint8_t *)w0->d_w, (const uint8_t *)(w1 ? w1->d_w : nullptr), w0->n_in,
              w0->n_out, x, xqs, xds, y, o);
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

void gemv_flat_launch(int ep, const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                      const void *xq, float *y, const gemv_ep_out &o, const cuda_launch *l)
{
    switch (w0->type) {
    case GGML_TYPE_F32: DS_ASSERT(x); launch_t<f32f_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_F16: DS_ASSERT(x); launch_t<f16f_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_BF16: DS_ASSERT(x); launch_t<bf16f_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_Q8_0: DS_ASSERT(xq); launch_t<q80_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_Q4_K: DS_ASSERT(xq); launch_t<q4k4_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_Q5_K: DS_ASSERT(xq); launch_t<q5k_t>(ep, w0, w1, x, xq, y, o, l); break;
    case GGML_TYPE_Q6_K: DS_ASSERT(xq); launch_t<q6k4_t>(ep, w0, w1, x, xq, y, o, l); break;
    default: DS_ASSERT(!"gemv: unsupported type");
    }
}
