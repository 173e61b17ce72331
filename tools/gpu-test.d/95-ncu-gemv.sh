# DS_GPU_NCU_GEMV=1: ncu's detailed sections (occupancy, warp stall reasons, memory workload)
# for one launch of a GEMV kernel (DS_GPU_NCU_KERNEL, a regex: default the warp kernel,
# gemv_kernel) at a few shapes (DS_GPU_NCU_SHAPES, ';'-separated gemv_bench shape filters),
# into $OUT/ncu-gemv.txt.
if [ "${DS_GPU_NCU_GEMV:-0}" = 1 ] && command -v ncu > /dev/null; then
    IFS=';' read -ra ncu_shapes <<< "${DS_GPU_NCU_SHAPES:-27B ffn_gate;4B ffn_gate;0.8B ffn_down}"
    for shape in "${ncu_shapes[@]}"; do
        step "ncu_gemv_${shape// /_}" 180 ncu --clock-control none \
            --kernel-name "regex:${DS_GPU_NCU_KERNEL:-gemv_kernel}" \
            --launch-skip 12 --launch-count 1 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
            --section SchedulerStats --section SourceCounters --section InstructionStats \
            "$here/bin/gemv_bench" --fast 20 all "$shape"
    done
    grep -v "^==PROF==" "$log" | sed -n '/===== ncu_gemv/,$p' > "$OUT/ncu-gemv.txt"
fi
