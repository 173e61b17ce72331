"""Cross-checks our GGUF reader and writer against gguf-py (llama.cpp's reference code).

usage: gguf_py_crosscheck.py HELPER WORKDIR

(a) HELPER write a.gguf: our writer writes every KV type and F32/F16/BF16/Q8_0/Q4_K/Q5_K/Q6_K
    tensors and prints what it meant to write; gguf.GGUFReader must read exactly that.
(b) gguf.GGUFWriter writes b.gguf (every KV type, alignment 64, F32/F16/BF16/I32 and raw
    quantized tensors); HELPER dump b.gguf (our reader) must report exactly what was written.
Exits non-zero with a list of the differences.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import gguf
from gguf import GGUFValueType as VT

VT_NAME = {
    VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16", VT.UINT32: "u32",
    VT.INT32: "i32", VT.FLOAT32: "f32", VT.BOOL: "bool", VT.STRING: "str", VT.ARRAY: "arr",
    VT.UINT64: "u64", VT.INT64: "i64", VT.FLOAT64: "f64",
}
NAME_VT = {v: k for k, v in VT_NAME.items()}

errors = []


def err(msg):
    errors.append(msg)


def same_scalar(vtype, a, b):
    """a, b: values of GGUF type name vtype, compared exactly in that type."""
    if vtype == "f32":
        return np.float32(a).tobytes() == np.float32(b).tobytes()
    if vtype == "f64":
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    if vtype == "bool":
        return bool(a) == bool(b)
    if vtype == "str":
        return a == b
    return int(a) == int(b)


def same_value(kv_type, arr_type, a, b):
    if kv_type != "arr":
        return same_scalar(kv_type, a, b)
    return len(a) == len(b) and all(same_scalar(arr_type, x, y) for x, y in zip(a, b))


def run_helper(helper, mode, path):
    r = subprocess.run([helper, mode, path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{helper} {mode} {path} failed ({r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout)


# ---- (a) our writer -> gguf-py reader ------------------------------------------------------

def check_our_writer(helper, path):
    want = run_helper(helper, "write", path)
    r = gguf.GGUFReader(path)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    if r.alignment != want["alignment"]:
        err(f"(a) alignment: gguf-py {r.alignment}, ours {want['alignment']}")
    if [k["key"] for k in want["kv"]] != list(fields):
        err(f"(a) keys differ: ours {[k['key'] for k in want['kv']]}, gguf-py {list(fields)}")
    n_kv = 0
    for kv in want["kv"]:
        f = fields.get(kv["key"])
        if f is None:
            continue
        n_kv += 1
        t = VT_NAME[f.types[0]]
        at = VT_NAME[f.types[-1]] if t == "arr" and len(f.types) > 1 else None
        if t == "arr" and kv["value"] == []:
            # gguf-py reports an empty array's element type only through the raw part
            at = VT_NAME[VT(int(f.parts[3][0]))]  # [key len, key, type, elem type, n]
        if t != kv["type"] or at != kv["arr_type"]:
            err(f"(a) {kv['key']}: type {t}/{at}, ours {kv['type']}/{kv['arr_type']}")
            continue
        got = f.contents()
        if t == "arr" and kv["value"] == []:
            got = []
        if not same_value(t, at, got, kv["value"]):
            err(f"(a) {kv['key']}: gguf-py reads {got!r}, ours wrote {kv['value']!r}")
    if len(r.tensors) != len(want["tensors"]):
        err(f"(a) {len(r.tensors)} tensors read, {len(want['tensors'])} written")
    for rt, wt in zip(r.tensors, want["tensors"]):
        if rt.name != wt["name"]:
            err(f"(a) tensor name {rt.name!r}, ours {wt['name']!r}")
            continue
        if int(rt.tensor_type) != wt["type"]:
            err(f"(a) {rt.name}: type {int(rt.tensor_type)}, ours {wt['type']}")
        if [int(x) for x in rt.shape] != wt["ne"]:
            err(f"(a) {rt.name}: shape {list(rt.shape)}, ours {wt['ne']}")
        if rt.n_bytes != wt["n_bytes"] or rt.data_offset != wt["data_offset"]:
            err(f"(a) {rt.name}: {rt.n_bytes} bytes at {rt.data_offset}, ours "
                f"{wt['n_bytes']} at {wt['data_offset']}")
        if rt.data.tobytes() != bytes.fromhex(wt["hex"]):
            err(f"(a) {rt.name}: tensor bytes differ")
    print(f"(a) our writer -> gguf-py: {n_kv} KVs, {len(r.tensors)} tensors compared")


# ---- (b) gguf-py writer -> our reader ------------------------------------------------------

def gguf_py_file(path):
    """Writes path with gguf.GGUFWriter; returns (kvs, tensors) as written."""
    rng = np.random.default_rng(1234)
    w = gguf.GGUFWriter(path, arch="pycheck")
    w.add_custom_alignment(64)
    kvs = [("general.architecture", "str", None, "pycheck"),
           ("general.alignment", "u32", None, 64)]

    def scalar(key, vtype, value):
        w.add_key_value(key, value, NAME_VT[vtype])
        kvs.append((key, vtype, None, value))

    def array(key, arr_type, values):
        w.add_key_value(key, values, VT.ARRAY, sub_type=NAME_VT[arr_type])
        kvs.append((key, "arr", arr_type, values))

    scalar("p.u8", "u8", 255)
    scalar("p.i8", "i8", -128)
    scalar("p.u16", "u16", 65535)
    scalar("p.i16", "i16", -2)
    scalar("p.u32", "u32", 2**32 - 1)
    scalar("p.i32", "i32", -(2**31))
    scalar("p.f32", "f32", float(np.float32(1e-6)))
    scalar("p.bool", "bool", True)
    scalar("p.str", "str", "h\u00e9llo \"w\"\n\u4e16\u754c")
    scalar("p.str.empty", "str", "")
    scalar("p.u64", "u64", 2**64 - 1)
    scalar("p.i64", "i64", -(2**63))
    scalar("p.f64", "f64", math.pi)
    array("p.arr.u8", "u8", [0, 7, 255])
    array("p.arr.i8", "i8", [-1, 1])
    array("p.arr.u16", "u16", [1, 2, 65535])
    array("p.arr.i16", "i16", [-32768, 32767])
    array("p.arr.u32", "u32", [11, 11, 10, 0])
    array("p.arr.i32", "i32", [3, -3, 2, 0])
    array("p.arr.f32", "f32", [float(np.float32(x)) for x in (0.5, -1e-3, 1e30)])
    array("p.arr.bool", "bool", [True, False, True])
    array("p.arr.u64", "u64", [0, 2**64 - 1])
    array("p.arr.i64", "i64", [-(2**63), 2**63 - 1])
    array("p.arr.f64", "f64", [1e-300, -2.5])
    array("p.arr.str", "str", ["<|im_start|>", "", "\u0120the", "\u00e9\u00e9"])

    tensors = []

    def tensor(name, arr, raw_dtype=None, ne=None):
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
        tensors.append((name, arr.tobytes(), ne or list(reversed(arr.shape)), raw_dtype))

    tensor("w.f32", rng.standard_normal((3, 16)).astype(np.float32))
    tensor("w.f16", rng.standard_normal((2, 32)).astype(np.float16))
    tensor("w.i32", np.arange(24, dtype=np.int32).reshape(2, 3, 4))
    bf16 = (rng.standard_normal(8).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    tensor("w.bf16", bf16.view(np.uint8), gguf.GGMLQuantizationType.BF16, [8])
    for qt, bs, ts, ne0, rows in ((gguf.GGMLQuantizationType.Q8_0, 32, 34, 64, 3),
                                  (gguf.GGMLQuantizationType.Q4_K, 256, 144, 256, 2),
                                  (gguf.GGMLQuantizationType.Q5_K, 256, 176, 512, 1),
                                  (gguf.GGMLQuantizationType.Q6_K, 256, 210, 256, 2)):
        raw = rng.integers(0, 256, size=(rows, ne0 // bs * ts), dtype=np.uint8)
        tensor("w." + qt.name.lower(), raw, qt, [ne0, rows])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kvs, tensors


def check_our_reader(helper, path):
    kvs, tensors = gguf_py_file(path)
    got = run_helper(helper, "dump", path)
    if got["alignment"] != 64:
        err(f"(b) alignment {got['alignment']}, gguf-py wrote 64")
    if got["version"] != 3:
        err(f"(b) version {got['version']}")
    ours = {k["key"]: k for k in got["kv"]}
    if [k["key"] for k in got["kv"]] != [k[0] for k in kvs]:
        err(f"(b) keys: ours {[k['key'] for k in got['kv']]}, gguf-py {[k[0] for k in kvs]}")
    for key, t, at, value in kvs:
        o = ours.get(key)
        if o is None:
            err(f"(b) {key}: missing in our dump")
            continue
        if o["type"] != t or o["arr_type"] != at:
            err(f"(b) {key}: our type {o['type']}/{o['arr_type']}, gguf-py wrote {t}/{at}")
        elif not same_value(t, at, o["value"], value):
            err(f"(b) {key}: we read {o['value']!r}, gguf-py wrote {value!r}")
    if len(got["tensors"]) != len(tensors):
        err(f"(b) {len(got['tensors'])} tensors read, {len(tensors)} written")
    ref = gguf.GGUFReader(path)  # for data offsets and type ids as gguf-py lays them out
    for ot, (name, data, ne, raw), rt in zip(got["tensors"], tensors, ref.tensors):
        if ot["name"] != name:
            err(f"(b) tensor {ot['name']!r}, gguf-py wrote {name!r}")
            continue
        if ot["ne"] != ne:
            err(f"(b) {name}: ne {ot['ne']}, gguf-py wrote {ne}")
        if ot["type"] != int(rt.tensor_type) or (raw is not None and ot["type"] != int(raw)):
            err(f"(b) {name}: type {ot['type']}, gguf-py wrote {int(rt.tensor_type)}")
        if ot["data_offset"] != rt.data_offset or ot["n_bytes"] != len(data):
            err(f"(b) {name}: {ot['n_bytes']} bytes at {ot['data_offset']}, gguf-py "
                f"{len(data)} at {rt.data_offset}")
        if bytes.fromhex(ot["hex"]) != data:
            err(f"(b) {name}: tensor bytes differ")
    print(f"(b) gguf-py -> our reader: {len(kvs)} KVs, {len(tensors)} tensors compared")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    helper, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    from importlib.metadata import version
    print(f"gguf-py {version('gguf')} from {os.path.dirname(gguf.__file__)}")
    check_our_writer(helper, os.path.join(work, "ours.gguf"))
    check_our_reader(helper, os.path.join(work, "gguf_py.gguf"))
    if errors:
        print(f"{len(errors)} differences:")
        for e in errors:
            print("  " + e)
        sys.exit(1)
    print("gguf-py cross-check: all equal")


if __name__ == "__main__":
    main()
