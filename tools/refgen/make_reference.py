#!/usr/bin/env python3
"""Makes a reference case for deltaserve: a small Qwen3.5 text model with random, seeded
weights, run through Hugging Face transformers (float32, CPU), exported to GGUF in llama.cpp's
`qwen35` conventions, with the tokenizer entries, prompts, greedy continuations and logits that
the engine's tests compare against.

    make_reference.py CASE --out DIR        (CASE: one of the presets below, or --list)

writes DIR/CASE.gguf, DIR/CASE.json and DIR/CASE.logits.f32 in the format of
shared/reference/README.md (see tools/refgen/README.md). Deterministic: the same CASE and the
same pinned versions (tools/refgen/requirements.txt) give the same bytes.

The GGUF follows llama.cpp's converter (conversion/qwen.py, Qwen3NextModel + the V-head
reorder; see docs/QWEN35.md §1.4-1.6):
  - arch `qwen35`, all tensors F32, `general.file_type` 0;
  - RMSNorm weights stored as 1 + w_hf, except `linear_attn.norm` (ssm_norm) stored as is;
  - `ssm_a` = -exp(A_log); `dt_bias` -> `ssm_dt.bias`; conv1d (C,1,4) -> ne=[4, C];
  - V heads in tiled order (HF v-head g*r + j -> GGUF j*n_k + g) for the V rows of
    in_proj_qkv and conv1d, in_proj_z, in_proj_a, in_proj_b, A_log, dt_bias and the input
    columns of out_proj;
  - `attn_q` = HF q_proj as is (its rows are already per-head [q | gate]);
  - tied models have no `output.weight`;
  - tokenizer.ggml.* model gpt2, pre qwen35, the BPE vocabulary and merges of the trained
    tokenizer, special tokens as CONTROL (type 3), no BOS added.
"""
import argparse
import hashlib
import json
import math
import os
import sys

import numpy as np

# ---- the tokenizer pipeline (model/tokenizer_encode.c, docs/QWEN35.md §1.6) ----

# HF's form of the qwen35 split regex (llama.cpp spells the contractions out case by case).
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
         r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# Tokenizer entries: encoded and decoded by HF (no special-token insertion).
TOKENIZER_TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; they've said it's theirs.",
    "In 1987 the town had 4,512 residents.",
    "def f(x):\n    return x * 2\n",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "e\u0301 versus \u00e9",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0",
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d",
    "\U0001f642\U0001f680 emoji",
    "  leading and   multiple spaces ",
    "tabs\tand\nnewlines\n\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "DON'T SHOUT",
    "x" * 40,
    "3.14159 and 0x1F3A",
]
TOKENIZER_TEXTS_EXTRA = [
    "<think>\nThe user wants a list.\n</think>\n\n1. one\n2. two<|im_end|><|endoftext|>",
    "THEY'LL say it'S fine, WE'D agree, she'LL see",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0b9a\u0bc6\u0ba9\u0bcd\u0ba9\u0bc8 \uc548\ub155\ud558\uc138\uc694 \u041f\u0440\u0438\u0432\u0435\u0442",
    "a\u0323\u0307 \u212b \ufb01ne \u1100\u1161\u11a8 >\u0338",
    "\r\n\r\n  \t \u00a0\u3000end",
]

# ---- prompts ----

