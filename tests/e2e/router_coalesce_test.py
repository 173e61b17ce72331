"""The router's coalesced streaming to the client (issue 27): what a worker sends while the
router's previous message to a client is still on its way travels together in the next
GenerateResponse.

A client (a channel with a small fixed HTTP/2 window) that stops reading after the first
message of a long stream with 20 logprobs a token fills its window, so the router's message in
flight cannot leave; the worker generates to the end meanwhile and the router gathers what it
sends (waited for through the router's log line of the request, not by sleeping). When the
client reads again, the stream must have far fewer messages than tokens, and be exactly what a
promptly reading client gets: the same ids, text, logprobs (with each alternative's text) and
final usage; with a stop string that matches late, the same cut and finish. A client that
cancels while its stream is stuck so ends its request, and the router still serves afterwards.
A router with --stream-interval 4 sends the first token at once, then messages of at least 4
tokens (the final one whatever is left), the same ids, text and logprobs as the plain router."""
import os
import sys
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

pb = h.pb
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
N = 600


def flat_logprobs(msgs):
    return [(lp.token_id, lp.logprob, [(t.token_id, t.logprob, t.text) for t in lp.top])
            for m in msgs for lp in m.logprobs]


class RouterCoalesce(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = h.start_worker("rcoalesce_w", extra=["--slots", "2", "--threads", "1"])
        cls.r = h.start_router([cls.w], name="rcoalesce_router")
        cls.c = h.Client(cls.r.addr)
        cls.wc = h.Client(cls.w.addr)
        # a client with a small fixed window (no BDP growth): the stream's window fills after
        # a few dozen tokens it does not read
        cls.slow_ch = grpc.insecure_channel(cls.r.addr, options=[
            ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16384),
            ("grpc.max_receive_message_length", 64 << 20)])
        cls.slow = h.pb_grpc.GenerationStub(cls.slow_ch)
        cls.seq = 0

    @classmethod
    def tearDownClass(cls):
        cls.slow_ch.close()
        cls.c.close()
        cls.wc.close()
        cls.r.stop()
        cls.w.stop()

    def rid(self):
        RouterCoalesce.seq += 1
        return "rcoalesce-%d" % RouterCoalesce.seq

    def slow_stream(self, stop=()):
        """The stream as a reader that stops after the first message and reads on once the
        router logged the request's end."""
        rid = self.rid()
        req = h.request(ids=PROMPT, stop=stop, max_tokens=N, ignore_eos=True, logprobs=20,
                        request_id=rid)
        it = self.slow.Generate(req, timeout=120)
        first = next(it)
        self.r.wait_line(r"request %s: OK" % rid, timeout=120)
        return [first] + list(it)

    def check_same(self, msgs, ref):
        ids = [t for m in msgs for t in m.token_ids]
        ref_ids = [t for m in ref for t in m.token_ids]
        self.assertEqual(ids, ref_ids, "the same tokens in the same order")
        self.assertEqual("".join(m.text for m in msgs), "".join(m.text for m in ref))
        self.assertEqual(flat_logprobs(msgs), flat_logprobs(ref), "the same logprobs")
        for m in msgs:
            self.assertEqual(len(m.logprobs), len(m.token_ids))
        final, ref_final = msgs[-1], ref[-1]
        self.assertEqual(final.finish_reason, ref_final.finish_reason)
        self.assertEqual(final.stop_string, ref_final.stop_string)
        self.assertEqual(final.usage.completion_tokens, ref_final.usage.completion_tokens)
        self.assertEqual(final.usage.completion_tokens, len(ids))
        self.assertEqual(final.usage.prompt_tokens, len(PROMPT))
        for m in msgs[:-1]:
            self.assertEqual(m.finish_reason, pb.FINISH_REASON_UNSPECIFIED)
        sizes = [len(m.token_ids) for m in msgs]
        self.assertGreater(max(sizes), 1, "no message carried more than one token (%d messages)"
                           % len(msgs))
        self.assertLess(len(msgs), len(ids) // 2,
                        "%d messages for %d tokens: not coalesced" % (len(msgs), len(ids)))
        print("slow reader: %d tokens in %d messages (largest %d tokens); prompt reader: %d "
              "messages" % (len(ids), len(msgs), max(sizes), len(ref)))

    def test_slow_reader_gets_several_tokens_per_message(self):
        ref, ref_ids, _, _ = self.c.generate(ids=PROMPT, max_tokens=N, ignore_eos=True,
                                             logprobs=20)
        self.assertEqual(len(ref_ids), N)
        self.check_same(self.slow_stream(), ref)

    def test_stop_string_across_coalesced_messages(self):
        _, _, text, _ = self.c.generate(ids=PROMPT, max_tokens=N, ignore_eos=True)
        # a stop string first seen late in the output
        stop = None
        for at in range(len(text) * 3 // 4, len(text) - 8):
            cand = text[at:at + 6]
            if text.find(cand) == at and cand.strip():
                stop = cand
                break
        self.assertIsNotNone(stop, "no late stop string in %r" % text[-200:])
        ref, _, ref_text, ref_final = self.c.generate(ids=PROMPT, max_tokens=N, ignore_eos=True,
                                                      logprobs=20, stop=[stop])
        self.assertEqual(ref_final.finish_reason, pb.FINISH_REASON_STOP)
        self.assertEqual(ref_text, text[:text.find(stop)])
        self.check_same(self.slow_stream(stop=[stop]), ref)

    def test_cancel_while_stuck_ends_and_serves_on(self):
        rid = self.rid()
        req = h.request(ids=PROMPT, max_tokens=N, ignore_eos=True, logprobs=20, request_id=rid)
        it = self.slow.Generate(req, timeout=120)
        next(it)
        it.cancel()
        with self.assertRaises(grpc.RpcError) as cm:
            list(it)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.CANCELLED)
        self.r.wait_line(r"request %s: CANCELLED" % rid, timeout=60)
        h.wait_until(lambda: (lambda l: l.running == 0 and l.free_slots == l.total_slots)(
            self.wc.load()), 60, "the worker idle, every slot free")
        _, ids, _, final = self.c.generate(ids=PROMPT, max_tokens=5, ignore_eos=True)
        self.assertEqual(len(ids), 5)
        self.assertEqual(final.usage.completion_tokens, 5)


