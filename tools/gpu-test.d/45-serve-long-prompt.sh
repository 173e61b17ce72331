# Chunked prefill under load (issue 14): one router and one `worker --device cuda`, 32 streams
# generating DS_GPU_LONG_GEN (768) tokens each; a second loadgen sends one DS_GPU_LONG_PP-token
# (8192) prompt while they run. The first loadgen's inter-token latency p50 / p99 (client side,
# per token) against a run of the same 32 streams alone, and the long prompt's time to first
# token under that load. DS_GPU_LONG: the models (default 4b); worker --step-tokens
# DS_GPU_STEP_TOKENS (256).
serve_long_prompt() { # serve_long_prompt SIZE
    local rp=50162 pp=${DS_GPU_LONG_PP:-8192} gen=${DS_GPU_LONG_GEN:-768} wlog rlog wpid rpid
    serve_up long-$1 50161 $rp --model /tmp/synth-$1.gguf --device cuda --slots 48 \
        --ctx $((pp + 1024)) --step-tokens ${DS_GPU_STEP_TOKENS:-256}
    local streams="--addr 127.0.0.1:$rp --concurrency 32 --requests 32 --ids 9,8,7,6,5,4,3,2,1,10,11,12,13,14,15,16 --max-tokens $gen --ignore-eos --timeout-ms 120000"
    echo "--- 32 streams alone"
    "$here/bin/loadgen" $streams
    echo "--- 32 streams while one $pp-token prompt is admitted"
    "$here/bin/loadgen" $streams > /tmp/long-streams-$1.txt 2>&1 &
    local lpid=$!
    sleep 2
    echo "--- the $pp-token prompt (1 token generated)"
    "$here/bin/loadgen" --addr 127.0.0.1:$rp --concurrency 1 --requests 1 \
        --ids "$(seq -s, 1000 $((999 + pp)))" --max-tokens 1 --timeout-ms 120000
    local rc=$?
    wait $lpid || rc=1
    cat /tmp/long-streams-$1.txt
    kill $rpid $wpid 2>/dev/null; wait $rpid $wpid 2>/dev/null
    echo "--- worker log"; grep -v "info request" "$wlog" | tail -20
    return $rc
}
if [ -x "$here/bin/deltaserve" ] && [ -x "$here/bin/loadgen" ]; then
    for p in ${DS_GPU_LONG:-4b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        step "serve_long_prompt_$p" 300 bash -c "$(declare -f serve_up serve_long_prompt); here='$here'; serve_long_prompt $p"
    done
fi
