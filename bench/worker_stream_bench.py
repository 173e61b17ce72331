"""CPU per streamed token of one CPU worker, bench/loadgen straight to it (--worker): the
worker's streaming side without the router (issue 27, docs/BENCH.md 3.10).

Starts `deltaserve worker` on the tiny reference model (--slots STREAMS --threads 1), runs
loadgen with STREAMS streams of TOKENS tokens (--ignore-eos, closed loop, REQUESTS streams in
all), and prints the worker's CPU (utime + stime from /proc) over the run per token: the whole
process, its engine thread ("ds-engine": the forward pass and the hand-off of each step's
tokens), its completion-queue thread ("ds-rpc-cq") and gRPC's own threads (the rest), then one
line "worker-stream-bench streams=S tokens=N total_us=T engine_us=E cq_us=C grpc_us=G tok_s=R"
per run. With DS_BENCH_PERF=1 the run is also sampled by `perf record -g` and the line adds
fwd_share (the share of the worker's samples under worker_backend_step: the forward pass) and
stream_us = total_us x (1 - fwd_share): the CPU per token of everything but the forward
(admission, the engine's bookkeeping, the hand-off, packing, gRPC, the kernel's TCP). Run from
the repository root after `bazel build //cli:deltaserve //bench:loadgen`:

    .venv/bin/python bench/worker_stream_bench.py [STREAMS ...]   # default: 16 64

Env: DS_BENCH_TOKENS (256), DS_BENCH_REQUESTS (4 x STREAMS), DS_BIN, DS_REFERENCE_DIR."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "tests",
                                "e2e"))
import harness as h  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid):
    """{thread name: utime + stime in seconds} summed over the threads of that name."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                s = f.read()
        except OSError:
            continue  # the thread ended
        name = s[s.index("(") + 1:s.rindex(")")]
        fields = s.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def process_cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def forward_share(data):
    """The share of the samples with the backend's step on their stack (perf report):
    worker_backend_step, or cpu_step, which it tail-calls (the frame seen in its place)."""
    out = subprocess.run(["perf", "report", "-i", data, "--children", "--sort", "sym", "-g",
                          "none", "--percent-limit", "0"], capture_output=True, text=True).stdout
    share = 0.0
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[-1] in ("worker_backend_step", "cpu_step"):
            share = max(share, float(f[0].rstrip("%")) / 100)
    if share == 0:
        sys.exit("perf report: no samples under worker_backend_step")
    return share


def run(streams, tokens, requests):
    w = h.start_worker("stream_bench", extra=["--slots", str(streams), "--threads", "1",
                                              "--queue", str(streams)])
    perf = None
    try:
        if os.environ.get("DS_BENCH_PERF") == "1":
            perf = subprocess.Popen(["perf", "record", "-q", "-F", "999", "-g", "-o",
                                     "/tmp/worker_stream_bench.perf", "-p", str(w.p.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0, p0 = thread_cpu(w.p.pid), process_cpu(w.p.pid)
        out = subprocess.run(
            [os.path.join(h.repo_root(), "bazel-bin/bench/loadgen"), "--worker", "--addr",
             w.addr, "--concurrency", str(streams), "--requests", str(requests),
             "--max-tokens", str(tokens), "--ignore-eos", "--ids", "1,2,3,4"],
            capture_output=True, text=True, timeout=900)
        t1, p1 = thread_cpu(w.p.pid), process_cpu(w.p.pid)
        if perf:
            perf.send_signal(2)
            perf.wait(timeout=60)
    finally:
        w.stop()
    text = out.stdout + out.stderr
    m = re.search(r"loadgen-summary mode=fixed ok=(\d+) failed=(\d+) \S+ tokens=(\d+)", text)
    if out.returncode != 0 or not m or int(m.group(2)) != 0:
        sys.exit("loadgen failed:\n" + text)
    n = int(m.group(3))
    d = {k: t1.get(k, 0.0) - t0.get(k, 0.0) for k in t1}
    eng, cq = d.get("ds-engine", 0.0), d.get("ds-rpc-cq", 0.0)
    total = p1 - p0
    tps = re.search(r"tokens/s ([\d.]+)", text).group(1)
    extra = ""
    if perf:
        share = forward_share("/tmp/worker_stream_bench.perf")
        extra = " fwd_share=%.4f stream_us=%.2f" % (share, total * (1 - share) * 1e6 / n)
    print("worker-stream-bench streams=%d tokens=%d total_us=%.1f engine_us=%.1f cq_us=%.1f "
          "grpc_us=%.1f tok_s=%s%s" % (streams, n, total * 1e6 / n, eng * 1e6 / n, cq * 1e6 / n,
                                       (total - eng - cq) * 1e6 / n, tps, extra))
    sys.stdout.flush()


def main():
    tokens = int(os.environ.get("DS_BENCH_TOKENS", "256"))
    for s in [int(a) for a in sys.argv[1:]] or [16, 64]:
        run(s, tokens, int(os.environ.get("DS_BENCH_REQUESTS", str(4 * s))))


if __name__ == "__main__":
    main()
