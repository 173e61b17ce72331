#!/usr/bin/env bash
# Differential test of the C tokenizer against the Hugging Face `tokenizers` library (installed
# by tools/setup into .venv) on both reference models. Args: the oracle tool, the .py script.
set -euo pipefail
tool=$(readlink -f "$1")
script=$(readlink -f "$2")

root=${DS_REPO_ROOT:-}
if [ -z "$root" ]; then # walk up from this script's real path to the folder holding .venv
    d=$(dirname "$(readlink -f "$0")")
    while [ "$d" != / ] && [ ! -x "$d/.venv/bin/python" ]; do d=$(dirname "$d"); done
    root=$d
fi
py="$root/.venv/bin/python"
[ -x "$py" ] || { echo "no $py: run tools/setup" >&2; exit 1; }
ref=${DS_REFERENCE_DIR:-$root/../shared/reference}

for m in tiny-r2-tied tiny-r1-untied; do
    "$py" "$script" "$tool" "$ref/$m.gguf" "$ref/$m.json" "${DS_ORACLE_CASES:-3000}" 4242
done
