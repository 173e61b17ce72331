"""End-to-end test harness: starts `deltaserve worker` / `deltaserve router` (and the fake
worker) on loopback with port 0, learns each port from its `listening on HOST:PORT` log line,
waits for readiness through grpc.health.v1 Watch (no fixed sleeps), and stops everything at
the end. Runs under /usr/bin/python3 (Debian python3-grpcio) or the project venv.

Paths: the deltaserve binary is DS_BIN, or `cli/deltaserve` in the Bazel runfiles, or
bazel-bin/cli/deltaserve in the repository; the reference models are DS_REFERENCE_DIR or
<repo>/../shared/reference; the tiny model is tiny-r2-tied there, else the repository's own
own-r2-tied of tests/reference (tests/testutil/refcases.py)."""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import dsproto  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "testutil"))
import refcases  # noqa: E402

import grpc  # noqa: E402

pb, pb_grpc, hpb, hpb_grpc = dsproto.load()

LISTEN_RE = re.compile(r"listening on (\S+?):(\d+)")
HERE = os.path.dirname(os.path.realpath(__file__))


def repo_root():
    return dsproto.repo_root()


def binary():
    b = os.environ.get("DS_BIN")
    if b:
        return os.path.abspath(b)
    root = repo_root()
    for c in ("cli/deltaserve", os.path.join(root, "bazel-out/k8-opt/bin/cli/deltaserve"),
              os.path.join(root, "bazel-bin/cli/deltaserve")):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise RuntimeError("deltaserve binary not found (set DS_BIN)")


def reference_dir():
    d = os.environ.get("DS_REFERENCE_DIR")
    if d and os.path.isdir(d):
        return d
    return os.path.join(os.path.dirname(repo_root()), "shared", "reference")


def tiny_model():
    """tiny-r2-tied.gguf of the shared folder, else own-r2-tied.gguf of tests/reference."""
    return refcases.resolve_path("tiny-r2-tied", ".gguf")


def tiny_json():
    """The reference (prompts, greedy ids) of tiny_model()."""
    return refcases.resolve_path("tiny-r2-tied", ".json")


_LOG_DIR = []


def log_dir():
    """Where process logs go: Bazel's undeclared outputs (kept in bazel-testlogs), or a fresh
    temporary directory."""
    if not _LOG_DIR:
        d = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or tempfile.mkdtemp(prefix="ds-e2e-")
        os.makedirs(d, exist_ok=True)
        _LOG_DIR.append(d)
    return _LOG_DIR[0]


class Proc:
    """A child process whose stderr is read by a thread: lines are kept (and copied to a log
    file) and `wait_line` blocks on a condition variable until a matching line arrives."""

    def __init__(self, name, argv, env=None):
        self.name = name
        self.argv = argv
        self.lines = []
        self.cv = threading.Condition()
        self.log = open(os.path.join(log_dir(), "%s.log" % name), "w")
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, env=env, start_new_session=True)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()
        self.addr = None

    def _read(self):
        for raw in self.p.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log.write(line + "\n")
            self.log.flush()
            with self.cv:
                self.lines.append(line)
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)  # EOF
            self.cv.notify_all()

    def wait_line(self, pattern, timeout=60.0, start=0):
        """The first match of pattern in a line from index `start` on; raises on EOF/timeout."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        i = start
        with self.cv:
            while True:
                while i < len(self.lines):
                    line = self.lines[i]
                    if line is None:
                        raise RuntimeError("%s exited (rc=%s) before a line matching %r:\n%s" % (
                            self.name, self.p.poll(), pattern, self.tail()))
                    m = rx.search(line)
                    if m:
                        return m
                    i += 1
                left = end - time.monotonic()
                if left <= 0:
                    raise RuntimeError("%s: no line matching %r within %.0f s:\n%s" % (
                        self.name, pattern, timeout, self.tail()))
                self.cv.wait(left)

    def tail(self, n=30):
        return "\n".join(l for l in self.lines[-n:] if l is not None)

    def wait_listening(self, timeout=60.0):
        m = self.wait_line(LISTEN_RE.pattern, timeout)
        self.addr = "%s:%s" % (m.group(1), m.group(2))
        return self.addr

    def signal(self, sig):
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def kill(self):
        self.signal(signal.SIGKILL)
        self.p.wait()

    def wait(self, timeout=60.0):
        return self.p.wait(timeout)

    def stop(self, timeout=30.0):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.t.join(5)
        if not self.t.is_alive():
            self.p.stderr.close()
        self.log.close()
        return self.p.returncode

    def rss_kb(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1


def wait_serving(addr, service, timeout=60.0):
    """Blocks on grpc.health.v1 Watch until `service` at addr reports SERVING."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        ch = grpc.insecure_channel(addr)
        try:
            stub = hpb_grpc.HealthStub(ch)
            it = stub.Watch(hpb.HealthCheckRequest(service=service),
                            timeout=max(0.1, end - time.monotonic()), wait_for_ready=True)
            for r in it:
                last = r.status
                if r.status == hpb.HealthCheckResponse.SERVING:
                    it.cancel()
                    return
        except grpc.RpcError as e:
            last = e
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                break
            # UNIMPLEMENTED Watch (the fake worker) falls back to Check
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                r = stub.Check(hpb.HealthCheckRequest(service=service), timeout=5)
                if r.status == hpb.HealthCheckResponse.SERVING:
                    return
                time.sleep(0.05)  # Check has no push: poll the condition
        finally:
            ch.close()
    raise RuntimeError("%s: %r not SERVING within %.0f s (last: %r)" % (addr, service, timeout, last))


