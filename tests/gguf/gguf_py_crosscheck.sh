#!/usr/bin/env bash
# Runs gguf_py_crosscheck.py (args: HELPER SCRIPT) with the project venv made by tools/setup,
# found through $DS_REPO_ROOT or by walking up from this script's real location.
set -euo pipefail
helper=$1
script=$2
. "$(dirname "$0")/../testutil/venv.sh" # sets ds_root, ds_py
exec "$ds_py" "$script" "$helper" "${TEST_TMPDIR:-/tmp}/gguf_py_crosscheck.$$"
