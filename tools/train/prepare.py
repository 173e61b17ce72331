#!/usr/bin/env python3
"""Trains the demo model's vocabulary on the corpus and packs the tokens for the GPU host.

    prepare.py --work .train        (reads .train/corpus/, writes .train/pack/)

The byte-level BPE of recipe.TRAIN_VOCAB tokens is trained on the training split with
tools/refgen's pipeline (NFC, the qwen35 split regex, ByteLevel; the 5 specials appended).
Every document is encoded and followed by <|endoftext|>; the chat pairs keep their
<|im_start|>/<|im_end|> as the special ids. Writes pack/tokenizer.json (HF tokenizers),
pack/train.u16.gz and pack/heldout.u16.gz (little-endian uint16 ids, documents in file order)
and pack/meta.json.
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np

import recipe


def read_docs(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def encode(tk, docs, eot):
    out = []
    texts = [d["text"] for d in docs]
    for k in range(0, len(texts), 2048):
        for e in tk.encode_batch(texts[k:k + 2048], add_special_tokens=False):
            out.extend(e.ids)
            out.append(eot)
    return np.asarray(out, dtype="<u2")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=".train")
    a = ap.parse_args()
    mr = recipe.refgen()
    train = read_docs(os.path.join(a.work, "corpus", "train.jsonl"))
    held = read_docs(os.path.join(a.work, "corpus", "heldout.jsonl"))
    t0 = time.time()
    tk = mr.train_tokenizer(recipe.TRAIN_VOCAB, texts=[d["text"] for d in train])
    V = tk.get_vocab_size()
    eot = tk.token_to_id("<|endoftext|>")
    print("vocabulary %d (trained in %.0f s)" % (V, time.time() - t0), file=sys.stderr)
    pack = os.path.join(a.work, "pack")
    os.makedirs(pack, exist_ok=True)
    tk.save(os.path.join(pack, "tokenizer.json"))
    meta = dict(name=recipe.NAME, vocab_size=V, eot=eot, files={})
    for split, docs in (("train", train), ("heldout", held)):
        ids = encode(tk, docs, eot)
        chars = sum(len(d["text"]) for d in docs)
        with gzip.open(os.path.join(pack, split + ".u16.gz"), "wb", compresslevel=6) as f:
            f.write(ids.tobytes())
        meta["files"][split] = dict(docs=len(docs), chars=chars, tokens=int(ids.size))
        print("%s: %d docs, %d chars, %d tokens (%.2f chars/token)" %
              (split, len(docs), chars, ids.size, chars / ids.size), file=sys.stderr)
    json.dump(meta, open(os.path.join(pack, "meta.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
