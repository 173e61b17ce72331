# Only with DS_GPU_PROFILE=1: ncu (hardware counters; --clock-control none leaves the clocks
# alone) over a few decode tokens of each synthetic model: per-kernel durations and DRAM bytes,
# summarised by tools/ncu_summary.py into $OUT/ncu-summary.txt.
# DS_GPU_PROFILE_VARIANTS="A=1 B=2,C=3": the last token kernel by kernel instead, once per
# variant of the graph's switches (tools/ncu_seq.py, $OUT/seq-MODEL-N.txt, N counting variants).
if [ "${DS_GPU_PROFILE:-0}" = 1 ] && [ -n "${DS_GPU_PROFILE_VARIANTS:-}" ] && command -v ncu >/dev/null; then
    for p in ${DS_GPU_PROFILE_MODELS:-0.8b 27b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        i=0
        for v in $DS_GPU_PROFILE_VARIANTS; do
            step "ncuseq_${p}_$i" 240 env ${v//,/ } bash -c "ncu --clock-control none --csv --page raw \
                --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size \
                \"$here/bin/deltaserve\" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 1 --warmup 1 \
                > /tmp/ncu-seq.csv 2>&1"
            { echo "# $p $v"; python3 "$DS_REPO_ROOT/tools/ncu_seq.py" /tmp/ncu-seq.csv; } > "$OUT/seq-$p-$i.txt" 2>&1
            i=$((i+1))
        done
    done
elif [ "${DS_GPU_PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
    for p in ${DS_GPU_PROFILE_MODELS:-0.8b 4b 27b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        step "ncu_$p" 240 bash -c "ncu --clock-control none --csv --page raw \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size \
            -k regex:'gemv|gdn|attn|norm|quantize|embed|mk_' \
            \"$here/bin/deltaserve\" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 3 --warmup 1 \
            > $OUT/ncu-$p.csv 2>&1"
        { echo "== $p"; python3 "$DS_REPO_ROOT/tools/ncu_summary.py" "$OUT/ncu-$p.csv" 4; } >> "$OUT/ncu-summary.txt" 2>&1
    done
    cat "$OUT/ncu-summary.txt"
fi
# Only with DS_GPU_PROFILE_PREFILL=1: ncu over DS_GPU_PROFILE_COUNT (700) kernels from launch
# DS_GPU_PROFILE_SKIP (9000) of one 8192-token prompt (bench batch with the TTFT steps' 512
# tokens, two passes of 256 rows each: passes late in the prompt), per-kernel sums by tools/ncu_summary.py into
# $OUT/ncu-summary.txt; the raw CSV comes back too.
if [ "${DS_GPU_PROFILE_PREFILL:-0}" = 1 ] && command -v ncu >/dev/null; then
    for p in ${DS_GPU_PROFILE_MODELS:-4b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        step "ncu_prefill_$p" 240 bash -c "ncu --clock-control none --csv --page raw \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size \
            --launch-skip ${DS_GPU_PROFILE_SKIP:-9000} --launch-count ${DS_GPU_PROFILE_COUNT:-700} \
            \"$here/bin/deltaserve\" bench batch --model /tmp/synth-$p.gguf --prompt 8192 --gen 2 \
            --batch 1 --step-tokens 512 > $OUT/ncu-prefill-$p.csv 2>&1"
        { echo "== prefill $p"; python3 "$DS_REPO_ROOT/tools/ncu_summary.py" "$OUT/ncu-prefill-$p.csv" 1; } >> "$OUT/ncu-summary.txt" 2>&1
    done
    cat "$OUT/ncu-summary.txt"
fi
