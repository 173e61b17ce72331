# Only with DS_GPU_AB=1: A/B of the warp graph's switches on each synthetic model, same host,
# same binary, each switch against the default: DS_PDL=0 (no programmatic dependent launch),
# DS_GEMV_PREFETCH=0 (no L2 prefetch), DS_GEMV_SHORT_FLAT=1 (short wide matrices on the flat
# kernel), DS_GDN_FUSED=1 (gated norm fused into gdn_decode). A variant may set several
# variables joined by commas ("DS_GEMV_WARP_FUSE=1,DS_GEMV_PAIR_MB=64"). With
# DS_GPU_AB_PARITY=1 each variant also runs engine_parity (the reference models, the worker
# backend) and, where the synthetic files exist, engine_parity on them (steps abpar_*).
if [ "${DS_GPU_AB:-0}" = 1 ] && [ -x "$here/bin/deltaserve" ]; then
    variants=${DS_GPU_AB_VARIANTS:-DS_PDL=0 DS_GEMV_PREFETCH=0 DS_GEMV_SHORT_FLAT=1 DS_GDN_FUSED=1}
    if [ "${DS_GPU_AB_PARITY:-0}" = 1 ]; then
        for v in $variants; do
            n="abpar_$(echo "$v" | tr ' ,=' '_+-')"
            step "$n" 150 env ${v//,/ } "$here/bin/engine_parity"
            if [ -s /tmp/synth-0.8b.gguf ] && [ -s /tmp/synth-4b.gguf ]; then
                step "${n}_synth" 150 env ${v//,/ } DS_ENGINE_GGUF=/tmp/synth-0.8b.gguf:/tmp/synth-4b.gguf \
                    DS_ENGINE_TOKENS=64 "$here/bin/engine_parity"
            fi
        done
    fi
    for p in ${DS_GPU_AB_MODELS:-0.8b 4b 27b}; do
        [ -s /tmp/synth-$p.gguf ] || continue
        for v in $variants; do
            n="ab_${p}_$(echo "$v" | tr ' ,=' '_+-')"
            step "$n" 60 env ${v//,/ } "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
        done
    done
fi
