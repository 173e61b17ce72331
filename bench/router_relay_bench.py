"""The router's user-space instructions per relayed token and message, counted by callgrind
(issue 27, docs/BENCH.md 3.8): a count that does not move with the neighbours on a shared
machine, where CPU time per token does by tens of percent.

Starts two CPU workers on the tiny reference model (--slots STREAMS/2 --threads 1) and a router
under `valgrind --tool=callgrind --instr-atstart=no`, warms up with two short streams, turns the
instrumentation on (callgrind_control -i on) for one loadgen run of STREAMS streams x TOKENS
tokens (--ignore-eos) through the router and off after it, and prints the instructions (Ir)
counted then, per token and per message the client received, in all and by shared object
(the router binary, libgrpc, protobuf-c, abseil, libc, the dynamic loader), as one line
"router-relay-bench streams=S tokens=N messages=M ir_per_token=T ir_per_message=P
OBJECT=per_message ...". The router runs some 50x slower under callgrind, so the worker's
messages bunch up: messages per token is lower than in router_bench_test, and per message is
the figure to compare. Kernel time (the sockets, the wake-ups) is not counted. Run from the
repository root after `bazel build //cli:deltaserve //bench:loadgen`:

    /usr/bin/python3 bench/router_relay_bench.py [STREAMS TOKENS]   # default: 16 256

Env: DS_BIN (the binary for the router and the workers), DS_REFERENCE_DIR."""
import glob
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "tests",
                                "e2e"))
import harness as h  # noqa: E402

OBJECTS = (("router", None), ("grpc", "libgrpc"), ("gpr", "libgpr"), ("protobuf_c", "libprotobuf-c"),
           ("absl", "libabsl"), ("libc", "libc.so"), ("ld_so", "ld-linux"))


def loadgen(addr, streams, tokens):
    out = subprocess.run(
        [os.path.join(h.repo_root(), "bazel-bin/bench/loadgen"), "--addr", addr,
         "--concurrency", str(streams), "--requests", str(streams), "--max-tokens", str(tokens),
         "--ignore-eos", "--ids", "1,2,3,4", "--timeout-ms", "600000"],
        capture_output=True, text=True, timeout=1800)
    text = out.stdout + out.stderr
    m = re.search(r"loadgen-summary mode=fixed ok=(\d+) failed=(\d+) \S+ tokens=(\d+) "
                  r"messages=(\d+)", text)
    if out.returncode != 0 or not m or int(m.group(2)) != 0:
        sys.exit("loadgen failed:\n" + text)
    return int(m.group(3)), int(m.group(4))


def by_object(path, binary):
    """{object label: Ir} from callgrind_annotate's per-function (exclusive) lines."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
                         capture_output=True, text=True).stdout
    total, objs = 0, {k: 0 for k, _ in OBJECTS}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(.*\)\s+(.*)$", line)
        if not m:
            continue
        ir = int(m.group(1).replace(",", ""))
        if "PROGRAM TOTALS" in m.group(2):
            total = ir
            continue
        where = re.search(r"\[([^\]]*)\]\s*$", m.group(2))
        obj = where.group(1) if where else ""
        for label, key in OBJECTS:
            if (key is None and obj == binary) or (key and key in os.path.basename(obj)):
                objs[label] += ir
                break
    return total, objs


def main():
    streams = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    slots = str(max(1, (streams + 1) // 2))
    model = os.environ.get("DS_BENCH_MODEL") or h.tiny_model()
    ws = [h.start_worker("relay_bench_w%d" % i, model=model,
                         extra=["--slots", slots, "--threads", "1"]) for i in range(2)]
    out_dir = tempfile.mkdtemp(prefix="router-relay-bench-")
    cg_out = os.path.join(out_dir, "callgrind.out")
    binary = os.path.realpath(h.binary())
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=" + cg_out,
            binary, "router", "--listen", "127.0.0.1:0", "--workers",
            ",".join(w.addr for w in ws), "--poll-ms", "100", "--model", model]
    r = h.Proc("relay_bench_router", argv)
    try:
        r.wait_listening(timeout=300)
        h.wait_serving(r.addr, "deltaserve.v1.Generation")
        loadgen(r.addr, 2, 8)
        subprocess.run(["callgrind_control", "-i", "on", str(r.p.pid)], check=True,
                       capture_output=True)
        n_tok, n_msg = loadgen(r.addr, streams, tokens)
        subprocess.run(["callgrind_control", "-i", "off", str(r.p.pid)], check=True,
                       capture_output=True)
    finally:
        r.stop()
        for w in ws:
            w.stop()
    total, objs = by_object(max(glob.glob(cg_out + "*"), key=os.path.getmtime), binary)
    print("router-relay-bench streams=%d tokens=%d messages=%d ir_per_token=%.0f "
          "ir_per_message=%.0f %s" % (
              streams, n_tok, n_msg, total / n_tok, total / n_msg,
              " ".join("%s=%.0f" % (k, v / n_msg) for k, v in objs.items())))


if __name__ == "__main__":
    main()
