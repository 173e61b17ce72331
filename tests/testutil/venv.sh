# Sourced by sh_tests that run Python with the project venv (.venv from tools/setup):
#   . "$(dirname "$0")/../testutil/venv.sh"   (list //tests/testutil:venv.sh in data)
# Sets ds_root (the repository: $DS_REPO_ROOT, else the folder holding .venv found by walking
# up from the calling script's real path) and ds_py ($ds_root/.venv/bin/python); exits 1 with
# a message naming the missing python when there is none.
ds_root=${DS_REPO_ROOT:-}
if [ -z "$ds_root" ]; then
    ds_d=$(dirname "$(readlink -f "$0")")
    while [ "$ds_d" != / ] && [ ! -x "$ds_d/.venv/bin/python" ]; do ds_d=$(dirname "$ds_d"); done
    ds_root=$ds_d
fi
ds_py="$ds_root/.venv/bin/python"
[ -x "$ds_py" ] || { echo "$(basename "$0"): no $ds_py: run tools/setup" >&2; exit 1; }
