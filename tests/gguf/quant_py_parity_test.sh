#!/usr/bin/env bash
# Runs tests/gguf/quant_py_parity.py with the project venv (.venv from tools/setup, which has
# gguf-py and numpy): quant_py_parity_test.sh SCRIPT.py QUANT_PY_GEN.
set -euo pipefail
script=$(readlink -f "$1")
gen=$(readlink -f "$2")

root=${DS_REPO_ROOT:-}
if [ -z "$root" ]; then # walk up from this script's real path to the folder holding .venv
    d=$(dirname "$(readlink -f "$0")")
    while [ "$d" != / ] && [ ! -x "$d/.venv/bin/python" ]; do d=$(dirname "$d"); done
    root=$d
fi
py="$root/.venv/bin/python"
[ -x "$py" ] || { echo "no $py: run tools/setup" >&2; exit 1; }
work="${TEST_TMPDIR:-$(mktemp -d)}/quant_py"
exec "$py" "$script" "$gen" "$work"
