# Synthetic Q4_K_M models of the real shapes, then the decode benchmark on each at 4K context
# (the engine's default: flat GEMV, fused epilogues, programmatic dependent launch).
if [ -x "$here/bin/deltaserve" ]; then
    for p in 0.8b 4b 27b; do
        step "synth_$p" 120 "$here/bin/deltaserve" gguf synth --preset $p --quant q4_k_m --seed 1 --threads 4 -o /tmp/synth-$p.gguf
        [ -s /tmp/synth-$p.gguf ] && step "bench_decode_$p" 120 "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
    done
fi