LONG_PROSE = (
    "The lighthouse keeper counted the ships that passed the rocks every night. In the first "
    "year he wrote their names in a small book with a green cover: the Marguerite, the North "
    "Star, the Anna of Bergen, the little ferry that carried mail to the islands twice a week. "
    "When the fog came in from the sea he lit the lamp early and wound the clockwork that turned "
    "the great lens, 4 turns every 15 minutes, and listened for the horns. Some nights there "
    "were 12 ships, some nights only 2. In winter the waves climbed the rocks and the spray "
    "froze on the windows, and he scraped the ice away with a knife so that the light would "
    "not be dimmed. His daughter asked him once why he counted them at all, since nobody ever "
    "read the book. He said that a ship that is counted is a ship that came home, and that the "
    "sea forgets quickly but paper does not. Years later, when the lamp was electric and the "
    "keeper's house was a museum, she found the books in a box under the stairs: 31 of them, "
    "one for every year, each page ruled into columns for the date, the hour, the name and the "
    "weather. The last entry said only: calm sea, clear sky, the ferry on time. She closed the "
    "book and looked out at the water, where a small boat was turning toward the harbour."
)
LONG_CHAT = (
    "<|im_start|>system\nYou are a careful engineer. Answer briefly and show code when it "
    "helps.<|im_end|>\n<|im_start|>user\nI am writing an inference engine for a hybrid model. "
    "Three of every four layers are linear attention with a recurrent state, and the fourth is "
    "full attention with a key-value cache. Here is my decode loop:\n\n"
    "def decode(model, state, token):\n    x = model.embed[token]\n"
    "    for i, layer in enumerate(model.layers):\n        h = rms_norm(x) * layer.norm\n"
    "        if layer.recurrent:\n            x = x + delta_rule(layer, state[i], h)\n"
    "        else:\n            x = x + attention(layer, state[i], h, pos=state.n_past)\n"
    "        x = x + mlp(layer, rms_norm(x) * layer.post_norm)\n    state.n_past += 1\n"
    "    return model.head @ (rms_norm(x) * model.final_norm)\n\n"
    "The logits drift from the reference after about 200 tokens, by 0.3% at most. The prefill "
    "path uses chunks of 64 tokens and agrees with the token-by-token path to 1e-5. What should "
    "I check first?<|im_end|>\n<|im_start|>assistant\n<think>\n"
)
LONG_MIXED = (
    "Notes from the harbour office, 14 March 2024. Weather: wind 5 Bft from the north-west, "
    "waves 1.5 m, visibility 8 km. Arrivals: the Marguerite (cargo, 2,340 t) at 06:15, the "
    "North Star (fishing) at 07:40. \u65e5\u672c\u8a9e\u306e\u30e1\u30e2\uff1a\u6d77\u306f\u7a4f"
    "\u3084\u304b\u3067\u3059\u3002 \u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002 \u041f\u0440\u0438"
    "\u0432\u0435\u0442 \u0438\u0437 \u043f\u043e\u0440\u0442\u0430! Caf\u00e9 on the quay closed "
    "at 18:00; the r\u00e9sum\u00e9 of the new pilot was filed. \U0001f642\U0001f680 Tasks for "
    "tomorrow:\n  1. check the buoys\n  2. repaint the 3rd mooring post\n  3. send the report "
    "to the office\n\nfor (int i = 0; i < 8; i++) { load[i] = 0; }\n"
    "The tide table says high water at 11:52 (4.3 m) and 00:17 (4.1 m); low water at 05:40 "
    "and 18:03. THEY'LL need the crane at noon, and we'd better tell them it's booked."
)

# The training text of the BPE vocabulary: several scripts, code, numbers, chat markup.
CORPUS = [
    "The lighthouse keeper counted the ships that passed the rocks every night. When the fog came "
    "in from the sea, he lit the lamp early and wrote the names of the boats in a small book.",
    "A recurrent state is updated once per token: the state decays, the key writes a correction, "
    "and the query reads the result. Attention layers keep every key and value; linear layers "
    "keep a fixed-size state.",
    "Weights are stored in blocks of 256 values, each block with its own scale and minimum. The "
    "quantized weights are read once per token during decoding, so memory bandwidth sets the speed.",
    "She said: \"I'm sure you're right; they've said it's theirs, and we'll see what I'd do.\" "
    "He answered that he didn't know, and THEY'RE NOT SURE EITHER.",
    "In 1987 the town had 4,512 residents; by 2023 it had 12,870. The river is 3.14 km long and "
    "0x1F3A is 7994 in decimal. Prices rose 7.5% in 2022 and fell 2.25% in 2024.",
    "def forward(x, weights):\n    for layer in weights:\n        x = layer(x) + x\n    return x\n\n"
    "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}\nif (sum > max) { max = sum; }\n"
    "import numpy as np\nx = np.zeros((4, 8), dtype=np.float32)\nprint(x.shape)\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Write a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    "Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time.<|im_end|>\n",
    "Café, naïve, résumé, façade, Ångström, Straße, Übermut, crème brûlée, piñata, São Paulo.",
    "日本語の文章を書くのは楽しいです。東京の天気は晴れで、海の近くは風が強いです。",
    "今天天气很好，我们去公园散步吧。这个模型的状态在每个词之后更新一次。",
    "Привет, как дела? Сегодня хорошая погода, и мы идём гулять по набережной.",
    "नमस्ते, आप कैसे हैं? आज मौसम बहुत अच्छा है और हम समुद्र के किनारे चल रहे हैं।",
    "வணக்கம், நீங்கள் எப்படி இருக்கிறீர்கள்? இன்று வானிலை நன்றாக உள்ளது.",
    "안녕하세요, 오늘 날씨가 좋네요. 바다 근처에서 산책을 합시다.",
    "مرحبا، كيف حالك؟ الطقس جميل اليوم ونحن نمشي على الشاطئ.",
    "Emoji: 🙂🚀🌊⚓️🐟 and symbols → ← ≤ ≥ ± × ÷ ∞ ∑ √ °C €100 £50 ¥2000.",
    "  leading and   multiple spaces, tabs\tand\nnewlines\n\n, trailing spaces   \r\nwindows lines\r\n",
    "Ελληνικά: η θάλασσα είναι ήρεμη σήμερα. Türkçe: deniz bugün sakin. Polski: morze jest spokojne.",
    LONG_PROSE, LONG_CHAT, LONG_MIXED,
    "The model reads the prompt in one prefill pass and then decodes one token at a time, keeping a "
    "cache of keys and values for the attention layers and a small recurrent state for the others.",
]
CORPUS_REPEAT = 20

