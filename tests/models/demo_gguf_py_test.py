"""gguf-py (llama.cpp's reference GGUF reader) reads the demo model (models/README.md) in
llama.cpp's qwen35 conventions.

Checks: the file is at most 40 MiB; its metadata keys are those of the repository's tied
reference case made by the same exporter (tests/reference/own-r2-tied.gguf) plus
qwen35.nextn_predict_layers (the MTP head, tools/train/export_mtp.py), with the values of the
reference case's HF config (models/NAME.json), block_count one more than its layers (the head's
layer) and 2 V heads per K head; the tensors are the ones a tied qwen35 model has for each layer
type (3 DeltaNet layers then one attention layer) plus the 15 of the MTP block llama.cpp's
converter writes (an attention layer's and nextn.eh_proj / enorm / hnorm / shared_head_norm at
layer L), with their shapes, the matrices F16 and the vectors, ssm_a and ssm_conv1d F32, all
finite; the tokenizer is gpt2/qwen35 with the five specials last as CONTROL tokens, <|im_end|>
the EOS.
Run with the project venv (models_py_test.sh)."""
import json
import os
import sys

import gguf
import numpy as np

NAME = "demo-en-17m"
DIR = os.environ.get("DS_REPO_REFERENCE_DIR", "models")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def value(r, key):
    f = r.fields[key]
    return f.contents()


def expected_tensors(cfg, layer_types):
    """{name: (ne, kind)}: ne in GGUF order, kind "mat" (F16) or "vec" (F32)."""
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    d_k, d_v = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    n_h, n_kv, d_h = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    C = 2 * n_k * d_k + n_v * d_v
    out = {"token_embd.weight": ([H, V], "mat"), "output_norm.weight": ([H], "vec")}
    for i, lt in enumerate(layer_types):
        b = "blk.%d." % i
        out.update({b + "attn_norm.weight": ([H], "vec"),
                    b + "post_attention_norm.weight": ([H], "vec"),
                    b + "ffn_gate.weight": ([H, F], "mat"), b + "ffn_up.weight": ([H, F], "mat"),
                    b + "ffn_down.weight": ([F, H], "mat")})
        if lt == "linear_attention":
            out.update({b + "attn_qkv.weight": ([H, C], "mat"),
                        b + "attn_gate.weight": ([H, n_v * d_v], "mat"),
                        b + "ssm_beta.weight": ([H, n_v], "mat"),
                        b + "ssm_alpha.weight": ([H, n_v], "mat"),
                        b + "ssm_conv1d.weight": ([cfg["linear_conv_kernel_dim"], C], "vec"),
                        b + "ssm_dt.bias": ([n_v], "vec"), b + "ssm_a": ([n_v], "vec"),
                        b + "ssm_norm.weight": ([d_v], "vec"),
                        b + "ssm_out.weight": ([n_v * d_v, H], "mat")})
        else:
            out.update({b + "attn_q.weight": ([H, 2 * n_h * d_h], "mat"),
                        b + "attn_k.weight": ([H, n_kv * d_h], "mat"),
                        b + "attn_v.weight": ([H, n_kv * d_h], "mat"),
                        b + "attn_output.weight": ([n_h * d_h, H], "mat"),
                        b + "attn_q_norm.weight": ([d_h], "vec"),
                        b + "attn_k_norm.weight": ([d_h], "vec")})
    b = "blk.%d." % len(layer_types)  # the MTP block (docs/QWEN35.md §1.4)
    out.update({b + "attn_norm.weight": ([H], "vec"), b + "post_attention_norm.weight": ([H], "vec"),
                b + "ffn_gate.weight": ([H, F], "mat"), b + "ffn_up.weight": ([H, F], "mat"),
                b + "ffn_down.weight": ([F, H], "mat"),
                b + "attn_q.weight": ([H, 2 * n_h * d_h], "mat"),
                b + "attn_k.weight": ([H, n_kv * d_h], "mat"),
                b + "attn_v.weight": ([H, n_kv * d_h], "mat"),
                b + "attn_output.weight": ([n_h * d_h, H], "mat"),
                b + "attn_q_norm.weight": ([d_h], "vec"), b + "attn_k_norm.weight": ([d_h], "vec"),
                b + "nextn.eh_proj.weight": ([2 * H, H], "mat"),
                b + "nextn.enorm.weight": ([H], "vec"), b + "nextn.hnorm.weight": ([H], "vec"),
                b + "nextn.shared_head_norm.weight": ([H], "vec")})
    return out


