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
#   serve_bench.sh prefix MODEL   the prefix cache on (the default budget), then off
#       (--prefix-cache-mb 0), each on a fresh worker: cold prompts (32 distinct 2,048-token
#       prompts one at a time, 1 token generated: TTFT); 64 users x 8 turns of a 2,048-token
#       system prompt, 128 user and 128 generated tokens (64 at once); 256 requests sharing a
#       4,096-token prefix with distinct 64-token suffixes (64 at once, 16 generated); loadgen's
#       report and summary line for each, and the worker's prefix figures from /metrics
#   serve_bench.sh long-context MODEL [PROMPT] [GEN]   one worker with the default context (the
#       model's, no --ctx or --slots) behind a router: its "memory:" line, then one prompt of
#       PROMPT (131072) tokens generating GEN (16) through the router end to end (loadgen's
#       shared-prefix mode: PROMPT - 16 drawn ids and 16 more); fails unless it ends with every
#       token, and prints its time to first token
#   serve_bench.sh sched MODEL PROMPT STEP:MIN[,STEP:MIN...]   the scheduler's step budget: for
#       each STEP:MIN a fresh worker (--slots 256 --ctx 4096 --prefix-cache-mb 0 --step-tokens
#       STEP --prefill-min-tokens MIN) behind a router, loadgen at 16, 64 and 256 streams of one
#       PROMPT-token prompt (the same ids every time; with the cache off each computes it all)
#       and 128 generated tokens, 3 x streams
#       in all (2 x at PROMPT >= 1024); one "sched ..." line per run with loadgen's summary
#       (tok/s, TTFT and inter-token p50 / p99 at the client)
set -uo pipefail
. tests/gpu/gpu_lib.sh
mode=${1:-}
model=${2:-}
case $mode in loadgen|long-prompt|two-workers|prefix|long-context|sched) ;; *)
    echo "usage: serve_bench.sh loadgen|long-prompt|two-workers|prefix|long-context|sched MODEL [...]" >&2; exit 2;; esac
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

prefix() {
    local cache rc=0 seed=1 wp=50171 rp=50172 mp=50173
    for cache in on off; do
        local flag=""
        [ $cache = off ] && flag="--prefix-cache-mb 0"
        serve_up "prefix-$cache" $wp $rp --model "$model" --device cuda --ctx 8192 \
            --metrics-listen 127.0.0.1:$mp $flag
        echo "=== cache $cache: $(grep -o 'prefix cache[^,]*' "$wlog" | head -1)"
        local common="--addr 127.0.0.1:$rp --ignore-eos --timeout-ms 480000 --id-range 100,100000"
        echo "--- cold prompts: 32 x 2048 tokens, one at a time"
        bench/loadgen $common --id-seed $((seed++)) --concurrency 1 --users 32 --turns 1 \
            --system-tokens 0 --user-tokens 2048 --max-tokens 1 || rc=1
        echo "--- multi-turn: 64 users x 8 turns, system 2048, user 128, generated 128"
        bench/loadgen $common --id-seed $((seed++)) --concurrency 64 --users 64 --turns 8 \
            --system-tokens 2048 --user-tokens 128 --max-tokens 128 || rc=1
        echo "--- shared prefix: 256 requests, prefix 4096, suffix 64, 64 at once"
        bench/loadgen $common --id-seed $((seed++)) --concurrency 64 --requests 256 \
            --shared-prefix 4096 --suffix-tokens 64 --max-tokens 16 || rc=1
        echo "--- worker /metrics"
        python3 - "$mp" <<'PY' || true
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
for line in body.splitlines():
    if line.startswith(("deltaserve:prefix_cache", "deltaserve:num_preemptions", "deltaserve:num_free_kv", "deltaserve:num_total_kv")):
        print(line)
PY
        serve_down
        echo "--- worker log"; grep -v "info request" "$wlog" | tail -8
    done
    return $rc
}

# long_context MODEL [PROMPT] [GEN]: the default context serves one PROMPT-token prompt.
long_context() {
    local pp=${3:-131072} gen=${4:-16} rc
    serve_up longctx 50171 50172 --model "$model" --device cuda
    echo "--- worker sizing"; grep -E " (memory|ready): |cuda: .*(slots|partials)" "$wlog"
    bench/loadgen --addr 127.0.0.1:50172 --concurrency 1 --requests 1 --shared-prefix $((pp - 16)) \
        --suffix-tokens 16 --max-tokens "$gen" --ignore-eos --timeout-ms 480000
    rc=$?
    serve_down
    echo "--- router log"; tail -3 "$rlog"
    echo "--- worker log"; grep -v "info request" "$wlog" | tail -8
    return $rc
}

sched() {
    local pp=${3:?sched: PROMPT tokens} cfgs=${4:?sched: STEP:MIN list} cfg c rc=0 n out
    local prompt
    prompt=$(seq -s, 1000 $((999 + pp)))
    out=${TMPDIR:-/tmp}/sched-loadgen.txt
    for cfg in ${cfgs//,/ }; do
        local step=${cfg%%:*} min=${cfg#*:}
        serve_up "sched-$step-$min" 50181 50182 --model "$model" --device cuda --slots 256 \
            --ctx 4096 --prefix-cache-mb 0 --step-tokens "$step" --prefill-min-tokens "$min"
        for c in 16 64 256; do
            n=$((3 * c)); [ "$pp" -ge 1024 ] && n=$((2 * c))
            timeout 120 bench/loadgen --addr 127.0.0.1:50182 --concurrency $c --requests $n \
                --ids "$prompt" --max-tokens 128 --ignore-eos --timeout-ms 110000 > "$out" 2>&1 || rc=1
            echo "sched prompt=$pp step=$step min=$min streams=$c $(grep loadgen-summary "$out")"
        done
        serve_down
    done
    return $rc
}

case $mode in
    sched) sched "$@" ;;
    prefix) prefix "$@" ;;
    long-context) long_context "$@" ;;
    loadgen) loadgen "$@" ;;
    long-prompt) long_prompt "$@" ;;
    two-workers) two_workers "$@" ;;
esac
