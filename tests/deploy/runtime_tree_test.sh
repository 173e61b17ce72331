#!/usr/bin/env bash
# The container's runtime tree (tools/runtime-tree) serves on its own: assemble it from the
# built binary, start a worker (tiny synthetic model, as tools/run --random makes) and a
# router with the tree's loader and libraries only (an empty environment, --inhibit-cache,
# --library-path into the tree), stream one generation through the router with the tree's
# `deltaserve client`, and check in /proc/PID/maps that every file the servers mapped lies in
# the tree. SIGTERM then stops both with exit 0. A CUDA build's tree also carries cuBLAS,
# cuBLASLt and NCCL with their licences: `deltaserve version` run from the tree must load each
# (dlopen, no GPU needed) from the tree's lib folder, so the dense path and --tp are available.
#   runtime_tree_test.sh RUNTIME_TREE_SCRIPT DELTASERVE_BIN
set -euo pipefail
script=$(readlink -f "$1")
bin=$(readlink -f "$2")
T=$(mktemp -d "${TEST_TMPDIR:-/tmp}/rtree.XXXXXX")
tree=$T/tree
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$T"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -20 "$f"; }; done; exit 1; }

"$script" -b "$bin" "$tree"
[ -x "$tree/bin/deltaserve" ] || fail "no bin/deltaserve in the tree"
cmp -s "$bin" "$tree/bin/deltaserve" || fail "bin/deltaserve differs from the built binary"

# Every library ldd resolves for the binary is in the tree, at the same path.
while read -r lib; do
    [ -f "$tree$lib" ] || fail "library $lib is not in the tree"
done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
interp=$(ldd "$bin" | awk '$1 ~ /^\// { print $1 }' | head -1)
libdirs=$(cd "$tree" && find . -name '*.so*' -printf '%h\n' | sort -u | sed "s|^\.|$tree|" | paste -sd:)

# Runs the tree's binary with nothing from the host: the tree's loader, its libraries only.
run() {
    env -i LD_LIBRARY_PATH="$libdirs" "$tree$interp" --inhibit-cache --library-path "$libdirs" \
        "$tree/bin/deltaserve" "$@"
}
# The same, replacing the calling (background sub)shell, so that $! is the server's pid.
run_exec() {
    exec env -i LD_LIBRARY_PATH="$libdirs" "$tree$interp" --inhibit-cache --library-path "$libdirs" \
        "$tree/bin/deltaserve" "$@"
}

run --help > "$T/help.txt" || fail "deltaserve --help from the tree"
grep -q "worker" "$T/help.txt" || fail "unexpected --help output"
# The GPU libraries (loaded with dlopen, so not in ldd's list): from the tree, for a CUDA build.
run version > "$T/version.txt" || fail "deltaserve version from the tree"
cat "$T/version.txt"
libdir=$tree$(dirname "$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /libc\.so\.6$/ { print $3 }')")
if grep -q '^backends:.* cuda' "$T/version.txt"; then
    for want in \
        "dense path (cuBLAS): available: cuBLAS [0-9.]* (libcublas.so.13) from $libdir/libcublas.so.13" \
        "dense path (cuBLASLt): available: libcublasLt.so.13 from $libdir/libcublasLt.so.13" \
        "tensor parallel --tp (NCCL): available: NCCL [0-9.]* (libnccl.so.2) from $libdir/libnccl.so.2"
    do
        grep -qx "$want" "$T/version.txt" || fail "version from the tree lacks: $want"
    done
    for f in LICENSE.cublas.txt LICENSE.nccl.txt; do
        [ -s "$tree/usr/share/doc/cuda/$f" ] || fail "no licence $f in the tree"
        grep -q "$f" "$tree/MANIFEST" || fail "$f is not in MANIFEST"
    done
    # and what they need comes from the tree too (the loader's trace of every file it loads)
    env -i LD_DEBUG=libs LD_LIBRARY_PATH="$libdirs" "$tree$interp" --inhibit-cache \
        --library-path "$libdirs" "$tree/bin/deltaserve" version > /dev/null 2> "$T/ld.txt"
    outside=$(sed -n 's/.*calling init: //p' "$T/ld.txt" | sort -u | grep -v "^$tree/" || true)
    [ -z "$outside" ] || fail "version loaded libraries from outside the tree: $outside"
    grep -q "calling init: $libdir/libnccl.so.2" "$T/ld.txt" || fail "no loader trace of NCCL"
    echo "the tree's cuBLAS, cuBLASLt and NCCL load from $libdir, with their dependencies"
