#!/usr/bin/env bash
# Runs a Python check of the shipped models (models/) with the project venv (.venv from
# tools/setup): models_py_test.sh SCRIPT [ARGS...] runs .venv/bin/python SCRIPT ARGS with the
# reference folders (DS_REFERENCE_DIR, DS_REPO_REFERENCE_DIR; tests/testutil/refcases.py) set
# to the runfiles' models/ alone, and DS_BIN to the runfiles' deltaserve when it is there.
set -euo pipefail
script=$(readlink -f "$1")
shift
. "$(dirname "$0")/../testutil/venv.sh" # sets ds_root, ds_py
DS_REFERENCE_DIR=$PWD/models
DS_REPO_REFERENCE_DIR=$PWD/models
export DS_REFERENCE_DIR DS_REPO_REFERENCE_DIR PYTHONDONTWRITEBYTECODE=1
if [ -z "${DS_BIN:-}" ] && [ -x cli/deltaserve ]; then
    DS_BIN=$PWD/cli/deltaserve
    export DS_BIN
fi
exec "$ds_py" "$script" "$@"
