#!/usr/bin/env bash
# gpu_run.sh PROGRAM ARGS...: runs PROGRAM (a runfiles path such as cli/deltaserve) with ARGS
# where a GPU is listed (gpu_lib.sh's require_gpu: without one, fails under DS_REQUIRE_GPU=1,
# else skips). The GPU steps that are one command (bench/cuda/BUILD: synthetic models,
# `deltaserve bench decode/batch`) are this script with their command as args.
set -euo pipefail
. tests/gpu/gpu_lib.sh  # paths are relative to the runfiles root, the working directory
[ $# -ge 1 ] || { echo "usage: gpu_run.sh PROGRAM [ARGS...]" >&2; exit 2; }
require_gpu "$*"
exec "$@"
