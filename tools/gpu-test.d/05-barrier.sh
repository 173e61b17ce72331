# What a phase boundary costs: grid barrier in a persistent kernel vs graph kernel boundaries.
step grid_barrier_bench 60 "$here/bin/grid_barrier_bench" 1000
