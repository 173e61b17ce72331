#!/usr/bin/env bash
# llama.cpp beside deltaserve on one GPU host, the same GPU and model files (the llama.cpp
# columns of docs/BENCH.md). Here: tools/llama-src packs llama.cpp's source into .llama/; the
# device call carries [".gpu", ".llama"] and runs, from the repository root:
#
#   bench/cuda/llama_side.sh build [DIR]
#       llama-bench, llama-batched-bench and llama-server from .llama/llama-src.tar.xz into DIR
#       (default /tmp/llama), CUDA for sm_90 (about 5 minutes on 16 cores; GGML_CUDA=0 in the
#       environment builds for the CPU instead). Prints the llama.cpp commit (.llama/VERSION).
#   bench/cuda/llama_side.sh depth DIR DSBIN MODEL DEPTHS [N]
#       batch-1 decode after DEPTHS (a comma list) positions of context, N generated tokens
#       (default 64): `deltaserve bench decode --ctx D --tokens N` (DSBIN: the deltaserve binary;
#       DS_DEVICE, default cuda, its --device) and `llama-bench -fa 1 -p 0 -n N -r 1 -d D`, one
#       markdown row a depth: tok/s of each and their ratio.
#
# A run that fails leaves "failed" in its row, and the script exits 1.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
die() { echo "llama_side: $*" >&2; exit 2; }

build() {
    local dir=${1:-/tmp/llama} src=.llama/llama-src.tar.xz cuda=${GGML_CUDA:-1}
    [ -s "$src" ] || die "no $src (run tools/llama-src here and carry .llama)"
    case $dir in /|/tmp|"$HOME"|.) die "DIR '$dir': give a folder of its own";; esac
    rm -rf "$dir"
    mkdir -p "$dir/src" || die "cannot make $dir"
    xz -dc "$src" | tar -C "$dir/src" -xf - || die "cannot unpack $src"
    local gpu=(-DGGML_CUDA=OFF)
    [ "$cuda" = 1 ] && gpu=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF)
    cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${gpu[@]}" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > "$dir/build.log" 2>&1 ||
        { tail -20 "$dir/build.log"; die "cmake failed (log: $dir/build.log)"; }
    ninja -C "$dir/build" llama-bench llama-batched-bench llama-server >> "$dir/build.log" 2>&1 ||
        { tail -20 "$dir/build.log"; die "build failed (log: $dir/build.log)"; }
    cat .llama/VERSION 2>/dev/null
    echo "llama_side: built in $dir/build/bin"
}

# tok/s of one deltaserve bench decode at context D, or nothing
ds_tps() {
    "$1" bench decode --model "$2" --ctx "$3" --tokens "$4" --device "${DS_DEVICE:-cuda}" 2>/dev/null |
        sed -n 's/^decode: .* = \([0-9.]*\) tok\/s.*/\1/p'
}

# tok/s of one llama-bench generation run after D positions, or nothing
ll_tps() {
    "$1/build/bin/llama-bench" -m "$2" -fa 1 -p 0 -n "$4" -r 1 -d "$3" -o csv 2>/dev/null |
        python3 -c '
import csv, sys
rows = list(csv.DictReader(l for l in sys.stdin if "," in l))
ts = rows[-1].get("avg_ts") if rows else None
print(f"{float(ts):.1f}" if ts else "")'
}

depth() {
    [ $# -ge 4 ] || die "depth needs DIR DSBIN MODEL DEPTHS [N]"
    local dir=$1 ds=$2 model=$3 depths=$4 n=${5:-64} bad=0
    [ -x "$dir/build/bin/llama-bench" ] || die "no $dir/build/bin/llama-bench (run build first)"
    [ -x "$ds" ] || die "no deltaserve binary '$ds'"
    [ -s "$model" ] || die "no model '$model'"
    case $depths in ""|*[!0-9,]*) die "DEPTHS '$depths': a comma list of positions";; esac
    case $n in ""|*[!0-9]*) die "N '$n': a number of tokens";; esac
    echo "model $model, $n generated tokens a run; llama.cpp: $(sed -n 's/^llama.cpp //p' .llama/VERSION 2>/dev/null)"
    echo "| context | deltaserve tok/s | llama.cpp tok/s | ratio |"
    echo "|---|---|---|---|"
    local IFS=,
    for d in $depths; do
        local a b
        a=$(ds_tps "$ds" "$model" "$d" "$n")
        b=$(ll_tps "$dir" "$model" "$d" "$n")
        [ -n "$a" ] && [ -n "$b" ] || bad=1
        echo "| $d | ${a:-failed} | ${b:-failed} | $([ -n "$a" ] && [ -n "$b" ] &&
            python3 -c "print(f'{$a / $b:.2f}x')" || echo -) |"
    done
    return $bad
}

case ${1:-} in
    build) shift; build "$@" ;;
    depth) shift; depth "$@" ;;
    *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
