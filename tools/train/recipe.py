"""The demo model's recipe: its shapes, vocabulary size and training settings, shared by
prepare.py (here), train.py (on the GPU host) and export.py (here). See tools/train/README.md."""
import os
import sys

NAME = "demo-en-17m"

# 8187 BPE tokens (the 256 byte symbols included) + the 5 specials = 8192.
TRAIN_VOCAB = 8187

# Qwen3.5's hybrid layout at a small size: 8 layers, 3 Gated DeltaNet layers then one full
# (gated) attention layer, twice; 2 V heads per K head; tied embeddings. 17.3 M parameters.
CONFIG = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
              num_attention_heads=6, num_key_value_heads=2, head_dim=64,
              linear_num_key_heads=3, linear_num_value_heads=6,
              linear_key_head_dim=64, linear_value_head_dim=64,
              tie_word_embeddings=True)

# A few-step configuration of the same layout for checking the loop on a CPU.
TINY_CONFIG = dict(CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, linear_num_key_heads=1,
                   linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=32)

TRAIN = dict(
    seq_len=512,          # tokens per training window (random offsets into the packed stream)
    batch=64,             # windows per step: 32,768 tokens
    lr=2e-3,              # AdamW peak; linear warm-up, cosine decay to min_lr_frac of it
    min_lr_frac=0.1,
    warmup_steps=100,
    weight_decay=0.1,     # on the matrices (embedding included), not on norms, A_log, dt_bias
    betas=(0.9, 0.95),
    grad_clip=1.0,
    epochs=10,            # passes over the training tokens, unless time_budget_s ends it first
    time_budget_s=400,    # progress = max(steps done / steps planned, seconds / budget)
    eval_every=100,       # steps between held-out evaluations
    eval_windows=96,      # held-out windows of seq_len tokens per evaluation
    seed=20251203,
)

REFGEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "refgen")


def refgen():
    """tools/refgen/make_reference.py as a module (tokenizer pipeline, HF config, GGUF export)."""
    if REFGEN not in sys.path:
        sys.path.insert(0, REFGEN)
    import make_reference
    return make_reference


def hf_config(vocab_size, config=None):
    """(cfg, c, layer_types, sections) of the demo model, as tools/refgen builds its cases."""
    return refgen().hf_config(dict(config=config or CONFIG, vocab_size=vocab_size))
