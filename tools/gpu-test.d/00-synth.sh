# The synthetic Q4_K_M models of the real shapes: engine_parity compares the 0.8B with the CPU
# (DS_ENGINE_GGUF; required under DS_REQUIRE_GPU=1), the benches decode all three.
if [ -x "$here/bin/deltaserve" ]; then
    for p in ${DS_GPU_SYNTH:-0.8b 4b 27b}; do
        step "synth_$p" 150 "$here/bin/deltaserve" gguf synth --preset $p --quant q4_k_m --seed 1 --threads 16 -o /tmp/synth-$p.gguf
    done
fi
[ -s /tmp/synth-0.8b.gguf ] && export DS_ENGINE_GGUF=/tmp/synth-0.8b.gguf DS_ENGINE_TOKENS=64
