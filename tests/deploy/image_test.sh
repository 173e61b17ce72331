#!/usr/bin/env bash
# The image, built offline and run: tools/image-build commits the runtime tree as a `FROM
# scratch` image with buildah (a private store under the test's temporary folder, vfs driver),
# then a worker, a router and a client run from that image with `buildah run --isolation
# chroot --network host` (the process chrooted into the image's root filesystem, as user
# 65532 from the image's configuration; no OCI runtime needed: where this test runs, crun
# cannot create cgroups). Checked: `deltaserve version` in the image loads cuBLAS, cuBLASLt
# and NCCL (CUDA builds), one generation streams worker -> router -> client, SIGTERM stops
# both servers with exit 0. Skips, saying why, where buildah is not installed.
#   image_test.sh RUNTIME_TREE_SCRIPT IMAGE_BUILD_SCRIPT DELTASERVE_BIN
set -euo pipefail
rtree=$(readlink -f "$1")
ibuild=$(readlink -f "$2")
bin=$(readlink -f "$3")
if ! command -v buildah > /dev/null; then
    echo "SKIP: buildah is not installed (tools/setup installs it from Debian)"
    exit 0
fi
T=$(mktemp -d "${TEST_TMPDIR:-/tmp}/image.XXXXXX")
export BUILDAH_OPTS="--root $T/storage --runroot $T/run --storage-driver vfs"
# shellcheck disable=SC2206
B=(buildah $BUILDAH_OPTS)
pids=()
ctr=""
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    [ -z "$ctr" ] || "${B[@]}" rm "$ctr" > /dev/null 2>&1 || true
    "${B[@]}" rmi -a -f > /dev/null 2>&1 || true
    rm -rf "$T" 2>/dev/null || true
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$T"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }; done
    exit 1
}

"$rtree" -b "$bin" "$T/tree"
id=$("$ibuild" -t "$T/tree" deltaserve:test) || fail "tools/image-build"
"${B[@]}" inspect --type image --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' \
    deltaserve:test > "$T/config.txt"
grep -qx '65532:65532 \[/bin/deltaserve\]' "$T/config.txt" ||
    fail "image config: $(cat "$T/config.txt")"
echo "image $id: $(cat "$T/config.txt")"
rm -rf "$T/tree"
ctr=$("${B[@]}" from deltaserve:test)
run() { "${B[@]}" run --isolation chroot --network host "$ctr" -- /bin/deltaserve "$@"; }

run version > "$T/version.txt" 2>&1 ||
    fail "deltaserve version in the image: $(cat "$T/version.txt")"
cat "$T/version.txt"
if grep -q '^backends:.* cuda' "$T/version.txt"; then
    for what in "dense path (cuBLAS)" "dense path (cuBLASLt)" "tensor parallel --tp (NCCL)"; do
        grep -q "^$what: available: .* from /lib/x86_64-linux-gnu/" "$T/version.txt" ||
            fail "$what is not available in the image"
    done
fi
run gguf synth --preset tiny --quant f32 --seed 1 -o /tmp/tiny.gguf > /dev/null ||
    fail "gguf synth in the image"

# The innermost process under pid $1 (buildah -> buildah-chroot-exec -> deltaserve).
leaf() {
    local p=$1 c
    while c=$(ps -o pid= --ppid "$p" | head -1 | tr -d ' ') && [ -n "$c" ]; do p=$c; done
    echo "$p"
}
# Starts a server in the image with stderr in $T/NAME.log; waits for "listening on".
start() {
    local name=$1; shift
    run "$@" 2> "$T/$name.log" < /dev/null &
    pids+=("$!")
    local pid=$! deadline=$((SECONDS + 60))
    until grep -q 'listening on' "$T/$name.log"; do
        kill -0 "$pid" 2>/dev/null || fail "$name exited before listening"
        [ $SECONDS -lt $deadline ] || fail "$name did not listen within 60 s"
        sleep 0.05 # polls the log for the line each server prints once bound
    done
    ADDR=127.0.0.1:$(grep -m1 -o 'listening on [^ ]*' "$T/$name.log" | sed 's/.*://')
    LEAF=$(leaf "$pid")
}
start worker worker --model /tmp/tiny.gguf --listen 127.0.0.1:0 --threads 1
worker_pid=${pids[-1]} worker_leaf=$LEAF worker_addr=$ADDR
start router router --listen 127.0.0.1:0 --workers "$worker_addr" --model /tmp/tiny.gguf --poll-ms 100
router_pid=${pids[-1]} router_leaf=$LEAF router_addr=$ADDR
[ "$(ps -o user= -p "$worker_leaf" | tr -d ' ')" != root ] || fail "the worker runs as root"

deadline=$((SECONDS + 60))
until run client --addr "$router_addr" --prompt "Hello" --max-tokens 8 --ignore-eos --verbose \
        > "$T/client.out" 2> "$T/client.log"; do
    grep -q "UNAVAILABLE" "$T/client.log" || fail "client in the image failed"
    [ $SECONDS -lt $deadline ] || fail "router never became ready"
    sleep 0.1 # waits for the router's next health poll of the worker
done
[ -s "$T/client.out" ] || fail "the client printed no text"
grep -q "length" "$T/client.log" || fail "no finish_reason length in the client summary"
echo "streamed through the image's router and worker: $(head -c 80 "$T/client.out" | tr -d '\n')"

# SIGTERM to each server (inside its chroot): drains, exits 0, and so does its buildah run.
kill -TERM "$router_leaf"
wait "$router_pid" || fail "router exited $? on SIGTERM"
kill -TERM "$worker_leaf"
wait "$worker_pid" || fail "worker exited $? on SIGTERM"
pids=()
echo "image: ok"
