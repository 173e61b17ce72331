step gemv_bench 240 "$here/bin/gemv_bench" 200
