"""docs/LOADTEST.md's commands, read from the page and run as written: every command of the
blocks marked `<!-- loadtest-commands -->` (ghz and bench/loadgen) against a router (--model,
--routing prefix) and two CPU workers on the demo model on loopback, with the page's variables
set: the addresses, and the run sizes small (REQUESTS=8 DURATION_S=2 WARMUP=4 USERS=2
TURNS=2). The TLS/token command runs against a second router over the same workers, with TLS
(certificates made with openssl) and --auth-token-file. Each command must exit 0 and print
what the page says it prints: ghz, every call OK (and --total of them); loadgen, no failed
stream, the streams asked for, --max-tokens tokens each under --ignore-eos, the cancelled
streams and the workers' loads unchanged after a --cancel-after run, the multi-turn and
shared-prefix summary line's counts.

ghz is DS_GHZ (a binary, or an xz-compressed one unpacked here) or `ghz` on PATH; without
it the ghz commands are skipped with the reason printed. The page is read from the source tree
(DS_REPO_ROOT), so the test target is tagged "external"."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

DEMO = os.path.join("models", "demo-en-17m.gguf")  # runfiles (//models:demo)
PAGE = os.path.join("docs", "LOADTEST.md")
MARK = "<!-- loadtest-commands -->"
SIZES = {"REQUESTS": 8, "DURATION_S": 2, "WARMUP": 4, "USERS": 2, "TURNS": 2}
ADDRESSES = ("ROUTER", "WORKER1", "WORKER2", "CA", "TOKEN_FILE")
LOADGEN = "bazel-bin/bench/loadgen"
HEALTH_RE = r"health \(plaintext\) on (\S+?):(\d+)"  # the router's --health-listen line


def page_commands(text):
    """[(title, command)] of the marked ```sh blocks: continuation lines joined, a comment
    line titling the command after it."""
    blocks = re.findall(re.escape(MARK) + r"\n```sh\n(.*?)\n```", text, re.S)
    out = []
    for block in blocks:
        title, cur = "", None
        for line in block.split("\n"):
            if cur is None and line.startswith("#"):
                title = line.lstrip("# ").strip()
                continue
            cur = line if cur is None else cur + "\n" + line
            if not line.endswith("\\"):
                out.append((title, cur))
                title, cur = "", None
        if cur is not None:
            out.append((title, cur))
    return out, len(blocks)


def flag(cmd, name, env):
    """The value of --name in cmd, its ${VAR:-default} and $VAR expanded from env."""
    m = re.search(r"(?:^|\s)%s[ =](\S+)" % re.escape(name), cmd)
    if not m:
        return None
    v = m.group(1)
    v = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda x: str(env.get(x.group(1), x.group(2))), v)
    return re.sub(r"\$(\w+)", lambda x: str(env.get(x.group(1), "")), v)


def demo_model():
    if os.path.isfile(DEMO):
        return os.path.abspath(DEMO)
    return os.path.join(h.repo_root(), DEMO)


def find_ghz(tmp):
    """(path, None) of a ghz binary, or (None, why not)."""
    g = os.environ.get("DS_GHZ")
    if g:
        if not os.path.isfile(g):
            return None, "DS_GHZ=%s is not a file" % g
        if g.endswith(".xz"):
            out = os.path.join(tmp, "ghz.unpacked")
            with open(out, "wb") as f:
                subprocess.run(["xz", "-dc", g], stdout=f, check=True)
            os.chmod(out, 0o755)
            return out, None
        return os.path.abspath(g), None
    g = shutil.which("ghz")
    if g:
        return g, None
    return None, ("ghz is not on PATH and DS_GHZ is unset (ghz is not in Debian: "
                  "--test_env=DS_GHZ=<repo>/../shared/tools/ghz/ghz.xz)")


def openssl(d, *args):
    subprocess.run(["openssl"] + list(args), cwd=d, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def make_tls(d):
    """ca.pem and a server certificate for 127.0.0.1 signed by it; None without openssl."""
    if not shutil.which("openssl"):
        return None
    openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=loadtest-ca")
    openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "extendedKeyUsage=serverAuth\n")
    openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    with open(os.path.join(d, "token"), "w") as f:
        f.write("loadtest-token-4f1c9a\n")
    return d


TEXT = open(os.path.join(h.repo_root(), PAGE)).read()
COMMANDS, BLOCKS = page_commands(TEXT)


class LoadtestPage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="loadtest-", dir=os.environ.get("TEST_TMPDIR"))
        cls.ghz, cls.no_ghz = find_ghz(cls.tmp)
        if cls.no_ghz:
            print("ghz commands skipped: " + cls.no_ghz, flush=True)
        # the repository's layout for the commands: proto/ and bazel-bin/bench/loadgen
        cls.cwd = os.path.join(cls.tmp, "root")
        os.makedirs(os.path.join(cls.cwd, "bazel-bin", "bench"))
        lg = os.path.abspath("bench/loadgen")
        if not os.access(lg, os.X_OK):
            lg = os.path.join(h.repo_root(), LOADGEN)
        os.symlink(lg, os.path.join(cls.cwd, LOADGEN))
        proto = os.path.abspath("proto")
        if not os.path.isfile(os.path.join(proto, "deltaserve/v1/deltaserve.proto")):
            proto = os.path.join(h.repo_root(), "proto")
        os.symlink(proto, os.path.join(cls.cwd, "proto"))
        cls.path = os.environ.get("PATH", "/usr/bin:/bin")
        if cls.ghz:
            bindir = os.path.join(cls.tmp, "bin")
            os.makedirs(bindir)
            os.symlink(cls.ghz, os.path.join(bindir, "ghz"))
            cls.path = bindir + ":" + cls.path
        model = demo_model()
        cls.workers = [h.start_worker("lt_w%d" % i, model=model, extra=["--threads", "1"])
                       for i in (1, 2)]
        cls.router = h.start_router(cls.workers, model=model, name="lt_router",
                                    extra=["--routing", "prefix"])
        cls.tls_router = None
        cls.tls = make_tls(cls.tmp) if cls.ghz else None

    @classmethod
    def tearDownClass(cls):
        for p in [cls.tls_router, cls.router] + cls.workers:
            if p is not None:
                p.stop()

    def start_tls_router(self):
        if self.tls is None:
            self.skipTest("openssl is missing: no certificate for the TLS router")
        if LoadtestPage.tls_router is None:
            d = self.tls
            r = h.Proc("lt_tls_router", [
                h.binary(), "router", "--listen", "127.0.0.1:0",
                "--workers", ",".join(w.addr for w in self.workers), "--poll-ms", "100",
                "--tls-cert", os.path.join(d, "server.pem"),
                "--tls-key", os.path.join(d, "server.key"),
                "--auth-token-file", os.path.join(d, "token"),
                "--health-listen", "127.0.0.1:0"])
            r.wait_listening()
            m = r.wait_line(HEALTH_RE)
            h.wait_serving("%s:%s" % (m.group(1), m.group(2)), "deltaserve.v1.Generation")
            LoadtestPage.tls_router = r
        return LoadtestPage.tls_router

    def env(self, tls=False):
        e = dict(os.environ)
        e["PATH"] = self.path
        e.update({k: str(v) for k, v in SIZES.items()})
        e["ROUTER"] = self.router.addr
        e["WORKER1"], e["WORKER2"] = self.workers[0].addr, self.workers[1].addr
        if tls:
            e["ROUTER"] = self.start_tls_router().addr
            e["CA"] = os.path.join(self.tls, "ca.pem")
            e["TOKEN_FILE"] = os.path.join(self.tls, "token")
        return e

    def run_command(self, cmd, env):
        p = subprocess.run(["bash", "-c", cmd], cwd=self.cwd, env=env, capture_output=True,
                           text=True, timeout=120)
        out = p.stdout + p.stderr
        print("$ %s\n%s" % (cmd, out), flush=True)
        return p.returncode, out

    def check_ghz(self, cmd):
        if self.ghz is None:
            self.skipTest(self.no_ghz)
        env = self.env(tls="--cacert" in cmd)
        rc, out = self.run_command(cmd, env)
        self.assertEqual(rc, 0, out)
        m = re.search(r"Status code distribution:\n((?:  \[.*\n?)+)", out)
        self.assertIsNotNone(m, out)
        codes = dict((c, int(n)) for c, n in
                     re.findall(r"\[(\w+)\]\s+(\d+) responses", m.group(1)))
        self.assertEqual(list(codes), ["OK"], out)
        self.assertNotIn("Error distribution", out)
        count = int(re.search(r"Count:\s+(\d+)", out).group(1))
        self.assertEqual(count, codes["OK"], out)
        if "--duration" in cmd:
            self.assertGreater(count, 0, out)
        else:
            self.assertEqual(count, int(flag(cmd, "--total", env)), out)

    def check_loadgen(self, cmd):
        env = self.env()
        rc, out = self.run_command(cmd, env)
        self.assertEqual(rc, 0, out)
        if "--users" in cmd or "--shared-prefix" in cmd:
            m = re.search(r"^loadgen-summary (.*)$", out, re.M)
            self.assertIsNotNone(m, out)
            s = dict(x.split("=", 1) for x in m.group(1).split())
            if "--users" in cmd:
                want = int(flag(cmd, "--users", env)) * int(flag(cmd, "--turns", env))
                self.assertEqual(s["mode"], "multi-turn", out)
            else:
                want = int(flag(cmd, "--requests", env))
                self.assertEqual(s["mode"], "shared-prefix", out)
            self.assertEqual((int(s["ok"]), int(s["failed"])), (want, 0), out)
            return
        m = re.search(r"(\d+) streams ok, (\d+) failed", out)
        self.assertIsNotNone(m, out)
        ok, failed = int(m.group(1)), int(m.group(2))
        self.assertEqual(failed, 0, out)
        cancel = flag(cmd, "--cancel-after", env)
        cancelled = 0
        if cancel is not None:  # the streams cancelled by loadgen count as such, not failed
            cancelled = int(re.search(r"cancelled by this client: (\d+)", out).group(1))
            self.assertGreater(cancelled, 0, out)
        if "--duration-s" in cmd:
            self.assertGreater(ok, 0, out)
        else:
            self.assertEqual(ok + cancelled, int(flag(cmd, "--requests", env)), out)
        if "--ignore-eos" in cmd and cancel is None:
            per = float(re.search(r"tokens/stream ([\d.]+)", out).group(1))
            self.assertEqual(per, float(flag(cmd, "--max-tokens", env)), out)
        loads = flag(cmd, "--load-addr", env)
        if loads:
            self.assertEqual(out.count(": the same"), len(loads.split(",")), out)
            self.assertNotIn("CHANGED", out)


class PageShape(unittest.TestCase):
    def test_the_page_has_its_command_blocks(self):
        # a marker lost in an edit would silently drop commands from the test
        self.assertEqual(TEXT.count(MARK), BLOCKS)
        self.assertGreaterEqual(BLOCKS, 4)
        tools = [c.split()[0] for _, c in COMMANDS]
        self.assertGreaterEqual(tools.count("ghz"), 10, tools)
        self.assertGreaterEqual(tools.count(LOADGEN), 9, tools)

    def test_variables_are_the_documented_ones(self):
        for _, cmd in COMMANDS:
            used = set(re.findall(r"\$\{?(\w+)", cmd))
            self.assertLessEqual(used, set(SIZES) | set(ADDRESSES), cmd)
            for v in set(SIZES) & used:  # a size has its full-size default in place
                self.assertRegex(cmd, r"\$\{%s:-\d+\}" % v)
            for v in used:  # in the page's table of variables
                self.assertRegex(TEXT, r"\n\|[^\n]*`%s`[^\n]*\|" % v)

    def test_duration_runs_wait_for_the_calls_in_flight(self):
        for _, cmd in COMMANDS:
            if cmd.startswith("ghz") and "--duration" in cmd:
                self.assertIn("--duration-stop wait", cmd)


def add_command_tests():
    seen = set()
    for i, (title, cmd) in enumerate(COMMANDS):
        words = re.findall(r"\w+", title.split("(")[0].split(":")[0].lower())[:5]
        slug = "_".join(words) or "command"
        tool = "ghz" if cmd.startswith("ghz") else "loadgen"
        name = "test_%02d_%s_%s" % (i, tool, slug)
        while name in seen:
            name += "_"
        seen.add(name)
        if tool == "ghz":
            fn = (lambda c: lambda self: self.check_ghz(c))(cmd)
        elif cmd.startswith(LOADGEN):
            fn = (lambda c: lambda self: self.check_loadgen(c))(cmd)
        else:
            fn = (lambda c: lambda self: self.fail("not a ghz or loadgen command: " + c))(cmd)
        setattr(LoadtestPage, name, fn)


add_command_tests()

if __name__ == "__main__":
    unittest.main(verbosity=2)
