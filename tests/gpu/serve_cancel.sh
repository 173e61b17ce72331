#!/usr/bin/env bash
# serve_cancel.sh MODEL: cancellation under load on the GPU. One router and one
# `worker --device cuda` on loopback; bench/loadgen with 64 concurrent streams, 1,000 streams
# each cancelled after 0..64 of its 128 tokens (some before the first). Passes when loadgen's
# checks pass (the worker's GetLoad after: free slots and KV blocks back, nothing running or
# waiting) and the worker's GPU memory (nvidia-smi, the worker process) is the same after as
# before. Paths are relative to the runfiles root (tests/gpu/gpu_lib.sh).
set -uo pipefail
. tests/gpu/gpu_lib.sh
[ $# -eq 1 ] || { echo "usage: serve_cancel.sh MODEL.gguf" >&2; exit 2; }
require_gpu "serve_cancel"
[ -s "$1" ] || { echo "serve_cancel: no model $1 (tools/gpu-test makes synth/SIZE.gguf)"; exit 1; }
wp=50171 rp=50172
serve_up cancel "$wp" "$rp" --model "$1" --device cuda
ids=9,8,7,6,5,4,3,2,1,10,11,12,13,14,15,16
worker_mem() {
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
        awk -F', ' -v p="$wpid" '$1 == p {print $2}'
}
# every path warm first (a stream of each kind), then the worker's memory
bench/loadgen --addr 127.0.0.1:$rp --concurrency 64 --requests 64 --ids $ids --max-tokens 128 \
    --ignore-eos > /dev/null
mem0=$(worker_mem)
bench/loadgen --addr 127.0.0.1:$rp --concurrency 64 --warmup 64 --requests 1000 --ids $ids \
    --max-tokens 128 --ignore-eos --cancel-after 64 --load-addr 127.0.0.1:$wp --timeout-ms 120000
rc=$?
mem1=$(worker_mem)
echo "worker GPU memory (MiB, nvidia-smi): ${mem0:-?} before, ${mem1:-?} after"
[ -n "$mem0" ] && [ "$mem0" = "$mem1" ] || rc=1
serve_down
echo "--- worker log (requests: $(grep -c 'info request' "$wlog"), cancelled: $(grep -c 'CANCELLED' "$wlog"))"
grep -v "info request" "$wlog" | tail -5
exit $rc
