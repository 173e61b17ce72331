# The flat graph without programmatic dependent launch only (DS_PDL=0): what PDL adds.
for p in 0.8b 4b; do
    [ -s /tmp/synth-$p.gguf ] || continue
    DS_GEMV_KERNEL=flat DS_PDL=0 step "bench_decode_${p}_flat_nopdl" 60 "$here/bin/deltaserve" bench decode --model /tmp/synth-$p.gguf --ctx 4096 --tokens 256
done
