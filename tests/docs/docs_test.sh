#!/usr/bin/env bash
# docs_test.sh DOCS_TEST_PY DELTASERVE: runs the check with the system python3 (it needs no
# package); the repository is DS_REPO_ROOT, else found from the script's real path.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
exec python3 "$1" "$2"
