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