else
    grep -q '^cuda: not built' "$T/version.txt" || fail "a CPU-only binary's version says why"
    ! ls "$tree"/lib/x86_64-linux-gnu/libcublas* > /dev/null 2>&1 ||
        fail "a CPU-only binary's tree carries cuBLAS"
    echo "CPU-only binary (no CUDA toolkit at build time): no GPU libraries to check"
fi

run gguf synth --preset tiny --quant f32 --seed 1 -o "$T/tiny.gguf" > /dev/null ||
    fail "gguf synth from the tree"

# Starts a server from the tree with stderr in $T/NAME.log; waits for "listening on" (or death).
start() {
    local name=$1; shift
    run_exec "$@" 2> "$T/$name.log" < /dev/null &
    pids+=("$!")
    local pid=$! deadline=$((SECONDS + 60))
    until grep -q 'listening on' "$T/$name.log"; do
        kill -0 "$pid" 2>/dev/null || fail "$name exited before listening"
        [ $SECONDS -lt $deadline ] || fail "$name did not listen within 60 s"
        sleep 0.05 # polls the log for the line each server prints once bound
    done
    ADDR=127.0.0.1:$(grep -m1 -o 'listening on [^ ]*' "$T/$name.log" | sed 's/.*://')
}

start worker worker --model "$T/tiny.gguf" --listen 127.0.0.1:0 --threads 1
worker_pid=${pids[-1]}
worker_addr=$ADDR
start router router --listen 127.0.0.1:0 --workers "$worker_addr" --model "$T/tiny.gguf" --poll-ms 100
router_pid=${pids[-1]}
router_addr=$ADDR

# Stream one generation through the router (retries while the router has no healthy worker
# yet: it answers UNAVAILABLE at once until its first health poll).
deadline=$((SECONDS + 60))
until run client --addr "$router_addr" --prompt "Hello" --max-tokens 8 --ignore-eos --verbose \
        > "$T/client.out" 2> "$T/client.log"; do
    grep -q "UNAVAILABLE" "$T/client.log" || fail "client from the tree failed"
    [ $SECONDS -lt $deadline ] || fail "router never became ready"
    sleep 0.1 # waits for the router's next health poll of the worker
done
[ -s "$T/client.out" ] || fail "the client printed no text"
grep -q "length" "$T/client.log" || fail "no finish_reason length in the client summary"
echo "streamed through the tree's router and worker: $(head -c 80 "$T/client.out" | tr -d '\n')"

# Every file mapped by the servers comes from the tree (no host library slipped in).
for pid in "$worker_pid" "$router_pid"; do
    outside=$(awk '$6 ~ /^\// { print $6 }' "/proc/$pid/maps" | sort -u |
              grep -v "^$(readlink -f "$tree")/" | grep -v "^$T/tiny.gguf$" || true)
    [ -z "$outside" ] || fail "pid $pid mapped files outside the tree: $outside"
    n=$(awk '$6 ~ /\.so/ { print $6 }' "/proc/$pid/maps" | sort -u | wc -l)
    [ "$n" -gt 10 ] || fail "pid $pid maps only $n shared objects: is /proc/PID/maps readable?"
done
echo "worker and router mapped only the tree's files (and the model)"

# SIGTERM: both drain and exit 0.
kill -TERM "$router_pid"
wait "$router_pid" || fail "router exited $? on SIGTERM"
kill -TERM "$worker_pid"
wait "$worker_pid" || fail "worker exited $? on SIGTERM"
pids=()
echo "runtime tree: ok ($(du -sh "$tree" | cut -f1), $(grep -c . "$tree/MANIFEST") files)"
