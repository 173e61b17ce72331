# Only with DS_GPU_PROFILE=1: ncu (hardware counters; --clock-control none leaves the clocks
# alone) over a few decode tokens of each synthetic model: per-kernel durations and DRAM bytes,
# summarised by tools/ncu_summary.py into $OUT/ncu-summary.txt.
if [ "${DS_GPU_PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
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
