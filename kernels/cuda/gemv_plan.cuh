// Internal to kernels/cuda, GEMV family (gemv.h): the tuning table, and the interface between
// the planner / dispatcher (gemv_plan.cu) and the kernel files (gemv_warp.cu, gemv_flat.cu,
// gemv_pair.cu). The table is constexpr: the register builds (minb) are template arguments of
// the warp kernel, so the compiler reads the same rows the planner does.
#ifndef DS_KERNELS_CUDA_GEMV_PLAN_CUH
#define DS_KERNELS_CUDA_GEMV_PLAN_CUH

#include <stdint.h>

#include "gguf/quant_blocks.h"
#include "kernels/cuda/gemv.h"

// the epilogues, also the index of gemv_plan.shape
enum { EP_STORE = 0, EP_ADD = 1, EP_SWIGLU = 2, EP_ARGMAX = 3, EP_CONV = 4 };
static_assert(EP_CONV + 1 == GEMV_N_SHAPES, "one shape per epilogue");

#define GEMV_ANY_TYPE 0xffffffffu
#define GEMV_NO_LIMIT INT64_MAX

// One row of the tuning table: matrices of `type` (or any) with n_in·n_out in [w_min, w_max)
// and n_out in [out_min, out_max] take `kernel` (flat rows only where gemv_flat_supported), and
// on the warp kernel `rows` rows per warp, registers capped for `minb` CTAs per SM (1:
// uncapped) and `prefetch` row groups ahead in L2. The first row that matches wins.
struct gemv_tune_row {
    uint32_t type;
    int64_t w_min, w_max;
    int64_t out_min, out_max;
    int kernel;
    int rows;
    int minb;
    int prefetch;
};

// Measured on the H200 (each row's comment says against what; the choices that lost are not
// in the table).
static constexpr gemv_tune_row k_gemv_tune[] = {
    // Q6_K of 2^25..2^30 weights other than the lm_heads (the 27B's ffn_down and attn_qkv):
    // flat: 27B ffn_down at 65.8% of 4.6 TB/s flat vs 54.0% warp, attn_qkv 59.9 vs 49.0; the
    // 27B decodes 140.2 vs 135.8 tok/s, the 4B even
    {GGML_TYPE_Q6_K, 1ll << 25, 1ll << 30, 1, 65536, GEMV_KERNEL_FLAT, 0, 0, 0},
    // Q6_K lm_heads (248320 rows): 4 rows a warp, 128 registers (4 CTAs per SM):
    // 1024/2560/5120 wide at 69/81/91% of 4.6 TB/s with 4 rows, 53/69/81% with 2
    {GGML_TYPE_Q6_K, 0, GEMV_NO_LIMIT, 65536, GEMV_NO_LIMIT, GEMV_KERNEL_WARP, 4, 4, 1},
    // other tall Q6_K: 2 rows a warp, registers uncapped (capping for 6 CTAs spilled and
    // measured -5..+2%)
    {GGML_TYPE_Q6_K, 0, GEMV_NO_LIMIT, 4096, 65535, GEMV_KERNEL_WARP, 2, 1, 1},
    {GGML_TYPE_Q6_K, 0, GEMV_NO_LIMIT, 1, 4095, GEMV_KERNEL_WARP, 1, 1, 1},
    // Q4_K: one row a warp (1 beat 2 and 4 at every shape), registers capped for 10 CTAs per SM
    // (48 registers): 0.8B 1413 / 4B 555 / 27B 143.3 tok/s at 10 against 1370 / 528 / 143.2 at
    // 12 (40 registers), A/B on one host; 2 rows a warp for the 27B's large Q4_K matrices was
    // faster alone in gemv_bench and slower in the step (27B 137.4). 16 CTAs spilled and
    // decoded 8-13% slower
    {GGML_TYPE_Q4_K, 0, GEMV_NO_LIMIT, 1, GEMV_NO_LIMIT, GEMV_KERNEL_WARP, 1, 10, 1},
    // everything else: one row a warp, uncapped, one row group ahead
    {GEMV_ANY_TYPE, 0, GEMV_NO_LIMIT, 1, GEMV_NO_LIMIT, GEMV_KERNEL_WARP, 1, 1, 1},
};

// What one wave of the warp kernel may keep prefetched ahead in L2: deeper prefetch of a large
// matrix evicts lines before they are read (2 groups ahead read the 27B lm_head 1.8x from DRAM)
#define GEMV_PREFETCH_CAP (24ull << 20)

// Two in-projection groups run as one gemv_pair launch when both are Q4_K/Q6_K warp matrices
// and together at most this many bytes. Decode with the pair: 0.8B (6.3 MiB) +4.4%, 4B
// (~22 MiB) +1.4%, 27B (~55 MiB) -0.5%: the limit falls between the 4B and the 27B.
#define GEMV_PAIR_MAX_BYTES (32ull << 20)

// The register build of the warp kernel for a type and rows per warp (a forced rows_per_warp
// too): the first warp row of the table with that type and rows, else uncapped.
static constexpr int gemv_tune_minb(uint32_t type, int rows)
{
    for (const gemv_tune_row &r : k_gemv_tune)
        if (r.kernel == GEMV_KERNEL_WARP && (r.type == type || r.type == GEMV_ANY_TYPE) &&
            r.rows == rows)
            return r.minb;
    return 1;
}

// ---- between gemv_plan.cu and the kernel files (host code; m is planned unless said) ----

// The warp kernel's plan.shape of m (plan.rows_per_warp set; the rest of the plan is filled
// here); STATUS_DEVICE if an occupancy query fails.
int gemv_warp_plan(gemv_matrix *m, int prefetch, const cuda_device_props *p, status *st);
// The flat kernel's plan.shape of m.
int gemv_flat_plan(gemv_matrix *m, const cuda_device_props *p, status *st);
// plan.pair_per_sm of a Q4_K/Q6_K matrix.
int gemv_pair_plan(gemv_matrix *m, const cuda_device_props *p, status *st);
// plan.cols, gemv_cols' builds (left zero where gemv_cols_supported is false).
int gemv_cols_plan(gemv_matrix *m, const cuda_device_props *p, status *st);

// what a launch writes besides y (by epilogue)
struct gemv_ep_out {
    unsigned long long *best; // EP_ARGMAX
    const float *conv_w;      // EP_CONV: [n_conv][K]
    float *conv_state;        // EP_CONV: [n_conv][K-1]
    int64_t n_conv;
    int K;
};

// One launch of w0 (and w1, EP_SWIGLU's up matrix) with epilogue ep on the warp / flat kernel.
void gemv_warp_launch(int ep, const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                      const void *xq, float *y, const gemv_ep_out &out, const cuda_launch *l);
void gemv_flat_launch(int ep, const gemv_matrix *w0, const gemv_matrix *w1, const float *x,
                      const void *xq, float *y, const gemv_ep_out &out, const cuda_launch *l);

#endif
