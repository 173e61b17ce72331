"""End-to-end tests of the service with real `deltaserve worker` processes on the tiny
reference model, through Debian's python3-grpcio and stubs generated from our .proto.

Fixtures x scenarios:
  WorkerDirect   one worker, called on deltaserve.v1.Worker/Generate
  RouterTwo      a router + two workers, called on deltaserve.v1.Generation/Generate (the
                 workers' messages on their feeds, the default)
  RouterTwoNoFeed  the same with --worker-feed=false (each worker call carries its messages)
Scenarios (both fixtures): ids prompt = the reference greedy tokens (and = `deltaserve generate`
when that command is built), same seed same tokens, stop token, max tokens, logprobs, cancel
after k tokens frees the slot, deadline, overload -> RESOURCE_EXHAUSTED, bad requests ->
INVALID_ARGUMENT. Router only: text and chat prompts, stop strings, the two fixtures agree.
Faults (own fixture): a worker killed mid-stream. SIGTERM drains are in drain_test.py."""
import json
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402

pb = h.pb
SLOTS, QUEUE = 2, 1
WORKER_FLAGS = ["--slots", str(SLOTS), "--queue", str(QUEUE), "--threads", "1"]
LONG = 4000  # tokens: a stream that outlives the test step (the tiny model, ctx 4096)


def reference():
    with open(h.tiny_json()) as f:
        return json.load(f)


REF = reference()


