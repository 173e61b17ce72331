# Last (the device time is short): the 27B with the previous graph, then the engine against the
# CPU forward on synthetic 0.8B and 4B Q4_K_M files (logits over 64 tokens).
[ -s /tmp/synth-27b.gguf ] && DS_GEMV_KERNEL=warp step bench_decode_27b_warp 60 "$here/bin/deltaserve" bench decode --model /tmp/synth-27b.gguf --ctx 4096 --tokens 256
if [ -s /tmp/synth-0.8b.gguf ] && [ -s /tmp/synth-4b.gguf ]; then
    export DS_ENGINE_GGUF=/tmp/synth-0.8b.gguf:/tmp/synth-4b.gguf DS_ENGINE_TOKENS=64
    step engine_parity_synth 120 "$here/bin/engine_parity"
    unset DS_ENGINE_GGUF DS_ENGINE_TOKENS
fi
