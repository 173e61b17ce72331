# The engine against the CPU with the flat GEMV graph (the default graph, warp GEMV, ran in the
# engine_parity step above), then synthetic Q4_K_M models of the real shapes and the decode
# benchmark on each at 4K context: the default graph, then DS_GEMV_KERNEL=flat (flat GEMV,
# fused epilogues, programmatic dependent launch) on the same host in the same session.
DS_GEMV_KERNEL=flat step engine_parity_flat 150 "$here/bin/engine_parity"
if [ -x "$here/bin/deltaserve" ]; then
    for p in 0.8b 4b 27b; do
        step "synth_$p" 120 "$here/bin/deltaserve" gguf synth --preset $p --quant q4_k_m --seed 1 --threads 4 -o /tmp/synth-$p.gguf
        [ -s /tmp/synth-$p.gguf ] || continue
        step "bench_decode_$p" 120 "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
        DS_GEMV_KERNEL=flat step "bench_decode_${p}_flat" 120 "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
    done
fi