# Presets. `config` holds the HF config values that differ between cases; the json's `config`
# block repeats them (the shared format).
PRESETS = {
    # GQA 3 (6 query heads over 2 KV heads) and 3 V heads per K head (6 over 2); untied;
    # prompts of 200-400 tokens.
    "tiny-r3-gqa3": dict(
        seed=3303, train_vocab=1000,  # 1000 + 5 specials
        config=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                    num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                    linear_num_key_heads=2, linear_num_value_heads=6,
                    linear_key_head_dim=32, linear_value_head_dim=32,
                    tie_word_embeddings=False),
        tokenizer_texts=TOKENIZER_TEXTS + TOKENIZER_TEXTS_EXTRA,
        prompts=[(LONG_PROSE, 32), ("Hello", 24), (LONG_CHAT, 32), ("She said:", 16)],
    ),
    # The shapes and prompts of the shared cases (different weights and vocabulary: the
    # corpus and the initialisation of the shared cases are not known). For checking this
    # script's conventions against the engine.
    "tiny-r2-tied": dict(
        seed=1242, train_vocab=1024,
        config=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=64, linear_value_head_dim=64,
                    tie_word_embeddings=True),
        tokenizer_texts=TOKENIZER_TEXTS,
        prompts=[("The lighthouse keeper counted the ships", 24), ("Hello", 24),
                 ("<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n", 24),
                 (CORPUS[1], 24)],
    ),
    "tiny-r1-untied": dict(
        seed=102, train_vocab=768,
        config=dict(hidden_size=256, intermediate_size=256, num_hidden_layers=8,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                    linear_num_key_heads=4, linear_num_value_heads=4,
                    linear_key_head_dim=32, linear_value_head_dim=32,
                    tie_word_embeddings=False),
        tokenizer_texts=TOKENIZER_TEXTS[:8],
        prompts=[("Weights are stored in blocks of 256 values", 24), ("She said:", 24)],
    ),
}

COMMON_CONFIG = dict(linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096)
ROPE = dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
            mrope_interleaved=True)
FULL_ATTENTION_INTERVAL = 4


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- tokenizer ----

