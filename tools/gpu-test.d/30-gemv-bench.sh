# GEMV bandwidth, the short list of shapes: the warp kernel (rows per warp by shape, 1, 2, 4) and
# the flat kernel; with the default L2 prefetch (1 group ahead) and without.
step gemv_bench 90 "$here/bin/gemv_bench" 100 key
DS_GEMV_PREFETCH=0 step gemv_bench_nopf 90 "$here/bin/gemv_bench" 100 key
# DS_GPU_WPR_AB=1: the warp kernel with 2 and 4 warps per row forced (DS_GEMV_WPR) at every shape
if [ "${DS_GPU_WPR_AB:-0}" = 1 ]; then
    DS_GEMV_WPR=2 step gemv_bench_wpr2 90 "$here/bin/gemv_bench" 100 key
    DS_GEMV_WPR=4 step gemv_bench_wpr4 90 "$here/bin/gemv_bench" 100 key
fi
