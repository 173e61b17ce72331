# GEMV bandwidth, the short list of shapes: the warp kernel (rows per warp by shape, 1, 2, 4) and
# the flat kernel; with the default L2 prefetch (1 group ahead) and without.
step gemv_bench 90 "$here/bin/gemv_bench" 100 key
DS_GEMV_PREFETCH=0 step gemv_bench_nopf 90 "$here/bin/gemv_bench" 100 key
