"""`deltaserve eval` and `deltaserve generate` on the demo model (models/README.md) against its
transformers reference case (models/NAME.json + NAME.logits.f32, made by tools/train/export.py
with the F16 values the GGUF holds): every logits row of every prompt within 1e-3 * max|logit|
in prefill mode and in prompt-prefill-then-decode mode (tests/cli/forward_cli_test.py's
test_eval on this case alone), and greedy generation reproducing the reference ids from --ids
and from the prompt text, and from --ids with speculative decoding by the model's MTP head
(--speculative-k 1 and 3: the same ids, verify runs in the summary line), and sampled generation
(temperature 0.8, top-p 0.95, a seed a prompt) giving with --speculative-k 2 the ids it gives
without, drafts accepted over the prompts. Needs DS_BIN and DS_REPO_REFERENCE_DIR (models_py_test.sh)."""
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
    sampled_accepted = 0
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
        # sampled: every verify row draws as a one-row step would, so the ids are those of
        # speculation off for the seed
        ids = ",".join(map(str, p["ids"]))
        base = ["generate", "--model", model, "--ids", ids, "--max-tokens", "48", "--print-ids",
                "--temperature", "0.8", "--top-p", "0.95", "--seed", str(5 + i)]
        r0 = fc.run(*base)
        r2 = fc.run(*base, "--speculative-k", "2", "--spec-gate=false", "--spec-min-acceptance", "0")
        err = r2.stderr.decode() if isinstance(r2.stderr, bytes) else r2.stderr
        m = re.search(r"speculative k 2: verify runs (\d+), drafted (\d+), accepted (\d+)", err)
        ok = (r0.returncode == 0 and r2.returncode == 0 and m is not None and
              json.loads(r2.stdout) == json.loads(r0.stdout) and int(m.group(1)) > 0)
        sampled_accepted += int(m.group(3)) if m else 0
        fc.check(ok, "generate %s prompt %d sampled --speculative-k 2: the ids of k 0, verify "
                 "runs %s" % (NAME, i, m.groups() if m else err.strip()))
    fc.check(sampled_accepted > 0, "sampled speculation: no draft accepted over the prompts")
    print("sampled, k 2: %d drafts accepted over the prompts" % sampled_accepted)
    print("%d failed" % len(fc.failures))
    return 1 if fc.failures else 0


if __name__ == "__main__":
    sys.exit(main())
