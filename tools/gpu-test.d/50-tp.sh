# Tensor parallel on two GPUs (issues 15, 16): only where nvidia-smi lists two or more.
# Correctness: every prompt of the reference cases through `eval --device cuda --tp 2` against
# `--tp 1` (logits, worst max|d| / max|logit|, printed; bound 1e-3), and the synthetic 27B's
# first 64 tokens likewise when it was made. Speed: `bench decode` is single-GPU; a worker with
# --tp 2 behind a router under loadgen is the next step (issue 16).
tp_eval_check() { # tp_eval_check MODEL IDS: eval --tp 1 and --tp 2 on the same ids, compared
    "$here/bin/deltaserve" eval --model "$1" --ids "$2" --device cuda --logits-out /tmp/tp1.f32 || return 1
    "$here/bin/deltaserve" eval --model "$1" --ids "$2" --device cuda --tp 2 --logits-out /tmp/tp2.f32 || return 1
    python3 - "$1" <<'PY'
import sys, numpy as np
a = np.fromfile("/tmp/tp1.f32", dtype="<f4"); b = np.fromfile("/tmp/tp2.f32", dtype="<f4")
ok = a.size == b.size and np.isfinite(b).all()
w = float(np.max(np.abs(a - b)) / np.max(np.abs(a))) if ok else float("inf")
print("%s: --tp 2 vs --tp 1: worst max|d|/max|logit| %.3g over %d logits (bound 1e-3)" % (sys.argv[1], w, a.size))
sys.exit(0 if ok and w <= 1e-3 else 1)
PY
}
if [ -x "$here/bin/deltaserve" ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    for g in "$DS_REPO_ROOT"/tests/reference/*.gguf; do
        step "tp2_eval_$(basename "$g" .gguf)" 120 bash -c "$(declare -f tp_eval_check); here='$here'; tp_eval_check '$g' $(seq -s, 1 200)"
    done
    [ -s /tmp/synth-27b.gguf ] &&
        step "tp2_eval_27b" 240 bash -c "$(declare -f tp_eval_check); here='$here'; tp_eval_check /tmp/synth-27b.gguf $(seq -s, 1 64)"
fi

# The rest of issue 16's runs (only with two GPUs), each TP = 1 against TP = 2 in one step:
#  - greedy: 256 generated tokens of `generate --tp 2` equal to `--tp 1`'s (reference models,
#    synthetic 27B);
#  - speed: `bench decode` (batch 1, 4K context) and `bench batch` of the 27B on cuda:0 and on
#    cuda:0,1 --tp 2; tp_allreduce_bench: the step's all-reduces alone (µs a step at B = 1, 16,
#    64, 256: against the steps above, their share when nothing overlaps them);
#  - two workers, one a GPU (cuda:0, cuda:1), one router: loadgen with 64 streams, against one
#    worker alone in the same step (target: >= 1.8x).
tp_greedy_check() { # tp_greedy_check MODEL: 256 greedy ids, --tp 1 vs --tp 2
    local a b ids
    ids=$(seq -s, 1 16)
    a=$("$here/bin/deltaserve" generate --model "$1" --ids "$ids" --max-tokens 256 --print-ids --device cuda:0 --ctx 512) || return 1
    b=$("$here/bin/deltaserve" generate --model "$1" --ids "$ids" --max-tokens 256 --print-ids --device cuda:0,1 --tp 2 --ctx 512) || return 1
    if [ "$a" = "$b" ]; then echo "$1: 256 greedy ids equal at --tp 2 and --tp 1"; return 0; fi
    echo "$1: greedy ids differ"; echo "tp1 $a"; echo "tp2 $b"; return 1
}
serve_two() { # serve_two SIZE: loadgen 64 streams on one worker, then on two behind one router
    local m=/tmp/synth-$1.gguf i rc=0 n
    for n in 1 2; do
        local wp0=50161 wp1=50162 rp=50163 pids="" workers=127.0.0.1:50161
        "$here/bin/deltaserve" worker --model "$m" --device cuda:0 --listen 127.0.0.1:$wp0 > /tmp/two-w0.log 2>&1 &
        pids="$!"
        if [ $n = 2 ]; then
            "$here/bin/deltaserve" worker --model "$m" --device cuda:1 --listen 127.0.0.1:$wp1 > /tmp/two-w1.log 2>&1 &
            pids="$pids $!"; workers="$workers,127.0.0.1:$wp1"
        fi
        for i in $(seq 1 900); do
            # the worker's last start-up line ("info ready: MODEL, ..."; the CUDA engine's own
            # "cuda: ready:" comes before it)
            [ "$(cat /tmp/two-w0.log $([ $n = 2 ] && echo /tmp/two-w1.log) | grep -c ' info ready: ')" -ge $n ] && break
            sleep 0.2
        done
        "$here/bin/deltaserve" router --listen 127.0.0.1:$rp --workers "$workers" --poll-ms 100 > /tmp/two-r.log 2>&1 &
        pids="$pids $!"
        sleep 1
        echo "=== $n worker(s): $workers"
        "$here/bin/loadgen" --addr 127.0.0.1:$rp --concurrency 64 --warmup 64 --requests 256 \
            --ids 9,8,7,6,5,4,3,2,1,10,11,12,13,14,15,16 --max-tokens 128 --ignore-eos --timeout-ms 120000 || rc=1
        kill $pids 2>/dev/null; wait $pids 2>/dev/null
        grep -h " info ready: " /tmp/two-w0.log $([ $n = 2 ] && echo /tmp/two-w1.log)
    done
    return $rc
}
if [ -x "$here/bin/deltaserve" ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    for g in "$DS_REPO_ROOT"/tests/reference/*.gguf /tmp/synth-27b.gguf; do
        [ -s "$g" ] || continue
        step "tp2_greedy_$(basename "$g" .gguf)" 240 bash -c "$(declare -f tp_greedy_check); here='$here'; tp_greedy_check '$g'"
    done
    if [ -s /tmp/synth-27b.gguf ]; then
        step "tp_bench_decode_27b" 300 bash -c "'$here/bin/deltaserve' bench decode --model /tmp/synth-27b.gguf --ctx 4096 --tokens 256 --device cuda:0 &&
            '$here/bin/deltaserve' bench decode --model /tmp/synth-27b.gguf --ctx 4096 --tokens 256 --device cuda:0,1 --tp 2"
        step "tp_bench_batch_27b" 400 bash -c "'$here/bin/deltaserve' bench batch --model /tmp/synth-27b.gguf --prompt 512 --gen 128 --batch 1,16,64 --device cuda:0 &&
            '$here/bin/deltaserve' bench batch --model /tmp/synth-27b.gguf --prompt 512 --gen 128 --batch 1,16,64 --device cuda:0,1 --tp 2"
    fi
    [ -x "$here/bin/tp_allreduce_bench" ] &&
        step "tp_allreduce_bench" 120 "$here/bin/tp_allreduce_bench" --gpus 0,1 --hidden 5120 --layers 64
    for p in ${DS_GPU_SERVE:-4b}; do
        [ -s /tmp/synth-$p.gguf ] && [ -x "$here/bin/loadgen" ] &&
            step "serve_two_workers_$p" 400 bash -c "$(declare -f serve_two); here='$here'; serve_two $p"
    done
fi

# On a host with one GPU (issue 15): `--tp 2` refused at start, non-zero, in one line.
tp_refused() { # tp_refused MODEL
    local out rc
    out=$("$here/bin/deltaserve" eval --model "$1" --ids 1,2,3 --device cuda --tp 2 --logits-out /tmp/tp-refused.f32 2>&1)
    rc=$?
    echo "exit $rc: $out"
    [ $rc -ne 0 ] && [ "$(printf '%s\n' "$out" | grep -c .)" -eq 1 ] && printf '%s' "$out" | grep -q "needs 2 GPUs"
}
if [ -x "$here/bin/deltaserve" ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -eq 1 ]; then
    for g in "$DS_REPO_ROOT"/tests/reference/own-r2-tied.gguf; do
        [ -s "$g" ] && step "tp2_refused_one_gpu" 60 bash -c "$(declare -f tp_refused); here='$here'; tp_refused '$g'"
    done
fi
