#!/usr/bin/env bash
# Runs model_layers_test.py with the project venv on the C files given:
#   model_layers_test.sh SCRIPT.py FILE.c ...
set -euo pipefail
script=$(readlink -f "$1")
shift

. "$(dirname "$0")/../testutil/venv.sh" # sets ds_root, ds_py
exec "$ds_py" "$script" "$@"
