#!/usr/bin/env bash
# Runs a Python unittest file (first argument) with the system's python3; the rest are its
# arguments.
set -euo pipefail
exec /usr/bin/python3 "$@"
