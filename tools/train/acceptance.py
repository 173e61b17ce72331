#!/usr/bin/env python3
"""The demo model's MTP head measured with deltaserve itself: speculative acceptance on held-out
text and the batch-1 decode speed with and without speculation, on the CPU or the GPU.

    acceptance.py --bin bazel-bin/cli/deltaserve [--model models/demo-en-17m.gguf]
                  [--pack .train/pack] [--prompts 32] [--prompt-tokens 64] [--max-tokens 128]
                  [--ks 0,1,2,3,4] [--threads 2] [--device cpu] [--rounds 1] [--json OUT]
                  [--temperature 0] [--seed 1]

Prompts: --prompts windows of --prompt-tokens ids at evenly spaced offsets of the held-out
stream (pack/heldout.u16.gz, prepare.py; documents the model never trained on). Each prompt is
decoded for --max-tokens tokens (greedily, or sampled at --temperature with --seed) by `deltaserve generate --ids .. --print-ids
--speculative-k K --spec-min-acceptance 0 --device D` (the worker's engine and speculative
path, one slot, --threads CPU threads: the CPU forward's, and the MTP head's, which drafts on the
CPU; never switched off by the rolling acceptance or the gate, so every run counts) for every K of --ks
(0: off). Per K, over all prompts: verify runs, drafted and accepted
tokens, the acceptance rate (accepted / drafted), the mean accepted length (tokens per verify
run: accepted / runs + 1) and the decode speed (decoded tokens / decode seconds, from each
run's summary line). The generated ids of every K must equal those of K = 0 (speculation
changes no token, greedy or sampled), else it exits 1. --rounds R repeats the whole set R times, the K in turn within a prompt, and
takes each K's median speed over the rounds (the CPU's other load drifts).
"""
import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys

import numpy as np

SUMMARY = re.compile(r"generate: .*generated tokens (\d+).*decode ([\d.]+) tok/s"
                     r"(?:, speculative k (\d+): verify runs (\d+), drafted (\d+), accepted (\d+))?")


def prompts(pack, n, p):
    with gzip.open(os.path.join(pack, "heldout.u16.gz"), "rb") as f:
        ids = np.frombuffer(f.read(), dtype="<u2").astype(np.int64)
    step = (ids.size - p) // n
    return [ids[i * step:i * step + p].tolist() for i in range(n)]


def generate(a, ids, k):
    cmd = [a.bin, "generate", "--model", a.model, "--ids", ",".join(map(str, ids)),
           "--max-tokens", str(a.max_tokens), "--print-ids", "--threads", str(a.threads),
           "--speculative-k", str(k), "--spec-min-acceptance", "0", "--spec-gate=false",
           "--device", a.device, "--temperature", str(a.temperature), "--seed", str(a.seed)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit("acceptance: %s failed: %s" % (" ".join(cmd[:4]), r.stderr.strip()))
    m = SUMMARY.search(r.stderr)
    if not m or (k and m.group(3) is None):
        sys.exit("acceptance: no summary%s in: %s" % (" with speculation" if k else "", r.stderr))
    n_gen, tps = int(m.group(1)), float(m.group(2))
    runs, drafted, accepted = (int(m.group(i)) for i in (4, 5, 6)) if k else (0, 0, 0)
    return json.loads(r.stdout), n_gen, tps, runs, drafted, accepted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="bazel-bin/cli/deltaserve")
    ap.add_argument("--model", default="models/demo-en-17m.gguf")
    ap.add_argument("--pack", default=".train/pack")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ks", default="0,1,2,3,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu | cuda (generate's --device)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    ks = [int(k) for k in a.ks.split(",")]
    if 0 not in ks:
        ks = [0] + ks
    ps = prompts(a.pack, a.prompts, a.prompt_tokens)
    tot = {k: dict(runs=0, drafted=0, accepted=0, tokens=0) for k in ks}
    speed = {k: [] for k in ks}
    for rnd in range(a.rounds):
        dec = {k: [0, 0.0] for k in ks}  # decoded tokens, seconds
        for i, p in enumerate(ps):
            ref = None
            for k in ks:
                ids, n_gen, tps, runs, drafted, accepted = generate(a, p, k)
                if k == 0:
                    ref = ids
                elif ids != ref:
                    sys.exit("acceptance: prompt %d: k=%d generated other ids than k=0" % (i, k))
                if n_gen > 1 and tps > 0:
                    dec[k][0] += n_gen - 1
                    dec[k][1] += (n_gen - 1) / tps
                if rnd == 0:
                    t = tot[k]
                    t["runs"] += runs
                    t["drafted"] += drafted
                    t["accepted"] += accepted
                    t["tokens"] += n_gen
        for k in ks:
            speed[k].append(dec[k][0] / dec[k][1] if dec[k][1] else 0.0)
    rows = []
    base = statistics.median(speed[0])
    print("k  verify runs  drafted  accepted  acceptance  mean accepted length  decode tok/s  speedup")
    for k in ks:
        t = tot[k]
        acc = t["accepted"] / t["drafted"] if t["drafted"] else None
        mal = t["accepted"] / t["runs"] + 1 if t["runs"] else None
        tps = statistics.median(speed[k])
        rows.append(dict(k=k, tokens=t["tokens"], verify_runs=t["runs"], drafted=t["drafted"],
                         accepted=t["accepted"], acceptance=acc, mean_accepted_length=mal,
                         decode_tok_s=tps, decode_tok_s_rounds=speed[k],
                         speedup=tps / base if base else None))
        print("%d  %11d  %7d  %8d  %10s  %20s  %12.1f  %7.3f" %
              (k, t["runs"], t["drafted"], t["accepted"], "%.4f" % acc if acc is not None else "-",
               "%.3f" % mal if mal is not None else "-", tps, tps / base if base else 0))
    out = dict(model=os.path.basename(a.model), prompts=a.prompts, prompt_tokens=a.prompt_tokens,
               max_tokens=a.max_tokens, threads=a.threads, device=a.device, rounds=a.rounds,
               temperature=a.temperature, seed=a.seed,
               source="pack/heldout.u16.gz, evenly spaced windows", results=rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
