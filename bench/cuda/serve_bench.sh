#!/usr/bin/env bash
# The service on the GPU under load: routers, `worker --device cuda` and bench/loadgen on
# loopback. Paths are relative to the runfiles root (tests/gpu/gpu_lib.sh).
#   serve_bench.sh loadgen MODEL [STREAMS]   one worker, loadgen with STREAMS (64) concurrent
#       streams of a 16-token prompt and 128 generated tokens, 4 x STREAMS in all: aggregate
#       tok/s, TTFT and inter-token latency p50 / p99
#   serve_bench.sh long-prompt MODEL [PROMPT] [GEN]   chunked prefill under load: 32 streams
#       generating GEN (768) tokens each, alone, then again while one PROMPT-token (8192) prompt
#       is admitted (worker --step-tokens 256): the streams' inter-token latency both times and
#       the long prompt's time to first token under that load
#   serve_bench.sh two-workers MODEL   loadgen 64 streams on one worker (cuda:0), then on two
#       (cuda:0, cuda:1) behind one router (needs two GPUs)
set -uo pipefail
. tests/gpu/gpu_lib.sh
mode=${1:-}
model=${2:-}
case $mode in loadgen|long-prompt|two-workers) ;; *)
    echo "usage: serve_bench.sh loadgen|long-prompt|two-workers MODEL [...]" >&2; exit 2;; esac
require_gpu "serve_bench $mode"
[ -s "$model" ] || { echo "serve_bench: no model '$model' (tools/gpu-test makes synth/SIZE.gguf)"; exit 1; }
ids=9,8,7,6,5,4,3,2,1,10,11,12,13,14,15,16

loadgen() {
    local c=${3:-64} rc
    serve_up serve 50151 50152 --model "$model" --device cuda
    bench/loadgen --addr 127.0.0.1:50152 --concurrency "$c" --warmup "$c" --requests $((4 * c)) \
        --ids $ids --max-tokens 128 --ignore-eos --timeout-ms 120000
    rc=$?
    serve_down
    echo "--- worker log (requests: $(grep -c 'info request' "$wlog"))"; grep -v "info request" "$wlog"
    echo "--- router log"; tail -5 "$rlog"
    return $rc
}

long_prompt() {
    local pp=${3:-8192} gen=${4:-768} rp=50162 rc lpid
    serve_up long 50161 $rp --model "$model" --device cuda --slots 48 --ctx $((pp + 1024)) \
        --step-tokens 256
    local streams="--addr 127.0.0.1:$rp --concurrency 32 --requests 32 --ids $ids --max-tokens $gen --ignore-eos --timeout-ms 120000"
    local out=${TMPDIR:-/tmp}/long-streams.txt
    echo "--- 32 streams alone"
    bench/loadgen $streams
    echo "--- 32 streams while one $pp-token prompt is admitted"
    bench/loadgen $streams > "$out" 2>&1 &
    lpid=$!
    sleep 2
    echo "--- the $pp-token prompt (1 token generated)"
    bench/loadgen --addr 127.0.0.1:$rp --concurrency 1 --requests 1 \
        --ids "$(seq -s, 1000 $((999 + pp)))" --max-tokens 1 --timeout-ms 120000
    rc=$?
    wait $lpid || rc=1
    cat "$out"
    serve_down
    echo "--- worker log"; grep -v "info request" "$wlog" | tail -20
    return $rc
}

two_workers() {
    [ "$(gpu_count)" -ge 2 ] || { echo "serve_bench two-workers: needs two GPUs, nvidia-smi lists $(gpu_count)"; return 1; }
    local n i rc=0 logs
    for n in 1 2; do
        local pids="" workers=127.0.0.1:50161 d=${TMPDIR:-/tmp}
        cli/deltaserve worker --model "$model" --device cuda:0 --listen 127.0.0.1:50161 > "$d/two-w0.log" 2>&1 &
        pids=$!
        logs="$d/two-w0.log"
        if [ $n = 2 ]; then
            cli/deltaserve worker --model "$model" --device cuda:1 --listen 127.0.0.1:50162 > "$d/two-w1.log" 2>&1 &
            pids="$pids $!"; workers="$workers,127.0.0.1:50162"; logs="$logs $d/two-w1.log"
        fi
        for i in $(seq 1 900); do # each worker's last start-up line
            [ "$(cat $logs | grep -c ' info ready: ')" -ge $n ] && break
            sleep 0.2
        done
        cli/deltaserve router --listen 127.0.0.1:50163 --workers "$workers" --poll-ms 100 > "$d/two-r.log" 2>&1 &
        pids="$pids $!"
        sleep 1
        echo "=== $n worker(s): $workers"
        bench/loadgen --addr 127.0.0.1:50163 --concurrency 64 --warmup 64 --requests 256 \
            --ids $ids --max-tokens 128 --ignore-eos --timeout-ms 120000 || rc=1
        kill $pids 2>/dev/null; wait $pids 2>/dev/null
        grep -h " info ready: " $logs
    done
    return $rc
}

case $mode in
    loadgen) loadgen "$@" ;;
    long-prompt) long_prompt "$@" ;;
    two-workers) two_workers "$@" ;;
esac
