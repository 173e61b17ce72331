#!/usr/bin/env bash
# Speculative decoding served on the GPU with the MTP head drafting there (fwd_mtp_draft): the
# demo model (its trained head) generates greedily from held-out-like prompts with
# --speculative-k 0, 1 and 3 on cuda; the ids of every K must equal K = 0's, the log must say
# the head drafts on the GPU, and the runs must accept some drafts. Paths relative to the
# runfiles root (tests/gpu/gpu_lib.sh).
set -euo pipefail
. tests/gpu/gpu_lib.sh
require_gpu "spec_cuda"
model=models/demo-en-17m.gguf
[ -f "$model" ] || model=${DS_REPO_ROOT:?DS_REPO_ROOT unset: no $model}/$model
log=${TMPDIR:-/tmp}/spec_cuda.log
prompts=("The Python interpreter reads a module" "Debian packages are installed with"
         "In the Jargon File, a hacker is")
accepted=0
for p in "${prompts[@]}"; do
    base=""
    for k in 0 1 3; do
        ids=$(cli/deltaserve generate --model "$model" --prompt "$p" --max-tokens 96 --print-ids \
              --speculative-k "$k" --spec-min-acceptance 0 --spec-gate=false --device cuda 2> "$log")
        if [ "$k" = 0 ]; then
            base=$ids
            continue
        fi
        grep -q "drafts on the device" "$log" || { echo "k $k: the head did not draft on the GPU:"; cat "$log"; exit 1; }
        if [ "$ids" != "$base" ]; then
            echo "k $k, prompt '$p': ids differ from k 0"
            echo "  k 0: $base"; echo "  k $k: $ids"
            exit 1
        fi
        a=$(sed -n 's/.*speculative k [0-9]*: verify runs [0-9]*, drafted [0-9]*, accepted \([0-9]*\).*/\1/p' "$log")
        echo "k $k, '$p': $(grep -o 'speculative k .*' "$log")"
        accepted=$((accepted + ${a:-0}))
    done
done
[ "$accepted" -gt 0 ] || { echo "no draft accepted"; exit 1; }
echo "spec_cuda: PASS ($accepted drafts accepted)"
