#!/usr/bin/env bash
# Fidelity on the GPU against Hugging Face: tests/cli/forward_cli_test.py with DS_DEVICE=cuda
# (every prompt of every reference case: eval logits in prefill and decode modes within 1e-3 of
# max|logit|, greedy generate exact) on the reference cases under tests/reference. Paths are
# relative to the runfiles root (tests/gpu/gpu_lib.sh); the test script is the runfiles' when
# there, else $DS_REPO_ROOT's; python3 from PATH (the test needs only its standard library).
set -euo pipefail
. tests/gpu/gpu_lib.sh
require_gpu "fidelity_cuda"
py=tests/cli/forward_cli_test.py
[ -f "$py" ] || py=${DS_REPO_ROOT:?DS_REPO_ROOT unset: no tests/cli/forward_cli_test.py}/$py
DS_BIN=$(pwd -P)/cli/deltaserve DS_DEVICE=cuda PYTHONDONTWRITEBYTECODE=1 exec python3 "$py"
