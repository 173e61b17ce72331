#!/usr/bin/env python3
"""Writes a trained MTP head (train_mtp.py) into the demo model's GGUF.

    export_mtp.py --head DIR/mtp-head.safetensors [--gguf models/demo-en-17m.gguf] [--out F]
                  [--log DIR/log.json]

Rewrites the GGUF (in place unless --out) with every main tensor's bytes and every metadata key
as they were, `qwen35.block_count` L + 1 and `qwen35.nextn_predict_layers` 1, and the head's 15
tensors under the names llama.cpp's converter writes (docs/QWEN35.md §1.4) at layer L: the
attention layer's blk.L.{attn_norm, post_attention_norm, attn_q, attn_k, attn_v, attn_output,
attn_q_norm, attn_k_norm, ffn_gate, ffn_up, ffn_down} and blk.L.nextn.{eh_proj, enorm, hnorm,
shared_head_norm}; matrices F16, norms F32 (the file's F16 convention). A head already in the
file is replaced. The reference case's JSON beside the GGUF gets its new size (gguf_bytes);
--log copies train_mtp.py's log to MODELS/NAME.mtp-train-log.json.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import recipe  # noqa: E402
from train_mtp import MTPHead  # noqa: E402


def head_arrays(path):
    from safetensors.numpy import load_file
    t = load_file(path)
    assert sorted(t) == sorted(MTPHead.NAMES), sorted(t)
    return {n: np.ascontiguousarray(t[n], dtype=np.float32) for n in MTPHead.NAMES}


def is_matrix(name):
    return name.endswith(".weight") and not name.endswith("norm.weight")


def write(src, dst, head):
    """src GGUF + head arrays ({name: [n_out][n_in] or [n]}) -> dst (may be src)."""
    import gguf
    r = gguf.GGUFReader(src)
    f = {x.name: x for x in r.fields.values()}
    arch = f["general.architecture"].contents()
    L = f[arch + ".block_count"].contents()
    if arch + ".nextn_predict_layers" in f:
        L -= f[arch + ".nextn_predict_layers"].contents()
    tmp = dst + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    align = f["general.alignment"].contents() if "general.alignment" in f else 32
    w.add_custom_alignment(align)
    for name, x in f.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment",
                                                arch + ".nextn_predict_layers"):
            continue
        val = x.contents()
        if name == arch + ".block_count":
            val = L + 1
        sub = x.types[1] if x.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, val, x.types[0], sub_type=sub)
        if name == arch + ".block_count":
            w.add_uint32(arch + ".nextn_predict_layers", 1)
    own = "blk.%d." % L
    for t in r.tensors:
        if t.name.startswith(own):
            continue  # an earlier head
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(n) for n in t.shape])),
                     raw_dtype=t.tensor_type)
    for n in MTPHead.NAMES:
        a = head[n]
        w.add_tensor(own + n, a.astype(np.float16) if is_matrix(n) else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", required=True, help="train_mtp.py's mtp-head.safetensors")
    ap.add_argument("--gguf", default="models/%s.gguf" % recipe.NAME)
    ap.add_argument("--out", default=None, help="output GGUF (default: --gguf, in place)")
    ap.add_argument("--log", default=None, help="train_mtp.py's log.json, copied beside the GGUF")
    a = ap.parse_args()
    out = a.out or a.gguf
    L = write(a.gguf, out, head_arrays(a.head))
    case = os.path.splitext(out)[0] + ".json"
    if os.path.exists(case):
        j = json.load(open(case))
        j["gguf_bytes"] = os.path.getsize(out)
        with open(case, "w") as f:
            json.dump(j, f, ensure_ascii=True)
    if a.log:
        shutil.copyfile(a.log, os.path.splitext(out)[0] + ".mtp-train-log.json")
    print("wrote %s: the MTP head at layer %d (%d bytes)" % (out, L, os.path.getsize(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
