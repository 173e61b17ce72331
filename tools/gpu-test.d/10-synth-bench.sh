# Fidelity on the GPU against Hugging Face: tests/cli/forward_cli_test.py (every prompt of every
# reference case: eval logits in prefill and decode modes within 1e-3 of max|logit|, greedy
# generate exact) with --device cuda through DS_DEVICE, then the decode benchmark at 4K context
# on each synthetic model.
if [ -x "$here/bin/deltaserve" ]; then
    DS_DEVICE=cuda DS_BIN="$here/bin/deltaserve" step fidelity_hf_cuda 300 python3 "$DS_REPO_ROOT/tests/cli/forward_cli_test.py"
    for p in ${DS_GPU_SYNTH:-0.8b 4b 27b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        step "bench_decode_$p" 120 "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
        # DS_GPU_DECODE_CTX="0 16384": the same bench at other contexts (what attention costs)
        for c in ${DS_GPU_DECODE_CTX:-}; do
            step "bench_decode_${p}_ctx$c" 120 "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx "$c" --tokens 256
        done
    done
fi
