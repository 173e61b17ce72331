# End to end on the GPU (issue 13): one router and one `worker --device cuda` on loopback, bench/
# loadgen with DS_GPU_SERVE_C concurrent streams (64) of a 16-token prompt and 128 generated
# tokens each: aggregate tok/s, TTFT and inter-token latency p50 / p99. DS_GPU_SERVE: the models
# (default 4b).
serve_loadgen() { # serve_loadgen SIZE: the worker and router logs go to the step's log
    local c=${DS_GPU_SERVE_C:-64} rp=50152 wlog rlog wpid rpid
    serve_up serve-$1 50151 $rp --model /tmp/synth-$1.gguf --device cuda
    "$here/bin/loadgen" --addr 127.0.0.1:$rp --concurrency "$c" --warmup "$c" --requests $((4 * c)) \
        --ids 9,8,7,6,5,4,3,2,1,10,11,12,13,14,15,16 --max-tokens 128 --ignore-eos --timeout-ms 120000
    local rc=$?
    kill $rpid $wpid 2>/dev/null; wait $rpid $wpid 2>/dev/null
    echo "--- worker log (requests: $(grep -c 'info request' "$wlog"))"; grep -v "info request" "$wlog"
    echo "--- router log"; tail -5 "$rlog"
    return $rc
}
if [ -x "$here/bin/deltaserve" ] && [ -x "$here/bin/loadgen" ]; then
    for p in ${DS_GPU_SERVE:-4b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        # step runs a command under timeout: the function travels as text
        step "serve_loadgen_$p" 300 bash -c "$(declare -f serve_up serve_loadgen); here='$here'; serve_loadgen $p"
    done
fi
