# Only with DS_GPU_AB=1: A/B of the warp graph's switches on each synthetic model, same host,
# same binary: the default, then DS_PDL=1 (programmatic dependent launch; the GEMV's first L2
# prefetches run before its griddepcontrol.wait), DS_GEMV_PREFETCH=0 (no L2 prefetch) and =2,
# and DS_GDN_FUSED=0 (gated norm as its own kernel).
if [ "${DS_GPU_AB:-0}" = 1 ] && [ -x "$here/bin/deltaserve" ]; then
    for p in ${DS_GPU_AB_MODELS:-0.8b 4b 27b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        for v in "DS_PDL=1" "DS_GEMV_PREFETCH=0" "DS_GEMV_PREFETCH=2" "DS_PDL=1 DS_GEMV_PREFETCH=2" "DS_GDN_FUSED=0"; do
            n="ab_${p}_$(echo "$v" | tr ' =' '_-')"
            step "$n" 60 env $v "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
        done
    done
fi