def err(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def generate_cli(ids, n, *flags, prompt_flags=None):
    """`deltaserve generate` ids (greedy unless flags say otherwise), or None while that
    command is not built."""
    prompt = prompt_flags or ["--ids", ",".join(map(str, ids))]
    rc, out, errs = h.run_cli(["generate", "--model", h.tiny_model()] + prompt +
                              ["--max-tokens", str(n), "--print-ids", "--threads", "1"] +
                              (list(flags) or ["--temperature", "0"]))
    if rc != 0 and "not built yet" in errs:
        return None
    if rc != 0:
        raise AssertionError("deltaserve generate failed: " + errs)
    return json.loads(out.strip().splitlines()[-1])


class Scenarios:
    """Mixed into a fixture class that provides gen(ids=..., **kw), start(ids, **kw) (a live
    stream iterator), workers (harness.Proc list) and loads()."""

    def test_ids_prompt_is_the_reference_greedy(self):
        for p in REF["prompts"]:
            _, ids, _, final = self.gen(ids=p["ids"], max_tokens=len(p["greedy"]),
                                        ignore_eos=True)
            self.assertEqual(ids, p["greedy"], p["ids"])
            self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
            self.assertEqual(final.usage.prompt_tokens, len(p["ids"]))
            self.assertEqual(final.usage.completion_tokens, len(p["greedy"]))
            self.assertGreater(final.timings.total_ms, 0)

    def test_matches_deltaserve_generate(self):
        p = REF["prompts"][0]
        want = generate_cli(p["ids"], 16)
        if want is None:
            self.skipTest("deltaserve generate is not built yet")
        _, ids, _, _ = self.gen(ids=p["ids"], max_tokens=16)
        self.assertEqual(ids, want)

    def test_sampled_matches_deltaserve_generate(self):
        """Same seed, same sampling flags: the same tokens as the local command."""
        want = generate_cli([5, 6, 7], 12, "--temperature", "0.9", "--top-k", "40",
                            "--top-p", "0.95", "--seed", "1234")
        if want is None:
            self.skipTest("deltaserve generate is not built yet")
        try:
            _, ids, _, _ = self.gen(ids=[5, 6, 7], max_tokens=12, temperature=0.9, top_k=40,
                                    top_p=0.95, seed=1234)
        except grpc.RpcError as e:
            if "not built yet" in e.details():
                self.skipTest(e.details())
            raise
        self.assertEqual(ids, want)

    def test_same_seed_same_tokens(self):
        kw = dict(ids=[5, 6, 7], max_tokens=12, temperature=0.9, top_k=40, seed=1234,
                  ignore_eos=True)
        try:
            _, a, _, fa = self.gen(**kw)
        except grpc.RpcError as e:
            if "not built yet" in e.details():  # the worker's interim greedy-only sampler
                self.skipTest(e.details())
            raise
        _, b, _, fb = self.gen(**kw)
        self.assertEqual(a, b)
        self.assertEqual(fa.seed, 1234)
        self.assertEqual(len(a), 12)

    def test_stop_token(self):
        p = REF["prompts"][0]
        g = p["greedy"]
        stop = g[5]
        k = g.index(stop)
        _, ids, _, final = self.gen(ids=p["ids"], max_tokens=len(g), stop_ids=[stop],
                                    ignore_eos=True)
        self.assertEqual(ids, g[:k + 1])
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_STOP)
        self.assertEqual(final.WhichOneof("matched_stop"), "stop_token_id")
        self.assertEqual(final.stop_token_id, stop)

    def test_max_tokens(self):
        _, ids, _, final = self.gen(ids=[1, 2, 3], max_tokens=5, ignore_eos=True)
        self.assertEqual(len(ids), 5)
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
        self.assertEqual(final.usage.completion_tokens, 5)

    def test_logprobs(self):
        msgs, ids, _, _ = self.gen(ids=REF["prompts"][1]["ids"], max_tokens=6, logprobs=3,
                                   ignore_eos=True)
        lps = [lp for m in msgs for lp in m.logprobs]
        self.assertEqual([lp.token_id for lp in lps], ids)
        for lp in lps:
            self.assertEqual(len(lp.top), 3)
            self.assertLessEqual(lp.logprob, 0.0)
            self.assertEqual(lp.top[0].token_id, lp.token_id)  # greedy: the chosen is the top
            self.assertAlmostEqual(lp.top[0].logprob, lp.logprob, places=5)
            tops = [t.logprob for t in lp.top]
            self.assertEqual(tops, sorted(tops, reverse=True))

    def test_cancel_after_k_tokens_frees_the_slot(self):
        it = self.start(ids=[9, 8, 7], max_tokens=LONG, ignore_eos=True)
        got = 0
        for m in it:
            got += len(m.token_ids)
            if got >= 3:
                break
        it.cancel()
        self.wait_idle()

    def test_deadline(self):
        code, msg = err(lambda: self.gen(ids=[4, 5], max_tokens=LONG, ignore_eos=True,
                                         timeout=0.15))
        self.assertEqual(code, grpc.StatusCode.DEADLINE_EXCEEDED, msg)
        self.wait_idle()

    def test_overload_is_resource_exhausted(self):
        cap = (SLOTS + QUEUE) * len(self.workers)
        its = [self.start(ids=[3, 4, 5 + i], max_tokens=LONG, ignore_eos=True)
               for i in range(cap)]
        try:
            h.wait_until(lambda: all(l.running + l.waiting == SLOTS + QUEUE
                                     for l in self.loads()), 30, "every slot and queue entry taken")
            code, msg = err(lambda: self.gen(ids=[1], max_tokens=2))
            self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED, msg)
        finally:
            for it in its:
                it.cancel()
        self.wait_idle()

    def test_bad_requests_are_invalid_argument(self):
        cases = [
            (dict(ids=[]), "prompt"),
            (dict(ids=[1, 5000]), "5000"),
            (dict(ids=[1], logprobs=21), "logprobs"),
            (dict(ids=[1], temperature=-1.0), "sampling.temperature"),
            (dict(ids=[1], max_tokens=100000), "max_new_tokens"),
        ]
        for kw, word in cases:
            code, msg = err(lambda: self.gen(**kw))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, (kw, msg))
            self.assertIn(word, msg, kw)

    def wait_idle(self):
        h.wait_until(lambda: all(l.running == 0 and l.waiting == 0 and
                                 l.free_slots == l.total_slots for l in self.loads()), 30,
                     "every worker slot free")


