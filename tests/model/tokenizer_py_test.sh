#!/usr/bin/env bash
# Runs a Python tokenizer test with the project venv (.venv from tools/setup, which has gguf-py
# and Hugging Face tokenizers): tokenizer_py_test.sh SCRIPT.py BINARY [ARGS...] runs
#   .venv/bin/python SCRIPT.py BINARY REFERENCE_DIR [ARGS...]
set -euo pipefail
script=$(readlink -f "$1")
binary=$(readlink -f "$2")
shift 2

. "$(dirname "$0")/../testutil/venv.sh" # sets ds_root, ds_py
exec "$ds_py" "$script" "$binary" "${DS_REFERENCE_DIR:-$ds_root/../shared/reference}" "$@"
