#!/usr/bin/env bash
# Runs gguf_py_crosscheck.py (args: HELPER SCRIPT) with the project venv made by tools/setup,
# found through $DS_REPO_ROOT or by walking up from this script's real location.
set -euo pipefail
helper=$1
script=$2
root=${DS_REPO_ROOT:-}
if [ -z "$root" ]; then
    d=$(dirname "$(readlink -f "$0")")
    while [ "$d" != / ] && [ ! -x "$d/.venv/bin/python" ]; do d=$(dirname "$d"); done
    root=$d
fi
py=$root/.venv/bin/python
if [ ! -x "$py" ]; then
    echo "gguf_py_crosscheck: no $py (run tools/setup)" >&2
    exit 1
fi
exec "$py" "$script" "$helper" "${TEST_TMPDIR:-/tmp}/gguf_py_crosscheck.$$"
