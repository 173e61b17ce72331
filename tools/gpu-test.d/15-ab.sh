# Only with DS_GPU_AB=1: A/B of the warp graph's switches on each synthetic model, same host,
# same binary, each switch against the default: DS_PDL=0 (no programmatic dependent launch),
# DS_GEMV_PREFETCH=0 (no L2 prefetch), DS_GEMV_SHORT_FLAT=1 (short wide matrices on the flat
# kernel), DS_GDN_FUSED=1 (gated norm fused into gdn_decode).
if [ "${DS_GPU_AB:-0}" = 1 ] && [ -x "$here/bin/deltaserve" ]; then
    for p in ${DS_GPU_AB_MODELS:-0.8b 4b 27b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        for v in ${DS_GPU_AB_VARIANTS:-DS_PDL=0 DS_GEMV_PREFETCH=0 DS_GEMV_SHORT_FLAT=1 DS_GDN_FUSED=1}; do
            n="ab_${p}_$(echo "$v" | tr ' =' '_-')"
            step "$n" 60 env $v "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
        done
    done
fi
