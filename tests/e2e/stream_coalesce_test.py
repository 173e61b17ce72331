"""The worker's coalesced streaming (issue 27): tokens that pile up while a stream's previous
message is still on its way travel together in the next GenerateResponse.

A client (a channel with a small fixed HTTP/2 window) that stops reading after the first
message of a long stream with 20 logprobs a token (~230 bytes each) fills its window, so the worker's message in flight cannot leave; the
engine goes on generating to the end meanwhile (waited for through GetLoad, not by sleeping).
When the client reads again, messages must carry several tokens each (at most 64), and the
stream must be exactly the one a promptly reading client gets: the same token ids and logprobs
in the same order, the first message with the prompt's usage, the final usage counting every
token. A client that cancels while its stream is stuck so gets its slot back, and the worker
still serves afterwards."""
import os
import sys
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

pb = h.pb
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
MAX_MSG_TOKENS = 64  # WS_MSG_TOKENS in worker/service.c


def request(n, logprobs=20):
    req = pb.WorkerGenerateRequest(prompt_token_ids=PROMPT)
    h.fill_common(req, max_tokens=n, ignore_eos=True, logprobs=logprobs)
    return req


def flat_logprobs(msgs):
    return [(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top])
            for m in msgs for lp in m.logprobs]


class Coalesce(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = h.start_worker("coalesce_w", extra=["--slots", "2", "--threads", "1"])
        cls.c = h.Client(cls.w.addr)
        # a client with a small fixed window (no BDP growth): the stream's window fills after
        # a few dozen tokens it does not read
        cls.slow_ch = grpc.insecure_channel(cls.w.addr, options=[
            ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16384)])
        cls.slow = h.pb_grpc.WorkerStub(cls.slow_ch)
        info = cls.c.worker.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        cls.n = min(2000, info.max_context - len(PROMPT) - 1)

    @classmethod
    def tearDownClass(cls):
        cls.slow_ch.close()
        cls.c.close()
        cls.w.stop()

    def idle(self):
        h.wait_until(lambda: (lambda l: l.running == 0 and l.waiting == 0 and
                              l.free_slots == l.total_slots)(self.c.load()), 60,
                     "the worker idle, every slot free")

    def test_slow_reader_gets_several_tokens_per_message(self):
        ref, ref_ids, _, ref_final = h.collect(self.c.worker.Generate(request(self.n), timeout=120))
        self.assertEqual(len(ref_ids), self.n)
        self.idle()

        it = self.slow.Generate(request(self.n), timeout=120)
        first = next(it)
        self.idle()  # generated to the end while the client read nothing
        msgs = [first] + list(it)
        ids = [t for m in msgs for t in m.token_ids]
        final = msgs[-1]

        self.assertEqual(ids, ref_ids, "the same tokens in the same order")
        self.assertEqual(flat_logprobs(msgs), flat_logprobs(ref), "the same logprobs")
        for m in msgs:
            self.assertEqual(len(m.logprobs), len(m.token_ids))
            self.assertLessEqual(len(m.token_ids), MAX_MSG_TOKENS)
        sizes = [len(m.token_ids) for m in msgs]
        self.assertGreater(max(sizes), 1, "no message carried more than one token (%d messages)"
                           % len(msgs))
        self.assertLess(len(msgs), self.n // 2,
                        "%d messages for %d tokens: not coalesced" % (len(msgs), self.n))
        print("slow reader: %d tokens in %d messages (largest %d tokens); prompt reader: %d "
              "messages" % (self.n, len(msgs), max(sizes), len(ref)))

        self.assertEqual(first.usage.prompt_tokens, len(PROMPT))
        self.assertTrue(first.served_by)
        self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
        self.assertEqual(final.usage.completion_tokens, self.n)
        self.assertEqual(final.usage.prompt_tokens, len(PROMPT))
        self.assertEqual(final.usage.completion_tokens, ref_final.usage.completion_tokens)
        self.assertEqual(final.served_by, ref_final.served_by)
        for m in msgs[:-1]:
            self.assertEqual(m.finish_reason, pb.FINISH_REASON_UNSPECIFIED)

    def test_cancel_while_stuck_frees_and_serves_on(self):
        it = self.slow.Generate(request(self.n), timeout=120)
        next(it)
        self.idle()  # every token generated; the stream waits for the client
        it.cancel()
        with self.assertRaises(grpc.RpcError) as cm:
            list(it)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.CANCELLED)
        self.idle()
        _, ids, _, final = self.c.worker_generate(PROMPT, max_tokens=5, ignore_eos=True)
        self.assertEqual(len(ids), 5)
        self.assertEqual(final.usage.completion_tokens, 5)


if __name__ == "__main__":
    unittest.main()
