#!/usr/bin/env python3
"""Builds the English training corpus of the demo model (models/README.md) from Debian packages.

    corpus.py --work .train            (downloads into .train/debs, writes .train/corpus/)

1. `apt-get download` of the packages in PACKAGES into WORK/debs (skipped when present), then
   `dpkg-deb -x` of each into WORK/x (nothing is installed).
2. One extractor per package turns its files into documents of plain text: the Python
   documentation's reStructuredText sources without markup and code, the <p> paragraphs of the
   Debian Administrator's Handbook, the prose paragraphs of the Debian Reference's text edition,
   the Jargon File's entries, the fortune cookies (one document each).
3. A few question/answer pairs in ChatML (`<|im_start|>user ... <|im_end|>`): the Python
   glossary, the Python FAQ's questions and the Jargon File's entries ("What does X mean?").
4. Every document goes to the held-out split when a hash of its name says so (about 2.5 %,
   whole documents, never the chat pairs), else to training. Writes WORK/corpus/train.jsonl,
   heldout.jsonl (one {"source", "name", "text"} per line) and stats.json.

Deterministic: the same package versions give the same files.
"""
import argparse
import glob
import gzip
import hashlib
import html
import json
import os
import re
import subprocess
import sys

# name, what it is, licence (from the package's debian/copyright)
PACKAGES = [
    ("python3.11-doc", "the Python 3.11 documentation (reStructuredText sources)",
     "PSF License Version 2"),
    ("debian-handbook", "The Debian Administrator's Handbook (English HTML)",
     "GPL-2.0+ or CC-BY-SA-3.0"),
    ("debian-reference-en", "Debian Reference (English text edition)", "GPL-2.0+"),
    ("jargon-text", "The Jargon File 4.4.7", "public domain"),
    ("fortunes", "fortune cookie data files (English)", "BSD (fortune-mod)"),
    ("fortunes-min", "fortune cookie data files (selected)", "BSD (fortune-mod)"),
    ("python-django-doc", "the Django documentation (HTML)", "BSD-3-Clause"),
    ("postgresql-doc-15", "the PostgreSQL 15 manual (HTML)", "PostgreSQL License"),
    ("perl-doc", "the Perl 5.36 manual pages (POD)", "GPL-1+ or Artistic"),
    ("sphinx-doc", "the Sphinx documentation (reStructuredText sources)", "BSD-2-Clause"),
    ("debian-policy", "the Debian Policy Manual (reStructuredText sources)", "GPL-2.0+"),
]
HELDOUT_PER_MILLE = 25


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def fetch(work):
    debs = os.path.join(work, "debs")
    os.makedirs(debs, exist_ok=True)
    x = os.path.join(work, "x")
    versions = {}
    for name, _, _ in PACKAGES:
        have = glob.glob(os.path.join(debs, name + "_*.deb"))
        if not have:
            subprocess.run(["apt-get", "download", name], cwd=debs, check=True)
            have = glob.glob(os.path.join(debs, name + "_*.deb"))
        deb = sorted(have)[-1]
        versions[name] = os.path.basename(deb).split("_")[1].replace("%3a", ":")
        subprocess.run(["dpkg-deb", "-x", deb, x], check=True)
    return x, versions


# ---- reStructuredText (the Python documentation) ----

ROLE = re.compile(r":[a-zA-Z:+-]+:`([^`]*)`")
CODE_DIRECTIVES = ("code-block", "sourcecode", "doctest", "testcode", "testoutput", "testsetup",
                   "productionlist", "literalinclude", "toctree", "index", "highlight",
                   "only", "raw", "csv-table", "list-table", "table", "image", "figure",
                   "audit-event", "opcode", "c:", "cmdoption", "option", "envvar",
                   "include", "impl-detail", "availability", "seealso", "tabularcolumns")


def rst_role(m):
    t = m.group(1)
    t = re.sub(r"^[!~]", "", t)
    if "<" in t and t.endswith(">"):  # `title <target>`
        t = t[:t.rindex("<")].strip()
    return t


