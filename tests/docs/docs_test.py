#!/usr/bin/env python3
"""The documents name only what exists: every README.md of the repository and docs/*.md.

  docs_test.py DELTASERVE_BINARY      (under bazel test: the repository is found as below)
  docs_test.py DELTASERVE_BINARY ROOT (by hand)

Checks, each failure printed as FILE:LINE: what:
  1. Paths. A path that starts with one of the repository's top-level names (`model/fwd.h`,
     `tools/gpu-test.d/*.sh`, `kernels/cuda/sample.{h,cu}`, `status.h/.c` forms included)
     exists in the tree (a glob matches at least one file), or names a module or case by its
     stem (`gguf/quant`), a Bazel target by its output path (`bench/loadgen`), protoc-c's
     output of a .proto, or a file .gitignore names (one the tools write, e.g.
     models/default.gguf). In a folder's README, a file name without a folder in a code span
     (`gemv_plan.cuh`) exists below that folder or, failing that, anywhere in the tree. A
     Bazel label (`//tests/k8s:k8s_manifests_test`) names a package with a BUILD file and a
     target of it (a rule's name or a file). Citations of other repositories (`ggml-org/ggml:
     docs/gguf.md`), URLs and absolute paths are not checked; nor is a path with a placeholder
     (`cli/cmd_<name>.c`, `tests/gguf/…`).
  2. Flags. On a command line (a code span, a table cell or a code-block line) that runs
     `deltaserve SUB` (also `bazel-bin/cli/deltaserve SUB`, or a code span that starts with
     SUB, as the README's command table does), every `--flag` after SUB is one that
     `deltaserve SUB --help` lists, and SUB is a subcommand the binary has.
"""
import fnmatch
import glob
import os
import re
import subprocess
import sys

SKIP_DIRS = {"out"}  # besides hidden folders and bazel-*: what .gitignore keeps out of the tree
BARE_EXT = r"(?:c|h|cc|cu|cuh|py|sh|bzl|proto|ya?ml|md|json|gguf|f32|png|txt|cfg)"
SUBS2 = {"bench": ("decode", "batch"), "gguf": ("info", "synth")}


def find_root():
    """DS_REPO_ROOT, else the folder holding WORKSPACE above this script's real path."""
    r = os.environ.get("DS_REPO_ROOT")
    if r:
        return r
    d = os.path.dirname(os.path.realpath(__file__))
    while d != "/" and not os.path.isfile(os.path.join(d, "WORKSPACE")):
        d = os.path.dirname(d)
    return d


def walk_tree(root):
    """Relative paths of every file and folder of the source tree (no bazel-*, hidden or
    ignored folders)."""
    files, dirs = set(), set()
    for d, sub, names in os.walk(root):
        rel = os.path.relpath(d, root)
        sub[:] = [s for s in sub if not s.startswith(".") and not s.startswith("bazel-")
                  and not (rel == "." and s in SKIP_DIRS)]
        if rel != ".":
            dirs.add(rel)
        for n in names:
            files.add(os.path.normpath(os.path.join(rel, n)))
    return files, dirs


def gitignore_patterns(root):
    out = []
    try:
        with open(os.path.join(root, ".gitignore")) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and not line.startswith("!"):
                    out.append(line.lstrip("/").rstrip("/"))
    except OSError:
        pass
    return out


def expand(token):
    """`a.h/.c` -> a.h, a.c; `x.{h,cu}` -> x.h, x.cu."""
    m = re.fullmatch(r"(.*)\.(\w+)/\.(\w+)", token)
    if m:
        return [m.group(1) + "." + m.group(2), m.group(1) + "." + m.group(3)]
    m = re.search(r"\{([^{}]*)\}", token)
    if m:
        out = []
        for alt in m.group(1).split(","):
            out += expand(token[:m.start()] + alt + token[m.end():])
        return out
    return [token]


