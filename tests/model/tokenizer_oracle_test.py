"""Differential test: the C tokenizer against the Hugging Face `tokenizers` library.

The HF tokenizer is built from the GGUF's own vocabulary and merges with the Qwen3.5 pipeline
(NFC normalizer, qwen35 split regex, ByteLevel, special tokens matched before normalisation),
checked first against the reference `tokenizer` entries, then both tokenizers encode thousands
of random texts (scripts, combining marks, digits, odd whitespace, contractions, special tokens
in the text) and decode random id sequences (including ones that are invalid UTF-8).

usage: tokenizer_oracle_test.py TOOL REFERENCE_DIR [N_CASES] [SEED]
Runs every reference case of REFERENCE_DIR (the shared folder) and of tests/reference.
"""
import json
import os
import random
import subprocess
import sys
import unicodedata

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
         r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def reference_cases(shared):
    """(name, folder) of every reference case: NAME.gguf with NAME.json in the shared folder
    (when it exists), then in the repository's own folder ($DS_REPO_REFERENCE_DIR, else
    tests/reference under the working directory: the runfiles root under bazel, the repository
    root by hand). Sorted by name within each folder; tests/model/ref_cases.h does the same."""
    out, seen = [], set()
    for d in (shared, os.environ.get("DS_REPO_REFERENCE_DIR") or "tests/reference"):
        if not os.path.isdir(d) or os.path.realpath(d) in seen:
            continue
        seen.add(os.path.realpath(d))
        for f in sorted(os.listdir(d)):
            name = f[:-5]
            if f.endswith(".gguf") and os.path.exists(os.path.join(d, name + ".json")):
                out.append((name, d))
    return out


def field_strs(r, key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode() for i in f.data]


def build_hf(path):
    r = gguf.GGUFReader(path)
    toks = field_strs(r, 'tokenizer.ggml.tokens')
    f = r.fields['tokenizer.ggml.token_type']
    types = [int(f.parts[i][0]) for i in f.data]
    merges = [tuple(m.split(' ', 1)) for m in field_strs(r, 'tokenizer.ggml.merges')]
    special = {i for i, ty in enumerate(types) if ty in (3, 4)}
    # Specials stay in the model vocabulary so that add_special_tokens keeps their GGUF ids
    # (HF would give tokens it has to add new ids after the vocabulary).
    vocab = {}
    for i, t in enumerate(toks):
        vocab.setdefault(t, i)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(toks[i], special=True, normalized=False)
                           for i in sorted(special)])
    return tk, [toks[i] for i in sorted(special)], len(toks)


PIECES = [
    "the", "The", " quick", "DON'T", "it's", "they'VE", "'ll", "'LL", "'ſ", "'d", "'", "''s",
    "e\u0301", "\u00e9", "n\u0303", "a\u0308\u0304", "\u0301", " \u0301x", "\u1100\u1161\u11a8",
    "\u65e5\u672c\u8a9e", "\u4eca\u5929", "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0645\u0631\u062d\u0628\u0627",
    "\u041f\u0440\u0438\u0432\u0435\u0442", "\u03b1\u03b2\u03b3", "\U0001f642", "\U0001f680", "\U0001f468\u200d\U0001f469",
    "123", "4,512", "3.14", "\u0663\u0664", "\u00bd", "\u2167", "x", "xx", "__init__", "::", "->",
    " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u0085",
    "\u200b", "\ufeff", "!", "?!", "...", "\"", "(", ")", "{}", "#", "$", "@", "\\", "`",
    "\u304b\u3099", "\u30cf\u309a", "\uac00\u11a8", "\u1112\u1161", "\u4e00\u0301", "\u0b47\u0b3e",
    "\u0958", "\u2126", "\u0344", "a\u0323\u0307", "a\u0307\u0323", "\u0300\u0300", "\u0338", ">\u0338",
    "caf\u00e9", "na\u00efve", "\u00c5ngstr\u00f6m", "\u212b", "\ufb01", "\u2126", "\u0000",
]


def random_text(rng, specials):
    n = rng.randint(0, 24)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.55:
            out.append(rng.choice(PIECES))
        elif r < 0.65 and specials:
            out.append(rng.choice(specials))
        elif r < 0.9:
            out.append(chr(rng.randint(0x20, 0x7e)))
        else:  # any starter assigned in Unicode 14 (PCRE2 10.42's tables; see model/README.md:
            # the Unicode versions of PCRE2, utf8proc and HF differ for recent additions)
            cp = rng.randint(0, 0x10FFFF)
            while (0xD800 <= cp <= 0xDFFF or unicodedata.category(chr(cp)) == "Cn"
                   or unicodedata.combining(chr(cp))):
                cp = rng.randint(0, 0x10FFFF)
            out.append(chr(cp))
    return "".join(out)


def run_tool(tool, model, records):
    data = b"".join(records)
    res = subprocess.run([tool, model], input=data, stdout=subprocess.PIPE, check=True)
    return res.stdout.decode().split("\n")[:-1]


def main():
    tool, ref_dir = sys.argv[1], sys.argv[2]
    n_cases = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 4242
    fails = 0
    cases = reference_cases(ref_dir)
    if not cases:
        print("no reference cases in %s or tests/reference" % ref_dir)
        return 1
    for name, d in cases:
        fails += compare(tool, "%s/%s.gguf" % (d, name), "%s/%s.json" % (d, name),
                         n_cases, random.Random(seed))
    return 1 if fails else 0


def compare(tool, model, ref, n_cases, rng):
    tk, specials, n_vocab = build_hf(model)

    cases = json.load(open(ref))["tokenizer"]
    for c in cases:  # the oracle itself must match the reference first
        assert tk.encode(c["text"], add_special_tokens=False).ids == c["ids"], c["text"]
        assert tk.decode(c["ids"], skip_special_tokens=False) == c["decoded"], c["text"]

    texts = [c["text"] for c in cases] + [random_text(rng, specials) for _ in range(n_cases)]
    texts.append(" ".join(texts[: len(cases)]) * 20)  # one long text
    id_seqs = [[rng.randrange(n_vocab) for _ in range(rng.randint(0, 12))] for _ in range(n_cases)]
    id_seqs += [[rng.randrange(256) for _ in range(rng.randint(1, 8))] for _ in range(n_cases)]

    records = []
    for t in texts:
        b = t.encode()
        records.append(b"E %d\n" % len(b) + b + b"\n")
    for s in id_seqs:
        records.append(("D %d %s\n" % (len(s), " ".join(map(str, s)))).encode())
    lines = run_tool(tool, model, records)
    assert len(lines) == len(records), (len(lines), len(records))

    fails = 0
    for t, line in zip(texts, lines):
        want = tk.encode(t, add_special_tokens=False).ids
        got = [int(x) for x in line.split()] if not line.startswith("ERR") else line
        if got != want:
            fails += 1
            if fails <= 10:
                print("ENCODE MISMATCH text=%s\n  c =%s\n  hf=%s" % (ascii(t), got, want))
    for s, line in zip(id_seqs, lines[len(texts):]):
        want = tk.decode(s, skip_special_tokens=False).encode().hex()
        if line != want:
            fails += 1
            if fails <= 10:
                print("DECODE MISMATCH ids=%s\n  c =%s\n  hf=%s" % (s, line, want))
    print("%s: %d texts, %d id sequences, %d mismatches" % (model, len(texts), len(id_seqs), fails))
    return fails


if __name__ == "__main__":
    sys.exit(main())
