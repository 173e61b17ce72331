# The same binary with the previous graph (DS_GEMV_KERNEL=warp: warp GEMV, no fused epilogues,
# no PDL) and without PDL only: before/after on the same host in the same session.
for p in 0.8b 4b; do
    [ -s /tmp/synth-$p.gguf ] || continue
    DS_GEMV_KERNEL=warp step "bench_decode_${p}_warp" 60 "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
    DS_PDL=0 step "bench_decode_${p}_nopdl" 60 "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
done
