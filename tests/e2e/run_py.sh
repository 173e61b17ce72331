#!/usr/bin/env bash
# Runs an end-to-end Python test under Bazel: run_py.sh system|venv SCRIPT [ARGS...]
#   system: Debian's /usr/bin/python3 (python3-grpcio, python3-grpc-tools)
#   venv:   the project venv made by tools/setup (grpcio-reflection, grpcio-health-checking)
# Exports DS_BIN (the deltaserve binary from the runfiles) and DS_REPO_ROOT when unset.
set -euo pipefail
which_py=$1
script=$2
shift 2
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd -P)
if [ -z "${DS_REPO_ROOT:-}" ]; then
    DS_REPO_ROOT=$(cd "$here/../.." && pwd -P)
    export DS_REPO_ROOT
fi
if [ -z "${DS_BIN:-}" ] && [ -x cli/deltaserve ]; then
    DS_BIN=$(pwd -P)/cli/deltaserve
    export DS_BIN
fi
case $which_py in
    system) py=/usr/bin/python3 ;;
    venv)
        py=$DS_REPO_ROOT/.venv/bin/python
        [ -x "$py" ] || { echo "run_py.sh: $py missing: run tools/setup" >&2; exit 1; } ;;
    *) echo "run_py.sh: unknown python '$which_py'" >&2; exit 2 ;;
esac
export PYTHONDONTWRITEBYTECODE=1
exec "$py" "$script" "$@"
