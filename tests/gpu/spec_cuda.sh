#!/usr/bin/env bash
# Speculative decoding served on the GPU with the MTP head drafting there (fwd_mtp_draft): the
# demo model (its trained head) generates from held-out-like prompts with --speculative-k 0, 1
# and 3 on cuda, greedily and sampled (temperature 0.8, top-p 0.95, a seed: verify rows draw on
# the GPU sampler as one-row steps would); the ids of every K must equal K = 0's, the log must
# say the head drafts on the GPU, and the runs must accept some drafts, greedy and sampled. Paths relative to the
# runfiles root (tests/gpu/gpu_lib.sh).
set -euo pipefail
. tests/gpu/gpu_lib.sh
require_gpu "spec_cuda"
model=models/demo-en-17m.gguf
[ -f "$model" ] || model=${DS_REPO_ROOT:?DS_REPO_ROOT unset: no $model}/$model
log=${TMPDIR:-/tmp}/spec_cuda.log
prompts=("The Python interpreter reads a module" "Debian packages are installed with"
         "In the Jargon File, a hacker is")
run_all() { # $1: a label; the rest: generate's sampling flags
    local label=$1 accepted=0
    shift
    for p in "${prompts[@]}"; do
        local base=""
        for k in 0 1 3; do
            ids=$(cli/deltaserve generate --model "$model" --prompt "$p" --max-tokens 96 --print-ids \
                  --speculative-k "$k" --spec-min-acceptance 0 --spec-gate=false --device cuda "$@" 2> "$log")
            if [ "$k" = 0 ]; then
                base=$ids
                continue
            fi
            grep -q "drafts on the device" "$log" || { echo "k $k: the head did not draft on the GPU:"; cat "$log"; exit 1; }
            if [ "$ids" != "$base" ]; then
                echo "$label, k $k, prompt '$p': ids differ from k 0"
                echo "  k 0: $base"; echo "  k $k: $ids"
                exit 1
            fi
            a=$(sed -n 's/.*speculative k [0-9]*: verify runs [0-9]*, drafted [0-9]*, accepted \([0-9]*\).*/\1/p' "$log")
            echo "$label, k $k, '$p': $(grep -o 'speculative k .*' "$log")"
            accepted=$((accepted + ${a:-0}))
        done
    done
    [ "$accepted" -gt 0 ] || { echo "$label: no draft accepted"; exit 1; }
    echo "$label: $accepted drafts accepted"
}
run_all greedy --temperature 0
run_all sampled --temperature 0.8 --top-p 0.95 --seed 5
echo "spec_cuda: PASS"
