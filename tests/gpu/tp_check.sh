#!/usr/bin/env bash
# Tensor parallel on the GPUs. Paths are relative to the runfiles root (tests/gpu/gpu_lib.sh).
#   tp_check.sh eval [--tokens N] MODEL...   `eval --device cuda --tp 2` against `--tp 1` on
#                                ids 1..N (200) of each model: worst max|d| / max|logit| <= 1e-3
#   tp_check.sh greedy MODEL...  256 greedy ids of `generate --tp 2` (cuda:0,1) equal to --tp 1's
#   tp_check.sh refused MODEL    where fewer than 2 GPUs are visible (CUDA_VISIBLE_DEVICES=0):
#                                `--tp 2` exits non-zero at start with one line "... needs 2 GPUs ..."
# A MODEL argument that is a folder means every *.gguf in it.
set -uo pipefail
. tests/gpu/gpu_lib.sh
mode=${1:-}
shift || true
case $mode in eval|greedy|refused) ;; *) echo "usage: tp_check.sh eval|greedy|refused MODEL..." >&2; exit 2;; esac
tokens=200
if [ "$mode" = eval ] && [ "${1:-}" = --tokens ]; then tokens=$2; shift 2; fi
require_gpu "tp_check $mode"
[ $# -ge 1 ] || { echo "tp_check: no model given" >&2; exit 2; }
models=()
for m in "$@"; do
    if [ -d "$m" ]; then models+=("$m"/*.gguf); else models+=("$m"); fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

tp_eval() { # tp_eval MODEL
    local ids
    ids=$(seq -s, 1 "$tokens")
    cli/deltaserve eval --model "$1" --ids "$ids" --device cuda --logits-out "$tmp/tp1.f32" || return 1
    cli/deltaserve eval --model "$1" --ids "$ids" --device cuda --tp 2 --logits-out "$tmp/tp2.f32" || return 1
    python3 - "$1" "$tmp/tp1.f32" "$tmp/tp2.f32" <<'PY'
import array, math, sys
a, b = array.array("f"), array.array("f")
with open(sys.argv[2], "rb") as f: a.frombytes(f.read())
with open(sys.argv[3], "rb") as f: b.frombytes(f.read())
ok = len(a) == len(b) and len(a) > 0 and all(math.isfinite(x) for x in b)
w = max(abs(x - y) for x, y in zip(a, b)) / max(abs(x) for x in a) if ok else float("inf")
print("%s: --tp 2 vs --tp 1: worst max|d|/max|logit| %.3g over %d logits (bound 1e-3)" % (sys.argv[1], w, len(a)))
sys.exit(0 if ok and w <= 1e-3 else 1)
PY
}

tp_greedy() { # tp_greedy MODEL
    local a b ids
    ids=$(seq -s, 1 16)
    a=$(cli/deltaserve generate --model "$1" --ids "$ids" --max-tokens 256 --print-ids --device cuda:0 --ctx 512) || return 1
    b=$(cli/deltaserve generate --model "$1" --ids "$ids" --max-tokens 256 --print-ids --device cuda:0,1 --tp 2 --ctx 512) || return 1
    if [ "$a" = "$b" ]; then echo "$1: 256 greedy ids equal at --tp 2 and --tp 1"; return 0; fi
    echo "$1: greedy ids differ"; echo "tp1 $a"; echo "tp2 $b"
    return 1
}

tp_refused() { # tp_refused MODEL
    local out rc
    out=$(cli/deltaserve eval --model "$1" --ids 1,2,3 --device cuda --tp 2 --logits-out "$tmp/refused.f32" 2>&1)
    rc=$?
    echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}: exit $rc: $out"
    [ $rc -ne 0 ] && [ "$(printf '%s\n' "$out" | grep -c .)" -eq 1 ] && printf '%s' "$out" | grep -q "needs 2 GPUs"
}

rc=0
for m in "${models[@]}"; do
    [ -s "$m" ] || { echo "tp_check: no model $m"; rc=1; continue; }
    "tp_$mode" "$m" || rc=1
done
exit $rc