def start_worker(name, model=None, extra=(), env=None):
    argv = [binary(), "worker", "--model", model or tiny_model(), "--listen", "127.0.0.1:0",
            "--name", name] + list(extra)
    w = Proc(name, argv, env)
    w.wait_listening()
    wait_serving(w.addr, "deltaserve.v1.Worker")
    return w


def start_fake_worker(name, extra=()):
    argv = [sys.executable, os.path.join(HERE, "fake_worker.py"), "--name", name] + list(extra)
    w = Proc(name, argv)
    w.wait_listening()
    wait_serving(w.addr, "deltaserve.v1.Worker")
    return w


def start_router(workers, model=None, extra=(), name="router", ready=True):
    argv = [binary(), "router", "--listen", "127.0.0.1:0", "--workers",
            ",".join(w.addr if isinstance(w, Proc) else w for w in workers),
            "--poll-ms", "100"]
    if model is not False:
        argv += ["--model", model or tiny_model()]
    r = Proc(name, argv + list(extra))
    r.wait_listening()
    if ready:
        wait_serving(r.addr, "deltaserve.v1.Generation")
    return r


class Client:
    """Generation and Worker stubs over one channel."""

    def __init__(self, addr):
        self.ch = grpc.insecure_channel(addr)
        self.gen = pb_grpc.GenerationStub(self.ch)
        self.worker = pb_grpc.WorkerStub(self.ch)
        self.health = hpb_grpc.HealthStub(self.ch)

    def close(self):
        self.ch.close()

    def generate(self, timeout=60, **kw):
        """Runs a Generation/Generate to the end: (messages, ids, text, final)."""
        return collect(self.gen.Generate(request(**kw), timeout=timeout))

    def worker_generate(self, ids, timeout=60, **kw):
        req = pb.WorkerGenerateRequest(prompt_token_ids=ids)
        fill_common(req, **kw)
        return collect(self.worker.Generate(req, timeout=timeout))

    def load(self):
        return self.worker.GetLoad(pb.GetLoadRequest(), timeout=10)


def fill_common(req, max_tokens=0, seed=0, temperature=0.0, top_k=0, top_p=0.0, stop_ids=(),
                ignore_eos=False, logprobs=0, request_id=""):
    req.sampling.temperature = temperature
    req.sampling.top_k = top_k
    req.sampling.top_p = top_p
    req.sampling.seed = seed
    req.stopping.max_new_tokens = max_tokens
    req.stopping.stop_token_ids.extend(stop_ids)
    req.stopping.ignore_eos = ignore_eos
    req.logprobs = logprobs
    if request_id:
        req.request_id = request_id


def request(text=None, ids=None, chat=None, stop=(), **kw):
    req = pb.GenerateRequest()
    if text is not None:
        req.text = text
    elif ids is not None:
        req.token_ids.ids.extend(ids)
    elif chat is not None:
        for role, content in chat:
            req.chat.messages.add(role=role, content=content)
    req.stop.extend(stop)
    fill_common(req, **kw)
    return req


def collect(it):
    msgs = list(it)
    ids = [t for m in msgs for t in m.token_ids]
    text = "".join(m.text for m in msgs)
    final = msgs[-1] if msgs and msgs[-1].finish_reason else None
    return msgs, ids, text, final


def metric(proc, name):
    """The value of an unlabelled series on the /metrics of proc (started with
    --metrics-listen; its log names the address); 0 when absent."""
    import urllib.request
    m = proc.wait_line(r"metrics on (http://\S+)")
    body = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
    vals = [float(ln.split()[-1]) for ln in body.splitlines() if ln.split(" ")[0] == name]
    return vals[0] if vals else 0.0


def run_cli(args, timeout=120, check=False):
    """Runs `deltaserve ARGS`; returns (rc, stdout, stderr)."""
    p = subprocess.run([binary()] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=timeout)
    out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    if check and p.returncode != 0:
        raise RuntimeError("deltaserve %s: rc=%d\n%s" % (" ".join(args), p.returncode, err))
    return p.returncode, out, err


def wait_until(cond, timeout=30.0, what="condition", interval=0.02):
    """Polls cond() until true (for state only observable by polling, e.g. GetLoad)."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)
