"""10,000 streams through a router and two workers, each cancelled at a random point (before
its first token, after k tokens, or not at all), from 16 client threads. Afterwards every
worker's GetLoad reports every slot free and nothing running or waiting, and the workers'
RSS has not grown beyond a small allowance over a warmed-up baseline.
Prints the numbers (RSS before/after, wall time) for docs/BENCH.md.
Env: DS_STORM_STREAMS (default 10000), DS_STORM_THREADS (16)."""
import os
import random
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402

N = int(os.environ.get("DS_STORM_STREAMS", "10000"))
THREADS = int(os.environ.get("DS_STORM_THREADS", "16"))
WARMUP = 500
MAX_TOKENS = 48
RSS_ALLOWANCE_KB = 8 * 1024  # allocator noise; a leak of even 1 KiB per stream is 10 MiB


def storm(addr, n, seed):
    """Runs n streams from THREADS threads; returns counts of how they ended."""
    counts = {"finished": 0, "cancelled_early": 0, "cancelled_mid": 0, "error": 0}
    errors = []
    lock = threading.Lock()
    next_i = [0]

    def run(tid):
        rng = random.Random(seed * 1000 + tid)
        ch = grpc.insecure_channel(addr)
        stub = h.pb_grpc.GenerationStub(ch)
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= n:
                break
            cut = rng.randint(-1, MAX_TOKENS + 4)  # -1: before any token; > MAX: never
            req = h.request(ids=[1 + i % 500, 2, 3], max_tokens=MAX_TOKENS, ignore_eos=True)
            it = stub.Generate(req, timeout=60)
            kind = "finished"
            try:
                if cut < 0:
                    it.cancel()
                    kind = "cancelled_early"
                else:
                    got = 0
                    for m in it:
                        got += len(m.token_ids)
                        if got >= cut:
                            it.cancel()
                            kind = "cancelled_mid"
                            break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED:
                    kind = "error"
                    with lock:
                        errors.append((e.code(), e.details()))
            with lock:
                counts[kind] += 1
        ch.close()
    ts = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return counts, errors


class CancelStorm(unittest.TestCase):
    def test_storm_leaves_no_slot_or_memory_behind(self):
        ws = [h.start_worker("storm_w%d" % i, extra=["--slots", "8", "--queue", "64",
                                                      "--threads", "1"]) for i in range(2)]
        r = h.start_router(ws, name="storm_router", extra=["--log-level", "warn"])
        wc = [h.Client(w.addr) for w in ws]
        try:
            def idle():
                return all(l.running == 0 and l.waiting == 0 and l.free_slots == l.total_slots
                           for l in (c.load() for c in wc))
            counts, errors = storm(r.addr, WARMUP, 1)
            self.assertEqual(errors, [])
            h.wait_until(idle, 60, "idle workers after the warm-up")
            rss0 = [w.rss_kb() for w in ws] + [r.rss_kb()]
            t0 = time.monotonic()
            counts, errors = storm(r.addr, N, 2)
            wall = time.monotonic() - t0
            self.assertEqual(errors, [], errors[:5])
            self.assertEqual(sum(counts.values()), N)
            self.assertGreater(counts["cancelled_early"], N // 100)
            self.assertGreater(counts["cancelled_mid"], N // 2)
            h.wait_until(idle, 60, "every slot free after the storm")
            loads = [c.load() for c in wc]
            rss1 = [w.rss_kb() for w in ws] + [r.rss_kb()]
            print("\nSTORM streams=%d threads=%d wall_s=%.1f streams_per_s=%.0f counts=%s" % (
                N, THREADS, wall, N / wall, counts))
            for name, a, b in zip(["worker0", "worker1", "router"], rss0, rss1):
                print("STORM rss_kb %s before=%d after=%d delta=%+d" % (name, a, b, b - a))
            for l in loads:
                print("STORM load running=%d waiting=%d free_slots=%d/%d" % (
                    l.running, l.waiting, l.free_slots, l.total_slots))
            for a, b in zip(rss0[:2], rss1[:2]):
                self.assertLess(b - a, RSS_ALLOWANCE_KB, "worker RSS grew")
        finally:
            for c in wc:
                c.close()
            r.stop()
            for w in ws:
                w.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
