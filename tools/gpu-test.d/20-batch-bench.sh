# Batched decode (docs/GPU.md "Batched decode"): bench batch on each synthetic model in
# llama-batched-bench's columns. DS_GPU_BATCH overrides the sizes, DS_GPU_BATCH_PP/TG the
# prompt and generated tokens (512 / 128: the and llama-batched-bench's -npp/-ntg);
# DS_GPU_BATCH_ARGS: more flags (e.g. --dense-rows 0), here and in 25-ttft.sh.
if [ -x "$here/bin/deltaserve" ]; then
    for p in ${DS_GPU_SYNTH:-0.8b 4b 27b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        step "bench_batch_$p" 400 "$here/bin/deltaserve" bench batch --model /tmp/synth-$p.gguf \
            --prompt ${DS_GPU_BATCH_PP:-512} --gen ${DS_GPU_BATCH_TG:-128} --batch ${DS_GPU_BATCH:-1,16,64,256} \
            ${DS_GPU_BATCH_ARGS:-}
    done
fi