def rst_inline(s):
    s = ROLE.sub(rst_role, s)
    s = re.sub(r"``([^`]*)``", r"\1", s)
    s = re.sub(r"`([^`<]*?)\s*<[^>]*>`__?", r"\1", s)  # `text <url>`_
    s = re.sub(r"`([^`]*)`_{0,2}", r"\1", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"\1", s)
    s = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*", r"\1", s)
    s = re.sub(r"\|([\w -]+)\|", r"\1", s)  # substitutions
    s = re.sub(r"\[#\w*\]_|\[\d+\]_", "", s)  # footnote references
    s = s.replace("\\", "")
    return re.sub(r"\s+", " ", s).strip()


def indent_of(line):
    return len(line) - len(line.lstrip(" "))


def rst_to_text(src):
    """Paragraphs of prose: directives' own lines, literal blocks (after `::`), code
    directives' bodies, tables, comments, targets and section underlines are dropped; the
    bodies of other directives (function descriptions, notes) are kept, dedented."""
    lines = src.expandtabs(8).split("\n")
    paras, cur = [], []
    skip_indent = None  # drop lines indented more than this (a literal block, a code body)
    i = 0

    def flush():
        if cur:
            t = rst_inline(" ".join(x.strip() for x in cur))
            if t:
                paras.append(t)
            cur.clear()

    while i < len(lines):
        line = lines[i]
        i += 1
        s = line.strip()
        ind = indent_of(line)
        if skip_indent is not None:
            if not s or ind > skip_indent:
                continue
            skip_indent = None
        if not s:
            flush()
            continue
        if s.startswith(".. "):  # directive, comment, target
            flush()
            m = re.match(r"\.\. ([\w:-]+)::", s)
            name = m.group(1) if m else ""
            if not m or any(name.startswith(c) for c in CODE_DIRECTIVES):
                skip_indent = ind  # comments and code-like bodies go
            else:  # keep the body, drop the directive's options
                while i < len(lines) and re.match(r"\s+:[\w-]+:", lines[i]):
                    i += 1
            continue
        if s == "::":
            flush()
            skip_indent = ind
            continue
        if re.fullmatch(r"([=\-~^\"'`#*+.:_])\1{3,}", s):  # section over/underline
            if cur and len(cur) == 1:  # a title: keep it as its own paragraph
                flush()
            continue
        if s[0] in "+|" or s.startswith(">>>") or s.startswith("... ") or s.startswith("$ "):
            flush()  # tables, console sessions: drop the lines of the block
            while i < len(lines) and lines[i].strip() and indent_of(lines[i]) >= ind:
                i += 1
            continue
        if s.startswith(":") and re.match(r":[\w -]+:( |$)", s) and not cur:
            s = re.sub(r"^:[\w -]+:\s*", "", s)  # field lists (:param x: ...)
            if not s:
                continue
        if cur and ind != indent_of(cur[0]) and not (ind > indent_of(cur[0]) and len(cur) == 1):
            flush()
        cur.append(line)
        if s.endswith("::"):  # "For example::" starts a literal block
            cur[-1] = line.rstrip()[:-1]
            flush()
            skip_indent = ind
    flush()
    out = []
    for p in paras:
        p = re.sub(r"\s+([.,;:])", r"\1", p)
        if len(p) < 3 or not re.search(r"[A-Za-z]{2}", p):
            continue
        out.append(p)
    return "\n\n".join(out)


def docs_python(x):
    root = os.path.join(x, "usr/share/doc/python3.11/html/_sources")
    out = []
    for f in sorted(glob.glob(os.path.join(root, "**/*.rst.txt"), recursive=True)):
        rel = os.path.relpath(f, root)[:-len(".rst.txt")]
        if rel.startswith(("c-api/", "whatsnew/changelog", "includes/")) or rel in (
                "license", "copyright", "contents", "bugs", "about", "library/index",
                "py-modindex", "genindex", "glossary"):
            continue
        text = rst_to_text(open(f, encoding="utf-8").read())
        if len(text) > 200:
            out.append(("python", rel, text))
    return out


