#!/usr/bin/env bash
# One forward step's kernels under Nsight Compute (bench/cuda/step_profile.py says how the step
# is found and what it prints). Paths are relative to the runfiles root (tests/gpu/gpu_lib.sh).
#   step_profile.sh batch MODEL B      bench batch: B sequences of a 1-token prompt, then 2
#                                      decode steps of B rows; the last one profiled
#   step_profile.sh verify MODEL K     bench decode: verify runs of K+1 rows (--force-accept
#                                      0.7) at a 4K context; the last run profiled
#   step_profile.sh decode MODEL       bench decode at a 4K context: the last token profiled
# ncu: $NCU, else ncu on PATH, else the CUDA install's; --clock-control none (the lent hosts
# refuse clock locking). Prints step_profile.py's markdown table.
set -uo pipefail
. tests/gpu/gpu_lib.sh
mode=${1:-}
model=${2:-}
case $mode in batch|verify|decode) ;; *)
    echo "usage: step_profile.sh batch|verify|decode MODEL [B|K]" >&2; exit 2;; esac
require_gpu "step_profile $mode"
[ -s "$model" ] || { echo "step_profile: no model '$model' (tools/gpu-test makes synth/SIZE.gguf)"; exit 1; }
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
[ -x "$ncu" ] || { echo "step_profile: no ncu (set NCU)"; exit 1; }
case $mode in
    batch) args=(bench batch --model "$model" --prompt 1 --gen 2 --batch "${3:-64}") ;;
    verify) args=(bench decode --model "$model" --ctx 4096 --tokens 4 --warmup 2
                  --speculative-k "${3:-3}" --force-accept 0.7) ;;
    decode) args=(bench decode --model "$model" --ctx 4096 --tokens 2 --warmup 2) ;;
esac
csv=${TMPDIR:-/tmp}/step_profile_$$.csv
"$ncu" --clock-control none --metrics gpu__time_duration.sum --csv cli/deltaserve "${args[@]}" \
    > "$csv" 2> "$csv.err"
rc=$?
grep -E "decode:|speculative:|^ *[0-9]+ +[0-9]+ +[0-9]+ " "$csv" "$csv.err" | head -8
[ $rc -eq 0 ] || { echo "step_profile: ncu exited $rc"; tail -20 "$csv.err"; exit 1; }
python3 bench/cuda/step_profile.py "$csv" --markdown
