#!/usr/bin/env python3
"""Trains the MTP (multi-token-prediction) head of the demo model with the main model frozen.

    train_mtp.py --gguf models/demo-en-17m.gguf --pack .train/pack --out DIR
                 [--tiny] [--steps N] [--time-budget S] [--batch B] [--depth D] [--device D]

The main model is Hugging Face transformers' Qwen3_5ForCausalLM with the GGUF's weights
(main_from_gguf: the inverse of tools/refgen's gguf_tensors, V heads back from tiled to grouped
order, norms 1 + w back to w, ssm_a back to A_log; the F16 matrices are exact). It runs once,
in F32, over the training stream cut into consecutive windows of --window tokens and keeps its
final-norm output h (the lm_head's input, what model/mtp.c reads) for every position.

The head (MTPHead) computes exactly model/mtp.c's rows (docs/QWEN35.md §2.8):
    u = eh_proj · [RMSNorm(embd[x_{t+1}])·enorm ; RMSNorm(h_t)·hnorm]     embedding half first
    u += GatedAttention(RMSNorm(u)·attn_norm) at position t (its own KV: the rows before it)
    u += FFN(RMSNorm(u)·post_norm)
    g = RMSNorm(u)·head_norm;  logits = token_embd · g                 (tied lm_head, frozen)
with norms held as the GGUF stores them (the multiplier, 1 + w_hf), attn_q's rows per head
[query | gate], partial NEOX rotary (rope.dimension_count of head_dim, theta rope.freq_base).
The embedding and lm_head are the main model's (frozen); head_norm is the head's own
(nextn.shared_head_norm, initialised from output_norm). The layer starts as a copy of the main
model's last attention layer, eh_proj as the identity on the hidden half (plus noise 0.02), the
pre-projection norms at 1.

Teacher-forced, --depth D chained steps as speculative drafting runs them: at depth 1 the row
of anchor t is (h_t, x_{t+1}) at position t and predicts x_{t+2}; at depth d > 1 the row is
(g of depth d-1, x_{t+d}) at position t+d-1 and predicts x_{t+d+1}, attending to the depth-1
rows 0..t and to the deeper rows of its own anchor (the MTP cache while drafting). The target
of a row predicting x_j is the main model's own distribution at position j-1 (softmax of its
logits: what verification compares with), cross-entropy against it (--hard-weight adds the
corpus token's). Depth d's loss is weighted by --depth-decay^(d-1).

AdamW (betas 0.9/0.95, decay 0.1 on matrices), warm-up then cosine to 10 % over progress =
max(step / steps, seconds / time budget); bf16 autocast on CUDA. Every --eval-every steps and at
the end: held-out soft cross-entropy and the share of rows whose argmax is the main model's
argmax, per depth (teacher-forced acceptance); the head of the evaluation with the most agreement
(summed over depths) is the one saved. Writes DIR/mtp-head.safetensors (the 15 tensors
under their GGUF names, F32, numpy [n_out][n_in] layout) and DIR/log.json.
--tiny: a few windows of each split and a small batch, for checking on a CPU in a minute.
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


def log(*a):
    print(*a, flush=True)


def load_u16(path):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype="<u2").astype(np.int64)


# ---- the main model from the GGUF ----

GGUF_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
                10: "<u8", 11: "<i8", 12: "<f8"}


def gguf_arrays(path):
    """{name: numpy array [ne1][ne0] (or [ne0]), F32} and {key: value} of a GGUF file whose
    tensors are F32 or F16. A reader of its own (the GPU host has no gguf-py)."""
    buf = memoryview(open(path, "rb").read())
    off = 0

    def take(dt, n=1):
        nonlocal off
        a = np.frombuffer(buf, dtype=dt, count=n, offset=off)
        off += a.nbytes
        return a

    def string():
        n = int(take("<u8")[0])
        nonlocal off
        s = bytes(buf[off:off + n]).decode("utf-8", "replace")
        off += n
        return s

    def value(vt):
        if vt == 8:
            return string()
        if vt == 9:
            et, n = int(take("<u4")[0]), int(take("<u8")[0])
            if et in GGUF_SCALARS:
                return take(GGUF_SCALARS[et], n).tolist()
            return [value(et) for _ in range(n)]
        return take(GGUF_SCALARS[vt])[0].item()

    assert bytes(buf[:4]) == b"GGUF", "not a GGUF file"
    off = 4
    version, n_t, n_kv = int(take("<u4")[0]), int(take("<u8")[0]), int(take("<u8")[0])
    assert version >= 2, version
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(int(take("<u4")[0]))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = int(take("<u4")[0])
        ne = take("<u8", nd).tolist()
        infos.append((name, ne, int(take("<u4")[0]), int(take("<u8")[0])))
    align = int(kv.get("general.alignment", 32))
    base = (off + align - 1) // align * align
    w = {}
    for name, ne, ty, o in infos:
        assert ty in (0, 1), "%s: type %d (this reader takes F32 and F16)" % (name, ty)
        n = int(np.prod(ne))
        a = np.frombuffer(buf, dtype="<f4" if ty == 0 else "<f2", count=n, offset=base + o)
        w[name] = a.astype(np.float32).reshape(list(reversed(ne)) if len(ne) > 1 else ne)
    return w, kv


def grouped(x, n_k, r, d):
    """The inverse of make_reference.tiled: rows from tiled (j*n_k + g) to grouped (g*r + j)."""
    s = x.shape
    return x.reshape(r, n_k, d, *s[1:]).swapaxes(0, 1).reshape(s)


def main_from_gguf(path):
    """(HF Qwen3_5ForCausalLM in F32 with the GGUF's main weights, eval mode, CPU; the GGUF's
    arrays; its metadata; c; layer_types)."""
    from transformers import Qwen3_5ForCausalLM
    w, kv = gguf_arrays(path)
    V = w["token_embd.weight"].shape[0]
    cfg, c, layer_types, sec = recipe.hf_config(V)
    nextn = int(kv.get("qwen35.nextn_predict_layers", 0))
    assert int(kv["qwen35.block_count"]) - nextn == c["num_hidden_layers"], "layer count"
    assert int(kv["qwen35.embedding_length"]) == c["hidden_size"], "hidden size"
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg).float().eval()
    n_k, n_v = c["linear_num_key_heads"], c["linear_num_value_heads"]
    d_k, d_v, r = c["linear_key_head_dim"], c["linear_value_head_dim"], n_v // n_k
    D_k = n_k * d_k
    sd = {"model.embed_tokens.weight": w["token_embd.weight"],
          "model.norm.weight": w["output_norm.weight"] - 1}
    for i, lt in enumerate(layer_types):
        p, b = "model.layers.%d." % i, "blk.%d." % i
        sd.update({p + "input_layernorm.weight": w[b + "attn_norm.weight"] - 1,
                   p + "post_attention_layernorm.weight": w[b + "post_attention_norm.weight"] - 1,
                   p + "mlp.gate_proj.weight": w[b + "ffn_gate.weight"],
                   p + "mlp.up_proj.weight": w[b + "ffn_up.weight"],
                   p + "mlp.down_proj.weight": w[b + "ffn_down.weight"]})
        if lt == "linear_attention":
            a = p + "linear_attn."
            qkv = w[b + "attn_qkv.weight"].copy()
            qkv[2 * D_k:] = grouped(qkv[2 * D_k:], n_k, r, d_v)
            conv = w[b + "ssm_conv1d.weight"].copy()  # [C][K]
            conv[2 * D_k:] = grouped(conv[2 * D_k:], n_k, r, d_v)
            sd.update({a + "in_proj_qkv.weight": qkv,
                       a + "in_proj_z.weight": grouped(w[b + "attn_gate.weight"], n_k, r, d_v),
                       a + "in_proj_b.weight": grouped(w[b + "ssm_beta.weight"], n_k, r, 1),
                       a + "in_proj_a.weight": grouped(w[b + "ssm_alpha.weight"], n_k, r, 1),
                       a + "conv1d.weight": conv[:, None, :],
                       a + "dt_bias": grouped(w[b + "ssm_dt.bias"], n_k, r, 1),
                       a + "A_log": np.log(-grouped(w[b + "ssm_a"], n_k, r, 1)),
                       a + "norm.weight": w[b + "ssm_norm.weight"],
                       a + "out_proj.weight": np.ascontiguousarray(
                           grouped(w[b + "ssm_out.weight"].T, n_k, r, d_v).T)})
        else:
            a = p + "self_attn."
            sd.update({a + "q_proj.weight": w[b + "attn_q.weight"],
                       a + "k_proj.weight": w[b + "attn_k.weight"],
                       a + "v_proj.weight": w[b + "attn_v.weight"],
                       a + "o_proj.weight": w[b + "attn_output.weight"],
                       a + "q_norm.weight": w[b + "attn_q_norm.weight"] - 1,
                       a + "k_norm.weight": w[b + "attn_k_norm.weight"] - 1})
    own = model.state_dict()
    t = {}
    for k, v in sd.items():
        assert tuple(own[k].shape) == v.shape, (k, own[k].shape, v.shape)
        t[k] = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
    missing, unexpected = model.load_state_dict(t, strict=False)
    assert not unexpected and missing in ([], ["lm_head.weight"]), (missing, unexpected)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model, w, kv, c, layer_types


@torch.no_grad()
def main_hidden(model, tokens, W, batch, device):
    """The main model's final-norm output for every position of tokens cut into consecutive
    windows of W (the tail dropped): ([n][W] ids, [n][W][H] F32), on device."""
    n = tokens.numel() // W
    x = tokens[:n * W].view(n, W)
    hs = []
    for k in range(0, n, batch):
        xb = x[k:k + batch].to(device)
        hs.append(model.model(input_ids=xb, use_cache=False).last_hidden_state.float())
    return x.to(device), torch.cat(hs)


# ---- the head ----

def rmsnorm(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


class MTPHead(torch.nn.Module):
    """model/mtp.c's MTP block; parameters named as the GGUF tensors (blk.L. dropped)."""
    NAMES = ["attn_norm.weight", "post_attention_norm.weight", "attn_q.weight", "attn_k.weight",
             "attn_v.weight", "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight",
             "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "nextn.eh_proj.weight",
             "nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight"]

    def __init__(self, w, c, layer_types, seed):
        super().__init__()
        H, F_, nh, nkv, dh = (c["hidden_size"], c["intermediate_size"], c["num_attention_heads"],
                              c["num_key_value_heads"], c["head_dim"])
        self.H, self.nh, self.nkv, self.dh, self.eps = H, nh, nkv, dh, c["rms_norm_eps"]
        self.n_rot = int(dh * recipe.refgen().ROPE["partial_rotary_factor"])
        self.theta = recipe.refgen().ROPE["rope_theta"]
        last_attn = max(i for i, lt in enumerate(layer_types) if lt == "full_attention")
        b = "blk.%d." % last_attn
        g = torch.Generator().manual_seed(seed)
        init = {}
        for n in self.NAMES[:11]:  # the layer: a copy of the main model's last attention layer
            init[n] = torch.from_numpy(w[b + n].copy())
        eh = torch.randn(H, 2 * H, generator=g) * 0.02  # the hidden half starts as the identity
        eh[:, H:] += torch.eye(H)
        init["nextn.eh_proj.weight"] = eh
        init["nextn.enorm.weight"] = torch.ones(H)
        init["nextn.hnorm.weight"] = torch.ones(H)
        init["nextn.shared_head_norm.weight"] = torch.from_numpy(w["output_norm.weight"].copy())
        assert init["ffn_gate.weight"].shape == (F_, H)
        self.p = torch.nn.ParameterDict({n.replace(".", "__"): torch.nn.Parameter(v.float())
                                         for n, v in init.items()})
        self.register_buffer("embd", torch.from_numpy(w["token_embd.weight"].copy()),
                             persistent=False)

    def W(self, n):
        return self.p[n.replace(".", "__")]

    def tensors(self):
        return {n: self.W(n).detach().float().cpu().contiguous() for n in self.NAMES}

    def rope(self, x, pos):
        """x [B][heads][N][dh], pos [N] or [B][N]: partial NEOX rotation of dims [0, n_rot)."""
        half = self.n_rot // 2
        inv = 1.0 / self.theta ** (torch.arange(half, device=x.device, dtype=torch.float32) * 2 / self.n_rot)
        ang = pos.float()[..., None] * inv  # [.., N, half]
        if ang.dim() == 3:
            ang = ang[:, None]
        cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
        a, b, rest = x[..., :half], x[..., half:self.n_rot], x[..., self.n_rot:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos, rest], -1)

    def pre(self, hidden, tokens):
        """u = eh_proj · [enorm(e) ; hnorm(h)]: hidden [B][N][H], tokens [B][N]."""
        e = rmsnorm(self.embd[tokens], self.W("nextn.enorm.weight"), self.eps)
        hh = rmsnorm(hidden, self.W("nextn.hnorm.weight"), self.eps)
        return F.linear(torch.cat([e, hh], -1), self.W("nextn.eh_proj.weight"))

    def qkv(self, u, pos):
        B, N, _ = u.shape
        x = rmsnorm(u, self.W("attn_norm.weight"), self.eps)
        qg = F.linear(x, self.W("attn_q.weight")).view(B, N, self.nh, 2, self.dh)
        q, gate = qg[..., 0, :], qg[..., 1, :].reshape(B, N, self.nh * self.dh)
        k = F.linear(x, self.W("attn_k.weight")).view(B, N, self.nkv, self.dh)
        v = F.linear(x, self.W("attn_v.weight")).view(B, N, self.nkv, self.dh)
        q = self.rope(rmsnorm(q, self.W("attn_q_norm.weight"), self.eps).transpose(1, 2), pos)
        k = self.rope(rmsnorm(k, self.W("attn_k_norm.weight"), self.eps).transpose(1, 2), pos)
        return q, k, v.transpose(1, 2), gate

    def post(self, u, o, gate):
        B, N, _ = u.shape
        o = o.transpose(1, 2).reshape(B, N, self.nh * self.dh) * torch.sigmoid(gate)
        u = u + F.linear(o, self.W("attn_output.weight"))
        x = rmsnorm(u, self.W("post_attention_norm.weight"), self.eps)
        f = F.silu(F.linear(x, self.W("ffn_gate.weight"))) * F.linear(x, self.W("ffn_up.weight"))
        u = u + F.linear(f, self.W("ffn_down.weight"))
        return rmsnorm(u, self.W("nextn.shared_head_norm.weight"), self.eps)

    def logits(self, g):
        return F.linear(g.float(), self.embd)

    def forward(self, hidden, tokens, depth):
        """hidden [B][N][H] (h of anchors 0..N-1), tokens [B][N + depth - 1] (x_{t+1} ...).
        Returns [depth] of g [B][N][H]: depth d's row of anchor t at position t + d - 1."""
        B, N, _ = hidden.shape
        G = self.nh // self.nkv
        scale = 1.0 / math.sqrt(self.dh)
        pos = torch.arange(N, device=hidden.device)
        u = self.pre(hidden, tokens[:, :N])
        q, k1, v1, gate = self.qkv(u, pos)
        o = F.scaled_dot_product_attention(q, k1.repeat_interleave(G, 1),
                                           v1.repeat_interleave(G, 1), is_causal=True)
        gs = [self.post(u, o, gate)]
        if depth == 1:
            return gs
        causal = torch.ones(N, N, dtype=torch.bool, device=hidden.device).tril()
        k1g, v1g = k1.repeat_interleave(G, 1), v1.repeat_interleave(G, 1)
        ks, vs = [], []  # deeper rows of each anchor: [B][nh][N][dh]
        for d in range(2, depth + 1):
            u = self.pre(gs[-1], tokens[:, d - 1:d - 1 + N])
            q, k, v, gate = self.qkv(u, pos + d - 1)
            ks.append(k.repeat_interleave(G, 1))
            vs.append(v.repeat_interleave(G, 1))
            s_real = (q @ k1g.transpose(-1, -2)).float() * scale
            s_real = s_real.masked_fill(~causal, float("-inf"))
            s_own = torch.stack([(q * kk).sum(-1).float() * scale for kk in ks], -1)
            p = torch.softmax(torch.cat([s_real, s_own], -1), -1)
            o = (p[..., :N].to(v1g.dtype) @ v1g +
                 sum(p[..., N + j, None].to(vv.dtype) * vv for j, vv in enumerate(vs)))
            gs.append(self.post(u, o, gate))
        return gs