def train_tokenizer(train_vocab, texts=None):
    """The BPE of train_vocab tokens (the 256 byte symbols included) trained on texts (default:
    CORPUS, CORPUS_REPEAT times), then the SPECIALS appended (ids train_vocab ... +4)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, \
        pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=train_vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    if texts is None:
        texts = [c for _ in range(CORPUS_REPEAT) for c in CORPUS]

    def no_specials():  # split off before training so that their pieces do not become merges
        for c in texts:
            for s in SPECIALS:
                c = c.replace(s, "\n")
            yield c
    tk.train_from_iterator(no_specials(), trainer)
    n = tk.get_vocab_size()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert [tk.token_to_id(s) for s in SPECIALS] == list(range(n, n + len(SPECIALS)))
    return tk


def tokenizer_tables(tk):
    """tokens (by id), token types, merges (in rank order) of the trained tokenizer."""
    st = json.loads(tk.to_str())
    vocab = st["model"]["vocab"]
    n = len(vocab) + len(SPECIALS)
    tokens = [None] * n
    for t, i in vocab.items():
        tokens[i] = t
    for k, s in enumerate(SPECIALS):
        tokens[len(vocab) + k] = s
    assert all(t is not None for t in tokens)
    types = [1] * len(vocab) + [3] * len(SPECIALS)  # NORMAL, CONTROL
    merges = [m if isinstance(m, str) else " ".join(m) for m in st["model"]["merges"]]
    return tokens, types, merges


# ---- model ----

def hf_config(p):
    """The Qwen3_5TextConfig of preset-like p (its `config` values over COMMON_CONFIG, its
    `vocab_size`): every 4th layer full attention, ROPE with mrope sections scaled from
    [11, 11, 10]. Returns (cfg, c, layer_types, sections)."""
    from transformers import Qwen3_5TextConfig
    c = dict(COMMON_CONFIG, **p["config"])
    L = c["num_hidden_layers"]
    layer_types = ["linear_attention" if (i + 1) % FULL_ATTENTION_INTERVAL else "full_attention"
                   for i in range(L)]
    n_rot = int(c["head_dim"] * ROPE["partial_rotary_factor"])
    half = n_rot // 2  # frequencies; sections split them t/h/w like [11, 11, 10] of 32
    sec = [math.ceil(half * 11 / 32), math.ceil(half * 11 / 32)]
    sec.append(half - sum(sec))
    rope = dict(ROPE, mrope_section=sec)
    cfg = Qwen3_5TextConfig(vocab_size=p["vocab_size"], layer_types=layer_types,
                            rope_parameters=rope, pad_token_id=None, bos_token_id=None,
                            eos_token_id=None, hidden_act="silu", attention_bias=False, **c)
    cfg._attn_implementation = "eager"
    return cfg, c, layer_types, sec


def build_model(p):
    import torch
    from transformers import Qwen3_5ForCausalLM
    cfg, c, layer_types, sec = hf_config(p)
    torch.manual_seed(p["seed"])
    model = Qwen3_5ForCausalLM(cfg).float().eval()
    randomise(model, p["seed"])
    return model, c, layer_types, sec


def randomise(model, seed):
    """Re-draws every parameter from a seeded generator so that no part of the model is at its
    trivial init (norms at 1, dt_bias at 1): linear weights N(0, 1/fan_in), RMSNorm weights
    (stored as w, applied as 1+w) N(0, 0.2), q/k norms N(0, 0.15), the gated norm U(0.5, 1.5),
    conv1d N(0, 0.5), dt_bias N(0, 0.5), A = exp(A_log) log-uniform in [0.02, 16] (decays from
    a few tokens to hundreds of tokens)."""
    import torch
    g = torch.Generator().manual_seed(seed * 7919 + 17)
    with torch.no_grad():
        for name, prm in sorted(model.named_parameters()):
            shape = prm.shape
            if name.endswith("linear_attn.norm.weight"):
                v = torch.rand(shape, generator=g) + 0.5
            elif name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                v = torch.randn(shape, generator=g) * 0.15
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                v = torch.randn(shape, generator=g) * 0.2
            elif name.endswith("conv1d.weight"):
                v = torch.randn(shape, generator=g) * 0.5
            elif name.endswith("dt_bias"):
                v = torch.randn(shape, generator=g) * 0.5
            elif name.endswith("A_log"):
                lo, hi = math.log(0.02), math.log(16.0)
                v = torch.rand(shape, generator=g) * (hi - lo) + lo
            elif len(shape) == 2:
                v = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            else:
                raise SystemExit("unhandled parameter %s %s" % (name, tuple(shape)))
            prm.copy_(v)
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# ---- GGUF export ----

def tiled(x, n_k, r, d):
    """Rows of x (n_k*r*d first dim) from grouped v-head order (g*r + j) to tiled (j*n_k + g)."""
    s = x.shape
    return x.reshape(n_k, r, d, *s[1:]).swapaxes(0, 1).reshape(s)


def f16_matrix(name):
    """Whether export_gguf(f16=True) stores this GGUF tensor as F16: the weight matrices the
    engine binds as matrices (llama.cpp's F16 convention); norms, ssm_a, ssm_dt.bias and
    ssm_conv1d stay F32."""
    return name.endswith(".weight") and not name.endswith(("norm.weight", "ssm_conv1d.weight"))


def round_f16_matrices(model):
    """Rounds, in place, the HF parameters that export_gguf(f16=True) stores as F16 (every 2-D
    parameter) to F16 and back, so that the HF forward runs on the GGUF's values."""
    import torch
    with torch.no_grad():
        for _, prm in model.named_parameters():
            if prm.dim() == 2:
                prm.copy_(prm.to(torch.float16).to(prm.dtype))


def q8_0_roundtrip(a):
    """A 2-D array (rows of a multiple of 32) through Q8_0 and back: the values a Q8_0 GGUF holds
    (gguf-py's quantizer, the one llama.cpp's convert_hf_to_gguf.py uses)."""
    import gguf
    q = gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32),
                             gguf.GGMLQuantizationType.Q8_0)
    return gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(a.shape)


