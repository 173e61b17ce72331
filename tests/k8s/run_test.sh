#!/usr/bin/env bash
# Runs a tests/k8s Python driver with the project venv (kubernetes-validate, PyYAML, grpcio and
# grpc_health from tools/setup): run_test.sh SCRIPT [ARGS...]
set -euo pipefail
. "$(dirname "$0")/../testutil/venv.sh"
script=$1
shift
export PYTHONDONTWRITEBYTECODE=1
exec "$ds_py" "$script" "$@"
