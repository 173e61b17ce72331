"""SIGTERM drains with real processes on the tiny reference model: a worker, and a router in
front of a worker, each finish the stream in flight (every token, then status OK), refuse new
work while draining, and exit 0."""
import os
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402

pb = h.pb
WORKER_FLAGS = ["--slots", "2", "--queue", "1", "--threads", "1"]


def err(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


class Drains(unittest.TestCase):
    def test_worker_sigterm_finishes_streams_then_exits(self):
        w = h.start_worker("drain_w", extra=WORKER_FLAGS)
        c = h.Client(w.addr)
        try:
            req = pb.WorkerGenerateRequest(prompt_token_ids=[1, 2])
            h.fill_common(req, max_tokens=300, ignore_eos=True)
            it = c.worker.Generate(req, timeout=120)
            first = next(it)
            w.signal(signal.SIGTERM)
            rest = list(it)
            n = len(first.token_ids) + sum(len(m.token_ids) for m in rest)
            self.assertEqual(n, 300)
            self.assertEqual(rest[-1].finish_reason, pb.FINISH_REASON_LENGTH)
            self.assertEqual(w.wait(60), 0)
        finally:
            c.close()
            w.stop()

    def test_router_sigterm_finishes_streams_then_exits(self):
        ws = [h.start_worker("rdrain_w", extra=WORKER_FLAGS)]
        r = h.start_router(ws, name="rdrain_router")
        c = h.Client(r.addr)
        try:
            it = c.gen.Generate(h.request(ids=[1, 2], max_tokens=300, ignore_eos=True),
                                timeout=120)
            first = next(it)
            r.signal(signal.SIGTERM)
            r.wait_line("draining")
            code, _ = err(lambda: c.generate(ids=[1], max_tokens=1, timeout=10))
            self.assertEqual(code, grpc.StatusCode.UNAVAILABLE)
            rest = list(it)
            n = len(first.token_ids) + sum(len(m.token_ids) for m in rest)
            self.assertEqual(n, 300)
            self.assertEqual(r.wait(60), 0)
        finally:
            c.close()
            r.stop()
            for w in ws:
                w.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
