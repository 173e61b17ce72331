"""The MTP head of the C code against a numpy re-implementation of docs/QWEN35.md §2.8.

mtp_py_test.py DELTASERVE REFERENCE_DIR MTP_DUMP_TOOL (tokenizer_py_test.sh's order): writes synthetic tiny models with an MTP
block (`deltaserve gguf synth --mtp`, F32 and Q8_0), runs mtp_dump_tool on each (the main model's
h, the MTP rows' logits and g, k chained drafts) and recomputes the MTP rows from h, the pair
tokens and the GGUF weights read with gguf-py (Q8_0 dequantised by gguf.quants; the tool then
dots in F32). Logits and g must agree to 1e-4 of their scale, the drafts exactly unless the
reference's top two logits are closer than that.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def weights(path):
    r = GGUFReader(path)
    w = {}
    for t in r.tensors:
        w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64)  # [ne1][ne0] or [ne0]
    kv = {f.name: f for f in r.fields.values()}

    def u32(key):
        f = kv[key]
        return int(f.parts[f.data[0]][0])

    def f32(key):
        f = kv[key]
        return float(f.parts[f.data[0]][0])

    cfg = {
        "L": u32("qwen35.block_count") - u32("qwen35.nextn_predict_layers"),
        "n_h": u32("qwen35.attention.head_count"),
        "n_kv": u32("qwen35.attention.head_count_kv"),
        "d_h": u32("qwen35.attention.key_length"),
        "n_rot": u32("qwen35.rope.dimension_count"),
        "base": f32("qwen35.rope.freq_base"),
        "eps": f32("qwen35.attention.layer_norm_rms_epsilon"),
    }
    return w, cfg


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, n_rot, base):
    """Partial NEOX rotation of every head of x [heads][d_h] over dims [0, n_rot)."""
    half = n_rot // 2
    inv = 1.0 / base ** (np.arange(half) * 2.0 / n_rot)
    c, s = np.cos(pos * inv), np.sin(pos * inv)
    a, b = x[:, :half].copy(), x[:, half:n_rot].copy()
    x[:, :half] = a * c - b * s
    x[:, half:n_rot] = a * s + b * c
    return x


def mtp_rows(w, cfg, h, tokens):
    """Rows at positions 0..T-1: (logits [T][V], g [T][H])."""
    L, eps, dh, nh, nkv = cfg["L"], cfg["eps"], cfg["d_h"], cfg["n_h"], cfg["n_kv"]
    b = "blk.%d." % L

    def W(name):
        return w[name] if name in w else None

    embd = W(b + "nextn.embed_tokens.weight")
    embd = w["token_embd.weight"] if embd is None else embd
    head = W(b + "nextn.shared_head_head.weight")
    head = (W("output.weight") if W("output.weight") is not None else w["token_embd.weight"]) if head is None else head
    head_norm = W(b + "nextn.shared_head_norm.weight")
    head_norm = w["output_norm.weight"] if head_norm is None else head_norm
    K, Vc, logits, gs = [], [], [], []
    for t, (hv, tok) in enumerate(zip(h, tokens)):
        e = rmsnorm(embd[tok], w[b + "nextn.enorm.weight"], eps)
        hh = rmsnorm(hv, w[b + "nextn.hnorm.weight"], eps)
        u = w[b + "nextn.eh_proj.weight"] @ np.concatenate([e, hh])  # embedding half first
        x = rmsnorm(u, w[b + "attn_norm.weight"], eps)
        qg = (w[b + "attn_q.weight"] @ x).reshape(nh, 2, dh)
        q, gate = qg[:, 0, :].copy(), qg[:, 1, :].reshape(-1)
        k = (w[b + "attn_k.weight"] @ x).reshape(nkv, dh)
        v = (w[b + "attn_v.weight"] @ x).reshape(nkv, dh)
        q = rope(rmsnorm(q, w[b + "attn_q_norm.weight"], eps), t, cfg["n_rot"], cfg["base"])
        k = rope(rmsnorm(k, w[b + "attn_k_norm.weight"], eps), t, cfg["n_rot"], cfg["base"])
        K.append(k), Vc.append(v)
        Ks, Vs = np.stack(K), np.stack(Vc)  # [t+1][nkv][dh]
        o = np.empty((nh, dh))
        for hd in range(nh):
            kv = hd // (nh // nkv)
            sc = Ks[:, kv, :] @ q[hd] / np.sqrt(dh)
            p = np.exp(sc - sc.max())
            o[hd] = (p / p.sum()) @ Vs[:, kv, :]
        o = o.reshape(-1) / (1.0 + np.exp(-gate))
        u = u + w[b + "attn_output.weight"] @ o
        x = rmsnorm(u, w[b + "post_attention_norm.weight"], eps)
        gt, up = w[b + "ffn_gate.weight"] @ x, w[b + "ffn_up.weight"] @ x
        u = u + w[b + "ffn_down.weight"] @ (gt / (1.0 + np.exp(-gt)) * up)
        g = rmsnorm(u, head_norm, eps)
        gs.append(g)
        logits.append(head @ g)
    return np.array(logits), np.array(gs)


def read_dump(path):
    raw = open(path, "rb").read()
    T, K, H, V = np.frombuffer(raw[:16], np.int32)
    off = 16

    def take(n, dt):
        nonlocal off
        a = np.frombuffer(raw[off : off + 4 * n], dt)
        off += 4 * n
        return a

    pairs = take(T, np.int32)
    h = take(T * H, np.float32).reshape(T, H).astype(np.float64)
    lg = take(T * V, np.float32).reshape(T, V)
    g = take(T * H, np.float32).reshape(T, H)
    drafts = take(K, np.int32)
    assert off == len(raw), "dump size"
    return int(T), int(K), pairs, h, lg, g, drafts


def close(name, got, want, tol):
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    print("%s: max |diff| %.3g (scale %.3g)" % (name, err, scale))
    return err <= tol * scale


def check(bin_, tool, quant, tmp):
    model = os.path.join(tmp, "mtp_%s.gguf" % quant)
    dump = os.path.join(tmp, "mtp_%s.bin" % quant)
    subprocess.run([bin_, "gguf", "synth", "--preset", "tiny", "--quant", quant, "--seed", "3",
                    "--mtp", "-o", model], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([tool, model, dump, "exact"], check=True)
    w, cfg = weights(model)
    T, K, pairs, h, lg, g, drafts = read_dump(dump)
    ref_lg, ref_g = mtp_rows(w, cfg, h, pairs)
    ok = close(quant + " logits", lg, ref_lg, 1e-4) & close(quant + " g", g, ref_g, 1e-4)
    # the chain: (h[T-1], pairs[T-1]) at T-1, then (g, draft) at the next positions
    hs, toks = list(h[: T - 1]), list(pairs[: T - 1])
    hin, tok = h[T - 1], int(pairs[T - 1])
    for i in range(K):
        row_lg, row_g = mtp_rows(w, cfg, np.array(hs + [hin]), toks + [tok])
        last = row_lg[-1]
        top2 = np.sort(last)[-2:]
        want = int(np.argmax(last))
        if top2[1] - top2[0] < 1e-4 * max(1.0, abs(top2[1])):
            print("%s draft %d: near tie, chain not compared further" % (quant, i))
            break
        if int(drafts[i]) != want:
            print("%s draft %d: C %d, reference %d" % (quant, i, drafts[i], want))
            ok = False
            break
        hs.append(hin), toks.append(tok)
        hin, tok = row_g[-1], want
    print("%s drafts %s" % (quant, list(map(int, drafts))))
    return ok


def main():
    bin_, tool = sys.argv[1], sys.argv[3]
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
        ok = all([check(bin_, tool, q, tmp) for q in ("f32", "q8_0")])
    print("mtp_py_test: %s" % ("all checks passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
