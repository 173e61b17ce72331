#!/usr/bin/env python3
"""Trains the demo model (recipe.CONFIG) with Hugging Face transformers' Qwen3_5ForCausalLM.

    train.py --pack .train/pack --out DIR [--tiny] [--steps N] [--time-budget S] [--device D]

Reads pack/train.u16.gz and pack/heldout.u16.gz (prepare.py). Each step takes recipe.TRAIN's
`batch` windows of seq_len + 1 tokens at random offsets of the training stream; the loss is
the mean next-token cross-entropy. AdamW (decay on matrices only), bf16 autocast on CUDA (F32
master weights), linear warm-up then cosine decay driven by progress = max(step / planned
steps, seconds / time budget), so that a slower machine still ends its schedule in time.
The held-out loss (fixed windows) is measured every eval_every steps and at the end.

Writes to DIR: log.json (settings, versions, throughput, train loss every 10 steps, held-out
loss) and the weights as safetensors shards model-NN.safetensors of at most 15 MiB (the
device's transfer limit is 16 MiB a file): the 2-D matrices in F16 (exactly what the F16 GGUF
stores) and every other parameter in F32, HF names (lm_head.weight omitted: tied).
--tiny: recipe.TINY_CONFIG, for checking the loop on a CPU in seconds.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recipe  # noqa: E402

SHARD_BYTES = 15 << 20


def log(*a):
    print(*a, flush=True)


def load_u16(path):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype="<u2").astype(np.int64)


def build(vocab_size, tiny, device):
    from transformers import Qwen3_5ForCausalLM
    cfg, c, layer_types, sec = recipe.hf_config(vocab_size,
                                                recipe.TINY_CONFIG if tiny else None)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(recipe.TRAIN["seed"])
    model = Qwen3_5ForCausalLM(cfg).to(device=device, dtype=torch.float32)
    model.train()
    return model, cfg


def param_groups(model, weight_decay):
    decay, rest = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() == 2 else rest).append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=rest, weight_decay=0.0)]


def lr_at(progress, step, t):
    warm = min(1.0, (step + 1) / t["warmup_steps"])
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return t["lr"] * warm * (t["min_lr_frac"] + (1 - t["min_lr_frac"]) * cos)


def windows(tokens, starts, T, device):
    idx = torch.as_tensor(starts)[:, None] + torch.arange(T + 1)[None, :]
    w = tokens[idx].to(device, non_blocking=True)
    return w[:, :-1], w[:, 1:]


def loss_of(model, x, y, device):
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model, held, T, n, B, device):
    model.eval()
    n = min(n, (held.numel() - 1) // T)
    starts = np.arange(n) * T
    tot = 0.0
    for k in range(0, n, B):
        x, y = windows(held, starts[k:k + B], T, device)
        tot += float(loss_of(model, x, y, device)) * len(starts[k:k + B])
    model.train()
    return tot / n, n * T


def save_shards(model, out):
    sd = {k: v.detach() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    from safetensors.torch import save_file
    shards, cur, size = [], {}, 0
    for k in sorted(sd):
        v = sd[k].to("cpu")
        v = v.to(torch.float16) if v.dim() == 2 else v.to(torch.float32)
        b = v.numel() * v.element_size()
        if cur and size + b > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v.contiguous()
        size += b
    shards.append(cur)
    names = []
    for i, s in enumerate(shards):
        name = "model-%02d.safetensors" % i
        save_file(s, os.path.join(out, name), metadata=dict(format="pt"))
        names.append(name)
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", default=".train/pack")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="recipe.TINY_CONFIG (CPU check)")
    ap.add_argument("--steps", type=int, default=0, help="steps (default: epochs of the pack)")
    ap.add_argument("--batch", type=int, default=0, help="windows per step (default recipe)")
    ap.add_argument("--time-budget", type=float, default=0, help="seconds (default recipe)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    t = dict(recipe.TRAIN)
    if a.batch:
        t["batch"] = a.batch
    if a.time_budget:
        t["time_budget_s"] = a.time_budget
    T, B, dev = t["seq_len"], t["batch"], a.device
    os.makedirs(a.out, exist_ok=True)
    meta = json.load(open(os.path.join(a.pack, "meta.json")))
    train = torch.from_numpy(load_u16(os.path.join(a.pack, "train.u16.gz")))
    held = torch.from_numpy(load_u16(os.path.join(a.pack, "heldout.u16.gz")))
    steps = a.steps or max(1, int(t["epochs"] * train.numel() / (T * B)))

    import transformers
    import importlib.util
    kernels = {k: importlib.util.find_spec(k) is not None for k in ("fla", "causal_conv1d")}
    model, cfg = build(meta["vocab_size"], a.tiny, dev)
    n_params = sum(p.numel() for p in model.parameters())
    info = dict(name=meta["name"], device=dev,
                gpu=torch.cuda.get_device_name() if dev == "cuda" else None,
                torch=torch.__version__, transformers=transformers.__version__,
                config=recipe.TINY_CONFIG if a.tiny else recipe.CONFIG, train=t,
                params=n_params, train_tokens=int(train.numel()),
                heldout_tokens=int(held.numel()), planned_steps=steps, kernels=kernels)
    log(json.dumps(info))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    opt = torch.optim.AdamW(param_groups(model, t["weight_decay"]), lr=t["lr"],
                            betas=tuple(t["betas"]), eps=1e-8, fused=dev == "cuda")
    rng = np.random.default_rng(t["seed"])
    hist, evals = [], []
    t0 = time.time()
    step, progress = 0, 0.0
    while progress < 1.0:
        lr = lr_at(progress, step, t)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = windows(train, rng.integers(0, train.numel() - T - 1, size=B), T, dev)
        loss = loss_of(model, x, y, dev)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        step += 1
        el = time.time() - t0
        progress = max(step / steps, el / t["time_budget_s"])
        if step % 10 == 0 or step < 10 or progress >= 1.0:
            tok_s = step * B * T / el
            hist.append(dict(step=step, tokens=step * B * T, loss=float(loss), lr=lr,
                             grad_norm=float(gn), seconds=round(el, 2)))
            if step % 50 == 0 or step < 5 or progress >= 1.0:
                log("step %5d  loss %.4f  lr %.2e  |g| %.2f  %.0f tok/s  %.0f s" %
                    (step, float(loss), lr, float(gn), tok_s, el))
        if step % t["eval_every"] == 0 or progress >= 1.0:
            vl, vn = evaluate(model, held, T, t["eval_windows"], B, dev)
            evals.append(dict(step=step, tokens=step * B * T, heldout_loss=vl,
                              heldout_ppl=math.exp(vl), seconds=round(time.time() - t0, 2)))
            log("  held-out loss %.4f (ppl %.2f) over %d tokens" % (vl, math.exp(vl), vn))
    el = time.time() - t0
    shards = save_shards(model, a.out)
    info.update(steps=step, seconds=round(el, 1), tokens_seen=step * B * T,
                epochs_seen=step * B * T / train.numel(), tokens_per_s=step * B * T / el,
                train_loss=hist, heldout=evals, shards=shards)
    json.dump(info, open(os.path.join(a.out, "log.json"), "w"), indent=0)
    log("done: %d steps, %.1f epochs, %.0f s, final held-out loss %.4f; wrote %s" %
        (step, info["epochs_seen"], el, evals[-1]["heldout_loss"], ", ".join(shards)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