def depth_loss(head, gs, ids, h, d, hard_weight):
    """Row (anchor t, depth d) predicts x_{t+d+1}: soft CE against the main model's distribution
    at position t+d (softmax of its logits from h), plus hard_weight x the corpus token's CE;
    also the count of rows whose argmax is the main model's."""
    N = gs.shape[1]
    lg = head.logits(gs).float()
    with torch.no_grad():
        main = head.logits(h[:, d:d + N].float()).float()
        p_main = torch.softmax(main, -1)
        agree = (lg.argmax(-1) == main.argmax(-1)).sum()
    lq = torch.log_softmax(lg, -1)
    loss = -(p_main * lq).sum(-1).mean()
    if hard_weight:
        loss = loss + hard_weight * F.nll_loss(lq.reshape(-1, lq.shape[-1]),
                                               ids[:, d + 1:d + 1 + N].reshape(-1))
    return loss, agree


def head_loss(head, ids, h, depth, decay, hard_weight, device):
    """ids [B][W], h [B][W][H]: anchors 0..W-depth-2 (every depth's target inside the window)."""
    W = ids.shape[1]
    N = W - depth - 1
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        gs = head(h[:, :N], ids[:, 1:N + depth], depth)
    tot, per = 0.0, []
    for d, g in enumerate(gs, 1):
        loss, agree = depth_loss(head, g, ids, h, d, hard_weight)
        tot = tot + decay ** (d - 1) * loss
        per.append((float(loss), int(agree), g.shape[0] * g.shape[1]))
    return tot, per


