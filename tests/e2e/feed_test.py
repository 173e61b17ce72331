"""Worker/Feed (worker/README.md "Feeds") against a real `deltaserve worker` on the tiny
reference model, through python3-grpcio:
  - a Generate call naming an open feed sends nothing on itself and ends OK; its messages come
    as the feed's items under its tag: the reference greedy tokens, the first item with the
    prompt's usage and served_by, the last with the finish reason and usage;
  - two calls at once share batches (one FeedBatch carries items of both), each with its own
    tokens, the same as the same request without a feed;
  - a request with logprobs, or naming a feed that is not open, is served on its call;
  - Feed errors: feed_id 0 (INVALID_ARGUMENT), an id already open (ALREADY_EXISTS);
  - the feed cancelled while a call rides on it: the call ends UNAVAILABLE and its slot frees.
The router opens a feed to its worker and streams through it (RouterOnFeeds); the router's
side (relays on feeds, the default) runs through every router test, and the scenarios of
service_test.py run with and without feeds."""
import json
import os
import queue
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402

pb = h.pb
with open(h.tiny_json()) as _f:
    REF = json.load(_f)


class Feed:
    """A Worker/Feed call read on a thread: its batches in self.q, its end in self.code."""

    def __init__(self, client, feed_id):
        self.call = client.worker.Feed(pb.FeedRequest(feed_id=feed_id), timeout=120)
        self.q = queue.Queue()
        self.code = None
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        try:
            for b in self.call:
                self.q.put(b)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code = e.code()
        self.q.put(None)

    def batch(self, timeout=30):
        return self.q.get(timeout=timeout)

    def until_final(self, tags, timeout=60):
        """Batches until every tag in tags had its final item: {tag: [items]}, and the batches."""
        got = {t: [] for t in tags}
        batches = []
        while not all(got[t] and got[t][-1].response.finish_reason for t in tags):
            b = self.batch(timeout)
            if b is None:
                raise AssertionError("the feed ended: %s" % self.code)
            batches.append(b)
            for it in b.items:
                got.setdefault(it.tag, []).append(it)
        return got, batches


def start_on_feed(c, ids, feed_id, tag, **kw):
    req = pb.WorkerGenerateRequest(prompt_token_ids=ids, feed_id=feed_id, feed_tag=tag)
    h.fill_common(req, **kw)
    return c.worker.Generate(req, timeout=120)


class FeedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = h.start_worker("feed_w", extra=["--slots", "4", "--threads", "1"])
        cls.c = h.Client(cls.w.addr)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.w.stop()

    def open(self, feed_id):
        f = Feed(self.c, feed_id)
        first = f.batch()
        self.assertIsNotNone(first, f.code)
        self.assertEqual(len(first.items), 0)  # registered
        self.addCleanup(f.call.cancel)
        return f

    def test_items_carry_the_calls_messages(self):
        f = self.open(101)
        p = REF["prompts"][0]
        n = len(p["greedy"])
        call = start_on_feed(self.c, p["ids"], 101, 7, max_tokens=n, ignore_eos=True)
        self.assertEqual(list(call), [])  # nothing on the call itself; it ends OK
        got, _ = f.until_final([7])
        items = got[7]
        self.assertEqual([t for it in items for t in it.response.token_ids], p["greedy"])
        first, last = items[0].response, items[-1].response
        self.assertEqual(first.usage.prompt_tokens, len(p["ids"]))
        self.assertEqual(first.served_by, "feed_w")
        self.assertEqual(last.finish_reason, pb.FINISH_REASON_LENGTH)
        self.assertEqual(last.usage.completion_tokens, n)
        self.assertTrue(all(not it.response.finish_reason for it in items[:-1]))

    def test_two_calls_share_batches(self):
        f = self.open(102)
        a, b = REF["prompts"][0]["ids"], REF["prompts"][1]["ids"]
        want = {}
        for tag, ids in ((1, a), (2, b)):
            _, w, _, _ = self.c.worker_generate(ids, max_tokens=160, ignore_eos=True)
            want[tag] = w
        # 160 tokens each, started back to back: they overlap on a busy machine too
        calls = [start_on_feed(self.c, ids, 102, tag, max_tokens=160, ignore_eos=True)
                 for tag, ids in ((1, a), (2, b))]
        results = [None, None]

        def drain(i):
            results[i] = list(calls[i])
        ts = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        got, batches = f.until_final([1, 2])
        for t in ts:
            t.join(60)
        self.assertEqual(results, [[], []])
        for tag in (1, 2):
            self.assertEqual([t for it in got[tag] for t in it.response.token_ids], want[tag])
        shared = [bt for bt in batches if {it.tag for it in bt.items} == {1, 2}]
        self.assertTrue(shared, "no batch carried both calls' items")

    def test_logprobs_or_an_unknown_feed_stay_on_the_call(self):
        f = self.open(103)
        p = REF["prompts"][0]
        msgs = list(start_on_feed(self.c, p["ids"], 103, 1, max_tokens=4, ignore_eos=True,
                                  logprobs=2))
        self.assertEqual([t for m in msgs for t in m.token_ids], p["greedy"][:4])
        self.assertEqual(len(msgs[0].logprobs), len(msgs[0].token_ids))
        msgs = list(start_on_feed(self.c, p["ids"], 999, 1, max_tokens=4, ignore_eos=True))
        self.assertEqual([t for m in msgs for t in m.token_ids], p["greedy"][:4])
        self.assertTrue(f.q.empty())  # nothing came on the open feed

    def test_bad_feeds(self):
        f = Feed(self.c, 0)
        self.assertIsNone(f.batch())
        self.assertEqual(f.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.open(104)
        g = Feed(self.c, 104)
        self.assertIsNone(g.batch())
        self.assertEqual(g.code, grpc.StatusCode.ALREADY_EXISTS)

    def test_cancelled_feed_ends_its_calls(self):
        f = self.open(105)
        call = start_on_feed(self.c, REF["prompts"][0]["ids"], 105, 3, max_tokens=4000,
                             ignore_eos=True)
        while True:  # some tokens came
            b = f.batch()
            self.assertIsNotNone(b, f.code)
            if any(it.tag == 3 for it in b.items):
                break
        f.call.cancel()
        with self.assertRaises(grpc.RpcError) as e:
            list(call)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, e.exception.details())
        self.assertIn("feed", e.exception.details())
        h.wait_until(lambda: self.c.load().running == 0 and self.c.load().waiting == 0,
                     what="the worker idle")


class RouterOnFeeds(unittest.TestCase):
    """A router opens a feed to its worker, and a stream through it is the reference."""

    def test_router_rides_the_feed(self):
        w = h.start_worker("feed_rw", extra=["--slots", "2", "--threads", "1"])
        r = h.start_router([w], name="feed_router",
                           extra=["--log-level", "debug", "--metrics-listen", "127.0.0.1:0"])
        c = h.Client(r.addr)
        try:
            r.wait_line("token feed open", timeout=30)
            p = REF["prompts"][1]
            _, ids, _, final = c.generate(ids=p["ids"], max_tokens=len(p["greedy"]),
                                          ignore_eos=True)
            self.assertEqual(ids, p["greedy"])
            self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
            self.assertEqual(final.served_by, "feed_rw")
            # every message of the stream came on the feed (the first batch, empty, too)
            batches = h.metric(r, "deltaserve:router_feed_batches_total")
            items = h.metric(r, "deltaserve:router_feed_items_total")
            self.assertGreaterEqual(items, 2)  # the first token's message, ..., the final one
            self.assertLessEqual(items, len(p["greedy"]) + 1)
            self.assertGreaterEqual(batches, 2)
        finally:
            c.close()
            r.stop()
            w.stop()


if __name__ == "__main__":
    unittest.main()
