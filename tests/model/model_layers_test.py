"""model/ calls one way down: no call cycle between its C files.

model_layers_test.py FILE.c ... reads the C files, finds the functions each defines with
external linkage (not static) and the calls each function body makes, and draws an edge from
file A to file B when A calls a function B defines. It fails, naming the files and the calls
that close the loop, when the edges have a cycle; else it prints the files in layer order (each
above the files it calls). A self-check first runs the same analysis on two small synthetic
sources, one with a cycle and one without, so a parser that sees no calls cannot pass."""

import os
import re
import sys

KEYWORDS = {
    "if", "for", "while", "switch", "return", "sizeof", "do", "else", "case", "_Alignof",
    "_Static_assert", "defined", "__attribute__", "typeof", "__typeof__",
}


def strip(src):
    """src without comments, string and character literals, or preprocessor lines (their
    contents replaced by spaces, newlines kept)."""
    out = []
    i, n = 0, len(src)
    line_start = True
    while i < n:
        c = src[i]
        if line_start and c == "#":  # a directive, with its continuation lines
            while i < n and src[i] != "\n":
                if src[i] == "\\" and i + 1 < n and src[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        if c == "/" and src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
            continue
        if c == "/" and src.startswith("//", i):
            while i < n and src[i] != "\n":
                i += 1
            continue
        if c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
            continue
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = False
        out.append(c)
        i += 1
    return "".join(out)


DEF = re.compile(r"([A-Za-z_]\w*)\s*\(([^()]|\([^()]*\))*\)\s*$")
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def functions(src):
    """[(name, is_static, body)] for every function defined at file scope in src."""
    s = strip(src)
    found = []
    depth = 0
    stmt_start = 0  # where the current top-level declaration began
    i = 0
    while i < len(s):
        c = s[i]
        if c == "{" and depth == 0:
            head = s[stmt_start:i]
            m = DEF.search(head)
            j, d = i + 1, 1  # the matching brace
            while j < len(s) and d:
                d += {"{": 1, "}": -1}.get(s[j], 0)
                j += 1
            if m and "=" not in head[: m.start()]:  # not an initialiser
                words = head[: m.start()].split()
                if words and m.group(1) not in KEYWORDS:
                    found.append((m.group(1), "static" in words, s[i:j]))
            i = j
            # a struct / enum / union definition continues to its ';'
            stmt_start = j
            continue
        if c == ";" and depth == 0:
            stmt_start = i + 1
        i += 1
    return found


def call_graph(sources):
    """sources: {file: text}. Returns edges {(caller_file, callee_file): [(caller, callee)]}."""
    defs = {}
    bodies = {}
    for f, text in sources.items():
        bodies[f] = functions(text)
        for name, static, _ in bodies[f]:
            if not static:
                if name in defs and defs[name] != f:
                    raise SystemExit(f"{name} defined in both {defs[name]} and {f}")
                defs[name] = f
    edges = {}
    for f, fns in bodies.items():
        local = {name for name, static, _ in fns if static}
        for name, _, body in fns:
            for m in CALL.finditer(body):
                callee = m.group(1)
                if callee in local or callee not in defs or defs[callee] == f:
                    continue
                pairs = edges.setdefault((f, defs[callee]), [])
                if (name, callee) not in pairs:
                    pairs.append((name, callee))
    return edges


def cycles(files, edges):
    """The strongly connected components of more than one file (Tarjan)."""
    succ = {f: sorted({b for (a, b) in edges if a == f}) for f in files}
    index, low, on, stack, comps = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for f in sorted(files):
        if f not in index:
            visit(f)
    return comps


def layers(files, edges):
    """Files in layer order: each after every file that calls it (edges acyclic)."""
    order, left = [], set(files)
    while left:
        top = sorted(f for f in left if not any(a in left and b == f for (a, b) in edges))
        order.append(top)
        left -= set(top)
    return order


def report(sources):
    """(problems, order): a line per cycle with the calls that close it; the layer order."""
    edges = call_graph(sources)
    files = list(sources)
    problems = []
    for comp in cycles(files, edges):
        calls = []
        for (a, b), pairs in sorted(edges.items()):
            if a in comp and b in comp:
                shown = ", ".join(f"{x} -> {y}" for x, y in pairs[:4])
                more = f" (+{len(pairs) - 4})" if len(pairs) > 4 else ""
                calls.append(f"    {a} -> {b}: {shown}{more}")
        problems.append("call cycle between " + ", ".join(comp) + ":\n" + "\n".join(calls))
    return problems, ([] if problems else layers(files, edges))


def self_check():
    a = """
/* a comment calling b_two() */
#include "x.h"
static int helper(int x) { return b_two(x); }
int a_one(int x) { if (x) return helper(x); return 0; }
"""
    b = """
struct s { int (*f)(int); };
static const char *name = "a_one(";
int b_two(int x) { return x + 1; }
int b_three(int x) { return a_one(x); }
"""
    problems, _ = report({"a.c": a, "b.c": b})
    assert len(problems) == 1 and "a.c, b.c" in problems[0], problems
    assert "helper -> b_two" in problems[0] and "b_three -> a_one" in problems[0], problems
    b_down = b.replace("return a_one(x);", "return x;")
    problems, order = report({"a.c": a, "b.c": b_down})
    assert not problems and order == [["a.c"], ["b.c"]], (problems, order)
    # a call only in a comment or a string is no call
    a_quiet = a.replace("return b_two(x);", "return x; /* b_two(x) */")
    problems, order = report({"a.c": a_quiet, "b.c": b})
    assert not problems and order == [["b.c"], ["a.c"]], (problems, order)


def main(argv):
    self_check()
    if len(argv) < 2:
        print("usage: model_layers_test.py FILE.c ...", file=sys.stderr)
        return 2
    sources = {}
    for p in argv[1:]:
        with open(p, encoding="utf-8") as fh:
            sources[os.path.basename(p)] = fh.read()
    problems, order = report(sources)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    n_calls = sum(len(v) for v in call_graph(sources).values())
    print(f"{len(sources)} files, {n_calls} calls between them, no cycle; layers from the top:")
    for i, files in enumerate(order):
        print(f"  {i}: {' '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
