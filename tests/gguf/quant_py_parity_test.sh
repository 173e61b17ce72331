#!/usr/bin/env bash
# Runs tests/gguf/quant_py_parity.py with the project venv (.venv from tools/setup, which has
# gguf-py and numpy): quant_py_parity_test.sh SCRIPT.py QUANT_PY_GEN.
set -euo pipefail
script=$(readlink -f "$1")
gen=$(readlink -f "$2")

. "$(dirname "$0")/../testutil/venv.sh" # sets ds_root, ds_py
work="${TEST_TMPDIR:-$(mktemp -d)}/quant_py"
exec "$ds_py" "$script" "$gen" "$work"
