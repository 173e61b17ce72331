# serve_up NAME WORKER_PORT ROUTER_PORT WORKER_ARGS...: one `deltaserve worker` (with
# WORKER_ARGS) and one router in front of it on loopback, for the serve_* steps (40, 42, 45);
# they pass it into their step with `declare -f serve_up`. Sets the caller's wlog, rlog (the
# logs, /tmp/NAME-worker.log and /tmp/NAME-router.log), wpid and rpid. Returns once the worker
# logged its last start-up line ("info ready: MODEL, ..."; the CUDA engine's own "cuda: ready:"
# comes before it) or exited, and the router had a second to start.
serve_up() {
    local name=$1 wp=$2 rp=$3 i
    shift 3
    wlog=/tmp/$name-worker.log rlog=/tmp/$name-router.log
    "$here/bin/deltaserve" worker --listen 127.0.0.1:$wp "$@" > "$wlog" 2>&1 &
    wpid=$!
    for i in $(seq 1 600); do grep -q " info ready: " "$wlog" && break; kill -0 $wpid 2>/dev/null || break; sleep 0.2; done
    "$here/bin/deltaserve" router --listen 127.0.0.1:$rp --workers 127.0.0.1:$wp --poll-ms 100 > "$rlog" 2>&1 &
    rpid=$!
    sleep 1
}
