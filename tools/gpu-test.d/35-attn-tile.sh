# The candidate prefill attention tile (bench/cuda/attn_tile.h) against attn_prefill_runs: one
# 256-row chunk at positions 0, 1792, 6912 and 31744, 0.8B / 4B / 27B heads; fails when the
# merged outputs disagree.
if [ -x "$here/bin/attn_tile_bench" ]; then
    step attn_tile_bench 120 "$here/bin/attn_tile_bench"
fi
