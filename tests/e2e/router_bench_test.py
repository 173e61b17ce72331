"""The router benchmark CI runs (issue 27): a router and two CPU workers (by default) on the tiny reference
model, bench/loadgen driving STREAMS streams of TOKENS tokens each (--ignore-eos) through the
router at once. Prints the CPU time (utime + stime from /proc/PID/stat, over the loadgen run)
the router and the workers spent per streamed token, and one line
"router-bench router_us_per_token=R worker_us_per_token=W tokens=N messages=M
router_us_per_message=P" for scripts and docs/BENCH.md (M: the messages the client received;
about one a token at this machine's rate, so P is about R), and one line with the workers'
engine and completion-queue threads' CPU per token ("router-bench worker_engine_us_per_token=E
worker_cq_us_per_token=C"). Checks that every stream finished
with all its tokens, and that neither figure passes its ceiling: DS_ROUTER_BENCH_ROUTER_US,
default 120 (about 3.5x the median of docs/BENCH.md 3.8 on an idle machine, 1.5x the highest
seen there with the two cores busy); DS_ROUTER_BENCH_WORKER_US, default 3000, both workers
together (the worker's figure includes the forward pass), so a regression of the relay path
shows without a GPU. Env: DS_ROUTER_BENCH_STREAMS (16), DS_ROUTER_BENCH_TOKENS (256),
DS_ROUTER_BENCH_WORKERS (2; the streams' slots split between them)."""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

STREAMS = int(os.environ.get("DS_ROUTER_BENCH_STREAMS", "16"))
TOKENS = int(os.environ.get("DS_ROUTER_BENCH_TOKENS", "256"))
WORKERS = int(os.environ.get("DS_ROUTER_BENCH_WORKERS", "2"))
ROUTER_US_MAX = float(os.environ.get("DS_ROUTER_BENCH_ROUTER_US", "120"))
WORKER_US_MAX = float(os.environ.get("DS_ROUTER_BENCH_WORKER_US", "3000"))
TICK = os.sysconf("SC_CLK_TCK")


def loadgen():
    for c in ("bench/loadgen", os.path.join(h.repo_root(), "bazel-bin/bench/loadgen")):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise RuntimeError("bench/loadgen not found")


def thread_cpu_s(pid):
    """utime + stime of each thread of a process by thread name, summed over same-named ones."""
    out = {}
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, t)) as f:
                name = f.read().strip()
            with open("/proc/%d/task/%s/stat" % (pid, t)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended between the listing and the read
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def cpu_s(pid):
    """utime + stime of a process, in seconds (/proc/PID/stat fields 14 and 15)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / TICK


class RouterBench(unittest.TestCase):
    def test_cpu_per_streamed_token(self):
        slots = str(max(1, (STREAMS + WORKERS - 1) // WORKERS))
        ws = [h.start_worker("bench_w%d" % i, extra=["--slots", slots, "--threads", "1"])
              for i in range(WORKERS)]
        r = h.start_router(ws, name="bench_router")
        try:
            procs = {"router": [r], "worker": ws}
            before = {k: sum(cpu_s(p.p.pid) for p in v) for k, v in procs.items()}
            tb = [thread_cpu_s(w.p.pid) for w in ws]
            out = subprocess.run(
                [loadgen(), "--addr", r.addr, "--concurrency", str(STREAMS), "--requests",
                 str(STREAMS), "--max-tokens", str(TOKENS), "--ignore-eos", "--ids", "1,2,3,4"],
                capture_output=True, text=True, timeout=600)
            after = {k: sum(cpu_s(p.p.pid) for p in v) for k, v in procs.items()}
            ta = [thread_cpu_s(w.p.pid) for w in ws]
            text = out.stdout + out.stderr
            self.assertEqual(out.returncode, 0, text)
            m = re.search(r"loadgen-summary mode=fixed ok=(\d+) failed=(\d+) \S+ tokens=(\d+) "
                          r"messages=(\d+)", text)
            self.assertIsNotNone(m, text)
            ok, failed, tokens = int(m.group(1)), int(m.group(2)), int(m.group(3))
            msgs = int(m.group(4))
            self.assertEqual((ok, failed, tokens), (STREAMS, 0, STREAMS * TOKENS), text)
            us = {k: (after[k] - before[k]) * 1e6 / tokens for k in procs}
            tps = re.search(r"tokens/s ([\d.]+)", text).group(1)
            print("router-bench: %d streams x %d tokens through a router and %d CPU workers "
                  "(tiny model), %s tokens/s" % (STREAMS, TOKENS, WORKERS, tps))
            print("router-bench router_us_per_token=%.1f worker_us_per_token=%.1f tokens=%d "
                  "messages=%d router_us_per_message=%.1f"
                  % (us["router"], us["worker"], tokens, msgs,
                     (after["router"] - before["router"]) * 1e6 / msgs))
            # the workers' engine threads (forward and the step's hand-off) and CQ threads
            # (their streams' or feeds' writers after the first message), both workers
            th = {n: sum(a.get(n, 0.0) - b.get(n, 0.0) for a, b in zip(ta, tb)) * 1e6 / tokens
                  for n in ("ds-engine", "ds-rpc-cq")}
            print("router-bench worker_engine_us_per_token=%.1f worker_cq_us_per_token=%.1f"
                  % (th["ds-engine"], th["ds-rpc-cq"]))
            sys.stdout.flush()
            self.assertLess(us["router"], ROUTER_US_MAX, "router CPU per token")
            self.assertLess(us["worker"], WORKER_US_MAX, "worker CPU per token (both workers)")
        finally:
            r.stop()
            for w in ws:
                w.stop()


if __name__ == "__main__":
    unittest.main()