def main():
    path = os.path.join(DIR, NAME + ".gguf")
    meta = json.load(open(os.path.join(DIR, NAME + ".json")))
    cfg = dict(meta["config"], vocab_size=meta["vocab_size"])
    size = os.path.getsize(path)
    check(size <= 40 << 20, "%s: %d bytes <= 40 MiB" % (path, size))
    r = gguf.GGUFReader(path)

    # metadata: the exporter's key set, the config's values
    own = gguf.GGUFReader(os.path.join("tests", "reference", "own-r2-tied.gguf"))
    keys = {k for k in r.fields if not k.startswith("GGUF.")}
    want_keys = {k for k in own.fields if not k.startswith("GGUF.")} | {"qwen35.nextn_predict_layers"}
    check(keys == want_keys, "metadata keys are those of tools/refgen's tied case (%s)" %
          sorted(keys ^ want_keys))
    want = {"general.architecture": "qwen35", "general.file_type": 1,
            "qwen35.embedding_length": cfg["hidden_size"],
            "qwen35.block_count": cfg["num_hidden_layers"] + 1,
            "qwen35.nextn_predict_layers": 1,
            "qwen35.feed_forward_length": cfg["intermediate_size"],
            "qwen35.attention.head_count": cfg["num_attention_heads"],
            "qwen35.attention.head_count_kv": cfg["num_key_value_heads"],
            "qwen35.attention.key_length": cfg["head_dim"],
            "qwen35.ssm.group_count": cfg["linear_num_key_heads"],
            "qwen35.ssm.time_step_rank": cfg["linear_num_value_heads"],
            "qwen35.ssm.state_size": cfg["linear_key_head_dim"],
            "qwen35.ssm.inner_size": cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"],
            "qwen35.ssm.conv_kernel": cfg["linear_conv_kernel_dim"],
            "qwen35.full_attention_interval": 4,
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35"}
    for k, v in want.items():
        check(k in r.fields and value(r, k) == v, "%s = %r" % (k, v))
    check(cfg["linear_num_value_heads"] == 2 * cfg["linear_num_key_heads"],
          "2 V heads per K head (%d / %d)" % (cfg["linear_num_value_heads"],
                                              cfg["linear_num_key_heads"]))
    check(cfg["tie_word_embeddings"] and meta["layer_types"] ==
          ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 +
          ["full_attention"], "tied; layers 3 and 7 full attention, the others Gated DeltaNet")

    # tensors
    exp = expected_tensors(cfg, meta["layer_types"])
    got = {t.name: t for t in r.tensors}
    check(set(got) == set(exp), "tensor names: %d as expected (extra %s, missing %s)" %
          (len(got), sorted(set(got) - set(exp))[:4], sorted(set(exp) - set(got))[:4]))
    n_params, bad = 0, []
    for name, (ne, kind) in exp.items():
        t = got.get(name)
        if t is None:
            continue
        want_type = gguf.GGMLQuantizationType.F16 if kind == "mat" else \
            gguf.GGMLQuantizationType.F32
        data = np.asarray(t.data, dtype=np.float32)
        if list(t.shape) != ne or t.tensor_type != want_type or not np.isfinite(data).all():
            bad.append("%s %s %s" % (name, list(t.shape), t.tensor_type.name))
        n_params += int(np.prod(ne))
    check(not bad, "shapes, F16 matrices / F32 vectors, finite values (%s)" % bad[:4])
    check(10e6 <= n_params <= 30e6, "%.2f M parameters (10-30 M)" % (n_params / 1e6))

    # tokenizer
    toks = value(r, "tokenizer.ggml.tokens")
    types = value(r, "tokenizer.ggml.token_type")
    V = meta["vocab_size"]
    check(len(toks) == V == len(types) and 4096 <= V <= 8192, "vocabulary %d (4k-8k)" % V)
    check(toks[V - 5:] == SPECIALS and types[V - 5:] == [3] * 5 and set(types[:V - 5]) == {1},
          "the specials last, CONTROL; every other token NORMAL")
    check(value(r, "tokenizer.ggml.eos_token_id") == toks.index("<|im_end|>") and
          value(r, "tokenizer.ggml.bos_token_id") == toks.index("<|endoftext|>") and
          value(r, "tokenizer.ggml.add_bos_token") is False, "eos <|im_end|>, bos <|endoftext|>, no BOS added")
    check(len(value(r, "tokenizer.ggml.merges")) == V - 5 - 256, "merges: one per BPE token past the 256 bytes")
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