class Checker:
    def __init__(self, root, binary):
        self.root = root
        self.binary = binary
        self.files, self.dirs = walk_tree(root)
        self.basenames = {}
        for f in self.files:
            self.basenames.setdefault(os.path.basename(f), []).append(f)
        self.ignored = gitignore_patterns(root)
        tops = sorted({p.split(os.sep)[0] for p in self.dirs if os.sep not in p}, key=len,
                      reverse=True)
        seg = r"(?:[\w.*+-]|\{[\w.,*+-]+\})+"
        self.path_re = re.compile(r"(?<![\w/.$~@:-])((?:%s)/(?:%s/)*(?:%s)?)"
                                  % ("|".join(re.escape(t) for t in tops), seg, seg))
        self.helps = {}
        self.subs = self.subcommands()
        self.errors = []

    # ---- the binary ----
    def subcommands(self):
        out = subprocess.run([self.binary, "--help"], capture_output=True, text=True).stdout
        subs = set(re.findall(r"^  (\w+)\s", out, re.M))
        if not subs:
            sys.exit("docs_test: %s --help lists no subcommand:\n%s" % (self.binary, out))
        return subs

    def help_flags(self, sub):
        if sub not in self.helps:
            p = subprocess.run([self.binary] + sub.split() + ["--help"], capture_output=True,
                               text=True)
            # the flag table's lines, and the usage line (`client`: "also: --stop S"); not the
            # other lines, which may show another subcommand's usage (`bench decode --help`)
            out = (p.stdout + p.stderr).split("\n")
            lines = out[:1] + [l for l in out if re.match(r"\s+--", l)]
            self.helps[sub] = (None if p.returncode != 0 else
                               set(re.findall(r"--([a-z][\w-]*)", "\n".join(lines))))
        return self.helps[sub]

    # ---- paths ----
    def exists(self, rel):
        rel = os.path.normpath(rel.rstrip("/"))
        if any(c in rel for c in "*?["):
            if glob.glob(os.path.join(self.root, rel)):
                return True
        elif rel in self.files or rel in self.dirs:
            return True
        d, base = os.path.split(rel)
        if glob.glob(os.path.join(self.root, glob.escape(rel) + ".*")):
            return True  # a module or case by its stem: gguf/quant, tests/reference/tiny-r3-gqa3
        if re.search(r'\bname = "%s"' % re.escape(base), self.build_text(d)):
            return True  # a Bazel target by its output path: bench/loadgen, tests/gpu/sample_parity
        m = re.fullmatch(r"(.*)\.pb-c\.[ch]", rel)
        if m and m.group(1) + ".proto" in self.files:
            return True  # protoc-c's output for a .proto
        return any(fnmatch.fnmatch(rel, p) or rel.startswith(p + "/") for p in self.ignored)

    def build_text(self, pkg):
        try:
            with open(os.path.join(self.root, pkg, "BUILD")) as f:
                return f.read()
        except OSError:
            return ""

    def check_paths(self, doc, n, line):
        for m in self.path_re.finditer(line):
            token = m.group(1).rstrip(".")
            nxt = line[m.end(1):m.end(1) + 1]
            before = line[:m.start(1)]
            if nxt and nxt in "<…$" or "…" in token or "..." in token:
                continue  # a placeholder: cli/cmd_<name>.c, tests/gguf/…
            if re.search(r"[\w.-]+/[\w.-]+:\s*$", before) or re.search(r"://\S*$", before):
                continue  # another repository's file (`ggml-org/ggml: docs/gguf.md`), a URL
            for t in expand(token):
                if not self.exists(t):
                    self.fail(doc, n, "no such file or folder: %s" % t)

    def check_bare(self, doc, n, span):
        folder = os.path.dirname(doc)
        for word in re.findall(r"[^\s`'\"(),;:|\[\]]+", span):
            if "/" in word.replace("/.", "") or not re.fullmatch(
                    r"[\w.*+{},-]+\.%s(?:/\.%s)?" % (BARE_EXT, BARE_EXT), word):
                continue
            if re.search(r"\b(?:NAME|SIZE|FILE|CASE)\b", word):
                continue  # a placeholder: NAME.gguf
            for t in expand(word):
                if (self.exists(os.path.join(folder, t)) or
                        glob.glob(os.path.join(self.root, folder, "**", t), recursive=True)):
                    continue
                if any(fnmatch.fnmatch(b, t) for b in self.basenames):
                    continue
                if any(fnmatch.fnmatch(os.path.basename(p), t) for p in self.ignored):
                    continue
                self.fail(doc, n, "no file named %s in the tree" % t)

    def check_labels(self, doc, n, line):
        for m in re.finditer(r"(?<![\w:/])//([\w/.-]*)(?::([\w.+-]+))?", line):
            pkg, name = m.group(1).rstrip("/"), m.group(2)
            if pkg.endswith("..."):
                pkg = pkg[:-3].rstrip("/")
            if pkg and os.path.join(pkg, "BUILD") not in self.files:
                self.fail(doc, n, "no Bazel package //%s" % pkg)
            elif name and not (re.search(r'\bname = "%s"' % re.escape(name), self.build_text(pkg))
                               or os.path.join(pkg, name) in self.files):
                self.fail(doc, n, "no target //%s:%s" % (pkg, name))

    # ---- flags ----
    def check_command(self, doc, n, text, sub_at_start=False):
        """text: one command line. Checks the flags after `deltaserve SUB`."""
        if sub_at_start:
            words = text.split()
            if not words or words[0] not in self.subs:
                return
            start = 0
        else:
            words = text.split()
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
                words = words[1:]  # VAR=value before the command
            if len(words) < 2 or not re.fullmatch(r"(?:\S*/)?deltaserve", words[0]):
                return
            start = 1
        sub = words[start]
        if not re.fullmatch(r"[a-z][\w-]*", sub):
            return
        if sub not in self.subs:
            self.fail(doc, n, "deltaserve has no subcommand '%s'" % sub)
            return
        rest = words[start + 1:]
        if sub in SUBS2:
            if not rest or rest[0] not in SUBS2[sub]:
                if any(w.startswith("--") and w != "--help" for w in rest):
                    self.fail(doc, n, "`deltaserve %s` takes %s before its flags" %
                              (sub, " or ".join(SUBS2[sub])))
                return
            sub, rest = sub + " " + rest[0], rest[1:]
        have = self.help_flags(sub)
        if have is None:
            self.fail(doc, n, "`deltaserve %s --help` fails" % sub)
            return
        for w in rest:
            for f in re.findall(r"(?<![\w-])--([a-z][\w-]*)", w):
                if f not in have:
                    self.fail(doc, n, "`deltaserve %s --help` lists no --%s" % (sub, f))

    def fail(self, doc, n, what):
        e = "%s:%d: %s" % (doc, n, what)
        if e not in self.errors:
            self.errors.append(e)

    # ---- one document ----
    def check_doc(self, doc):
        with open(os.path.join(self.root, doc), encoding="utf-8") as f:
            lines = f.read().split("\n")
        fence = False
        block = None  # (first line number, text) of a code-block command being continued
        for n, line in enumerate(lines, 1):
            self.check_paths(doc, n, line)
            self.check_labels(doc, n, line)
            if line.lstrip().startswith("```"):
                fence = not fence
                continue
            indented = re.match(r"( {4,}|\t)\S", line) and not re.match(r"\s*[-*|]|\s*\d+\.",
                                                                      line)
            if fence or indented:
                # a code-block line: one command, continued by a trailing backslash or by
                # lines that start deeper than it; `|`, `;`, `&&`, `#` end it
                if block and (block[2] or re.match(r"\s{%d,}\S" % (block[3] + 1), line)):
                    block = (block[0], block[1] + " " + line.strip().rstrip("\\"),
                             line.rstrip().endswith("\\"), block[3])
                else:
                    if block:
                        self.check_command(doc, block[0], block[1])
                    block = (n, line.strip().rstrip("\\"), line.rstrip().endswith("\\"),
                             len(line) - len(line.lstrip()))
                continue
            if block:
                self.check_command(doc, block[0], block[1])
                block = None
            spans = re.findall(r"`([^`]+)`", line)
            for s in spans:
                if os.path.dirname(doc) not in ("", "docs"):
                    self.check_bare(doc, n, s)
                s = s.replace("\\|", "|")
                self.check_command(doc, n, s, sub_at_start=not re.search(r"\bdeltaserve\b", s))
        if block:
            self.check_command(doc, block[0], block[1])

    def docs(self):
        out = sorted(f for f in self.files if os.path.basename(f) == "README.md")
        out += sorted(f for f in self.files if re.fullmatch(r"docs/[^/]+\.md", f))
        return out


def split_commands(text):
    return [c for c in re.split(r"\s(?:\||;|&&|\|\||#)\s|\$\(", text) if c.strip()]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    root = sys.argv[2] if len(sys.argv) == 3 else find_root()
    if not os.path.isfile(os.path.join(root, "WORKSPACE")):
        sys.exit("docs_test: no repository at '%s' (set DS_REPO_ROOT)" % root)
    c = Checker(root, binary)
    orig = c.check_command

    def each_command(doc, n, text, sub_at_start=False):
        for part in split_commands(text):
            orig(doc, n, part.strip(), sub_at_start)
    c.check_command = each_command
    docs = c.docs()
    for d in docs:
        c.check_doc(d)
    for e in c.errors:
        print(e)
    print("docs_test: %d documents, %d subcommands' --help read: %s" %
          (len(docs), len(c.helps), "%d problems" % len(c.errors) if c.errors else "ok"))
    return 1 if c.errors else 0


if __name__ == "__main__":
    sys.exit(main())
