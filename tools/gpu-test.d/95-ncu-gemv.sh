# DS_GPU_NCU_GEMV=1: ncu's detailed sections (occupancy, warp stall reasons, memory workload)
# for one launch of the default warp GEMV at three shapes (gemv_bench's shape filter), into
# $OUT/ncu-gemv.txt.
if [ "${DS_GPU_NCU_GEMV:-0}" = 1 ] && command -v ncu > /dev/null; then
    for shape in "27B ffn_gate" "4B ffn_gate" "0.8B ffn_down"; do
        step "ncu_gemv_${shape// /_}" 180 ncu --clock-control none --kernel-name regex:gemv_kernel \
            --launch-skip 12 --launch-count 1 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
            --section SchedulerStats --section SourceCounters \
            "$here/bin/gemv_bench" 20 all "$shape"
    done
    grep -v "^==PROF==" "$log" | sed -n '/===== ncu_gemv/,$p' > "$OUT/ncu-gemv.txt"
fi
