#!/usr/bin/env python3
"""Held-out perplexity of the demo model, by transformers and by `deltaserve eval`, on the same
tokens.

    perplexity.py --bin bazel-bin/cli/deltaserve [--model models/NAME.gguf] [--windows N]

The held-out stream (pack/heldout.u16.gz, prepare.py) is cut into consecutive windows of
recipe.TRAIN["seq_len"] tokens (all of them, or the first N); in each window every token after
the first is predicted from the ones before it in the window. Perplexity = exp(mean negative
log-likelihood) over those predictions. transformers: Qwen3_5ForCausalLM in float32 on the CPU
with the trained weights (train.py's shards, the GGUF's values). deltaserve: `deltaserve eval
--mode prefill --logits-out` per window, log-softmax here. Prints both, their relative
difference and the largest per-window difference; --json writes them.
"""
import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recipe  # noqa: E402


def nll_sum(logits, ids):
    """Sum over t of -log softmax(logits[t])[ids[t + 1]] (float64)."""
    x = logits[:-1].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(x - m).sum(axis=1)))
    return float((lse - x[np.arange(len(ids) - 1), ids[1:]]).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the deltaserve binary")
    ap.add_argument("--model", default="models/%s.gguf" % recipe.NAME)
    ap.add_argument("--run", default=".train/run", help="train.py's output (HF weights)")
    ap.add_argument("--pack", default=".train/pack")
    ap.add_argument("--windows", type=int, default=0, help="first N windows (default all)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--q8", action="store_true",
                    help="the GGUF's matrices are Q8_0 (export.py --q8): the HF model's too")
    a = ap.parse_args()
    import torch
    import export
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    T = recipe.TRAIN["seq_len"]
    with gzip.open(os.path.join(a.pack, "heldout.u16.gz"), "rb") as f:
        held = np.frombuffer(f.read(), dtype="<u2").astype(np.int64)
    n = held.size // T
    if a.windows:
        n = min(n, a.windows)
    meta = json.load(open(os.path.join(a.pack, "meta.json")))
    log = json.load(open(os.path.join(a.run, "log.json")))
    model = export.load_model(a.run, meta["vocab_size"], log.get("config"))[0]
    if a.q8:
        recipe.refgen().round_q8_matrices(model)
    hf, ds = [], []
    t_hf = t_ds = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.f32")
        for w in range(n):
            ids = held[w * T:(w + 1) * T]
            t0 = time.time()
            with torch.no_grad():
                lg = model(torch.from_numpy(ids)[None], use_cache=False).logits[0].numpy()
            hf.append(nll_sum(lg, ids))
            t1 = time.time()
            subprocess.run([a.bin, "eval", "--model", a.model, "--ids", ",".join(map(str, ids)),
                            "--mode", "prefill", "--threads", str(a.threads),
                            "--logits-out", out] + (["--exact-dot"] if a.q8 else []),
                           check=True, stderr=subprocess.DEVNULL)
            got = np.fromfile(out, dtype="<f4").reshape(T, -1)
            ds.append(nll_sum(got, ids))
            t_ds += time.time() - t1
            t_hf += t1 - t0
    count = n * (T - 1)
    ppl_hf = math.exp(sum(hf) / count)
    ppl_ds = math.exp(sum(ds) / count)
    worst = max(abs(h - d) / (T - 1) for h, d in zip(hf, ds))
    res = dict(model=os.path.basename(a.model), windows=n, window_tokens=T,
               predicted_tokens=count, ppl_transformers=ppl_hf, ppl_deltaserve=ppl_ds,
               nll_transformers=sum(hf) / count, nll_deltaserve=sum(ds) / count,
               rel_diff=abs(ppl_hf - ppl_ds) / ppl_hf, worst_window_nll_diff=worst,
               seconds_transformers=round(t_hf, 1), seconds_deltaserve=round(t_ds, 1))
    print(json.dumps(res, indent=1))
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
