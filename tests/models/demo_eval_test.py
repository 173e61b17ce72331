"""`deltaserve eval` and `deltaserve generate` on the demo model (models/README.md) against its
transformers reference case (models/NAME.json + NAME.logits.f32, made by tools/train/export.py
with the F16 values the GGUF holds): every logits row of every prompt within 1e-3 * max|logit|
in prefill mode and in prompt-prefill-then-decode mode (tests/cli/forward_cli_test.py's
test_eval on this case alone), and greedy generation reproducing the reference ids from --ids
and from the prompt text, and from --ids with speculative decoding by the model's MTP head
(--speculative-k 1 and 3: the same ids, verify runs in the summary line). Needs DS_BIN and DS_REPO_REFERENCE_DIR (models_py_test.sh)."""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "cli"))
import forward_cli_test as fc  # noqa: E402  (tests/cli/forward_cli_test.py)

NAME = "demo-en-17m"
DIR = os.environ.get("DS_REPO_REFERENCE_DIR", "models")


def main():
    fc.CASES = [(NAME, DIR)]
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        fc.test_eval(tmp)
    model = os.path.join(DIR, NAME + ".gguf")
    meta = json.load(open(os.path.join(DIR, NAME + ".json")))
    for i, p in enumerate(meta["prompts"]):
        n = str(len(p["greedy"]))
        for how, arg in (("--ids", ",".join(map(str, p["ids"]))), ("--prompt", p["text"])):
            r = fc.run("generate", "--model", model, how, arg, "--max-tokens", n,
                       "--temperature", "0", "--print-ids")
            ok = r.returncode == 0 and json.loads(r.stdout) == p["greedy"]
            fc.check(ok, "generate %s prompt %d %s: the reference greedy ids" % (NAME, i, how))
        for k in (1, 3):
            r = fc.run("generate", "--model", model, "--ids", ",".join(map(str, p["ids"])),
                       "--max-tokens", n, "--print-ids", "--speculative-k", str(k),
                       "--spec-gate=false")
            err = r.stderr.decode() if isinstance(r.stderr, bytes) else r.stderr
            m = re.search(r"speculative k %d: verify runs (\d+), drafted (\d+), accepted (\d+)" % k,
                          err)
            ok = (r.returncode == 0 and json.loads(r.stdout) == p["greedy"] and m is not None and
                  int(m.group(1)) > 0 and int(m.group(3)) <= int(m.group(2)))
            fc.check(ok, "generate %s prompt %d --speculative-k %d: the reference greedy ids, "
                     "verify runs %s" % (NAME, i, k, m.groups() if m else err.strip()))
    print("%d failed" % len(fc.failures))
    return 1 if fc.failures else 0


if __name__ == "__main__":
    sys.exit(main())
