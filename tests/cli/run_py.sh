#!/usr/bin/env bash
# Runs a CLI test driver under Bazel:
#   run_py.sh [--venv] SCRIPT [ARGS...]
# with Debian's python3 (stdlib only), or with --venv the project venv made by tools/setup
# (DS_REPO_ROOT/.venv: jinja2, transformers, gguf-py). Exports DS_BIN (the deltaserve binary
# from the runfiles) when unset.
set -euo pipefail
py=/usr/bin/python3
if [ "$1" = --venv ]; then
    shift
    if [ -z "${DS_REPO_ROOT:-}" ]; then
        DS_REPO_ROOT=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd -P)
        export DS_REPO_ROOT
    fi
    py=$DS_REPO_ROOT/.venv/bin/python
    [ -x "$py" ] || { echo "run_py.sh: $py missing: run tools/setup" >&2; exit 1; }
fi
script=$1
shift
if [ -z "${DS_BIN:-}" ] && [ -x cli/deltaserve ]; then
    DS_BIN=$(pwd -P)/cli/deltaserve
    export DS_BIN
fi
export PYTHONDONTWRITEBYTECODE=1
exec "$py" "$script" "$@"
