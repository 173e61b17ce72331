# DS_GPU_NCU_PREFILL=1: ncu's detailed sections (occupancy, warp stall reasons, memory workload,
# source counters) for one launch of each prefill kernel of a late pass of the 4B's 8192-token
# prompt (DS_GPU_NCU_PREFILL_KERNELS, regexes: default the delta rule's two launches, the conv
# and the attention tile), into $OUT/ncu-prefill.txt: where the delta rule's 62 + 62 µs a layer
# go (BENCH.md run 45: not its arithmetic).
if [ "${DS_GPU_NCU_PREFILL:-0}" = 1 ] && command -v ncu > /dev/null && [ -s /tmp/synth-4b.gguf ]; then
    for k in ${DS_GPU_NCU_PREFILL_KERNELS:-gdn_chunk_prep gdn_chunk_scan gdn_conv_kernel attn_prefill_kernel}; do
        # a launch late in the prompt: 32 passes of 256 rows, 24 delta-rule layers and 8
        # attention layers a pass
        local_skip=600
        case "$k" in attn*) local_skip=200;; esac
        step "ncu_prefill_detail_$k" 240 ncu --clock-control none --kernel-name "regex:$k" \
            --launch-skip "$local_skip" --launch-count 1 --section SpeedOfLight \
            --section Occupancy --section LaunchStats --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
            "$here/bin/deltaserve" bench batch --model /tmp/synth-4b.gguf --prompt 8192 --gen 2 \
            --batch 1 --step-tokens 512
    done
    grep -v "^==PROF==" "$log" | sed -n '/===== ncu_prefill_detail/,$p' > "$OUT/ncu-prefill.txt"
fi
