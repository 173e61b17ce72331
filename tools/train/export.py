#!/usr/bin/env python3
"""Exports the trained demo model: F16 GGUF, reference case, loss curve.

    export.py --run .train/run --pack .train/pack --models models --png docs/demo-model-loss.png

--run holds train.py's output (model-NN.safetensors, log.json). Loads the weights into HF
transformers' Qwen3_5ForCausalLM (float32, eager attention, CPU; the matrices are F16 values,
so the HF model computes on exactly what the GGUF holds) and writes:
  MODELS/NAME.gguf          F16 matrices, F32 norms/conv/ssm_a/dt_bias (tools/refgen's export)
  MODELS/NAME.json,         a reference case in tests/reference/README.md's format (tools/refgen's
  MODELS/NAME.logits.f32    write_case): tokenizer entries, prompts, HF greedy and logits
  MODELS/NAME.train-log.json   train.py's log
  PNG                       train and held-out loss against tokens seen (matplotlib)
"""
import argparse
import glob
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recipe  # noqa: E402

# The reference case's prompts (text, greedy tokens): prose, a held-out-style sentence, a chat.
PROMPTS = [
    ("The Python interpreter", 24),
    ("A package manager installs software from", 16),
    ("<|im_start|>user\nWhat is a list in Python?<|im_end|>\n<|im_start|>assistant\n", 16),
]
TOKENIZER_TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; they've said it's theirs.",
    "In 1987 the town had 4,512 residents.",
    "def f(x):\n    return x * 2\n",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0",
    "  leading and   multiple spaces ",
    "tabs\tand\nnewlines\n\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<think>\n\n</think>\n\nThe apt-get command installs packages.<|im_end|><|endoftext|>",
    "DON'T SHOUT, THEY'LL hear",
    "PostgreSQL 15 supports JSON; Perl's regular expressions; Debian's dpkg.",
]


def load_model(run, vocab_size, config=None):
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3_5ForCausalLM
    cfg, c, layer_types, sec = recipe.hf_config(vocab_size, config)
    model = Qwen3_5ForCausalLM(cfg).float().eval()
    sd = {}
    for f in sorted(glob.glob(os.path.join(run, "model-*.safetensors"))):
        sd.update({k: v.to(torch.float32) for k, v in load_file(f).items()})
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert missing == ["lm_head.weight"] or not missing, missing  # tied to the embedding
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model, c, layer_types, sec


def plot(log, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tr = log["train_loss"]
    ho = log["heldout"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot([h["tokens"] / 1e6 for h in tr], [h["loss"] for h in tr], lw=0.8, alpha=0.8,
            label="training batch loss")
    ax.plot([h["tokens"] / 1e6 for h in ho], [h["heldout_loss"] for h in ho], "o-", ms=3,
            label="held-out loss (%d windows of %d tokens)" %
            (log["train"]["eval_windows"], log["train"]["seq_len"]))
    ep = log["train_tokens"] / 1e6
    for k in range(1, int(log["epochs_seen"]) + 1):
        ax.axvline(k * ep, color="grey", lw=0.3)
    ax.set_xlabel("tokens seen (millions; grey lines: epochs of %.1f M tokens)" % ep)
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_ylim(1, 9.5)
    ax.set_title("%s: %.1f M parameters, %d steps, %.0f s on one %s" %
                 (log["name"], log["params"] / 1e6, log["steps"], log["seconds"], log["gpu"]))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=".train/run")
    ap.add_argument("--pack", default=".train/pack")
    ap.add_argument("--models", default="models")
    ap.add_argument("--png", default="docs/demo-model-loss.png")
    ap.add_argument("--q8", action="store_true",
                    help="matrices Q8_0 in the GGUF (and rounded so in the HF model the reference "
                         "case comes from), about half the bytes of F16")
    a = ap.parse_args()
    import torch
    from tokenizers import Tokenizer
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    torch.use_deterministic_algorithms(True)
    mr = recipe.refgen()
    tk = Tokenizer.from_file(os.path.join(a.pack, "tokenizer.json"))
    V = tk.get_vocab_size()
    log = json.load(open(os.path.join(a.run, "log.json")))
    model, c, layer_types, sec = load_model(a.run, V, log.get("config"))
    name = recipe.NAME
    os.makedirs(a.models, exist_ok=True)
    if a.q8:
        mr.round_q8_matrices(model)
    mr.export_gguf(os.path.join(a.models, name + ".gguf"), name, model, c, layer_types, sec, tk,
                   f16=not a.q8, q8=a.q8)
    p = dict(seed=log["train"]["seed"], vocab_size=V, tokenizer_texts=TOKENIZER_TEXTS,
             prompts=PROMPTS)
    mr.write_case(name, a.models, p, model, tk, c, layer_types, sec,
                  extra=dict(weights="trained by tools/train/train.py (see models/README.md); "
                             "matrices %s in the GGUF and in the HF model" %
                             ("Q8_0" if a.q8 else "F16"), f16=not a.q8, q8=a.q8))
    shutil.copyfile(os.path.join(a.run, "log.json"), os.path.join(a.models, name + ".train-log.json"))
    plot(log, a.png)
    print("wrote %s/%s.{gguf,json,logits.f32,train-log.json} and %s" % (a.models, name, a.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
