# Last (the device time is short): the engine against the CPU forward on synthetic 0.8B and 4B Q4_K_M files (logits over 64 tokens).
if [ -s /tmp/synth-0.8b.gguf ] && [ -s /tmp/synth-4b.gguf ]; then
    export DS_ENGINE_GGUF=/tmp/synth-0.8b.gguf:/tmp/synth-4b.gguf DS_ENGINE_TOKENS=64
    step engine_parity_synth 120 "$here/bin/engine_parity"
    unset DS_ENGINE_GGUF DS_ENGINE_TOKENS
fi