class WorkerDirect(Scenarios, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workers = [h.start_worker("direct_w", extra=WORKER_FLAGS)]
        cls.c = h.Client(cls.workers[0].addr)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        for w in cls.workers:
            w.stop()

    def gen(self, ids, timeout=60, **kw):
        return self.c.worker_generate(ids, timeout=timeout, **kw)

    def start(self, ids, **kw):
        req = pb.WorkerGenerateRequest(prompt_token_ids=ids)
        h.fill_common(req, **kw)
        return self.c.worker.Generate(req, timeout=120)

    def loads(self):
        return [self.c.load()]


class RouterFixture(Scenarios):
    """A router + two workers; ROUTER_EXTRA: the router's flags."""
    ROUTER_EXTRA = ()
    NAME = "two"

    @classmethod
    def setUpClass(cls):
        cls.workers = [h.start_worker("%s_w%d" % (cls.NAME, i), extra=WORKER_FLAGS)
                       for i in range(2)]
        cls.r = h.start_router(cls.workers, name=cls.NAME + "_router",
                               extra=list(cls.ROUTER_EXTRA))
        cls.c = h.Client(cls.r.addr)
        cls.wc = [h.Client(w.addr) for w in cls.workers]

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        for c in cls.wc:
            c.close()
        cls.r.stop()
        for w in cls.workers:
            w.stop()

    def gen(self, timeout=60, **kw):
        return self.c.generate(timeout=timeout, **kw)

    def start(self, **kw):
        return self.c.gen.Generate(h.request(**kw), timeout=120)

    def loads(self):
        return [c.load() for c in self.wc]


class RouterTwoNoFeed(RouterFixture, unittest.TestCase):
    """The scenarios through a router whose worker calls carry their own messages
    (--worker-feed=false); RouterTwo's ride on the workers' feeds."""
    ROUTER_EXTRA = ("--worker-feed=false",)
    NAME = "nf"


class RouterTwo(RouterFixture, unittest.TestCase):
    def test_text_prompt_and_pieces(self):
        for p in REF["prompts"]:
            _, ids, text, final = self.gen(text=p["text"], max_tokens=len(p["greedy"]),
                                           ignore_eos=True)
            self.assertEqual(final.usage.prompt_tokens, len(p["ids"]))
            self.assertEqual(ids, p["greedy"], p["text"])
            rc, want, errs = h.run_cli(["detokenize", "--model", h.tiny_model(), "--ids",
                                        ",".join(map(str, ids))])
            self.assertEqual(rc, 0, errs)
            self.assertEqual(text, want)

    def test_chat_prompt(self):
        chat_text = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
        rc, out, errs = h.run_cli(["tokenize", "--model", h.tiny_model(), "--text", chat_text])
        self.assertEqual(rc, 0, errs)
        want_prompt = json.loads(out)
        _, a, _, fa = self.gen(chat=[("user", "Hello")], max_tokens=8, ignore_eos=True)
        _, b, _, _ = self.gen(ids=want_prompt, max_tokens=8, ignore_eos=True)
        self.assertEqual(fa.usage.prompt_tokens, len(want_prompt))
        self.assertEqual(a, b)

    def test_chat_matches_deltaserve_generate_chat(self):
        want = generate_cli(None, 10, "--temperature", "0",
                            prompt_flags=["--chat", "--prompt", "Hello there"])
        if want is None:
            self.skipTest("deltaserve generate is not built yet")
        _, ids, _, _ = self.gen(chat=[("user", "Hello there")], max_tokens=10)
        self.assertEqual(ids, want)

    def test_stop_string(self):
        p = REF["prompts"][2]
        n = len(p["greedy"])
        _, ids, text, _ = self.gen(ids=p["ids"], max_tokens=n, ignore_eos=True)
        # a stop string from the middle of the text, cut where it first occurs
        stop = text[len(text) // 2:len(text) // 2 + 3]
        self.assertTrue(stop)
        want = text[:text.find(stop)]
        msgs, ids2, text2, final = self.gen(ids=p["ids"], max_tokens=n, ignore_eos=True,
                                            stop=[stop, "\u2603never"])
        self.assertEqual(text2, want)
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_STOP)
        self.assertEqual(final.stop_string, stop)
        self.assertEqual(ids2, ids[:len(ids2)])
        self.assertLess(len(ids2), n)
        # the router ended the stream itself: the worker's --name and the prefill time still
        # come from the worker (its first message)
        self.assertIn(final.served_by, ("two_w0", "two_w1"))
        self.assertGreater(final.timings.prefill_ms, 0)

    def test_same_tokens_as_the_worker_directly(self):
        p = REF["prompts"][3]
        _, via_router, _, final = self.gen(ids=p["ids"], max_tokens=10, seed=77, ignore_eos=True)
        direct = [c for c in self.wc if c is not None][0]
        _, via_worker, _, _ = direct.worker_generate(p["ids"], max_tokens=10, seed=77,
                                                     ignore_eos=True)
        self.assertEqual(via_router, via_worker)
        self.assertIn(final.served_by, ("two_w0", "two_w1"))

    def test_requests_spread_over_both_workers(self):
        its = [self.start(ids=[7, 7, i], max_tokens=LONG, ignore_eos=True) for i in range(2)]
        try:
            h.wait_until(lambda: all(l.running == 1 for l in self.loads()), 30,
                         "one stream on each worker")
        finally:
            for it in its:
                it.cancel()
        self.wait_idle()


class WorkerDeath(unittest.TestCase):
    def test_worker_killed_mid_stream(self):
        ws = [h.start_worker("death_w%d" % i, extra=WORKER_FLAGS) for i in range(2)]
        r = h.start_router(ws, name="death_router")
        c = h.Client(r.addr)
        wc = [h.Client(w.addr) for w in ws]
        results = [None] * 4
        first_token = [threading.Event() for _ in range(4)]

        def run(k):
            try:
                it = c.gen.Generate(h.request(ids=[2, 3, k], max_tokens=1500, ignore_eos=True),
                                    timeout=120)
                n = 0
                final = None
                for m in it:
                    n += len(m.token_ids)
                    first_token[k].set()
                    if m.finish_reason:
                        final = m
                results[k] = ("ok", n, final.served_by)
            except grpc.RpcError as e:
                first_token[k].set()
                results[k] = (e.code(), e.details())
        try:
            ts = [threading.Thread(target=run, args=(k,)) for k in range(4)]
            for t in ts:
                t.start()
            for e in first_token:
                self.assertTrue(e.wait(60))
            h.wait_until(lambda: all(x.load().running == 2 for x in wc), 30,
                         "two streams on each worker")
            ws[0].kill()
            for t in ts:
                t.join(120)
            ok = [x for x in results if x[0] == "ok"]
            failed = [x for x in results if x[0] != "ok"]
            self.assertEqual(len(ok), 2, results)
            self.assertEqual(len(failed), 2, results)
            for x in ok:  # the other worker's streams ran to the end
                self.assertEqual(x[1], 1500)
                self.assertEqual(x[2], "death_w1")
            for x in failed:
                self.assertEqual(x[0], grpc.StatusCode.UNAVAILABLE)
                self.assertIn("failed after", x[1])
            # new requests do not fail: retried away from the dead worker
            for i in range(6):
                _, ids, _, final = c.generate(ids=[1, i], max_tokens=3)
                self.assertEqual(final.served_by, "death_w1")
        finally:
            c.close()
            for x in wc:
                x.close()
            r.stop()
            for w in ws:
                w.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
