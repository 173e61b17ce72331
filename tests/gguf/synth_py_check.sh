#!/usr/bin/env bash
# Runs synth_py_check.py (args: DELTASERVE SCRIPT) with the project venv made by tools/setup,
# found through $DS_REPO_ROOT or by walking up from this script's real location.
set -euo pipefail
bin=$1
script=$2
root=${DS_REPO_ROOT:-}
if [ -z "$root" ]; then
    d=$(dirname "$(readlink -f "$0")")
    while [ "$d" != / ] && [ ! -x "$d/.venv/bin/python" ]; do d=$(dirname "$d"); done
    root=$d
fi
py=$root/.venv/bin/python
if [ ! -x "$py" ]; then
    echo "synth_py_check: no $py (run tools/setup)" >&2
    exit 1
fi
exec "$py" "$script" "$bin" "${TEST_TMPDIR:-/tmp}/synth_py_check.$$"
