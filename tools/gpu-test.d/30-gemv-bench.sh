# GEMV bandwidth, the short list of shapes: the tuning table's plan, the warp kernel with 1, 2
# and 4 rows per warp, and the flat kernel; with the table's L2 prefetch and without.
step gemv_bench 90 "$here/bin/gemv_bench" 100 key
step gemv_bench_nopf 90 "$here/bin/gemv_bench" --prefetch 0 100 key
