"""The public API for clients in any language, through grpcio: Generation/GetModelInfo (the
workers' model, UNAVAILABLE naming why before any worker answered), Generation/Abort (mid-stream,
a request waiting for a slot, a worker that does not know the id, an unknown id), and a NUL byte
in any string field of a request refused with INVALID_ARGUMENT naming the field and offset (on
the router and on a worker), never cut. Real workers on the tiny reference model; the fake
worker where a worker must not know the id."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402

pb = h.pb
LONG = 4000  # tokens: a stream that outlives the test step (the tiny model, ctx 4096)
FLAGS = ["--slots", "1", "--queue", "4", "--threads", "1"]


def err(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def gguf_has_template(path):
    """Whether the GGUF holds tokenizer.chat_template, read with gguf-py (not our reader)."""
    import gguf
    r = gguf.GGUFReader(path)
    f = r.fields.get("tokenizer.chat_template")
    return f is not None and len(f.parts[f.data[0]]) > 0


class Api(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = h.start_worker("api_w", extra=FLAGS)
        cls.r = h.start_router([cls.w], name="api_router")
        cls.c = h.Client(cls.r.addr)
        cls.wc = h.Client(cls.w.addr)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.wc.close()
        cls.r.stop()
        cls.w.stop()

    def wait_idle(self):
        h.wait_until(lambda: (lambda l: l.running == 0 and l.waiting == 0)(self.wc.load()), 30,
                     "the worker idle")

    def start(self, rid, **kw):
        return self.c.gen.Generate(h.request(ids=[5, 6, 7], max_tokens=LONG, ignore_eos=True,
                                             request_id=rid, **kw), timeout=60)

    def abort(self, rid):
        return self.c.gen.Abort(pb.AbortRequest(request_id=rid), timeout=10).found

    # ---- GetModelInfo ----

    def test_model_info_is_the_workers(self):
        want = self.wc.worker.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        got = h.wait_until(self._info_or_none, 30, "the router's GetModelInfo")
        self.assertEqual(got, want)  # every field, the template facts included
        self.assertGreater(got.vocab_size, 0)
        self.assertGreater(got.max_context, 0)
        self.assertEqual(got.has_chat_template, gguf_has_template(h.tiny_model()))

    def _info_or_none(self):
        try:
            return self.c.gen.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return None

    def test_model_info_without_a_worker_is_unavailable(self):
        # a worker address nobody serves: the router never learns the model
        r = h.start_router(["127.0.0.1:9"], name="api_router_noworker", ready=False)
        c = h.Client(r.addr)
        try:
            code, msg = err(lambda: c.gen.GetModelInfo(pb.GetModelInfoRequest(), timeout=10))
            self.assertEqual(code, grpc.StatusCode.UNAVAILABLE, msg)
            self.assertIn("no worker has reported its model", msg)
        finally:
            c.close()
            r.stop()

    # ---- Abort ----

    def test_abort_mid_stream(self):
        it = self.start("api-abort-mid")
        got = 0
        for m in it:
            got += len(m.token_ids)
            if got >= 3:
                break
        self.assertTrue(self.abort("api-abort-mid"))
        rest = list(it)  # ends with status OK: no exception
        final = rest[-1]
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_CANCELLED)
        got += sum(len(m.token_ids) for m in rest)
        self.assertLess(got, LONG)
        self.assertEqual(final.usage.completion_tokens, got)
        self.assertEqual(final.request_id, "api-abort-mid")
        self.assertEqual(final.served_by, "api_w")  # the worker's own final message
        self.r.wait_line(r"abort api-abort-mid: found \(1 on workers, 1 ended by Worker/Abort\)")
        self.wait_idle()

    def test_abort_waiting_request(self):
        # one slot: the second request waits in the worker's queue until it is aborted
        first = self.start("api-abort-first")
        next(first)
        second = self.start("api-abort-second")
        h.wait_until(lambda: self.wc.load().waiting == 1, 30, "the second request waiting")
        self.assertTrue(self.abort("api-abort-second"))
        msgs = list(second)
        self.assertEqual(msgs[-1].finish_reason, pb.FINISH_REASON_CANCELLED)
        self.assertEqual(sum(len(m.token_ids) for m in msgs), 0)
        self.assertEqual(msgs[-1].usage.completion_tokens, 0)
        # the first one still runs, then goes the same way
        self.assertGreater(len(next(first).token_ids), 0)
        self.assertTrue(self.abort("api-abort-first"))
        self.assertEqual(list(first)[-1].finish_reason, pb.FINISH_REASON_CANCELLED)
        self.wait_idle()

    def test_abort_unknown_and_bad_ids(self):
        self.assertFalse(self.abort("api-no-such-request"))
        code, msg = err(lambda: self.abort(""))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("request_id", msg)
        code, msg = err(lambda: self.abort("x" * 129))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("request_id: 129 bytes", msg)
        # a finished request is no longer live
        _, ids, _, final = self.c.generate(ids=[1, 2], max_tokens=2, request_id="api-done")
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
        self.assertFalse(self.abort("api-done"))

    def test_abort_on_a_worker_that_does_not_know_the_id(self):
        # the fake worker answers Worker/Abort found=false: the router ends its worker call
        fw = h.start_fake_worker("api_fake", ["--token-ms", "20"])
        r = h.start_router([fw], name="api_router_fake")
        c = h.Client(r.addr)
        try:
            it = c.gen.Generate(h.request(ids=[1, 2], max_tokens=LONG, request_id="api-fake"),
                                timeout=60)
            first = next(it)
            self.assertTrue(c.gen.Abort(pb.AbortRequest(request_id="api-fake"), timeout=10).found)
            msgs = [first] + list(it)
            final = msgs[-1]
            self.assertEqual(final.finish_reason, pb.FINISH_REASON_CANCELLED)
            self.assertEqual(final.usage.completion_tokens,
                             sum(len(m.token_ids) for m in msgs))
            self.assertEqual(final.usage.prompt_tokens, 2)
            r.wait_line(r"abort api-fake: found \(1 on workers, 0 ended by Worker/Abort\)")
        finally:
            c.close()
            r.stop()
            fw.stop()

    # ---- NUL bytes ----

    def assert_nul_refused(self, stub_call, req, field, offset):
        code, msg = err(lambda: list(stub_call(req, timeout=10)))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, (field, msg))
        self.assertEqual(msg, "%s: contains a NUL byte at offset %d" % (field, offset))

    def test_nul_in_text_is_refused_not_cut(self):
        # docs/FUZZ.md finding 3: this was served as "Hello"
        self.assert_nul_refused(self.c.gen.Generate,
                                h.request(text="Hello\0 and a long tail", max_tokens=2),
                                "text", 5)
        _, _, _, final = self.c.generate(text="Hello and a long tail", max_tokens=2)
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)

    def test_nul_in_every_string_field(self):
        def chat_req(edit):
            req = h.request(chat=[("system", "Be brief."), ("user", "hi")], max_tokens=2)
            a = req.chat.messages.add(role="assistant", content="ok")
            a.tool_calls.add(id="call_1", name="f", arguments="{}")
            req.chat.messages.add(role="tool", content="42", tool_call_id="call_1", name="f")
            req.chat.tools.add(name="f", description="d", parameters="{}")
            edit(req)
            return req

        cases = [
            ("request_id", lambda q: setattr(q, "request_id", "a\0b"), 1),
            ("stop[1]", lambda q: q.stop.extend(["zz", "zz\0"]), 2),
            ("chat.messages[1].role", lambda q: setattr(q.chat.messages[1], "role", "us\0er"), 2),
            ("chat.messages[0].content",
             lambda q: setattr(q.chat.messages[0], "content", "\0"), 0),
            ("chat.messages[2].reasoning_content",
             lambda q: setattr(q.chat.messages[2], "reasoning_content", "hmm\0"), 3),
            ("chat.messages[2].tool_calls[0].arguments",
             lambda q: setattr(q.chat.messages[2].tool_calls[0], "arguments", '{"a":"\0"}'), 6),
            ("chat.messages[2].tool_calls[0].name",
             lambda q: setattr(q.chat.messages[2].tool_calls[0], "name", "f\0"), 1),
            ("chat.messages[2].tool_calls[0].id",
             lambda q: setattr(q.chat.messages[2].tool_calls[0], "id", "c\0"), 1),
            ("chat.messages[3].tool_call_id",
             lambda q: setattr(q.chat.messages[3], "tool_call_id", "call\0_1"), 4),
            ("chat.messages[3].name", lambda q: setattr(q.chat.messages[3], "name", "\0f"), 0),
            ("chat.tools[0].description",
             lambda q: setattr(q.chat.tools[0], "description", "d\0"), 1),
            ("chat.tools[0].parameters",
             lambda q: setattr(q.chat.tools[0], "parameters", "{}\0"), 2),
        ]
        for field, edit, off in cases:
            with self.subTest(field=field):
                self.assert_nul_refused(self.c.gen.Generate, chat_req(edit), field, off)
        # the same conversation without a NUL is not refused for its strings
        code, msg = err(lambda: list(self.c.gen.Generate(chat_req(lambda q: None), timeout=30)))
        self.assertNotIn("NUL", msg)
        # Abort's id, on the router
        code, msg = err(lambda: self.abort("ab\0c"))
        self.assertEqual((code, msg), (grpc.StatusCode.INVALID_ARGUMENT,
                                       "request_id: contains a NUL byte at offset 2"))

    def test_nul_on_the_worker(self):
        req = pb.WorkerGenerateRequest(prompt_token_ids=[1, 2], request_id="w\0x")
        self.assert_nul_refused(self.wc.worker.Generate, req, "request_id", 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
