"""Router behaviour that needs failures on cue, against the scriptable fake worker
(fake_worker.py): retries before the first token, a worker dying mid-stream, overload, no
healthy worker, deadline and cancel propagation, stop strings over known tokens, validation,
DNS discovery, prefix affinity (rendezvous, and the workers' prefix heads with cached_tokens
relayed), metrics, SIGTERM drain. Fixture: router + fake workers.
Run: /usr/bin/python3 router_faults_test.py (Bazel: //tests/e2e:router_faults_test)."""
import os
import signal
import sys
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402

pb = h.pb
# "Hello world. The end. <|im_end|>" in the tiny reference tokenizer (h.tiny_model():
# tiny-r2-tied, else the repository's own own-r2-tied, another vocabulary); the first
# N_THE_E tokens end with the " e" that completes the stop string "The e"; FIRST is the text of
# the first token.
if os.path.basename(h.tiny_model()).startswith("tiny-"):
    HELLO = [441, 718, 417, 712, 13, 901, 293, 264, 13, 220, 1026]  # He llo _wor ld . _The _e
    N_THE_E, FIRST = 7, "He"
else:
    # H e l lo _w or ld . _The _e
    HELLO = [39, 68, 75, 373, 268, 272, 605, 13, 455, 308, 269, 13, 220, 1026]
    N_THE_E, FIRST = 10, "H"
HELLO_TEXT = "Hello world. The end. <|im_end|>"


def code_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


class RetryAndOverload(unittest.TestCase):
    def test_retry_before_first_token_goes_to_another_worker(self):
        bad = h.start_fake_worker("bad", ["--mode", "unavailable"])
        good = h.start_fake_worker("good", ["--tokens", "5,6,7"])
        r = h.start_router([bad, good], extra=["--max-attempts", "2"])
        c = h.Client(r.addr)
        try:
            for i in range(12):
                _, ids, _, final = c.generate(ids=[1, 2], max_tokens=4)
                self.assertEqual(ids, [5, 6, 7, 5])
                self.assertEqual(final.served_by, "good")
                self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
        finally:
            c.close()
            r.stop()
            bad.stop()
            good.stop()

    def test_worker_without_feeds(self):
        """An older worker (no Worker/Feed: UNIMPLEMENTED) is asked once per healthy spell and
        serves its streams on their calls."""
        w = h.start_fake_worker("nofeed", ["--tokens", "5,6,7"])
        r = h.start_router([w])
        c = h.Client(r.addr)
        try:
            r.wait_line("has no token feed", timeout=10)
            time.sleep(0.6)  # six polls (--poll-ms 100): none asks again
            self.assertEqual(sum(1 for ln in list(r.lines) if ln and "has no token feed" in ln), 1)
            _, ids, _, final = c.generate(ids=[1, 2], max_tokens=4)
            self.assertEqual(ids, [5, 6, 7, 5])
            self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
        finally:
            c.close()
            r.stop()
            w.stop()

    def test_all_workers_exhausted_is_resource_exhausted(self):
        a = h.start_fake_worker("ex1", ["--mode", "exhausted"])
        b = h.start_fake_worker("ex2", ["--mode", "exhausted"])
        r = h.start_router([a, b], extra=["--metrics-listen", "127.0.0.1:0"])
        c = h.Client(r.addr)
        try:
            code, msg = code_of(lambda: c.generate(ids=[1, 2, 3], max_tokens=2))
            self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED, msg)
            self.assertIn("queue full", msg)
            self.assertIn("2 workers tried", msg)
            # a refused request's prompt was never computed: not in prompt_tokens_total (the
            # counters move just after the status is sent: wait for the failure to be counted)
            h.wait_until(lambda: h.metric(r, "deltaserve:request_failure_total") == 1.0, 10,
                         "the failure counted")
            self.assertEqual(h.metric(r, "deltaserve:prompt_tokens_total"), 0.0)
        finally:
            c.close()
            r.stop()
            a.stop()
            b.stop()

    def test_no_healthy_worker_is_unavailable_and_not_ready(self):
        r = h.start_router(["127.0.0.1:1"], ready=False)
        c = h.Client(r.addr)
        try:
            code, msg = code_of(lambda: c.generate(ids=[1], max_tokens=2))
            self.assertEqual(code, grpc.StatusCode.UNAVAILABLE)
            self.assertIn("no healthy worker", msg)
            st = c.health.Check(h.hpb.HealthCheckRequest(service="deltaserve.v1.Generation"))
            self.assertEqual(st.status, h.hpb.HealthCheckResponse.NOT_SERVING)
            st = c.health.Check(h.hpb.HealthCheckRequest(service=""))
            self.assertEqual(st.status, h.hpb.HealthCheckResponse.SERVING)
        finally:
            c.close()
            r.stop()


