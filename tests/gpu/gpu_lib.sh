# Shell helpers of the GPU steps (sourced; tests/gpu and bench/cuda scripts). Every step runs
# from a runfiles-shaped folder: cli/deltaserve, bench/loadgen, tests/reference/... relative to
# the working directory (Bazel's runfiles root, or the folder tools/gpu-test --run unpacks), and
# the synthetic models tools/gpu-test makes are synth/SIZE.gguf there.

# gpu_count: the GPUs nvidia-smi lists (0 without a driver or nvidia-smi).
gpu_count() {
    local n
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || true
    echo "${n:-0}"
}

# require_gpu WHAT: returns when a GPU is listed. Otherwise, with DS_REQUIRE_GPU=1 (the GPU
# host: tools/gpu-test --run sets it) prints "no GPU ...: WHAT FAILED" and exits 1; without it
# prints "no GPU: WHAT skipped" and exits 0 (tests/gpu/gpu_parity.h's rule for the C tests).
# deltaserve's --device cuda falls back to the CPU without a GPU, so no step may rely on it.
require_gpu() {
    [ "$(gpu_count)" -ge 1 ] && return 0
    if [ "${DS_REQUIRE_GPU:-0}" = 1 ]; then
        echo "no GPU (nvidia-smi lists none) but DS_REQUIRE_GPU=1: $1 FAILED"
        exit 1
    fi
    echo "no GPU (nvidia-smi lists none): $1 skipped"
    exit 0
}

# serve_up NAME WORKER_PORT ROUTER_PORT WORKER_ARGS...: one `deltaserve worker` (with
# WORKER_ARGS) and one router in front of it on loopback. Sets the caller's wlog, rlog (the
# logs, ${TMPDIR:-/tmp}/NAME-worker.log and NAME-router.log), wpid and rpid. Returns once the
# worker logged its last start-up line ("info ready: MODEL, ..."; the CUDA engine's own
# "cuda: ready:" comes before it) or exited, and the router had a second to start.
serve_up() {
    local name=$1 wp=$2 rp=$3 i
    shift 3
    wlog=${TMPDIR:-/tmp}/$name-worker.log rlog=${TMPDIR:-/tmp}/$name-router.log
    cli/deltaserve worker --listen 127.0.0.1:"$wp" "$@" > "$wlog" 2>&1 &
    wpid=$!
    for i in $(seq 1 600); do
        grep -q " info ready: " "$wlog" && break
        kill -0 "$wpid" 2>/dev/null || break
        sleep 0.2
    done
    cli/deltaserve router --listen 127.0.0.1:"$rp" --workers 127.0.0.1:"$wp" --poll-ms 100 > "$rlog" 2>&1 &
    rpid=$!
    sleep 1
}

# serve_down: stops what serve_up started.
serve_down() {
    kill "$rpid" "$wpid" 2>/dev/null
    wait "$rpid" "$wpid" 2>/dev/null
    return 0
}
