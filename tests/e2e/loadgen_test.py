"""The load-test scenarios of docs/LOADTEST.md run with bench/loadgen against CPU workers: a
router and two workers on the tiny reference model, then each scenario's loadgen command line
(the same flags, smaller counts so the test stays short): closed-loop streams through the
router, the same in the steady state (--steady), one stream at a time, a duration-bounded run, a text prompt, a worker called directly
(--worker), cancellation churn with the workers' loads checked before and after, and the
prefix-reuse modes' accounting (multi-turn and shared-prefix: prompt, reusable and unique
tokens). Each must exit 0 (loadgen exits 1 when any stream failed) and report exactly the
streams and tokens asked for (--ignore-eos: max_tokens each)."""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402


def loadgen():
    for c in ("bench/loadgen", os.path.join(h.repo_root(), "bazel-bin/bench/loadgen")):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise RuntimeError("bench/loadgen not found")


def run(*args, timeout=120):
    r = subprocess.run([loadgen(), *args], capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def summary(out):
    """(streams ok, streams failed, tokens per stream) from loadgen's report."""
    m = re.search(r"(\d+) streams ok, (\d+) failed", out)
    t = re.search(r"tokens/stream ([\d.]+)", out)
    return (int(m.group(1)), int(m.group(2)), float(t.group(1))) if m and t else (None, None, None)


class LoadgenScenarios(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workers = [h.start_worker("w%d" % i, extra=["--slots", "4", "--threads", "1"])
                       for i in range(2)]
        cls.router = h.start_router(cls.workers)

    @classmethod
    def tearDownClass(cls):
        cls.router.stop()
        for w in cls.workers:
            w.stop()

    def check(self, rc, out, streams=None, tokens=None):
        ok, failed, per = summary(out)
        self.assertEqual(rc, 0, out)
        self.assertEqual(failed, 0, out)
        if streams is not None:
            self.assertEqual(ok, streams, out)
        else:
            self.assertGreater(ok, 0, out)
        if tokens is not None:
            self.assertEqual(per, tokens, out)
        self.assertIn("TTFT (final message timings)", out)  # the server's timings, as documented
        self.assertIn("TTFT (client, first message)", out)

    def test_closed_loop_through_the_router(self):
        rc, out = run("--addr", self.router.addr, "--concurrency", "8", "--requests", "40",
                      "--max-tokens", "16", "--ignore-eos")
        self.check(rc, out, streams=40, tokens=16)

    def test_steady_state(self):
        # 4 warm-up streams flow into 12 counted ones: the report counts the 12, and tokens/s
        # is over the window from the first counted start to the first thread out of streams
        rc, out = run("--addr", self.router.addr, "--concurrency", "4", "--requests", "12",
                      "--warmup", "4", "--steady", "--max-tokens", "16", "--ignore-eos")
        self.check(rc, out, streams=12, tokens=16)
        s = self.summary_line(out)
        self.assertEqual(s["mode"], "steady", out)
        m = re.search(r"steady window ([\d.]+) s .*: (\d+) tokens of every stream", out)
        self.assertIsNotNone(m, out)
        window, tokens = float(m.group(1)), int(m.group(2))
        self.assertGreater(window, 0, out)
        # the window ends while the last streams still run: fewer than all 16 streams' tokens,
        # more than none
        self.assertGreater(tokens, 0, out)
        self.assertLess(tokens, 16 * 16, out)
        self.assertAlmostEqual(s["tokens_per_s"], tokens / window, delta=0.01 * tokens / window + 0.1)

    def test_one_stream_at_a_time(self):
        rc, out = run("--addr", self.router.addr, "--concurrency", "1", "--requests", "10",
                      "--warmup", "2", "--max-tokens", "16", "--ignore-eos")
        self.check(rc, out, streams=10, tokens=16)

    def test_duration_bounded(self):
        rc, out = run("--addr", self.router.addr, "--concurrency", "4", "--duration-s", "3",
                      "--warmup", "2", "--max-tokens", "8", "--ignore-eos")
        self.check(rc, out, tokens=8)

    def test_text_prompt(self):
        rc, out = run("--addr", self.router.addr, "--prompt", "The capital of France is",
                      "--requests", "8", "--max-tokens", "8", "--ignore-eos")
        self.check(rc, out, streams=8, tokens=8)

    def test_worker_directly(self):
        rc, out = run("--worker", "--addr", self.workers[0].addr, "--ids", "1,2,3,4",
                      "--requests", "8", "--max-tokens", "8", "--ignore-eos")
        self.check(rc, out, streams=8, tokens=8)

    def test_cancellation_churn_frees_every_slot(self):
        # every stream cancelled after 0..12 of its 24 tokens (some before the first): none
        # fails, and each worker's GetLoad afterwards equals the one before (docs/LOADTEST.md)
        addrs = ",".join(w.addr for w in self.workers)
        rc, out = run("--addr", self.router.addr, "--concurrency", "8", "--requests", "48",
                      "--warmup", "4", "--max-tokens", "24", "--ignore-eos",
                      "--cancel-after", "12", "--load-addr", addrs)
        ok, failed, _ = summary(out)
        self.assertEqual(rc, 0, out)
        self.assertEqual(failed, 0, out)
        m = re.search(r"cancelled by this client: (\d+)", out)
        self.assertIsNotNone(m, out)
        self.assertGreater(int(m.group(1)), 24, out)  # all but the races with a stream's end
        self.assertEqual(out.count(": the same"), 2, out)
        self.assertNotIn("CHANGED", out)

    def summary_line(self, out):
        m = re.search(r"^loadgen-summary (.*)$", out, re.M)
        self.assertIsNotNone(m, out)
        kv = dict(x.split("=", 1) for x in m.group(1).split())
        return {k: (v if k == "mode" else float(v)) for k, v in kv.items()}

    def test_multi_turn_accounting(self):
        # 2 users x 3 turns, system 16, user 8, generated 8: prompts of 24, 40 and 56 tokens;
        # reusable: turns 2 and 3 the whole conversation so far (32, 48), user 2's turn 1 the
        # system prompt (16), besides ids matching by chance
        rc, out = run("--addr", self.router.addr, "--concurrency", "1", "--users", "2",
                      "--turns", "3", "--system-tokens", "16", "--user-tokens", "8",
                      "--max-tokens", "8", "--ignore-eos")
        self.assertEqual(rc, 0, out)
        s = self.summary_line(out)
        self.assertEqual(s["mode"], "multi-turn")
        self.assertEqual((s["ok"], s["failed"]), (6, 0), out)
        self.assertEqual(s["prompt_tokens"], 2 * (24 + 40 + 56), out)
        self.assertGreaterEqual(s["reusable_tokens"], 2 * (32 + 48) + 16, out)
        self.assertLess(s["reusable_tokens"], 2 * (32 + 48) + 16 + 6, out)
        self.assertEqual(s["unique_tokens"], s["prompt_tokens"] - s["reusable_tokens"], out)
        self.assertEqual(s["computed_tokens"], s["prompt_tokens"] - s["cached_tokens"], out)
        self.assertIn("TTFT (client), turns >= 2", out)

    def test_shared_prefix_accounting(self):
        rc, out = run("--addr", self.router.addr, "--concurrency", "2", "--shared-prefix", "32",
                      "--suffix-tokens", "8", "--requests", "6", "--max-tokens", "4",
                      "--ignore-eos")
        self.assertEqual(rc, 0, out)
        s = self.summary_line(out)
        self.assertEqual(s["mode"], "shared-prefix")
        self.assertEqual((s["ok"], s["failed"]), (6, 0), out)
        self.assertEqual(s["prompt_tokens"], 6 * 40, out)
        # all but the first request (and one sent at the same moment) share the prefix
        self.assertGreaterEqual(s["reusable_tokens"], 4 * 32, out)
        self.assertLessEqual(s["cached_tokens"], s["reusable_tokens"], out)

    def test_modes_refuse_fixed_mode_flags(self):
        for flag in (["--warmup", "2"], ["--steady"]):
            rc, out = run("--addr", self.router.addr, "--users", "2", *flag)
            self.assertEqual(rc, 2, out)
            self.assertIn("--users and --shared-prefix", out)

    def test_load_check_fails_on_a_wrong_address(self):
        rc, out = run("--addr", self.router.addr, "--requests", "2", "--max-tokens", "2",
                      "--load-addr", "127.0.0.1:1")
        self.assertEqual(rc, 1, out)
        self.assertIn("--load-addr 127.0.0.1:1", out)

    def test_failures_are_reported(self):
        # a deadline no stream can meet: loadgen must exit 1 and count the failures
        rc, out = run("--addr", self.router.addr, "--concurrency", "2", "--requests", "4",
                      "--max-tokens", "64", "--ignore-eos", "--timeout-ms", "1")
        ok, failed, _ = summary(out)
        self.assertEqual(rc, 1, out)
        self.assertGreater(failed or 0, 0, out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
