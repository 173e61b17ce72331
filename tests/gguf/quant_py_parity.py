"""Parity of our quant kernels (gguf/quant*.c) with gguf-py (llama.cpp's reference Python).

usage: quant_py_parity.py QUANT_PY_GEN WORKDIR

QUANT_PY_GEN writes random valid blocks of every supported type with our dequantisation, and
our quantisation of F32 data with its dequantisation (see tests/gguf/quant_py_gen.c). Checks:
  1. gguf.quants.dequantize(blocks) == our dequantisation, bit for bit (max ulp printed);
  2. gguf-py dequantises our quantised bytes to exactly our dequantisation of them, and the
     round trip error (RMSE / RMS of the data) is within the format's bound;
  3. where gguf-py has a quantiser (F16, BF16, Q8_0), its bytes equal ours;
  4. the check can fail: one flipped byte in the blocks is detected.
Exits non-zero listing every difference.
"""
import os
import subprocess
import sys

import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as QT

# Round-trip error bounds (RMSE / RMS), as tests/gguf/quant_test.c (outlier column).
RT_BOUND = {"f32": 0.0, "f16": 2.5e-4, "bf16": 2.0e-3, "q8_0": 0.010, "q6_K": 0.030,
            "q5_K": 0.050, "q4_K": 0.100}
HAS_PY_QUANTIZER = {"f16", "bf16", "q8_0"}

errors = []


def read(workdir, name, ext, dtype):
    with open(os.path.join(workdir, f"{name}.{ext}"), "rb") as f:
        return np.frombuffer(f.read(), dtype=dtype)


def py_dequantize(raw, qtype, n):
    if qtype == QT.F32:
        return raw.view(np.float32).copy()
    if qtype == QT.F16:
        return raw.view(np.float16).astype(np.float32)
    return np.asarray(quants.dequantize(raw, qtype), dtype=np.float32).reshape(-1)[:n]


def py_quantize(src, qtype):
    if qtype == QT.F16:
        return src.astype(np.float16).view(np.uint8)
    return np.asarray(quants.quantize(src, qtype)).view(np.uint8).reshape(-1)


def max_ulp(a, b):
    """Largest distance between float32 arrays in units in the last place (floats mapped to
    ordered integers, so +0 and -0 are 0 apart and a sign change counts every step)."""
    def ordered(v):
        i = v.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    if a.shape != b.shape:
        return float("inf")
    return int(np.max(np.abs(ordered(a) - ordered(b)))) if len(a) else 0


def first_diffs(a, b, k=5):
    idx = np.nonzero(a.view(np.uint32) != b.view(np.uint32))[0][:k]
    return ", ".join(f"[{i}] ours {a[i]!r} gguf-py {b[i]!r}" for i in idx)


def main():
    gen, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    subprocess.run([gen, workdir], check=True)
    with open(os.path.join(workdir, "manifest.txt")) as f:
        manifest = [line.split() for line in f if line.strip()]
    if len(manifest) != 7:
        errors.append(f"manifest has {len(manifest)} types, want 7")
    for name, type_id, n in manifest:
        qtype, n = QT(int(type_id)), int(n)
        # 1. dequantisation of random blocks
        blocks = read(workdir, name, "blocks", np.uint8)
        ours = read(workdir, name, "deq", np.float32)
        theirs = py_dequantize(blocks, qtype, n)
        ulp = max_ulp(ours, theirs)
        print(f"{name:5s} dequant of {n} random-block values: max {ulp} ulp from gguf-py")
        if ours.shape != theirs.shape or ulp != 0:
            errors.append(f"{name}: dequant differs ({ulp} ulp): {first_diffs(ours, theirs)}")
        # 4. a flipped byte must be caught by the same comparison
        bad = blocks.copy()
        bad[len(bad) // 2 + 1] ^= 0x11
        if np.array_equal(py_dequantize(bad, qtype, n).view(np.uint32), ours.view(np.uint32)):
            errors.append(f"{name}: a flipped byte went unnoticed (the check cannot fail)")
        # 2. quantise -> dequantise
        src = read(workdir, name, "src", np.float32)
        quant = read(workdir, name, "quant", np.uint8)
        qdeq = read(workdir, name, "qdeq", np.float32)
        theirs_q = py_dequantize(quant, qtype, n)
        if not np.array_equal(qdeq.view(np.uint32), theirs_q.view(np.uint32)):
            errors.append(f"{name}: gguf-py dequantises our quantisation differently: "
                          f"{first_diffs(qdeq, theirs_q)}")
        rel = float(np.sqrt(np.mean((theirs_q.astype(np.float64) - src) ** 2) /
                            np.mean(src.astype(np.float64) ** 2)))
        print(f"{name:5s} our quantise -> gguf-py dequantise: rel rmse {rel:.5f} "
              f"(bound {RT_BOUND[name]})")
        if rel > RT_BOUND[name]:
            errors.append(f"{name}: round-trip rel rmse {rel:.5f} > {RT_BOUND[name]}")
        # 3. byte-identical quantisation where gguf-py has a quantiser
        if name in HAS_PY_QUANTIZER:
            py_bytes = py_quantize(src, qtype)
            same = py_bytes.shape == quant.shape and np.array_equal(py_bytes, quant)
            print(f"{name:5s} quantise bytes identical to gguf-py: {same}")
            if not same:
                nd = int(np.sum(py_bytes != quant)) if py_bytes.shape == quant.shape else -1
                errors.append(f"{name}: our quantised bytes differ from gguf-py in {nd} bytes")
    if errors:
        print("FAILED:\n  " + "\n  ".join(errors))
        return 1
    print("quant_py_parity: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
