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
#   serve_bench.sh sched MODEL PROMPT STEP:MIN[,STEP:MIN...] [ARRIVALS]   the scheduler's step budget: for
#       each STEP:MIN a fresh worker (--slots 256 --ctx 4096 --prefix-cache-mb 0 --step-tokens
#       STEP --prefill-min-tokens MIN) behind a router, loadgen at 1, 16, 64 and 256 streams of one
#       PROMPT-token prompt (the same ids every time; with the cache off each computes it all)
#       and 128 generated tokens, 3 x streams
#       in all (2 x at PROMPT >= 1024); one "sched ..." line per run with loadgen's summary
#       (tok/s, TTFT and inter-token p50 / p99 at the client). ARRIVALS burst (the default):
#       the streams start together; steady: STREAMS streams of warm-up flow into the counted
#       ones (loadgen --warmup STREAMS --steady), so these arrive as earlier streams end
#   serve_bench.sh overhead MODEL [STREAMS] [PROMPT]   what the router and the worker's streaming
#       side cost: one worker (--slots STREAMS --ctx 4096 --prefix-cache-mb 0, the default
#       scheduler flags) and a router in front; loadgen with STREAMS (256) streams of one
#       PROMPT-token (128) prompt and 128 generated tokens, STREAMS streams of warm-up through
#       the router (not counted), then 3 x STREAMS through the router, then 3 x STREAMS straight
#       to the worker (loadgen --worker, the same warm worker). One "overhead ..." line per run:
#       the CPU per streamed token of the router and the worker (below) and loadgen's summary
#       (tok/s, TTFT and inter-token p50 / p99 at the client); then one "overhead-compare ..."
#       line: the router run's tok/s against the direct run's and its added TTFT p50
#   serve_bench.sh soak MODEL [SECONDS]   a mixed soak (issue 27): one worker (the defaults,
#       /metrics on) behind a router; after a warm-up pass of each stream kind, the worker's
#       free slots and free KV blocks (/metrics; blocks held only by the prefix cache count as
#       free, as loadgen --load-addr counts them), RSS and the GPUs' memory used; then for
#       SECONDS (600) four loadgen runs at once through the router: short streams (32-token
#       prompt, 32 tokens, 16 at once), long streams (1,024-token prompt, 512 tokens, 4 at
#       once), streams cancelled by the client after 0..64 of 128 tokens (256-token prompt, 8 at
#       once) and streams with a 1,500 ms deadline (64-token prompt, 256 tokens, 8 at once: most
#       expire). One "soak-sample ..." line a minute; once the load stopped and nothing runs or
#       waits (60 s at most), the same figures again and one "soak ..." line with verdict=PASS
#       (exit 0) when the free slots and KV blocks are back, the GPU memory is the same, RSS grew
#       less than 5% from the first minute's sample to the end, and no stream failed other than
#       by its deadline
set -uo pipefail
. tests/gpu/gpu_lib.sh
mode=${1:-}
model=${2:-}
case $mode in loadgen|long-prompt|two-workers|prefix|long-context|sched|overhead|soak) ;; *)
    echo "usage: serve_bench.sh loadgen|long-prompt|two-workers|prefix|long-context|sched|overhead|soak MODEL [...]" >&2; exit 2;; esac
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
    local pp=${3:?sched: PROMPT tokens} cfgs=${4:?sched: STEP:MIN list} arrivals=${5:-burst} cfg c rc=0 n out
    case $arrivals in burst|steady) ;; *) echo "sched: ARRIVALS is burst or steady, not '$arrivals'"; return 2;; esac
    local prompt
    prompt=$(seq -s, 1000 $((999 + pp)))
    out=${TMPDIR:-/tmp}/sched-loadgen.txt
    for cfg in ${cfgs//,/ }; do
        local step=${cfg%%:*} min=${cfg#*:}
        serve_up "sched-$step-$min" 50181 50182 --model "$model" --device cuda --slots 256 \
            --ctx 4096 --prefix-cache-mb 0 --step-tokens "$step" --prefill-min-tokens "$min"
        for c in 1 16 64 256; do
            n=$((3 * c)); [ "$pp" -ge 1024 ] && n=$((2 * c))
            local warm=()
            [ "$arrivals" = steady ] && warm=(--warmup $c --steady)
            timeout 120 bench/loadgen --addr 127.0.0.1:50182 --concurrency $c --requests $n \
                "${warm[@]}" --ids "$prompt" --max-tokens 128 --ignore-eos --timeout-ms 110000 > "$out" 2>&1 || rc=1
            echo "sched prompt=$pp step=$step min=$min streams=$c arrivals=$arrivals $(grep loadgen-summary "$out")"
        done
        serve_down
    done
    return $rc
}

# cpu_ticks PID: "TOTAL ENGINE CQ", CPU time in clock ticks (getconf CLK_TCK a second): utime +
# stime (/proc/PID/stat fields 14 and 15) of the process, all its threads including those that
# ended, and of its threads named ds-engine (the worker's engine: the forward pass's host side
# and each step's token hand-off) and ds-rpc-cq (rpc/rpc_server.c's completion-queue thread),
# from /proc/PID/task/*/stat; a thread that ends between the two reads drops out of its sum.
cpu_ticks() {
    { cat "/proc/$1/stat"; cat "/proc/$1/task/"*/stat 2> /dev/null; } | awk '
        function ticks(s,   i, f) {
            for (i = length(s); i > 0 && substr(s, i, 1) != ")"; i--) ;
            name = substr(s, index(s, "(") + 1, i - index(s, "(") - 1)
            split(substr(s, i + 1), f, " ")
            return f[12] + f[13]
        }
        NR == 1 { total = ticks($0); next }
        { t = ticks($0) }
        name == "ds-engine" { engine += t }
        name == "ds-rpc-cq" { cq += t }
        END { printf "%d %d %d\n", total, engine, cq }'
}

# thread_ticks PID: "NAME=TICKS ..." of the process's live threads, summed by thread name.
thread_ticks() {
    cat "/proc/$1/task/"*/stat 2> /dev/null | awk '
        {
            for (i = length($0); i > 0 && substr($0, i, 1) != ")"; i--) ;
            name = substr($0, index($0, "(") + 1, i - index($0, "(") - 1)
            gsub(/[ =]/, "_", name)
            split(substr($0, i + 1), f, " ")
            t[name] += f[12] + f[13]
        }
        END { for (name in t) printf "%s=%d ", name, t[name]; print "" }'
}

# overhead MODEL [STREAMS] [PROMPT]: the router's and the worker's CPU per streamed token, and
# what the router adds to loadgen's figures against loadgen straight to the worker.
overhead() {
    local c=${3:-256} pp=${4:-128} rc=0 n path name prompt out ctx=4096 tck tag
    prompt=$(seq -s, 1000 $((999 + pp)))
    out=${TMPDIR:-/tmp}/overhead-loadgen.txt
    n=$((3 * c))
    tck=$(getconf CLK_TCK)
    name=$(basename "$model" .gguf)
    [ $((pp + 128)) -le $ctx ] || ctx=$((pp + 256))
    serve_up overhead 50191 50192 --model "$model" --device cuda --slots "$c" --ctx $ctx \
        --prefix-cache-mb 0
    echo "--- worker: $(grep -o ' info ready: .*' "$wlog")"
    kill -0 "$wpid" 2> /dev/null || { echo "overhead: the worker exited"; tail -20 "$wlog"; return 1; }
    echo "--- warm-up (not counted): $c streams through the router"
    timeout 60 bench/loadgen --addr 127.0.0.1:50192 --concurrency "$c" --requests "$c" \
        --ids "$prompt" --max-tokens 128 --ignore-eos --timeout-ms 60000 | grep loadgen-summary \
        || rc=1
    echo "--- CPU per streamed token: (utime + stime after - before the run) / the tokens the run"
    echo "    streamed (loadgen-summary tokens=, 128 a stream); router: the router process (with"
    echo "    path=direct: idle, its health polls alone); worker: the whole worker process;"
    echo "    worker_engine: its ds-engine thread (forward host side, step hand-off);"
    echo "    worker_service: worker - worker_engine (ds-rpc-cq and gRPC's own threads); worker_cq:"
    echo "    ds-rpc-cq alone. Clock ticks of 1/$tck s. Targets (issue 27): router <= 5 us,"
    echo "    worker_service <= 20 us, router tok/s >= 98% and TTFT p50 <= 1 ms over direct's"
    local r0 w0 r1 w1 t0 t1 summary direct="" via=""
    for path in router direct; do
        local args=(--addr 127.0.0.1:50192)
        [ $path = direct ] && args=(--worker --addr 127.0.0.1:50191)
        r0=$(cpu_ticks "$rpid"); w0=$(cpu_ticks "$wpid"); t0=$(thread_ticks "$wpid")
        timeout 90 bench/loadgen "${args[@]}" --concurrency "$c" --requests $n --ids "$prompt" \
            --max-tokens 128 --ignore-eos --timeout-ms 60000 > "$out" 2>&1 || rc=1
        r1=$(cpu_ticks "$rpid"); w1=$(cpu_ticks "$wpid"); t1=$(thread_ticks "$wpid")
        echo "--- $path: loadgen $c streams, $n requests"
        sed 's/^/    /' "$out"
        summary=$(grep -o 'loadgen-summary mode=fixed .*' "$out")
        [ -n "$summary" ] || { echo "overhead: no loadgen-summary ($path)"; rc=1; continue; }
        tag="overhead model=$name path=$path streams=$c prompt=$pp requests=$n"
        awk -v tag="$tag" -v tck="$tck" -v r0="$r0" -v r1="$r1" -v w0="$w0" -v w1="$w1" \
            -v s="${summary#loadgen-summary mode=fixed }" -v want=$((n * 128)) '
            BEGIN {
                split(r0, a, " "); split(r1, b, " "); split(w0, c, " "); split(w1, d, " ")
                if (match(s, /(^| )tokens=[0-9]+/)) tok = substr(s, RSTART, RLENGTH)
                sub(/.*=/, "", tok); tok += 0
                us = tok > 0 ? 1e6 / tck / tok : 0
                printf "%s router_us_per_token=%.2f worker_us_per_token=%.2f " \
                    "worker_engine_us_per_token=%.2f worker_service_us_per_token=%.2f " \
                    "worker_cq_us_per_token=%.2f %s\n", tag, (b[1] - a[1]) * us, (d[1] - c[1]) * us,
                    (d[2] - c[2]) * us, (d[1] - c[1] - d[2] + c[2]) * us, (d[3] - c[3]) * us, s
                exit !(tok == want && s ~ / failed=0 /)
            }' || { echo "overhead: $path: failed streams or not $((n * 128)) tokens"; rc=1; }
        awk -v t0="$t0" -v t1="$t1" -v s="$summary" -v tck="$tck" 'BEGIN {
            if (match(s, /(^| )tokens=[0-9]+/)) tok = substr(s, RSTART, RLENGTH)
            sub(/.*=/, "", tok); tok += 0
            n = split(t0, a, " "); for (i = 1; i <= n; i++) { split(a[i], kv, "="); b[kv[1]] = kv[2] }
            n = split(t1, a, " ")
            line = "    the worker'"'"'s threads by name, us per token (live at both reads):"
            for (i = 1; i <= n; i++) {
                split(a[i], kv, "=")
                if (tok > 0 && kv[1] in b) line = line sprintf(" %s %.2f", kv[1], (kv[2] - b[kv[1]]) * 1e6 / tck / tok)
            }
            print line
        }'
        [ $path = router ] && via=$summary || direct=$summary
    done
    if [ -n "$via" ] && [ -n "$direct" ]; then
        awk -v v="$via" -v d="$direct" -v tag="overhead-compare model=$name streams=$c prompt=$pp" '
            function get(s, k,   f, i) {
                split(s, f, " ")
                for (i in f) if (index(f[i], k "=") == 1) return substr(f[i], length(k) + 2) + 0
            }
            BEGIN {
                rt = get(v, "tokens_per_s"); dt = get(d, "tokens_per_s")
                printf "%s router_tok_s=%.1f direct_tok_s=%.1f router_tok_s_change_pct=%.2f " \
                    "router_ttft_p50_added_ms=%.2f router_ttft_p99_added_ms=%.2f " \
                    "router_itl_p99_added_ms=%.2f\n", tag, rt, dt, (dt > 0 ? (rt / dt - 1) * 100 : 0),
                    get(v, "ttft_p50_ms") - get(d, "ttft_p50_ms"),
                    get(v, "ttft_p99_ms") - get(d, "ttft_p99_ms"),
                    get(v, "itl_p99_ms") - get(d, "itl_p99_ms")
            }' || rc=1
    fi
    serve_down
    echo "--- router log"; tail -3 "$rlog"
    echo "--- worker log (requests: $(grep -c 'info request' "$wlog"))"; grep -v "info request" "$wlog" | tail -8
    return $rc
}

