"""Prefix reuse through the service, measured by bench/loadgen's prefix-reuse modes (as
docs/LOADTEST.md runs them, at CI size): a router (prefix routing) and a CPU worker on the demo
model with the prefix cache on. The worker's ready line reports the cache; a multi-turn run
(4 users x 4 turns, concurrency 1) has >= 90 % of its reusable prompt tokens served from the
cache (usage.cached_tokens relayed by the router); a shared-prefix run (48 requests of one
128-token prefix and distinct 16-token suffixes, concurrency 1) computes at most 1.2x its
unique prompt tokens (the first two requests compute the prefix: the second one's divergence
makes the snapshot the others resume from); the worker's GetLoad counts the hits. Each mode
draws its ids with its own seed, so neither run finds the other's prefixes."""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

DEMO = os.path.join("models", "demo-en-17m.gguf")  # runfiles (//models:demo)


def loadgen():
    for c in ("bench/loadgen", os.path.join(h.repo_root(), "bazel-bin/bench/loadgen")):
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise RuntimeError("bench/loadgen not found")


def summary(out):
    """The key=value pairs of loadgen's "loadgen-summary" line (numbers as floats)."""
    m = re.search(r"^loadgen-summary (.*)$", out, re.M)
    if not m:
        return None
    kv = dict(x.split("=", 1) for x in m.group(1).split())
    return {k: (v if k == "mode" else float(v)) for k, v in kv.items()}


def demo_model():
    if os.path.isfile(DEMO):
        return os.path.abspath(DEMO)
    return os.path.join(h.repo_root(), DEMO)


class PrefixReuse(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = h.start_worker("pfx_w", model=demo_model(),
                               extra=["--slots", "4", "--threads", "1", "--prefix-cache-mb", "256"])
        cls.r = h.start_router([cls.w], model=False, extra=["--routing", "prefix"],
                               name="pfx_router")

    @classmethod
    def tearDownClass(cls):
        cls.r.stop()
        cls.w.stop()

    def run_loadgen(self, *args):
        p = subprocess.run([loadgen(), "--addr", self.r.addr, "--concurrency", "1",
                            "--ignore-eos", *args], capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        print(out, flush=True)
        s = summary(out)
        self.assertEqual(p.returncode, 0, out)
        self.assertIsNotNone(s, out)
        self.assertEqual(s["failed"], 0, out)
        return s, out

    def test_ready_line_reports_the_cache(self):
        line = self.w.wait_line(r"ready: .*").group(0)
        self.assertRegex(line, r"prefix cache [1-9]\d* snapshots of [\d.]+ MiB")

    def test_multi_turn_served_from_the_cache(self):
        s, out = self.run_loadgen("--users", "4", "--turns", "4", "--system-tokens", "64",
                                  "--user-tokens", "16", "--max-tokens", "16", "--id-seed", "11")
        self.assertEqual(s["mode"], "multi-turn")
        self.assertEqual(s["ok"], 16, out)
        # 4 users: turn 1 shares the system prompt with earlier users, later turns the whole
        # conversation so far
        self.assertGreater(s["reusable_tokens"], 0.75 * s["prompt_tokens"], out)
        self.assertGreaterEqual(s["cached_ratio"], 0.90, out)
        self.assertLessEqual(s["cached_tokens"], s["reusable_tokens"], out)
        load = h.Client(self.w.addr)
        try:
            l = load.load()
        finally:
            load.close()
        self.assertTrue(l.prefix_cache)
        self.assertGreater(l.prefix_hits, 0)
        self.assertGreaterEqual(l.prefix_cached_tokens, s["cached_tokens"])
        self.assertGreater(l.prefix_snapshots, 0)

    def test_shared_prefix_computes_little_beyond_the_unique_tokens(self):
        s, out = self.run_loadgen("--shared-prefix", "128", "--suffix-tokens", "16",
                                  "--requests", "48", "--max-tokens", "4", "--id-seed", "12")
        self.assertEqual(s["mode"], "shared-prefix")
        self.assertEqual(s["ok"], 48, out)
        # the suffixes are distinct; a few may begin with the same drawn ids by chance
        self.assertLessEqual(s["unique_tokens"], 128 + 48 * 16, out)
        self.assertGreater(s["unique_tokens"], 128 + 48 * 15, out)
        self.assertGreater(s["cached_tokens"], 0, out)
        self.assertLessEqual(s["computed_ratio"], 1.2, out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
