#!/usr/bin/env bash
# //:tests (the root BUILD's test_suite) lists exactly the tests that are not tagged manual.
# Bazel cannot glob other packages' targets, so the list is written out; this test asks a
# separate Bazel (batch mode, its own output base under TEST_TMPDIR, the real workspace) and
# fails with the lines to paste into BUILD when a test was added or removed.
#   root_suite_test.sh ROOT_BUILD_FILE     (under bazel test)
#   tests/deploy/root_suite_test.sh --print  (from the repository: print the list)
set -euo pipefail

if [ "${1:-}" = "--print" ]; then
    ws=$(cd "$(dirname "$0")/../.." && pwd -P)
else
    # the workspace: DS_REPO_ROOT (tools/test exports it), else the real path of the BUILD
    ws=${DS_REPO_ROOT:-$(dirname "$(readlink -f "$1")")}
fi
[ -f "$ws/WORKSPACE" ] && [ -f "$ws/BUILD" ] || { echo "root_suite_test: no workspace at '$ws'" >&2; exit 1; }

# The packages to look in: every top-level folder holding a BUILD (not hidden: .venv* holds third-party BUILD
# files Bazel cannot load; not bazel-*), recursively.
universe=$(cd "$ws" && for d in */; do
    d=${d%/}
    case $d in bazel-*) continue ;; esac
    [ -L "$d" ] && continue
    [ -n "$(find "$d" \( -name BUILD -o -name BUILD.bazel \) -print -quit)" ] || continue
    echo "//$d/..."
done | paste -sd+ | sed 's/+/ + /g')

base=$(mktemp -d "${TEST_TMPDIR:-/tmp}/rootsuite.XXXXXX")
q() {
    (cd "$ws" && bazel --batch --output_user_root="$base/root" --output_base="$base/out" \
        query --noshow_progress "$1" 2> "$base/err") || { cat "$base/err" >&2; return 1; }
}
want=$(q "tests($universe) except attr(tags, '\\bmanual\\b', tests($universe))" | sort)
if [ "${1:-}" = "--print" ]; then
    sed 's/.*/        "&",/' <<<"$want"
    rm -rf "$base"
    exit 0
fi
have=$(q "tests(//:tests)" | sort)
chmod -R u+w "$base" 2>/dev/null || true
rm -rf "$base"

missing=$(comm -23 <(echo "$want") <(echo "$have"))
extra=$(comm -13 <(echo "$want") <(echo "$have"))
if [ -n "$missing$extra" ]; then
    [ -z "$missing" ] || { echo "tests not in //:tests:"; sed 's/^/  /' <<<"$missing"; }
    [ -z "$extra" ] || { echo "in //:tests but manual or gone:"; sed 's/^/  /' <<<"$extra"; }
    echo "fix: replace the generated block of the root BUILD with the output of"
    echo "     tests/deploy/root_suite_test.sh --print"
    exit 1
fi
echo "//:tests holds all $(grep -c . <<<"$want") non-manual tests"
