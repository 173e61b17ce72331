#!/usr/bin/env bash
# Runs a Python tokenizer test with the project venv (.venv from tools/setup, which has gguf-py
# and Hugging Face tokenizers): tokenizer_py_test.sh SCRIPT.py BINARY [ARGS...] runs
#   .venv/bin/python SCRIPT.py BINARY REFERENCE_DIR [ARGS...]
set -euo pipefail
script=$(readlink -f "$1")
binary=$(readlink -f "$2")
shift 2

root=${DS_REPO_ROOT:-}
if [ -z "$root" ]; then # walk up from this script's real path to the folder holding .venv
    d=$(dirname "$(readlink -f "$0")")
    while [ "$d" != / ] && [ ! -x "$d/.venv/bin/python" ]; do d=$(dirname "$d"); done
    root=$d
fi
py="$root/.venv/bin/python"
[ -x "$py" ] || { echo "no $py: run tools/setup" >&2; exit 1; }
exec "$py" "$script" "$binary" "${DS_REFERENCE_DIR:-$root/../shared/reference}" "$@"
