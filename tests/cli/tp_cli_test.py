"""deltaserve eval / generate / worker with --tp (tensor parallel; the CPU simulates the ranks).

eval --tp 2 (and --tp 4 where the model's heads split) gives the logits of eval --tp 1 on every
reference case, prompt + greedy rows, in prefill mode and in prompt-then-decode mode, within
5e-5 * max|logit| per row (tests/model:forward_tp_test holds the strict bound: 1e-5 or the
unsharded forward's own rounding floor; measured worst 2e-5); generate --temperature 0 --tp 2
prints the same ids as --tp 1. Refusals are one line: an N the heads do not split (exit 1, the
dimension named), --tp > 1 with --device cuda on a host without that many GPUs or without the
NCCL path (worker: exit 2 before listening), a negative --tp.
Needs DS_BIN (set by run_py.sh); the cases are forward_cli_test.py's (shared + tests/reference)."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from forward_cli_test import CASES, REF, check, failures, one_line_error, read_f32, run, worst_row_rel  # noqa: E402

TOL = 5e-5


def splits(meta, n):
    """Whether the case's heads split over n ranks (model/tp_shard.h's rules)."""
    c = meta["config"]
    n_h, n_kv = c["num_attention_heads"], c["num_key_value_heads"]
    n_k, n_v = c["linear_num_key_heads"], c["linear_num_value_heads"]
    rho = n_v // n_k
    return (n_h % n == 0 and (n_kv % n == 0 or n % n_kv == 0) and c["intermediate_size"] % n == 0
            and (n_k % n == 0 or (n % n_k == 0 and rho % (n // n_k) == 0)))


def test_eval(tmp):
    check(len(CASES) > 0, f"reference cases found in {REF} or tests/reference")
    ran = {2: 0, 4: 0}
    for name, d in CASES:
        model = os.path.join(d, name + ".gguf")
        meta = json.load(open(os.path.join(d, name + ".json")))
        V = meta["vocab_size"]
        p = meta["prompts"][-1]
        ids = p["ids"] + p["greedy"]
        rows = len(ids)
        arg = ",".join(map(str, ids))
        for mode in ("prefill", "decode"):
            extra = ["--mode", mode, "--prompt-len", str(len(p["ids"]))]
            one = os.path.join(tmp, "tp1.f32")
            r = run("eval", "--model", model, "--ids", arg, "--logits-out", one, "--threads", "2", *extra)
            check(r.returncode == 0, f"{name} eval --tp 1 --mode {mode}: exit {r.returncode} {r.stderr[-300:]!r}")
            if r.returncode:
                continue
            ref = read_f32(one)
            for n in (2, 4):
                out = os.path.join(tmp, f"tp{n}.f32")
                r = run("eval", "--model", model, "--ids", arg, "--logits-out", out, "--threads", "2",
                        "--tp", str(n), *extra)
                if not splits(meta, n):
                    check(one_line_error(r, 1) and b"do not split" in r.stderr,
                          f"{name} eval --tp {n}: refused in one line ({r.stderr.strip()!r})")
                    continue
                check(r.returncode == 0, f"{name} eval --tp {n} --mode {mode}: exit {r.returncode} {r.stderr[-300:]!r}")
                if r.returncode:
                    continue
                got = read_f32(out)
                rel = worst_row_rel(got, ref, rows, V) if len(got) == len(ref) == rows * V else float("inf")
                check(rel <= TOL, f"{name} eval --tp {n} --mode {mode} ({rows} rows) vs --tp 1: worst row rel {rel:.3g}")
                ran[n] += mode == "prefill"
    check(ran[2] == len(CASES) and ran[4] >= 1, f"cases compared: {ran[2]} at --tp 2, {ran[4]} at --tp 4")


def test_generate():
    for name, d in CASES:
        model = os.path.join(d, name + ".gguf")
        meta = json.load(open(os.path.join(d, name + ".json")))
        p = meta["prompts"][0]
        arg = ",".join(map(str, p["ids"]))
        outs = []
        for n in (1, 2):
            r = run("generate", "--model", model, "--ids", arg, "--max-tokens", "24", "--print-ids",
                    "--threads", "2", "--tp", str(n))
            check(r.returncode == 0, f"{name} generate --tp {n}: exit {r.returncode} {r.stderr[-300:]!r}")
            outs.append(r.stdout.strip())
            if n == 2:
                check(b"tensor parallel: 2 simulated ranks" in r.stderr, f"{name} generate --tp 2 names the split")
        check(len(outs[0]) > 2 and outs[0] == outs[1], f"{name} generate --tp 2 == --tp 1: {outs[1][:60]!r}")


def test_errors(tmp):
    name, d = next((c for c in CASES if c[0].endswith("r2-tied")), CASES[0])
    model = os.path.join(d, name + ".gguf")
    out = os.path.join(tmp, "x.f32")
    r = run("eval", "--model", model, "--ids", "1,2", "--logits-out", out, "--tp", "3")
    check(one_line_error(r, 1) and b"n_h = 4 query heads do not split over 3 ranks" in r.stderr,
          f"eval --tp 3: one line naming n_h ({r.stderr.strip()!r})")
    gpu_msg = (b"needs 2 GPUs, this host has",)
    r = run("eval", "--model", model, "--ids", "1,2", "--logits-out", out, "--tp", "2", "--device", "cuda")
    check(one_line_error(r, 1) and any(m in r.stderr for m in gpu_msg),
          f"eval --tp 2 --device cuda: one line ({r.stderr.strip()!r})")
    r = run("worker", "--model", model, "--listen", "127.0.0.1:0", "--tp", "2", "--device", "cuda")
    check(one_line_error(r, 2) and r.stderr.startswith(b"deltaserve worker: --tp 2")
          and any(m in r.stderr for m in gpu_msg) and not r.stdout,
          f"worker --tp 2 --device cuda: one line, exit 2 ({r.stderr.strip()!r})")
    # the ranks' GPUs named: a list must match --tp, and the GPUs must be there
    for args, want in ((["--device", "cuda:0,1"], b"lists 2 GPUs: give --tp 2"),
                       (["--device", "cuda:0,1,2", "--tp", "2"], b"lists 3 GPUs for --tp 2"),
                       (["--device", "cuda:2,3", "--tp", "2"], b"needs 4 GPUs, this host has"),
                       (["--device", "cuda:0,x", "--tp", "2"], b"expected cuda, cuda:N or cuda:A,B")):
        r = run("worker", "--model", model, "--listen", "127.0.0.1:0", *args)
        check(one_line_error(r, 2) and want in r.stderr and not r.stdout,
              f"worker {' '.join(args)}: one line, exit 2 ({r.stderr.strip()!r})")
    r = run("worker", "--model", model, "--listen", "127.0.0.1:0", "--tp", "-1")
    check(one_line_error(r, 2), f"worker --tp -1: one line, exit 2 ({r.stderr.strip()!r})")
    r = run("generate", "--model", model, "--ids", "1,2", "--tp", "3")
    check(one_line_error(r, 1) and b"do not split" in r.stderr, f"generate --tp 3: one line ({r.stderr.strip()!r})")


def main():
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        test_eval(tmp)
        test_generate()
        test_errors(tmp)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
