"""Synthetic GGUFs read by gguf-py (llama.cpp's own reader, in .venv), independently of our C
reader: every tiny quant is written with `deltaserve gguf synth`, then its metadata (keys, value
types), tensor table (names, shapes, types recomputed here from docs/QWEN35.md §1.4/§5.3), tokenizer
(merge invariants), chat template (by default Qwen3.5's, byte for byte the published one of
tests/model/data; --chat-template chatml the short ChatML) and values (every tensor dequantised
by gguf.quants: finite, intended scale) are checked.
Usage: synth_py_check.py DELTASERVE_BINARY TMPDIR"""
import os
import subprocess
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

failures = []
QWEN_TEMPLATE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "model", "data",
                             "qwen35_chat_template.jinja")
with open(QWEN_TEMPLATE, encoding="utf-8") as _f:
    PUBLISHED = _f.read()


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def field(r, key):
    f = r.fields[key]
    if f.types[0] == GGUFValueType.ARRAY:
        if f.types[1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# tiny: H 256, L 4 (layer 3 attention), F 512, n_h 4, n_kv 2, d_h 64, n_k 2, n_v 4, d 64, V 2048
H, L, F, V, NH, NKV, DH, NK, NV, DK = 256, 4, 512, 2048, 4, 2, 64, 2, 4, 64
C = 2 * NK * DK + NV * DK
FTYPE = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_k_m": 15}
PLAIN = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}


def expected_tensors(quant):
    """name -> (ne, type name) for the tiny preset (tied: no output.weight)."""
    def mm(kind, layer):
        if quant != "q4_k_m":
            return PLAIN[quant]
        if kind == "token_embd":
            return "Q6_K"  # tied: treated as the output
        if kind in ("attn_v", "attn_qkv", "ffn_down"):
            return "Q6_K" if use_more_bits(layer, L) else "Q4_K"
        return "Q4_K"

    t = {"token_embd.weight": ([H, V], mm("token_embd", -1)),
         "output_norm.weight": ([H], "F32")}
    for i in range(L):
        b = "blk.%d." % i
        t[b + "attn_norm.weight"] = ([H], "F32")
        t[b + "post_attention_norm.weight"] = ([H], "F32")
        t[b + "ffn_gate.weight"] = ([H, F], mm("ffn_gate", i))
        t[b + "ffn_up.weight"] = ([H, F], mm("ffn_up", i))
        t[b + "ffn_down.weight"] = ([F, H], mm("ffn_down", i))
        if (i + 1) % 4:
            t[b + "attn_qkv.weight"] = ([H, C], mm("attn_qkv", i))
            t[b + "attn_gate.weight"] = ([H, NV * DK], mm("attn_gate", i))
            t[b + "ssm_beta.weight"] = ([H, NV], mm("ssm_beta", i))
            t[b + "ssm_alpha.weight"] = ([H, NV], mm("ssm_alpha", i))
            t[b + "ssm_conv1d.weight"] = ([4, C], "F32")
            t[b + "ssm_dt.bias"] = ([NV], "F32")
            t[b + "ssm_a"] = ([NV], "F32")
            t[b + "ssm_norm.weight"] = ([DK], "F32")
            t[b + "ssm_out.weight"] = ([NV * DK, H], mm("ssm_out", i))
        else:
            t[b + "attn_q.weight"] = ([H, 2 * NH * DH], mm("attn_q", i))
            t[b + "attn_k.weight"] = ([H, NKV * DH], mm("attn_k", i))
            t[b + "attn_v.weight"] = ([H, NKV * DH], mm("attn_v", i))
            t[b + "attn_output.weight"] = ([NH * DH, H], mm("attn_output", i))
            t[b + "attn_q_norm.weight"] = ([DH], "F32")
            t[b + "attn_k_norm.weight"] = ([DH], "F32")
    return t


