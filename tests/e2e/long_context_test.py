"""Contexts as long as the model's, on the CPU with a synthetic tiny Qwen3.5 (`gguf synth --preset
tiny`: context_length 262,144, F32 weights, 1 KiB of KV per position):

- by default the worker's context is the model's: its start-up line says how many sequences of
  what length fit in what memory, GetModelInfo says 262,144, and a prompt longer than the old
  4,096 default is served;
- a 200,000-token prompt is admitted and runs without the memory of 8 slots x 262,144 positions
  being touched (RSS stays far below the 2 GiB KV pool), is cancelled, and the worker serves on;
- with a memory budget (--memory-mb) that cannot hold the model's context the default shrinks
  and the line says so; a 200,000-token prompt is then refused with INVALID_ARGUMENT naming the
  limit, by the worker and by the router (before any worker sees it);
- a given --ctx (or --slots) that does not fit exits 1 with one line naming the flag.

Serving the 200,000-token prompt to the end is not CI-size: the CPU forward's prefill attention
grows with the square of the prompt (the tiny model on two cores: 5,000 tokens in 2 s, 20,000 in
about a minute, 200,000 in over an hour)."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402

pb = h.pb
LONG = 200000
MODEL_CTX = 262144


def long_prompt(n):
    return [(i * 7919) % 2048 for i in range(n)]


def err(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


class LongContext(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ds-longctx-")
        cls.model = os.path.join(cls.tmp, "tiny-262k.gguf")
        h.run_cli(["gguf", "synth", "--preset", "tiny", "--quant", "f32", "--seed", "7", "-o",
                   cls.model], check=True)

    def test_default_context_is_the_models(self):
        w = h.start_worker("lc_default", model=self.model, extra=["--threads", "2"])
        c = h.Client(w.addr)
        try:
            line = w.wait_line(r"memory: context (\d+) tokens, (\d+) slots?").string
            self.assertIn("context %d tokens" % MODEL_CTX, line)
            self.assertIn("available RAM", line)
            self.assertNotIn("does not fit", line)
            info = c.worker.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            self.assertEqual(info.max_context, MODEL_CTX)
            # beyond the old 4,096 default: served
            msgs, ids, _, final = c.worker_generate(long_prompt(4200), max_tokens=2,
                                                    ignore_eos=True, timeout=120)
            self.assertEqual(len(ids), 2)
            self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)

            # 200,000 tokens: admitted, running, memory not blown up; then cancelled
            req = pb.WorkerGenerateRequest(prompt_token_ids=long_prompt(LONG))
            h.fill_common(req, max_tokens=1, ignore_eos=True, request_id="long-200k")
            fut = c.worker.Generate(req, timeout=300)
            h.wait_until(lambda: c.load().running == 1, timeout=60, what="the long prompt runs")
            rss_mb = w.rss_kb() / 1024  # the KV pool alone is 2 GiB of address space
            self.assertLess(rss_mb, 768, "RSS %.0f MiB while a 200k prompt runs" % rss_mb)
            fut.cancel()
            h.wait_until(lambda: c.load().running == 0, timeout=60, what="the long prompt ends")
            rss_mb = w.rss_kb() / 1024
            self.assertLess(rss_mb, 768, "RSS %.0f MiB after a 200k prompt ran" % rss_mb)
            _, ids, _, final = c.worker_generate([1, 2, 3], max_tokens=3, ignore_eos=True)
            self.assertEqual(len(ids), 3)
            self.assertIsNone(w.p.poll(), "the worker is still up")
        finally:
            c.close()
            w.stop()

    def test_budget_shrinks_the_default_and_long_prompts_are_refused(self):
        # 100 MiB: one sequence of 262,144 positions needs ~257 MiB
        w = h.start_worker("lc_small", model=self.model, extra=["--memory-mb", "100",
                                                                 "--threads", "1"])
        r = h.start_router([w], model=False, name="lc_router")
        cw, cr = h.Client(w.addr), h.Client(r.addr)
        try:
            line = w.wait_line(r"memory: context (\d+) tokens").string
            self.assertIn("does not fit", line)
            self.assertIn("the model's %d" % MODEL_CTX, line)
            info = cw.worker.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            ctx = info.max_context
            self.assertTrue(1024 <= ctx < LONG, ctx)
            self.assertIn("context %d tokens" % ctx, line)

            code, msg = err(lambda: cw.worker_generate(long_prompt(LONG), max_tokens=1))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
            self.assertIn("prompt_token_ids", msg)
            self.assertIn("context of %d" % ctx, msg)

            code, msg = err(lambda: cr.generate(ids=long_prompt(LONG), max_tokens=1))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
            self.assertIn("prompt: %d tokens do not fit the context of %d" % (LONG, ctx), msg)
            # prompt + 1 > context: the first length refused, one shorter served
            code, msg = err(lambda: cr.generate(ids=long_prompt(ctx), max_tokens=1))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
            code, msg = err(lambda: cr.generate(ids=[1, 2], max_tokens=ctx))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
            self.assertIn("stopping.max_new_tokens", msg)
            _, ids, _, _ = cr.generate(ids=[1, 2, 3], max_tokens=2, ignore_eos=True)
            self.assertEqual(len(ids), 2)
            self.assertIsNone(w.p.poll())
        finally:
            cw.close()
            cr.close()
            r.stop()
            w.stop()

    def test_given_values_that_cannot_fit_exit_1(self):
        for flags, named in ((["--ctx", str(LONG)], "--ctx %d" % LONG),
                             (["--slots", "64", "--ctx", "100000"], "--ctx 100000 --slots 64")):
            p = subprocess.run([h.binary(), "worker", "--model", self.model, "--listen",
                                "127.0.0.1:0", "--memory-mb", "100"] + flags,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 1, p.stderr)
            last = [x for x in p.stderr.splitlines() if x.startswith("deltaserve worker:")]
            self.assertEqual(len(last), 1, p.stderr)
            self.assertIn(named, last[0])
            self.assertIn("budget of 100.0 MiB", last[0])


if __name__ == "__main__":
    unittest.main()