# soak_load PORT: the worker's /metrics as "RUNNING WAITING FREE_SLOTS TOTAL_SLOTS FREE_KV
# TOTAL_KV PREFIX_BLOCKS" (PREFIX_BLOCKS 0 with the prefix cache off); nothing when unreadable.
soak_load() {
    python3 - "$1" <<'PY' 2> /dev/null
import sys, urllib.request
names = ["running", "waiting", "free_slots", "total_slots", "free_kv_blocks", "total_kv_blocks"]
keys = ["deltaserve:num_requests_" + n if n in ("running", "waiting") else "deltaserve:num_" + n
        for n in names] + ["deltaserve:prefix_cache_blocks"]
body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
v = {}
for line in body.splitlines():
    f = line.split()
    if len(f) == 2 and f[0] in keys:
        v[f[0]] = int(float(f[1]))
if all(k in v for k in keys[:6]):
    print(" ".join(str(v.get(k, 0)) for k in keys))
PY
}

# soak_rss PID: VmRSS in kB; soak_gpu_mem: MiB used on all the GPUs (nvidia-smi), or "none".
soak_rss() { awk '$1 == "VmRSS:" { print $2 }' "/proc/$1/status" 2> /dev/null; }
soak_gpu_mem() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2> /dev/null |
        awk '{ s += $1; n++ } END { if (n) print s; else print "none" }'
}