class StreamInterval(unittest.TestCase):
    def test_interval_gathers_tokens(self):
        w = h.start_worker("rinterval_w", extra=["--slots", "2", "--threads", "1"])
        plain = h.start_router([w], name="rinterval_plain")
        r4 = h.start_router([w], name="rinterval_router", extra=["--stream-interval", "4"])
        c, c4 = h.Client(plain.addr), h.Client(r4.addr)
        try:
            for stop in ((), ("zzzz-never",)):
                ref, ref_ids, ref_text, _ = c.generate(ids=PROMPT, max_tokens=61, ignore_eos=True,
                                                       logprobs=2, stop=stop)
                msgs, ids, text, final = c4.generate(ids=PROMPT, max_tokens=61, ignore_eos=True,
                                                     logprobs=2, stop=stop)
                self.assertEqual(ids, ref_ids)
                self.assertEqual(text, ref_text)
                self.assertEqual(flat_logprobs(msgs), flat_logprobs(ref))
                sizes = [len(m.token_ids) for m in msgs]
                self.assertGreaterEqual(sizes[0], 1, sizes)
                self.assertLessEqual(sizes[0], 2, "the first token waited: %s" % sizes)
                for n in sizes[1:-1]:
                    self.assertGreaterEqual(n, 4, "a message of fewer than 4 tokens: %s" % sizes)
                self.assertEqual(final.usage.completion_tokens, 61)
                # (not against the plain router's count: a slow reader coalesces it too)
                self.assertGreaterEqual(max(sizes), 4, sizes)
                self.assertLessEqual(len(msgs), 2 + (61 - 1 + 3) // 4, sizes)
                print("--stream-interval 4: %d tokens in %d messages (plain router: %d)"
                      % (len(ids), len(msgs), len(ref)))
        finally:
            c.close()
            c4.close()
            r4.stop()
            plain.stop()
            w.stop()

    def test_interval_out_of_range_refused(self):
        for v in ("0", "257", "x"):
            rc, _, err = h.run_cli(["router", "--listen", "127.0.0.1:0", "--workers",
                                    "127.0.0.1:1", "--stream-interval", v])
            self.assertEqual(rc, 2, err)
            self.assertIn("stream-interval", err)


if __name__ == "__main__":
    unittest.main()
