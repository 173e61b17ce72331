#!/usr/bin/env bash
# deltaserve gguf synth from the command line: exit codes and one-line errors for bad flags,
# the one-line summary, the file size it reports, byte-identical output for one seed whatever
# the thread count, and a different file for another seed.
set -u
bin="$1"
if [ -n "${TEST_TMPDIR:-}" ]; then
    tmp="$TEST_TMPDIR"
else
    tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fi
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# usage errors: exit 2, exactly one line on stderr, nothing on stdout
expect_usage() {
    local out err rc
    out=$("$bin" gguf synth "$@" 2>"$tmp/err"); rc=$?
    err=$(cat "$tmp/err")
    [ "$rc" -eq 2 ] || fail "'$*': exit $rc, want 2"
    [ -z "$out" ] || fail "'$*': printed to stdout: $out"
    [ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "'$*': stderr is not one line: $err"
}
expect_usage --preset 5b -o "$tmp/x.gguf"
expect_usage --quant q5_k -o "$tmp/x.gguf"
expect_usage --bogus -o "$tmp/x.gguf"
expect_usage --threads many -o "$tmp/x.gguf"
expect_usage --seed -1 -o "$tmp/x.gguf"
expect_usage --preset tiny
[ ! -e "$tmp/x.gguf" ] || fail "a usage error left a file"

# runtime error: exit 1, one line naming the path
"$bin" gguf synth -o "$tmp/no/such/dir.gguf" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 1 ] || fail "unwritable path: exit $rc, want 1"
grep -q "$tmp/no/such/dir.gguf" "$tmp/err" || fail "error does not name the path: $(cat "$tmp/err")"

# a good run: one summary line whose byte count is the file size
out=$("$bin" gguf synth --preset tiny --quant q8_0 --seed 9 --threads 1 -o "$tmp/a.gguf"); rc=$?
[ "$rc" -eq 0 ] || fail "good run: exit $rc"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "summary is not one line: $out"
echo "$out"
bytes=$(printf '%s\n' "$out" | sed -n 's/.* bytes \([0-9]*\) .*/\1/p')
size=$(stat -c %s "$tmp/a.gguf" 2>/dev/null || echo 0)
[ -n "$bytes" ] && [ "$bytes" = "$size" ] || fail "summary bytes '$bytes' != file size $size"
printf '%s\n' "$out" | grep -q "preset tiny quant q8_0 tensors 55 " || fail "summary: $out"
[ "$(head -c 4 "$tmp/a.gguf")" = "GGUF" ] || fail "no GGUF magic"

# same seed, other thread count (flag and environment forms): same bytes; other seed: not
"$bin" gguf synth --preset tiny --quant q8_0 --seed 9 --threads 4 --output "$tmp/b.gguf" >/dev/null ||
    fail "second run failed"
DS_SYNTH_QUANT=q8_0 DS_SYNTH_SEED=10 "$bin" gguf synth -o "$tmp/c.gguf" >/dev/null ||
    fail "third run failed"
cmp -s "$tmp/a.gguf" "$tmp/b.gguf" || fail "same seed, threads 1 vs 4: files differ"
cmp -s "$tmp/a.gguf" "$tmp/c.gguf" && fail "seeds 9 and 10 gave the same file"
[ "$(stat -c %s "$tmp/c.gguf")" = "$size" ] || fail "seed changed the file size"

# --mtp: the 15 tensors of a converted MTP block as blk.4; gguf info reports them
out=$("$bin" gguf synth --preset tiny --quant q8_0 --seed 9 --mtp -o "$tmp/m.gguf") || fail "--mtp run failed"
printf '%s\n' "$out" | grep -q "preset tiny +mtp quant q8_0 tensors 70 " || fail "--mtp summary: $out"
info=$("$bin" gguf info "$tmp/m.gguf") || fail "gguf info on the --mtp file failed"
printf '%s\n' "$info" | grep -q "^mtp: 1 nextn layer(s) from blk.4: 15 tensors" ||
    fail "gguf info mtp line: $(printf '%s\n' "$info" | grep '^mtp')"
printf '%s\n' "$info" | grep -q "blk.4.nextn.eh_proj.weight *q8_0 *\[512, 256\]" ||
    fail "gguf info lacks blk.4.nextn.eh_proj.weight [512, 256]"
"$bin" gguf info "$tmp/a.gguf" | grep -q "^mtp: none" || fail "gguf info without MTP: no 'mtp: none'"

rm -f "$tmp/a.gguf" "$tmp/b.gguf" "$tmp/c.gguf" "$tmp/m.gguf" "$tmp/err"
if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "synth_cli_test: all checks passed"