# soak_idle PORT: waits (60 s at most) until the worker runs and queues nothing; sets the
# caller's load to its last soak_load; 1 when it never got there.
soak_idle() {
    local j
    for j in $(seq 1 600); do
        load=$(soak_load "$1")
        [ -n "$load" ] && [ "${load%% *}" = 0 ] && set -- $load && [ "$2" = 0 ] && return 0
        sleep 0.1
    done
    return 1
}

# soak_ids N: N prompt ids from the caller's id0 on.
soak_ids() { seq -s, "$id0" $((id0 + $1 - 1)); }

# soak MODEL [SECONDS]: a mixed load for SECONDS leaves the worker as it found it (issue 27).
soak() {
    local secs=${3:-600} dev=cuda wp=50201 rp=50202 mp=50203 id0=1000
    local short_p=32 short_g=32 long_p=1024 long_g=512 cancel_p=256 cancel_g=128 cut=64
    local dl_p=64 dl_g=256 dl_ms=1500
    local dir=${TMPDIR:-/tmp}/soak name rc=0 i
    [[ $secs =~ ^[1-9][0-9]*$ ]] || { echo "soak: SECONDS '$secs' is not a positive number"; return 2; }
    name=$(basename "$model" .gguf)
    mkdir -p "$dir"
    serve_up soak $wp $rp --model "$model" --device $dev --metrics-listen 127.0.0.1:$mp
    kill -0 "$wpid" 2> /dev/null || { echo "soak: the worker exited"; tail -20 "$wlog"; return 1; }
    echo "--- worker: $(grep -o ' info ready: .*' "$wlog")"
    # the four stream kinds: NAME CONCURRENCY then loadgen's flags
    local -a kinds=(
        "short 16 --ids $(soak_ids $short_p) --max-tokens $short_g --ignore-eos --timeout-ms 120000"
        "long 4 --ids $(soak_ids $long_p) --max-tokens $long_g --ignore-eos --timeout-ms 600000"
        "cancel 8 --ids $(soak_ids $cancel_p) --max-tokens $cancel_g --ignore-eos --cancel-after $cut --timeout-ms 120000"
        "deadline 8 --ids $(soak_ids $dl_p) --max-tokens $dl_g --ignore-eos --timeout-ms $dl_ms"
    )
    local k kind c pids=""
    echo "--- warm-up (not counted): one pass of each kind"
    for k in "${kinds[@]}"; do
        read -r kind c <<< "${k%% --*}"
        timeout 300 bench/loadgen --addr 127.0.0.1:$rp --concurrency "$c" --requests "$c" \
            ${k#"$kind $c "} > "$dir/warmup-$kind.txt" 2>&1 &
        pids="$pids $!"
    done
    wait $pids
    for k in "${kinds[@]}"; do
        kind=${k%% *}
        echo "    $kind: $(grep -o 'loadgen-summary .*' "$dir/warmup-$kind.txt" || echo 'no loadgen-summary')"
    done
    local load l0 l1 rss0 gpu0
    soak_idle $mp || { echo "soak: the worker is not idle after the warm-up (/metrics: ${load:-none})"; rc=1; }
    l0=$load rss0=$(soak_rss "$wpid") gpu0=$(soak_gpu_mem)
    set -- $l0
    local slots0=${3:-?} kv0=$(( ${5:-0} + ${7:-0} )) tslots=${4:-?} tkv=${6:-?}
    echo "--- before: free slots $slots0 of $tslots, free KV blocks ${5:-?} + ${7:-0} the prefix cache holds of $tkv, RSS $((rss0 / 1024)) MiB, GPU memory used ${gpu0} MiB"
    echo "--- $secs s of load through the router: short (${short_p}:${short_g} x 16), long (${long_p}:${long_g} x 4), cancel (${cancel_p}:${cancel_g}, cut after 0..$cut, x 8), deadline (${dl_p}:${dl_g}, ${dl_ms} ms, x 8)"
    pids=""
    for k in "${kinds[@]}"; do
        read -r kind c <<< "${k%% --*}"
        timeout $((secs + 900)) bench/loadgen --addr 127.0.0.1:$rp --concurrency "$c" \
            --duration-s "$secs" ${k#"$kind $c "} > "$dir/$kind.txt" 2>&1 &
        pids="$pids $!"
    done
    local t0=$SECONDS el next=60 rss rss1="" gpu s
    while :; do
        local live=0 p
        for p in $pids; do kill -0 "$p" 2> /dev/null && live=1; done
        el=$((SECONDS - t0))
        if [ $el -ge $next ] || { [ $live = 0 ] && [ -z "$rss1" ]; }; then
            rss=$(soak_rss "$wpid") gpu=$(soak_gpu_mem) s=$(soak_load $mp)
            set -- $s
            echo "soak-sample elapsed_s=$el rss_mb=$(( ${rss:-0} / 1024 )) gpu_mem_mb=$gpu free_slots=${3:-?} free_kv_blocks=${5:-?} prefix_blocks=${7:-?} running=${1:-?} waiting=${2:-?}"
            [ -z "$rss1" ] && rss1=${rss:-0}
            next=$((next + 60))
        fi
        [ $live = 0 ] && break
        sleep 1
    done
    wait $pids 2> /dev/null
    local ok=0 failed=0 cancelled=0 deadline=0 f n
    for kind in short long cancel deadline; do
        f=$dir/$kind.txt
        s=$(grep -o 'loadgen-summary mode=fixed .*' "$f")
        echo "--- $kind: ${s:-no loadgen-summary}"
        grep -E '^  (errors|cancelled)' "$f" | sed 's/^/  /'
        if [ -z "$s" ]; then
            failed=$((failed + 1)); tail -5 "$f"; continue
        fi
        for n in ok failed cancelled; do
            local v
            v=$(grep -oE "(^| )$n=[0-9]+" <<< "$s" | tail -1); v=${v##*=}
            eval "$n=\$(( $n + ${v:-0} ))"
        done
        n=$(awk '$1 == "errors" && $2 == "DEADLINE_EXCEEDED:" { print $3 }' "$f")
        deadline=$((deadline + ${n:-0}))
    done
    local failed_other=$((failed - deadline))
    soak_idle $mp || { echo "soak: the worker is not idle 60 s after the load (/metrics: ${load:-none})"; rc=1; }
    l1=$load
    local rss2 gpu1
    rss2=$(soak_rss "$wpid") gpu1=$(soak_gpu_mem)
    set -- $l1
    local slots1=${3:-?} kv1=$(( ${5:-0} + ${7:-0} ))
    echo "--- after: free slots $slots1 of ${4:-?}, free KV blocks ${5:-?} + ${7:-0} the prefix cache holds of ${6:-?}, RSS $(( ${rss2:-0} / 1024 )) MiB, GPU memory used ${gpu1} MiB"
    kill -0 "$wpid" 2> /dev/null || { echo "soak: the worker exited"; rc=1; }
    local verdict
    verdict=$(awk -v s0="$slots0" -v s1="$slots1" -v k0="$kv0" -v k1="$kv1" -v r1="${rss1:-0}" \
        -v r2="${rss2:-0}" -v g0="$gpu0" -v g1="$gpu1" -v fo="$failed_other" -v ok="$ok" -v rc="$rc" '
        BEGIN { print (rc == 0 && s0 == s1 && s0 != "?" && k0 == k1 && r1 > 0 && r2 < r1 * 1.05 &&
                       g0 == g1 && fo == 0 && ok > 0) ? "PASS" : "FAIL" }')
    printf 'soak model=%s seconds=%s streams_ok=%d cancelled=%d deadline=%d failed_other=%d slots_before=%s slots_after=%s kv_free_before=%s kv_free_after=%s rss_1min_mb=%.1f rss_end_mb=%.1f gpu_mem_before_mb=%s gpu_mem_after_mb=%s verdict=%s\n' \
        "$name" "$secs" "$ok" "$cancelled" "$deadline" "$failed_other" "$slots0" "$slots1" "$kv0" \
        "$kv1" "$(awk -v r="${rss1:-0}" 'BEGIN { print r / 1024 }')" \
        "$(awk -v r="${rss2:-0}" 'BEGIN { print r / 1024 }')" "$gpu0" "$gpu1" "$verdict"
    serve_down
    echo "--- router log"; tail -3 "$rlog"
    echo "--- worker log (requests: $(grep -c 'info request' "$wlog"))"; grep -v "info request" "$wlog" | tail -8
    [ "$verdict" = PASS ]
}

case $mode in
    soak) soak "$@" ;;
    overhead) overhead "$@" ;;
    sched) sched "$@" ;;
    prefix) prefix "$@" ;;
    long-context) long_context "$@" ;;
    loadgen) loadgen "$@" ;;
    long-prompt) long_prompt "$@" ;;
    two-workers) two_workers "$@" ;;
esac