def chat_python(x):
    """(question, answer) pairs: the glossary's terms and the FAQ's questions."""
    root = os.path.join(x, "usr/share/doc/python3.11/html/_sources")
    pairs = []
    src = open(os.path.join(root, "glossary.rst.txt"), encoding="utf-8").read()
    entries = re.split(r"\n   (?=\S)", src.split(".. glossary::", 1)[1])
    for e in entries:
        head, _, body = e.partition("\n")
        term = rst_inline(head.strip())
        ans = rst_to_text("\n".join(l[3:] if l.startswith("   ") else l
                                    for l in body.split("\n")))
        ans = ans.split("\n\n")[0]
        if term and len(ans) > 40 and not term.startswith((">>>", "...", "2to3")):
            pairs.append(("What is %s in Python?" % term, ans))
    for f in sorted(glob.glob(os.path.join(root, "faq/*.rst.txt"))):
        lines = open(f, encoding="utf-8").read().split("\n")
        for k in range(1, len(lines) - 1):
            q = lines[k].strip()
            if q.endswith("?") and re.fullmatch(r"-{4,}", lines[k + 1].strip()):
                rest = []
                for l in lines[k + 2:]:
                    if re.fullmatch(r"[-=]{4,}", l.strip()) and rest:
                        rest.pop()
                        break
                    rest.append(l)
                ans = rst_to_text("\n".join(rest)).split("\n\n")
                ans = "\n\n".join(ans[:2])
                if len(ans) > 40:
                    pairs.append((rst_inline(q), ans))
    return pairs


# ---- HTML (the Debian Administrator's Handbook) ----

PARA = re.compile(r'<(div|p) class="(?:para|title)"[^>]*>(.*?)</\1>|<h[123][^>]*>(.*?)</h[123]>', re.S)


def html_paragraphs(src):
    """The text of every <div class="para">, <p class="title"> and heading (the handbook's
    DocBook HTML); a paragraph holding a <pre> or a table is dropped."""
    out = []
    for m in PARA.finditer(src):
        body = m.group(2) if m.group(2) is not None else m.group(3)
        if "<pre" in body or "<table" in body:
            continue
        t = html.unescape(re.sub(r"<[^>]+>", "", body))
        t = re.sub(r"\s+", " ", t).strip()
        if t:
            out.append(t)
    return out


P_TAG = re.compile(r"<p\b[^>]*>(.*?)</p>|<h[123]\b[^>]*>(.*?)</h[123]>", re.S)


def html_p_docs(x, source, pattern, skip=()):
    """One document per HTML page: its <p> paragraphs and headings (Sphinx, PostgreSQL)."""
    out = []
    root = os.path.join(x, pattern.split("*")[0])
    for f in sorted(glob.glob(os.path.join(x, pattern), recursive=True)):
        rel = os.path.relpath(f, root)[:-len(".html")]
        if any(rel.startswith(k) for k in skip):
            continue
        paras = []
        for m in P_TAG.finditer(open(f, encoding="utf-8", errors="replace").read()):
            body = m.group(1) if m.group(1) is not None else m.group(2)
            if "<pre" in body or "<table" in body:
                continue
            t = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", body))).strip()
            t = t.rstrip("\u00b6").strip()  # Sphinx's permalink mark
            if len(t.split()) >= 3:
                paras.append(t)
        text = "\n\n".join(paras)
        if len(text) > 200:
            out.append((source, rel, text))
    return out


def rst_docs(x, source, folder, skip=()):
    out = []
    root = os.path.join(x, folder)
    for f in sorted(glob.glob(os.path.join(root, "**/*.rst.txt"), recursive=True)):
        rel = os.path.relpath(f, root)[:-len(".rst.txt")]
        if any(rel.startswith(k) for k in skip):
            continue
        text = rst_to_text(open(f, encoding="utf-8").read())
        if len(text) > 200:
            out.append((source, rel, text))
    return out


POD_CODE = re.compile(r"([A-Z])<(<+) (.*?) >\2|([A-Z])<([^<>]*)>", re.S)
POD_ESC = {"gt": ">", "lt": "<", "verbar": "|", "sol": "/", "quot": '"', "amp": "&"}


def pod_code(m):
    code, text = (m.group(1), m.group(3)) if m.group(1) else (m.group(4), m.group(5))
    if code == "X" or code == "Z":
        return ""
    if code == "E":
        return POD_ESC.get(text, "")
    if code == "L":
        text = text.split("|")[0] if "|" in text else text.split("/")[-1].strip('"')
    return text