def round_q8_matrices(model):
    """Rounds, in place, the HF parameters that export_gguf(q8=True) stores as Q8_0 (every 2-D
    parameter) through Q8_0, so that the HF forward runs on the GGUF's values. The GGUF's row
    and column permutations (gguf_tensors' tiled) move whole 32-value blocks (d_v % 32 == 0), so
    blocks of the HF rows are blocks of the GGUF rows."""
    import torch
    with torch.no_grad():
        for _, prm in model.named_parameters():
            if prm.dim() == 2:
                prm.copy_(torch.from_numpy(q8_0_roundtrip(prm.detach().cpu().numpy())).to(prm.dtype))


def gguf_tensors(model, c, layer_types):
    sd = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    H, n_k, n_v = c["hidden_size"], c["linear_num_key_heads"], c["linear_num_value_heads"]
    d_k, d_v = c["linear_key_head_dim"], c["linear_value_head_dim"]
    r = n_v // n_k
    D_k = n_k * d_k
    out = [("token_embd.weight", sd["model.embed_tokens.weight"]),
           ("output_norm.weight", 1 + sd["model.norm.weight"])]
    if not c["tie_word_embeddings"]:
        out.append(("output.weight", sd["lm_head.weight"]))
    for i, lt in enumerate(layer_types):
        p = "model.layers.%d." % i
        b = "blk.%d." % i
        out += [(b + "attn_norm.weight", 1 + sd[p + "input_layernorm.weight"]),
                (b + "post_attention_norm.weight", 1 + sd[p + "post_attention_layernorm.weight"]),
                (b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"]),
                (b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"]),
                (b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])]
        if lt == "linear_attention":
            a = p + "linear_attn."
            qkv = sd[a + "in_proj_qkv.weight"].copy()
            qkv[2 * D_k:] = tiled(qkv[2 * D_k:], n_k, r, d_v)
            conv = sd[a + "conv1d.weight"].reshape(-1, c["linear_conv_kernel_dim"]).copy()
            conv[2 * D_k:] = tiled(conv[2 * D_k:], n_k, r, d_v)
            out += [(b + "attn_qkv.weight", qkv),
                    (b + "attn_gate.weight", tiled(sd[a + "in_proj_z.weight"], n_k, r, d_v)),
                    (b + "ssm_beta.weight", tiled(sd[a + "in_proj_b.weight"], n_k, r, 1)),
                    (b + "ssm_alpha.weight", tiled(sd[a + "in_proj_a.weight"], n_k, r, 1)),
                    (b + "ssm_conv1d.weight", conv),
                    (b + "ssm_dt.bias", tiled(sd[a + "dt_bias"], n_k, r, 1)),
                    (b + "ssm_a", tiled(-np.exp(sd[a + "A_log"]), n_k, r, 1)),
                    (b + "ssm_norm.weight", sd[a + "norm.weight"]),
                    (b + "ssm_out.weight",
                     np.ascontiguousarray(tiled(sd[a + "out_proj.weight"].T, n_k, r, d_v).T))]
        else:
            a = p + "self_attn."
            out += [(b + "attn_q.weight", sd[a + "q_proj.weight"]),
                    (b + "attn_k.weight", sd[a + "k_proj.weight"]),
                    (b + "attn_v.weight", sd[a + "v_proj.weight"]),
                    (b + "attn_output.weight", sd[a + "o_proj.weight"]),
                    (b + "attn_q_norm.weight", 1 + sd[a + "q_norm.weight"]),
                    (b + "attn_k_norm.weight", 1 + sd[a + "k_norm.weight"])]
    assert H == sd["model.embed_tokens.weight"].shape[1]
    return [(n, np.ascontiguousarray(t, dtype=np.float32)) for n, t in out]


def export_gguf(path, name, model, c, layer_types, sec, tk, f16=False, q8=False):
    """Writes the GGUF: all F32, or the matrices of f16_matrix() as F16 (f16: general.file_type
    1, MOSTLY_F16) or Q8_0 (q8: file_type 7, MOSTLY_Q8_0; the HF model's matrices should have
    gone through round_q8_matrices for its outputs to be the GGUF's)."""
    import gguf
    assert not (f16 and q8)
    arch = "qwen35"
    w = gguf.GGUFWriter(path, arch)
    w.add_custom_alignment(32)
    w.add_name(name)
    w.add_file_type(7 if q8 else 1 if f16 else 0)  # MOSTLY_Q8_0, MOSTLY_F16, ALL_F32
    w.add_quantization_version(2)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(ROPE["rope_theta"])
    w.add_rope_dimension_count(int(c["head_dim"] * ROPE["partial_rotary_factor"]))
    w.add_rope_dimension_sections(sec + [0])
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(c["linear_key_head_dim"])
    w.add_uint32(arch + ".ssm.group_count", c["linear_num_key_heads"])
    w.add_ssm_time_step_rank(c["linear_num_value_heads"])
    w.add_ssm_inner_size(c["linear_value_head_dim"] * c["linear_num_value_heads"])
    w.add_uint32(arch + ".full_attention_interval", FULL_ATTENTION_INTERVAL)
    tokens, types, merges = tokenizer_tables(tk)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eot = tokens.index("<|endoftext|>")
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(eot)
    w.add_bos_token_id(eot)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for n, t in gguf_tensors(model, c, layer_types):
        if q8 and f16_matrix(n):
            q8t = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(n, gguf.quants.quantize(t, q8t), raw_dtype=q8t)
        else:
            w.add_tensor(n, t.astype(np.float16) if f16 and f16_matrix(n) else t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- reference outputs ----

def run_prompts(model, tk, prompts, eog):
    import torch
    from transformers import GenerationConfig
    out = []
    for k, (text, n_new) in enumerate(prompts):
        ids = tk.encode(text, add_special_tokens=False).ids
        x = torch.tensor([ids])
        with torch.no_grad():
            gc = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=n_new,
                                  min_new_tokens=n_new, eos_token_id=None, pad_token_id=eog[0],
                                  bos_token_id=None, use_cache=True)
            g = model.generate(x, generation_config=gc, return_dict_in_generate=True,
                               output_logits=True)
            greedy = g.sequences[0, len(ids):].tolist()
            assert len(greedy) == n_new, (len(greedy), n_new)
            margins = []
            for t, lg in enumerate(g.logits):  # raw logits of each cached decode step
                top = torch.topk(lg[0].float(), 2)
                assert int(top.indices[0]) == greedy[t]
                margins.append(float(top.values[0] - top.values[1]))
            full = torch.tensor([ids + greedy])
            logits = model(full, use_cache=False).logits[0].float().numpy()
            hidden = None
            if k == 0:
                hs = model(x, use_cache=False, output_hidden_states=True).hidden_states
                hidden = [h[0, -1].float().tolist() for h in hs]
        from_full = logits[len(ids) - 1:-1].argmax(-1).tolist()
        bad = [t for t in greedy if t in eog]
        if bad:
            log("warning: prompt %d: greedy holds end-of-generation ids %s (deltaserve generate "
                "stops there)" % (k, bad))
        if from_full != greedy:
            log("warning: prompt %d: the full forward's argmax differs from the cached greedy" % k)
        out.append(dict(text=text, ids=ids, greedy=greedy, greedy_from_full_forward=from_full,
                        min_margin=min(margins), margins=margins, logits=logits, hidden=hidden))
        log("  prompt %d: %d ids + %d greedy, min margin %.4f, max|logit| %.3f" %
            (k, len(ids), n_new, min(margins), float(np.abs(logits).max())))
    return out


def make_case(name, out_dir):
    import torch
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    torch.use_deterministic_algorithms(True)
    p = dict(PRESETS[name])
    tk = train_tokenizer(p["train_vocab"])
    p["vocab_size"] = tk.get_vocab_size()
    log("%s: vocabulary %d (%d merges)" % (name, p["vocab_size"], len(tokenizer_tables(tk)[2])))
    model, c, layer_types, sec = build_model(p)
    os.makedirs(out_dir, exist_ok=True)
    export_gguf(os.path.join(out_dir, name + ".gguf"), name, model, c, layer_types, sec, tk)
    write_case(name, out_dir, p, model, tk, c, layer_types, sec)


def write_case(name, out_dir, p, model, tk, c, layer_types, sec, extra=None):
    """Writes NAME.json and NAME.logits.f32 of a case whose NAME.gguf is in out_dir: HF's
    tokenizer entries of p["tokenizer_texts"] and the greedy continuations and logits of
    p["prompts"] (run_prompts); p also gives seed and vocab_size. extra: more keys for the
    JSON's generator block."""
    import torch
    import tokenizers
    import transformers
    import gguf
    gguf_path = os.path.join(out_dir, name + ".gguf")
    tok_entries = []
    for t in p["tokenizer_texts"]:
        ids = tk.encode(t, add_special_tokens=False).ids
        tok_entries.append(dict(text=t, ids=ids, decoded=tk.decode(ids, skip_special_tokens=False)))

    eog = [tk.token_to_id("<|endoftext|>"), tk.token_to_id("<|im_end|>")]
    results = run_prompts(model, tk, p["prompts"], eog)
    logits_name = name + ".logits.f32"
    prompts, off = [], 0
    with open(os.path.join(out_dir, logits_name), "wb") as f:
        for r in results:
            lg = np.ascontiguousarray(r["logits"], dtype="<f4")
            f.write(lg.tobytes())
            e = dict(text=r["text"], ids=r["ids"], greedy=r["greedy"],
                     greedy_from_full_forward=r["greedy_from_full_forward"],
                     min_margin=r["min_margin"], margins=r["margins"], logits_file=logits_name,
                     logits_offset_floats=off, logits_shape=list(lg.shape))
            if r["hidden"] is not None:
                e["last_token_hidden_states"] = r["hidden"]
            prompts.append(e)
            off += lg.size
    config_keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "linear_num_key_heads",
                   "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                   "linear_conv_kernel_dim", "rms_norm_eps", "tie_word_embeddings",
                   "max_position_embeddings"]
    meta = dict(name=name, seed=p["seed"], gguf_bytes=os.path.getsize(gguf_path),
                vocab_size=p["vocab_size"], config={k: c[k] for k in config_keys},
                layer_types=layer_types, tokenizer=tok_entries, prompts=prompts,
                generator=dict(script="tools/refgen/make_reference.py",
                               transformers=transformers.__version__,
                               torch=torch.__version__.split("+")[0],
                               tokenizers=tokenizers.__version__,
                               gguf=getattr(gguf, "__version__", "0.17.1"),
                               rope_parameters=dict(ROPE, mrope_section=sec), **(extra or {})))
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, ensure_ascii=True)
    for ext in (".gguf", ".json", ".logits.f32"):
        fp = os.path.join(out_dir, name + ext)
        h = hashlib.sha256(open(fp, "rb").read()).hexdigest()[:16]
        log("  wrote %s (%d bytes, sha256 %s)" % (fp, os.path.getsize(fp), h))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case", nargs="*", help="preset names (default: tiny-r3-gqa3)")
    ap.add_argument("--out", default=".", help="output folder")
    ap.add_argument("--list", action="store_true", help="list the presets")
    a = ap.parse_args()
    if a.list:
        for n, p in PRESETS.items():
            print(n, json.dumps(p["config"]))
        return 0
    for n in a.case or ["tiny-r3-gqa3"]:
        if n not in PRESETS:
            ap.error("unknown case %s (--list)" % n)
        make_case(n, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
