"""End-to-end test of `deltaserve tokenize` / `deltaserve detokenize` on the reference models:
ids as a JSON array, exact text with no newline added, and the documented exit codes.

usage: tokenizer_cli_test.py DELTASERVE REFERENCE_DIR
The tokenizer entries of every reference case of REFERENCE_DIR (the shared folder) and of
tests/reference; the error cases use tiny-r2-tied of REFERENCE_DIR, else own-r2-tied of
tests/reference (refcases; both have 1029 ids).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "testutil"))
import refcases  # noqa: E402  (tests/testutil/refcases.py)

fails = 0


def reference_cases(shared):
    """(name, folder) of every reference case: NAME.gguf with NAME.json in the shared folder
    (when it exists), then in the repository's own folder ($DS_REPO_REFERENCE_DIR, else
    tests/reference under the working directory: the runfiles root under bazel, the repository
    root by hand). Sorted by name within each folder; tests/model/ref_cases.h does the same."""
    out, seen = [], set()
    for d in (shared, os.environ.get("DS_REPO_REFERENCE_DIR") or "tests/reference"):
        if not os.path.isdir(d) or os.path.realpath(d) in seen:
            continue
        seen.add(os.path.realpath(d))
        for f in sorted(os.listdir(d)):
            name = f[:-5]
            if f.endswith(".gguf") and os.path.exists(os.path.join(d, name + ".json")):
                out.append((name, d))
    return out


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what)


def run(ds, *args, stdin=None):
    return subprocess.run([ds, *args], input=stdin, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)


def main():
    ds, ref = sys.argv[1], sys.argv[2]
    all_cases = reference_cases(ref)
    check(len(all_cases) > 0, "reference cases found")
    for name, d in all_cases:
        model = "%s/%s.gguf" % (d, name)
        cases = json.load(open("%s/%s.json" % (d, name)))["tokenizer"]
        for c in cases:
            r = run(ds, "tokenize", "--model", model, "--text", c["text"])
            check(r.returncode == 0 and json.loads(r.stdout) == c["ids"]
                  and r.stdout.endswith(b"]\n"), "tokenize %r: %r" % (c["text"], r.stdout))
            r = run(ds, "tokenize", "--model", model, "--text-file", "-",
                    stdin=c["text"].encode())
            check(r.returncode == 0 and json.loads(r.stdout) == c["ids"],
                  "tokenize stdin %r" % c["text"])
            r = run(ds, "detokenize", "--model", model, "--ids", ",".join(map(str, c["ids"])))
            check(r.returncode == 0 and r.stdout == c["decoded"].encode(),
                  "detokenize %r: %r" % (c["ids"], r.stdout))
        r = run(ds, "detokenize", "--model", model, "--ids", json.dumps(cases[0]["ids"]))
        check(r.returncode == 0 and r.stdout == cases[0]["decoded"].encode(), "JSON-array ids")

    model = refcases.resolve_path("tiny-r2-tied", ".gguf")
    r = run(ds, "detokenize", "--model", model, "--ids", "1029")  # vocab is 1029
    check(r.returncode == 1 and r.stdout == b"" and r.stderr.count(b"\n") == 1
          and b"1029" in r.stderr, "unknown id: %r" % (r,))
    r = run(ds, "detokenize", "--model", model, "--ids", "1,two")
    check(r.returncode == 1 and r.stderr.count(b"\n") == 1, "unparsable ids: %r" % (r,))
    r = run(ds, "detokenize", "--model", ref + "/no-such.gguf", "--ids", "1")
    check(r.returncode == 1 and r.stderr.count(b"\n") == 1, "missing model: %r" % (r,))
    r = run(ds, "tokenize", "--model", model, "--text", b"bad \xff".decode("latin-1"))
    check(r.returncode == 0, "latin-1 text re-encoded by the shell is valid UTF-8")
    r = run(ds, "tokenize", "--model", model, "--text-file", "-", stdin=b"bad \xff")
    check(r.returncode == 1 and b"UTF-8" in r.stderr, "invalid UTF-8: %r" % (r,))
    r = run(ds, "tokenize", "--model", model)
    check(r.returncode == 2, "no text: usage")
    r = run(ds, "detokenize", "--model", model)
    check(r.returncode == 2, "no ids: usage")
    r = run(ds, "tokenize", "--model", model, "--text", "x", "--frobnicate")
    check(r.returncode == 2, "unknown flag: usage")
    r = run(ds, "detokenize", "--model", model, "--ids", "")
    check(r.returncode == 0 and r.stdout == b"", "empty id list prints nothing")
    r = run(ds, "tokenize", "--model", model, "--text", "user")  # 385,259 in tiny-r2-tied
    user = ",".join(map(str, json.loads(r.stdout))) if r.returncode == 0 else "385,259"
    r = run(ds, "detokenize", "--model", model, "--ids", "1025,%s,1026" % user)
    check(r.returncode == 0 and r.stdout == b"<|im_start|>user<|im_end|>", "specials: %r" % (r,))
    print("tokenizer CLI: %d failures" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