def pod_to_text(src):
    paras = []
    for p in re.split(r"\n\s*\n", src):
        if not p.strip() or p[0] in " \t":  # verbatim (code) paragraphs
            continue
        if p.startswith("="):
            cmd, _, rest = p.partition(" ")
            if cmd not in ("=head1", "=head2", "=head3", "=head4", "=item"):
                continue
            p = rest
            if re.fullmatch(r"[*\d.]*\s*", p):
                continue
            p = re.sub(r"^[*]\s*|^\d+\.?\s+", "", p)
        for _ in range(3):  # nested codes
            p = POD_CODE.sub(pod_code, p)
        p = re.sub(r"\s+", " ", p).strip()
        if p and re.search(r"[A-Za-z]{2}", p):
            paras.append(p)
    return "\n\n".join(paras)


def docs_perl(x):
    out = []
    for f in sorted(glob.glob(os.path.join(x, "usr/share/perl/*/pod/*.pod"))):
        name = os.path.basename(f)[:-4]
        if re.match(r"perl\d*delta$|perl5\d+delta$|perltoc$|perlhist$|perlapi$|perlintern$|"
                    r"perl(cn|jp|ko|tw)$",
                    name):
            continue
        text = pod_to_text(open(f, encoding="utf-8", errors="replace").read())
        if len(text) > 200:
            out.append(("perl", name, text))
    return out


def docs_handbook(x):
    out = []
    for f in sorted(glob.glob(os.path.join(x, "usr/share/doc/debian-handbook/html/en-US/*.html"))):
        paras = [t for t in html_paragraphs(open(f, encoding="utf-8").read())
                 if len(t.split()) >= 3]
        paras = [re.sub(r"^(\d+(\.\d+)*\.)\s+", "", t) for t in paras]
        text = "\n\n".join(paras)
        if len(text) > 200:
            out.append(("handbook", os.path.basename(f)[:-5], text))
    return out


# ---- Debian Reference (text edition) ----

def prose(p):
    """A paragraph of running text: enough words, mostly letters, ends like a sentence."""
    words = p.split()
    if len(words) < 6 or not p.rstrip().endswith((".", ":", "?", "!", ")", "\"")):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in p)
    return letters >= 0.85 * len(p) and not re.search(r"[$#]\s|[{}<>|=]{1}|\t", p)


def docs_reference(x):
    src = gzip.open(os.path.join(x, "usr/share/debian-reference/debian-reference.en.txt.gz"),
                    "rt", encoding="utf-8").read().replace("\u00a0", " ")
    chapters = re.split(r"\nChapter \d+\. ", src)
    out = []
    for k, ch in enumerate(chapters[1:], 1):
        title, _, body = ch.partition("\n")
        paras = []
        for p in re.split(r"\n\s*\n", body):
            t = re.sub(r"\s+", " ", p).strip()
            if prose(t):
                paras.append(t)
        if paras:
            out.append(("reference", "ch%02d" % k, title.strip() + "\n\n" + "\n\n".join(paras)))
    return out


# ---- the Jargon File ----

def jargon_entries(x):
    src = gzip.open(os.path.join(x, "usr/share/doc/jargon-text/jargon.txt.gz"), "rt",
                    encoding="utf-8").read()
    body = src[src.index("\n   :(TM): "):] if "\n   :(TM): " in src else src
    out = []
    for e in re.split(r"\n   (?=:[^:\n]+:)", body):
        m = re.match(r":([^:\n]+):([^\n]*)\n(.*)", e.strip(), re.S)
        if not m:
            continue
        head, pos = m.group(1).strip(), m.group(2).strip()
        paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", m.group(3))]
        paras = [p.replace("{", "").replace("}", "") for p in paras if p]
        if paras:
            out.append((head, pos, paras))
    return out


def docs_jargon(entries):
    return [("jargon", head, "%s%s\n\n%s" % (head, ", " + pos if pos else "", "\n\n".join(paras)))
            for head, pos, paras in entries]


