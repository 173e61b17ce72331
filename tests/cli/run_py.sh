#!/usr/bin/env bash
# Runs a CLI test driver under Bazel with Debian's python3 (stdlib only):
#   run_py.sh SCRIPT [ARGS...]
# Exports DS_BIN (the deltaserve binary from the runfiles) when unset.
set -euo pipefail
script=$1
shift
if [ -z "${DS_BIN:-}" ] && [ -x cli/deltaserve ]; then
    DS_BIN=$(pwd -P)/cli/deltaserve
    export DS_BIN
fi
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 "$script" "$@"
