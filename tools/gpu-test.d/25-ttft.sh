# Time to first token of one stream (issue 14): one prompt of DS_GPU_TTFT_PP tokens (512, 8192
# and 32768) and one generated token, alone on the worker's forward (bench batch, B = 1, passes
# of 256 rows); T_PP is the time to the first token. DS_GPU_TTFT: the models (default the
# synthetic ones made).
if [ -x "$here/bin/deltaserve" ]; then
    for p in ${DS_GPU_TTFT:-${DS_GPU_SYNTH:-0.8b 4b 27b}}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        for pp in ${DS_GPU_TTFT_PP:-512 8192 32768}; do
            step "ttft_${p}_$pp" 240 "$here/bin/deltaserve" bench batch --model /tmp/synth-$p.gguf \
                --prompt $pp --gen 2 --batch 1 --step-tokens 512 ${DS_GPU_BATCH_ARGS:-}
        done
    done
fi