class MidStreamDeath(unittest.TestCase):
    def test_worker_dies_mid_stream(self):
        # "dies" exits after 6 tokens in all; "steady" is slow enough to overlap
        dies = h.start_fake_worker("dies", ["--tokens", "9", "--token-ms", "20",
                                            "--die-after", "6"])
        steady = h.start_fake_worker("steady", ["--tokens", "8", "--token-ms", "20"])
        r = h.start_router([dies, steady])
        c = h.Client(r.addr)
        results = {}

        def run(k):
            try:
                msgs, ids, _, final = c.generate(ids=[1], max_tokens=30)
                results[k] = ("ok", ids, final.served_by)
            except grpc.RpcError as e:
                results[k] = (e.code(), e.details())
        try:
            # the first stream takes one worker, the second the other (fewest outstanding)
            ts = [threading.Thread(target=run, args=(k,)) for k in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            outcomes = sorted(str(v[0]) for v in results.values())
            self.assertEqual(len(results), 2, results)
            failed = [v for v in results.values() if v[0] != "ok"]
            ok = [v for v in results.values() if v[0] == "ok"]
            self.assertEqual(len(failed), 1, outcomes)
            self.assertEqual(failed[0][0], grpc.StatusCode.UNAVAILABLE)
            self.assertIn("failed after", failed[0][1])
            self.assertEqual(len(ok), 1)
            self.assertEqual(ok[0][1], [8] * 30)  # the other stream is unaffected
            self.assertEqual(ok[0][2], "steady")
            dies.wait(10)
            # the dead worker is retried away from: every new request succeeds
            for _ in range(6):
                _, ids, _, final = c.generate(ids=[1], max_tokens=3)
                self.assertEqual(final.served_by, "steady")
        finally:
            c.close()
            r.stop()
            steady.stop()
            dies.stop()


class Streams(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = h.start_fake_worker("hello", ["--tokens", ",".join(map(str, HELLO)),
                                              "--token-ms", "2"])
        cls.slow = h.start_fake_worker("slow", ["--tokens", "72", "--token-ms", "30",
                                                "--slots", "4"])
        cls.r = h.start_router([cls.w], extra=["--metrics-listen", "127.0.0.1:0"])
        cls.rs = h.start_router([cls.slow], name="router_slow")
        cls.c = h.Client(cls.r.addr)
        cls.cs = h.Client(cls.rs.addr)
        cls.slow_direct = h.Client(cls.slow.addr)

    @classmethod
    def tearDownClass(cls):
        for c in (cls.c, cls.cs, cls.slow_direct):
            c.close()
        for p in (cls.r, cls.rs, cls.w, cls.slow):
            p.stop()

    def test_text_pieces_join_to_the_decoded_text(self):
        msgs, ids, text, final = self.c.generate(ids=[1], max_tokens=len(HELLO))
        self.assertEqual(ids, HELLO)
        self.assertEqual(text, HELLO_TEXT)
        self.assertEqual(final.usage.completion_tokens, len(HELLO))
        self.assertEqual(final.usage.prompt_tokens, 1)
        self.assertTrue(final.request_id)
        self.assertNotEqual(final.seed, 0)  # the router picks and reports a seed

    def test_stop_string_trims_and_reports(self):
        msgs, ids, text, final = self.c.generate(ids=[1], max_tokens=30, stop=["The e", "zzz"])
        self.assertEqual(text, "Hello world. ")
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_STOP)
        self.assertEqual(final.WhichOneof("matched_stop"), "stop_string")
        self.assertEqual(final.stop_string, "The e")
        # tokens up to " e", the one that completed the stop
        self.assertEqual(ids, HELLO[:N_THE_E])
        self.assertEqual(final.usage.completion_tokens, len(ids))
        # the router ended the stream: it still names the worker by its --name and reports the
        # prefill time the worker's first message gave
        self.assertEqual(final.served_by, "hello")
        self.assertEqual(final.timings.prefill_ms, 3.5)
        self.assertEqual(final.timings.queue_ms, 0.25)
        self.assertGreater(final.timings.total_ms, 0)
        # no message ever carried text that turned out to be part of the stop
        self.assertNotIn("The", "".join(m.text for m in msgs))

    def test_stop_string_prefix_is_released_when_it_does_not_match(self):
        _, ids, text, final = self.c.generate(ids=[1], max_tokens=len(HELLO), stop=["world!"])
        self.assertEqual(text, HELLO_TEXT)
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)

    def test_stop_token_reported(self):
        _, ids, _, final = self.c.generate(ids=[1], max_tokens=30, stop_ids=[HELLO[4]])
        self.assertEqual(ids, HELLO[:5])
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_STOP)
        self.assertEqual(final.stop_token_id, HELLO[4])

    def test_logprobs_get_text(self):
        msgs, ids, _, final = self.c.generate(ids=[1], max_tokens=3, logprobs=2)
        lps = [lp for m in msgs for lp in m.logprobs]
        self.assertEqual([lp.token_id for lp in lps], ids)
        self.assertEqual(len(lps[0].top), 2)
        self.assertEqual(lps[0].top[0].text, FIRST)

    def test_validation_names_the_field(self):
        cases = [
            (dict(text=""), "text"),
            (dict(), "prompt"),
            (dict(ids=[]), "token_ids"),
            (dict(ids=[1, -4]), "token_ids.ids[1]"),
            (dict(ids=[1, 5000]), "token_ids.ids[1]"),
            (dict(ids=[1], stop=["x"] * 17), "stop"),
            (dict(ids=[1], stop=["ok", ""]), "stop[1]"),
            (dict(ids=[1], logprobs=21), "logprobs"),
            (dict(ids=[1], temperature=-1.0), "sampling.temperature"),
            (dict(ids=[1], top_p=2.0), "sampling.top_p"),
            (dict(ids=[1], stop_ids=list(range(17))), "stopping.stop_token_ids"),
            (dict(chat=[("", "hi")]), "chat.messages[0].role"),
            (dict(ids=[1], request_id="x" * 200), "request_id"),
        ]
        for kw, field in cases:
            code, msg = code_of(lambda: self.c.generate(**kw))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, (kw, msg))
            self.assertTrue(msg.startswith(field), (field, msg))

    def test_chat_is_rendered_with_the_models_template(self):
        # the tiny model's tokenizer.chat_template is ChatML: the prompt the worker saw
        # (usage.prompt_tokens) is that rendering, tokenized
        _, ids, _, final = self.c.generate(chat=[("user", "Hi")], max_tokens=1)
        rc, out, err = h.run_cli(["tokenize", "--model", h.tiny_model(), "--text",
                                  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(final.usage.prompt_tokens, len(out.strip().strip("[]").split(",")))

    def test_deadline_propagates(self):
        code, _ = code_of(lambda: self.cs.generate(ids=[1], max_tokens=200, timeout=0.3))
        self.assertEqual(code, grpc.StatusCode.DEADLINE_EXCEEDED)
        h.wait_until(lambda: self.slow_direct.load().running == 0, 10,
                     "the worker to see the deadline")

    def test_cancel_propagates(self):
        it = self.cs.gen.Generate(h.request(ids=[1], max_tokens=500), timeout=60)
        got = 0
        for m in it:
            got += len(m.token_ids)
            if got >= 3:
                break
        self.assertEqual(self.slow_direct.load().running, 1)
        it.cancel()
        h.wait_until(lambda: self.slow_direct.load().running == 0, 10,
                     "the worker to see the cancel")

    def test_metrics(self):
        self.c.generate(ids=[1], max_tokens=2)
        m = self.r.wait_line(r"metrics on (http://\S+)")
        body = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        self.assertIn('deltaserve:request_success_total{finished_reason="length"}', body)
        self.assertIn("deltaserve:time_to_first_token_seconds_bucket", body)
        self.assertIn("deltaserve:router_healthy_workers 1", body)
        # counted just after the status is sent
        h.wait_until(lambda: h.metric(self.r, "deltaserve:prompt_tokens_total") >= 1.0, 10,
                     "the prompt counted")


class Discovery(unittest.TestCase):
    def test_workers_dns_and_prefix_affinity(self):
        a = h.start_fake_worker("a", ["--tokens", "1"])
        b = h.start_fake_worker("b", ["--tokens", "2"])
        # --workers-dns resolves localhost to the worker's loopback address
        port = a.addr.rsplit(":", 1)[1]
        r = h.Proc("router_dns", [h.binary(), "router", "--listen", "127.0.0.1:0",
                                  "--workers-dns", "localhost:" + port, "--poll-ms", "100"])
        r.wait_listening()
        h.wait_serving(r.addr, "deltaserve.v1.Generation")
        c = h.Client(r.addr)
        try:
            _, _, _, final = c.generate(ids=[3], max_tokens=1)
            self.assertEqual(final.served_by, "a")
        finally:
            c.close()
            r.stop()
        # prefix affinity: the same prompt prefix always lands on the same worker
        r = h.start_router([a, b], model=False, extra=["--routing", "prefix"], name="router_pfx")
        c = h.Client(r.addr)
        try:
            seen = {}
            for k in range(24):  # all 24 on one worker by chance: p = 2^-23
                prompt = [100 + k] * 40
                for rep in range(3):
                    _, _, _, final = c.generate(ids=prompt + [rep], max_tokens=1)
                    seen.setdefault(k, set()).add(final.served_by)
            for k, s in seen.items():
                self.assertEqual(len(s), 1, (k, s))
            self.assertEqual(set().union(*seen.values()), {"a", "b"})  # prefixes spread
            # ids-only router refuses text prompts and stop strings, naming --model
            code, msg = code_of(lambda: c.generate(text="hi"))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("--model", msg)
        finally:
            c.close()
            r.stop()
            a.stop()
            b.stop()


class PrefixHeads(unittest.TestCase):
    def test_request_goes_to_the_worker_holding_its_head(self):
        # a holds the prefixes P0..P3, b the prefixes Q0..Q3 (their GetLoad heads); with
        # rendezvous alone all 8 would land right by chance with p = 2^-8
        ps = [[200 + i] * 8 for i in range(4)]
        qs = [[300 + i] * 8 for i in range(4)]
        heads = lambda xs: [f for x in xs for f in ("--heads-of", ",".join(map(str, x)))]
        hello = ["--tokens", ",".join(map(str, HELLO))]
        a = h.start_fake_worker("pa", hello + ["--cached-tokens", "5"] + heads(ps))
        b = h.start_fake_worker("pb", hello + ["--cached-tokens", "7"] + heads(qs))
        # readiness follows a full poll: both workers' heads are known once it is SERVING
        r = h.start_router([a, b], extra=["--routing", "prefix", "--prefix-tokens", "8"],
                           name="router_heads")
        c = h.Client(r.addr)
        try:
            for name, cached, prefixes in (("pa", 5, ps), ("pb", 7, qs)):
                for x in prefixes:
                    for rep in range(2):
                        _, _, _, final = c.generate(ids=x + [rep, rep + 1], max_tokens=2)
                        self.assertEqual(final.served_by, name, (x, rep))
                        self.assertEqual(final.usage.cached_tokens, cached)
                        self.assertEqual(final.usage.prompt_tokens, 10)
            # a stop string ends the stream at the router: cached_tokens from the first message
            _, ids, text, final = c.generate(ids=qs[1] + [1], max_tokens=30, stop=["The e"])
            self.assertEqual(final.stop_string, "The e")
            self.assertEqual(final.served_by, "pb")  # the name, from the first message
            self.assertEqual(final.usage.cached_tokens, 7)
            self.assertEqual(final.usage.completion_tokens, N_THE_E)
        finally:
            c.close()
            r.stop()
            a.stop()
            b.stop()


class Drain(unittest.TestCase):
    def test_sigterm_finishes_in_flight_then_exits(self):
        w = h.start_fake_worker("drainw", ["--tokens", "4", "--token-ms", "20"])
        r = h.start_router([w], name="router_drain")
        c = h.Client(r.addr)
        try:
            it = c.gen.Generate(h.request(ids=[1], max_tokens=40), timeout=60)
            first = next(it)
            r.signal(signal.SIGTERM)
            r.wait_line("draining")
            # a new call is refused while the old one runs to its end
            code, msg = code_of(lambda: c.generate(ids=[1], max_tokens=1, timeout=10))
            self.assertEqual(code, grpc.StatusCode.UNAVAILABLE, msg)
            rest = list(it)
            ids = list(first.token_ids) + [t for m in rest for t in m.token_ids]
            self.assertEqual(len(ids), 40)
            self.assertEqual(rest[-1].finish_reason, pb.FINISH_REASON_LENGTH)
            self.assertEqual(r.wait(30), 0)
        finally:
            c.close()
            r.stop()
            w.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
