# DS_GPU_REPEAT=1: what each kind of kernel costs inside the real step graph. For each model,
# `bench decode` plain, then with DS_STEP_REPEAT=<kind> (that kind's kernels recorded twice:
# the difference in µs/token is the cost of one copy of all of them). Table in $OUT/repeat.txt.
if [ "${DS_GPU_REPEAT:-0}" = 1 ] && [ -x "$here/bin/deltaserve" ]; then
    for p in ${DS_GPU_REPEAT_MODELS:-0.8b 4b 27b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        for kind in none norm quant in gdn gdnnorm prep attn out ffn down head; do
            rk=$kind; [ $kind = none ] && rk=
            n0=$(grep -c 'decode: ' "$log")
            DS_STEP_REPEAT=$rk step "repeat_${p}_$kind" 120 "$here/bin/deltaserve" bench decode \
                --model /tmp/synth-$p.gguf --ctx 4096 --tokens 128
            [ "$(grep -c 'decode: ' "$log")" -gt "$n0" ] || continue
            printf '%-6s %-8s %s\n' "$p" "$kind" \
                "$(grep 'decode: ' "$log" | tail -1 | sed 's/.*= //')" >> "$OUT/repeat.txt"
        done
    done
fi
