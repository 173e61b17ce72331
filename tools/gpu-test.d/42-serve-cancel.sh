# Cancellation under load on the GPU (issue 13): one router and one `worker --device cuda`,
# bench/loadgen with 64 concurrent streams, 1,000 streams each cancelled after 0..64 of its 128
# tokens (some before the first); the worker's GetLoad (free slots and KV blocks, nothing
# running or waiting) and its GPU memory (nvidia-smi, the worker process) must be the same
# after as before. DS_GPU_SERVE: the models (default 4b).
serve_cancel() { # serve_cancel SIZE
    local wp=50171 rp=50172 rc mem0 mem1 wlog rlog wpid rpid
    serve_up cancel-$1 $wp $rp --model /tmp/synth-$1.gguf --device cuda
    # warm every path first (a stream of each kind), then the worker's memory
    "$here/bin/loadgen" --addr 127.0.0.1:$rp --concurrency 64 --requests 64 \
        --ids 9,8,7,6,5,4,3,2,1,10,11,12,13,14,15,16 --max-tokens 128 --ignore-eos > /dev/null
    mem0=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p=$wpid '$1 == p {print $2}')
    "$here/bin/loadgen" --addr 127.0.0.1:$rp --concurrency 64 --warmup 64 --requests 1000 \
        --ids 9,8,7,6,5,4,3,2,1,10,11,12,13,14,15,16 --max-tokens 128 --ignore-eos \
        --cancel-after 64 --load-addr 127.0.0.1:$wp --timeout-ms 120000
    rc=$?
    mem1=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p=$wpid '$1 == p {print $2}')
    echo "worker GPU memory (MiB, nvidia-smi): ${mem0:-?} before, ${mem1:-?} after"
    [ -n "$mem0" ] && [ "$mem0" = "$mem1" ] || rc=1
    kill $rpid $wpid 2>/dev/null; wait $rpid $wpid 2>/dev/null
    echo "--- worker log (requests: $(grep -c 'info request' "$wlog"), cancelled: $(grep -c 'CANCELLED' "$wlog"))"
    grep -v "info request" "$wlog" | tail -5
    return $rc
}
if [ -x "$here/bin/deltaserve" ] && [ -x "$here/bin/loadgen" ]; then
    for p in ${DS_GPU_SERVE:-4b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        step "serve_cancel_$p" 300 bash -c "$(declare -f serve_up serve_cancel); here='$here'; serve_cancel $p"
    done
fi