def check_file(path, quant):
    r = GGUFReader(path)
    check(field(r, "general.architecture") == "qwen35", "architecture")
    check(field(r, "general.file_type") == FTYPE[quant], "file_type")
    check(field(r, "general.quantization_version") == 2, "quantization_version")
    u32 = {"context_length": 262144, "embedding_length": H, "block_count": L,
           "feed_forward_length": F, "attention.head_count": NH,
           "attention.head_count_kv": NKV, "attention.key_length": DH,
           "attention.value_length": DH, "rope.dimension_count": 16, "ssm.conv_kernel": 4,
           "ssm.state_size": DK, "ssm.group_count": NK, "ssm.time_step_rank": NV,
           "ssm.inner_size": NV * DK, "full_attention_interval": 4}
    for k, v in u32.items():
        key = "qwen35." + k
        check(r.fields[key].types[0] == GGUFValueType.UINT32, key + " is not u32")
        check(field(r, key) == v, "%s = %s, want %s" % (key, field(r, key), v))
    sec = r.fields["qwen35.rope.dimension_sections"]
    check(sec.types == [GGUFValueType.ARRAY, GGUFValueType.INT32], "sections not i32[]")
    check(field(r, "qwen35.rope.dimension_sections") == [3, 3, 2, 0], "sections")
    check(abs(field(r, "qwen35.rope.freq_base") - 1e7) < 1, "freq_base")
    check(abs(field(r, "qwen35.attention.layer_norm_rms_epsilon") - 1e-6) < 1e-9, "eps")

    toks = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    check(field(r, "tokenizer.ggml.model") == "gpt2", "tokenizer model")
    check(field(r, "tokenizer.ggml.pre") == "qwen35", "pre")
    check(len(toks) == V and len(types) == V and len(set(toks)) == V, "tokens not V unique")
    ids = {t: i for i, t in enumerate(toks)}
    bad = 0
    for k, m in enumerate(merges):
        a, b = m.split(" ")
        want = 256 + k
        bad += not (ids.get(a + b) == want and ids.get(a, V) < want and ids.get(b, V) < want)
    check(bad == 0, "%d merges break the invariants" % bad)
    eos = field(r, "tokenizer.ggml.eos_token_id")
    check(toks[eos] == "<|im_end|>" and types[eos] == 3, "eos is not a CONTROL <|im_end|>")
    check(toks[field(r, "tokenizer.ggml.padding_token_id")] == "<|endoftext|>", "padding id")
    check(field(r, "tokenizer.ggml.add_bos_token") is False, "add_bos_token")
    tmpl = field(r, "tokenizer.chat_template")
    check(tmpl == PUBLISHED, "chat template: not Qwen3.5's as published (%s)"
          % os.path.basename(QWEN_TEMPLATE))

    want = expected_tensors(quant)
    got = {t.name: t for t in r.tensors}
    check(len(r.tensors) == 3 * 14 + 11 + 2 == len(want), "tensor count %d" % len(r.tensors))
    check(set(got) == set(want), "tensor names differ: %s" % sorted(set(got) ^ set(want))[:5])
    for name, (ne, tname) in want.items():
        t = got.get(name)
        if t is None:
            continue
        check([int(x) for x in t.shape] == ne, "%s shape %s, want %s" % (name, list(t.shape), ne))
        check(t.tensor_type.name == tname, "%s type %s, want %s" % (name, t.tensor_type.name, tname))
        d = dequantize(t.data, t.tensor_type).astype(np.float64)
        ok = bool(np.isfinite(d).all())
        if name.endswith("norm.weight"):
            ok = ok and abs(d.mean() - 1) < 0.05 and 0.01 < d.std() < 0.2
        elif name.endswith("ssm_a"):
            ok = ok and (d < 0).all()
        elif name.endswith("ssm_conv1d.weight") or name.endswith("ssm_dt.bias"):
            ok = ok and np.abs(d).max() < 1.5
        else:
            sigma = 1 / np.sqrt(ne[0])
            ok = ok and 0.85 * sigma < d.std() < 1.2 * sigma and abs(d.mean()) < 0.1 * sigma
        check(ok, "%s values: mean %.4g sd %.4g" % (name, d.mean(), d.std()))


def main():
    binary, tmp = sys.argv[1], sys.argv[2]
    os.makedirs(tmp, exist_ok=True)
    # --chat-template chatml: the short ChatML instead of the default Qwen3.5 template
    path = os.path.join(tmp, "synth_py_chatml.gguf")
    subprocess.run([binary, "gguf", "synth", "--preset", "tiny", "--quant", "f32", "--chat-template",
                    "chatml", "-o", path], check=True, stdout=subprocess.DEVNULL)
    tmpl = field(GGUFReader(path), "tokenizer.chat_template")
    check(tmpl.startswith("{% for m in messages %}<|im_start|>") and "think" not in tmpl,
          "--chat-template chatml: %r" % tmpl[:80])
    os.unlink(path)
    for quant in ["f32", "f16", "bf16", "q8_0", "q4_k_m"]:
        path = os.path.join(tmp, "synth_py_%s.gguf" % quant)
        subprocess.run([binary, "gguf", "synth", "--preset", "tiny", "--quant", quant,
                        "--seed", "11", "-o", path], check=True, stdout=subprocess.DEVNULL)
        n = len(failures)
        check_file(path, quant)
        print("%-7s %s" % (quant, "ok" if len(failures) == n else "FAILED"))
        os.unlink(path)
    if failures:
        print("%d failure(s)" % len(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