@torch.no_grad()
def evaluate(head, ids, h, depth, batch, device):
    """Held-out soft CE and argmax agreement with the main model, per depth."""
    head.eval()
    sums = [[0.0, 0, 0] for _ in range(depth)]
    for k in range(0, ids.shape[0], batch):
        _, per = head_loss(head, ids[k:k + batch], h[k:k + batch], depth, 1.0, 0.0, device)
        for s, (loss, agree, n) in zip(sums, per):
            s[0] += loss * n
            s[1] += agree
            s[2] += n
    head.train()
    return [dict(depth=d + 1, soft_ce=s[0] / s[2], agree=s[1] / s[2], rows=s[2])
            for d, s in enumerate(sums)]


def save(head, out):
    from safetensors.torch import save_file
    save_file(head.tensors(), os.path.join(out, "mtp-head.safetensors"), metadata=dict(format="pt"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default="models/demo-en-17m.gguf")
    ap.add_argument("--pack", default=".train/pack")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="a few windows, small batch (CPU check)")
    ap.add_argument("--train-windows", type=int, default=0,
                    help="use only the first N training windows (0: all; a CPU run)")
    ap.add_argument("--steps", type=int, default=4000, help="planned steps (the time budget may end it first)")
    ap.add_argument("--time-budget", type=float, default=150, help="seconds of training")
    ap.add_argument("--batch", type=int, default=64, help="windows per step")
    ap.add_argument("--window", type=int, default=512, help="tokens per window")
    ap.add_argument("--depth", type=int, default=4, help="chained draft steps trained (1..4)")
    ap.add_argument("--depth-decay", type=float, default=0.8)
    ap.add_argument("--hard-weight", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20251206)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = a.device
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = False  # the main model's h in true F32
    torch.backends.cudnn.allow_tf32 = False
    meta = json.load(open(os.path.join(a.pack, "meta.json")))
    train = torch.from_numpy(load_u16(os.path.join(a.pack, "train.u16.gz")))
    held = torch.from_numpy(load_u16(os.path.join(a.pack, "heldout.u16.gz")))
    if a.tiny:
        train, held = train[:8 * a.window], held[:2 * a.window]
    if a.train_windows:
        train = train[:a.train_windows * a.window]
    model, w, kv, c, layer_types = main_from_gguf(a.gguf)
    assert w["token_embd.weight"].shape[0] == meta["vocab_size"], "the pack's vocabulary is not the GGUF's"
    model.to(dev)
    t0 = time.time()
    tr_ids, tr_h = main_hidden(model, train, a.window, 16 if a.tiny else 64, dev)
    ho_ids, ho_h = main_hidden(model, held, a.window, 16 if a.tiny else 64, dev)
    t_hidden = time.time() - t0
    del model
    torch.backends.cuda.matmul.allow_tf32 = True  # the head trains under bf16 autocast anyway
    log("main model's h: %d + %d windows of %d in %.1f s" %
        (tr_ids.shape[0], ho_ids.shape[0], a.window, t_hidden))
    head = MTPHead(w, c, layer_types, a.seed).to(dev)
    head.train()
    mats = [p for n, p in head.p.items() if p.dim() == 2]
    rest = [p for n, p in head.p.items() if p.dim() != 2]
    opt = torch.optim.AdamW([dict(params=mats, weight_decay=0.1), dict(params=rest, weight_decay=0.0)],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev == "cuda")
    B = min(a.batch, 4 if a.tiny else a.batch, tr_ids.shape[0])
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    n_params = sum(p.numel() for p in head.p.values())
    import transformers
    info = dict(gguf=os.path.basename(a.gguf), device=dev,
                gpu=torch.cuda.get_device_name() if dev == "cuda" else None,
                torch=torch.__version__, transformers=transformers.__version__, params=n_params,
                args=vars(a), train_windows=int(tr_ids.shape[0]), heldout_windows=int(ho_ids.shape[0]),
                hidden_seconds=round(t_hidden, 1))
    log(json.dumps(info))
    rng = np.random.default_rng(a.seed)
    hist, evals = [], []
    best, best_state = None, None
    t0 = time.time()
    step, progress = 0, 0.0
    while progress < 1.0:
        warm = min(1.0, (step + 1) / a.warmup)
        lr = a.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.as_tensor(rng.integers(0, tr_ids.shape[0], size=B), device=dev)
        loss, per = head_loss(head, tr_ids[idx], tr_h[idx], a.depth, a.depth_decay,
                              a.hard_weight, dev)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(list(head.p.values()), 1.0)
        opt.step()
        step += 1
        el = time.time() - t0
        progress = max(step / a.steps, el / a.time_budget)
        if step % 10 == 0 or step < 5 or progress >= 1.0:
            hist.append(dict(step=step, loss=float(loss), lr=lr, grad_norm=float(gn),
                             seconds=round(el, 2),
                             agree=[round(ag / n, 4) for _, ag, n in per]))
            if step % 50 == 0 or step < 5 or progress >= 1.0:
                log("step %5d  loss %.4f  agree %s  lr %.2e  |g| %.2f  %.0f s" %
                    (step, float(loss), " ".join("%.3f" % (ag / n) for _, ag, n in per), lr,
                     float(gn), el))
        if step % a.eval_every == 0 or progress >= 1.0:
            ev = evaluate(head, ho_ids, ho_h, a.depth, 16 if a.tiny else 64, dev)
            evals.append(dict(step=step, seconds=round(time.time() - t0, 2), depths=ev))
            score = sum(e["agree"] for e in ev)
            if best is None or score > best[0]:
                best = (score, step)
                best_state = {n: p.detach().clone() for n, p in head.p.items()}
            log("  held-out: " + "  ".join("d%d ce %.3f agree %.3f" % (e["depth"], e["soft_ce"], e["agree"])
                                           for e in ev))
    el = time.time() - t0
    with torch.no_grad():  # the evaluation with the most held-out agreement (summed over depths)
        for n, p in head.p.items():
            p.copy_(best_state[n])
    save(head, a.out)
    info.update(steps=step, saved_step=best[1],
                peak_gpu_bytes=torch.cuda.max_memory_allocated() if dev == "cuda" else None, seconds=round(el, 1), total_seconds=round(time.time() - t_start, 1),
                train=hist, heldout=evals)
    json.dump(info, open(os.path.join(a.out, "log.json"), "w"), indent=0)
    log("done: %d steps in %.0f s (%.0f s in all); wrote %s/mtp-head.safetensors (step %d), log.json" %
        (step, el, time.time() - t_start, a.out, best[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
