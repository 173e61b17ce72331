# GEMV bandwidth, the short list of shapes: warp kernel vs flat kernel (1 and 2 blocks in flight).
step gemv_bench 90 "$here/bin/gemv_bench" 100 key