def chat_jargon(entries):
    pairs = []
    for head, _, paras in entries:
        ans = paras[0]
        if ans.startswith("[") and len(paras) > 1:
            ans = paras[1]
        ans = re.sub(r"^\d+\. ", "", ans)
        if len(ans) > 40 and not head.startswith(("(", "@")):
            pairs.append(("What does \"%s\" mean?" % head, ans))
    return pairs


# ---- fortunes ----

def docs_fortunes(x):
    out = []
    seen = set()
    for f in sorted(glob.glob(os.path.join(x, "usr/share/games/fortunes/*"))):
        base = os.path.basename(f)
        if "." in base or base in ("art", "ascii-art") or os.path.isdir(f):
            continue
        raw = open(f, "rb").read().decode("utf-8", "replace")
        for k, c in enumerate(raw.split("\n%\n")):
            c = c.strip("\n").replace("\t", "    ")
            if len(c) < 20 or c in seen or "\ufffd" in c:
                continue
            seen.add(c)
            out.append(("fortunes", "%s/%d" % (base, k), c))
    return out


def english(text):
    """The paragraphs of text that are mostly ASCII (drops translations and stray scripts)."""
    keep = [p for p in text.split("\n\n")
            if sum(ord(c) > 127 for c in p) <= 0.1 * len(p)]
    return "\n\n".join(keep)


def chatml(q, a):
    return "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n%s<|im_end|>" % (q, a)


def heldout(source, name):
    h = int(hashlib.sha256(("%s/%s" % (source, name)).encode()).hexdigest()[:8], 16)
    return h % 1000 < HELDOUT_PER_MILLE


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=".train", help="work folder (ignored by git)")
    a = ap.parse_args()
    x, versions = fetch(a.work)
    jargon = jargon_entries(x)
    docs = (docs_python(x) + docs_handbook(x) + docs_reference(x) + docs_jargon(jargon) +
            docs_fortunes(x) +
            html_p_docs(x, "django", "usr/share/doc/python-django-doc/html/**/*.html",
                        skip=("releases/", "genindex", "py-modindex", "search", "_modules")) +
            html_p_docs(x, "postgresql", "usr/share/doc/postgresql-doc-15/html/*.html",
                        skip=("release-", "bookindex", "biblio")) +
            docs_perl(x) +
            rst_docs(x, "sphinx", "usr/share/doc/sphinx-doc/html/_sources",
                     skip=("changes", "extdev/deprecated")) +
            rst_docs(x, "policy", "usr/share/doc/debian-policy/policy.html/_sources"))
    pairs = [("chat-python", q, a) for q, a in chat_python(x)]
    pairs += [("chat-jargon", q, a) for q, a in chat_jargon(jargon)]
    out = os.path.join(a.work, "corpus")
    os.makedirs(out, exist_ok=True)
    stats = {}
    with open(os.path.join(out, "train.jsonl"), "w") as tr, \
            open(os.path.join(out, "heldout.jsonl"), "w") as ho:
        for source, name, text in docs:
            text = english(text)
            if len(text) < 20:
                continue
            split = "heldout" if heldout(source, name) else "train"
            (ho if split == "heldout" else tr).write(
                json.dumps(dict(source=source, name=name, text=text)) + "\n")
            s = stats.setdefault(source, dict(docs=0, chars=0, heldout_docs=0, heldout_chars=0))
            s["docs" if split == "train" else "heldout_docs"] += 1
            s["chars" if split == "train" else "heldout_chars"] += len(text)
        for source, q, ans in pairs:
            tr.write(json.dumps(dict(source=source, name=q, text=chatml(q, ans))) + "\n")
            s = stats.setdefault(source, dict(docs=0, chars=0, heldout_docs=0, heldout_chars=0))
            s["docs"] += 1
            s["chars"] += len(chatml(q, ans))
    meta = dict(packages=[dict(name=n, version=versions[n], what=w, licence=l)
                          for n, w, l in PACKAGES], sources=stats)
    json.dump(meta, open(os.path.join(out, "stats.json"), "w"), indent=1)
    for k, s in stats.items():
        log("%-12s %6d docs %9d chars   held out %4d docs %8d chars" %
            (k, s["docs"], s["chars"], s["heldout_docs"], s["heldout_chars"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
