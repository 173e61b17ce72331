#!/usr/bin/env bash
# deltaserve worker as a process: usage errors exit 2, a bad model exits 1 naming it, port 0
# logs "listening on HOST:PORT" then "ready:", a busy port exits 1 naming the address,
# --device cuda without a CUDA backend/GPU says "no GPU, using CPU" and serves, SIGTERM exits 0.
set -u
DS="$1"
REF="${DS_REFERENCE_DIR:-${DS_REPO_ROOT:-$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)}/../shared/reference}"
MODEL="$REF/tiny-r2-tied.gguf"
# no shared folder (a bare clone): the repository's own equivalent (tests/reference, in the data)
[ -f "$MODEL" ] || MODEL="$PWD/tests/reference/own-r2-tied.gguf"
fails=0
check() { # name, condition result
    if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$DS" worker --listen 127.0.0.1:0 >"$tmp/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q -- "--model is required" "$tmp/o"; check "no --model: exit 2" $?
"$DS" worker --model "$MODEL" --device tpu >"$tmp/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "device" "$tmp/o"; check "bad --device: exit 2" $?
"$DS" worker --model "$MODEL" --slots -1 >"$tmp/o" 2>&1; rc=$?
[ $rc = 2 ]; check "--slots -1: exit 2" $?
"$DS" worker --model "$MODEL" --step-tokens -1 >"$tmp/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q -- "--step-tokens" "$tmp/o"; check "--step-tokens -1: exit 2 naming it" $?
"$DS" worker --model "$MODEL" --prefill-min-tokens 0 >"$tmp/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q -- "--prefill-min-tokens" "$tmp/o"; check "--prefill-min-tokens 0: exit 2 naming it" $?
"$DS" worker --model /nonexistent.gguf --listen 127.0.0.1:0 >"$tmp/o" 2>&1; rc=$?
[ $rc = 1 ] && grep -q "/nonexistent.gguf" "$tmp/o"; check "missing model: exit 1 naming it" $?

# Starts a worker with stderr on fd 3 of this shell; waits (blocking reads, 20 s at most) for
# "ready:"; sets PID, PORT and appends every line to $tmp/log.$1.
start() {
    local tag=$1; shift
    exec 3< <(exec "$DS" worker --model "$MODEL" --listen 127.0.0.1:0 "$@" 2>&1)
    PID=$!
    PORT=""
    while IFS= read -r -t 20 line <&3; do
        echo "$line" >>"$tmp/log.$tag"
        case "$line" in
            *"listening on 127.0.0.1:"*) PORT=${line##*:} ;;
            *"ready:"*) return 0 ;;
        esac
    done
    return 1
}

start a --slots 2; check "port 0: listening on + ready" $?
[ -n "$PORT" ] && [ "$PORT" -gt 0 ]; check "picked port logged ($PORT)" $?
grep -q "ready: .*step 256 tokens" "$tmp/log.a"; check "CPU: steps of 256 tokens by default" $?
APID=$PID
exec 4<&3
"$DS" worker --model "$MODEL" --listen "127.0.0.1:$PORT" >"$tmp/o" 2>&1; rc=$?
[ $rc = 1 ] && grep -q "cannot listen on 127.0.0.1:$PORT" "$tmp/o"; check "busy port: exit 1 naming it" $?

start b --device cuda; check "--device cuda: ready" $?
grep -q "no GPU, using CPU" "$tmp/log.b"; check "--device cuda: 'no GPU, using CPU'" $?
grep -q "ready: .*step 256 tokens" "$tmp/log.b"; check "--device cuda on the CPU: steps of 256 tokens" $?
BPID=$PID
kill -TERM "$BPID"
while IFS= read -r -t 20 line <&3; do echo "$line" >>"$tmp/log.b"; done
wait "$BPID"; rc=$?
[ $rc = 0 ] && grep -q "drained" "$tmp/log.b"; check "SIGTERM: drained, exit 0" $?

kill -TERM "$APID"
while IFS= read -r -t 20 line <&4; do echo "$line" >>"$tmp/log.a"; done
wait "$APID"; rc=$?
[ $rc = 0 ]; check "SIGTERM (first worker): exit 0" $?

if [ $fails -ne 0 ]; then
    echo "--- logs"; cat "$tmp"/log.* 2>/dev/null
fi
echo "$fails failed"
[ $fails = 0 ]
