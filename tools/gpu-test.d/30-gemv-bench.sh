# GEMV bandwidth, the short list of shapes: the warp kernel (rows per warp by shape, 1, 2, 4) and
# the flat kernel; with the default L2 prefetch (1 group ahead) and without.
step gemv_bench 90 "$here/bin/gemv_bench" 100 key
DS_GEMV_PREFETCH=0 step gemv_bench_nopf 90 "$here/bin/gemv_bench" 100 key
# DS_GPU_WPR_AB=1: the warp kernel with 2 and 4 warps per row forced (DS_GEMV_WPR) at every shape
if [ "${DS_GPU_WPR_AB:-0}" = 1 ]; then
    DS_GEMV_WPR=2 step gemv_bench_wpr2 90 "$here/bin/gemv_bench" 100 key
    DS_GEMV_WPR=4 step gemv_bench_wpr4 90 "$here/bin/gemv_bench" 100 key
fi
# DS_GPU_RING_SWEEP=1: the ring kernel's stage size (KiB), stage count and shared memory per CTA
# (KiB) swept over the FFN shapes (DS_GEMV_RING_STAGE_KB / _STAGES / _SMEM_KB)
if [ "${DS_GPU_RING_SWEEP:-0}" = 1 ]; then
    for cfg in ${DS_GPU_RING_CFGS:-48,4,200 24,8,200 12,8,100 24,4,100 6,8,56 12,4,56}; do
        IFS=, read -r kb ns sm <<< "$cfg"
        DS_GEMV_BENCH_FAST=1 DS_GEMV_RING_STAGE_KB=$kb DS_GEMV_RING_STAGES=$ns DS_GEMV_RING_SMEM_KB=$sm \
            step "gemv_ring_${kb}_${ns}_${sm}" 90 "$here/bin/gemv_bench" 100 key "${DS_GPU_RING_SHAPES:-ffn}"
    done
fi
