"""Overload: a router and two CPU workers on the tiny reference model, driven at about twice
their capacity (CLIENTS concurrent streams against 2 x (slots + queue)) for DS_OVERLOAD_SECONDS
(default 60) by streaming clients on threads, each call with a DEADLINE_S deadline. Checks:
  - every call ends in time (its deadline + SLACK_S of wall time, measured by the client)
    with one of: the whole stream (max_tokens tokens, finish LENGTH), RESOURCE_EXHAUSTED or
    UNAVAILABLE; no other code (DEADLINE_EXCEEDED included: a call stuck in a queue is a
    failure), and no client thread is still running after the storm;
  - the load was real overload: some calls completed and some were refused;
  - every process is alive afterwards, the workers drain to idle (GetLoad), and a normal
    request then streams the reference greedy tokens.
Load is bounded: CLIENTS threads, one call each at a time, and a refused client waits
BACKOFF_S before its next call (without it the refusals alone would spin both cores).
Env: DS_OVERLOAD_SECONDS, DS_OVERLOAD_DEADLINE_S (to see the test fail: 0.05)."""
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402

pb = h.pb
SLOTS, QUEUE, N_WORKERS = 2, 2, 2
CAPACITY = N_WORKERS * (SLOTS + QUEUE)
CLIENTS = 2 * CAPACITY
SECONDS = float(os.environ.get("DS_OVERLOAD_SECONDS", "60"))
DEADLINE_S = float(os.environ.get("DS_OVERLOAD_DEADLINE_S", "10"))
SLACK_S = 2.0
MAX_TOKENS = (8, 48)  # per call, cycled through: short and long streams mixed
BACKOFF_S = 0.02
ALLOWED = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


def tiny_json():
    """The reference cases of h.tiny_model() (the harness says which file, where it can)."""
    f = getattr(h, "tiny_json", None)
    return f() if f else os.path.join(h.reference_dir(), "tiny-r2-tied.json")


def storm(addr, seconds):
    """Runs CLIENTS threads for `seconds`; returns (outcomes, bad, n_threads_alive) where
    outcomes counts "ok" and each allowed code, and bad lists every call that broke a rule."""
    lock = threading.Lock()
    outcomes = {"ok": 0, "tokens": 0, "max_ok_s": 0.0}
    bad = []
    stop_at = time.monotonic() + seconds

    def run(tid):
        ch = grpc.insecure_channel(addr)
        stub = h.pb_grpc.GenerationStub(ch)
        k = 0
        while time.monotonic() < stop_at:
            n = MAX_TOKENS[k % len(MAX_TOKENS)]
            k += 1
            req = h.request(ids=[1 + (tid * 31 + k) % 500, 2, 3], max_tokens=n, ignore_eos=True)
            t0 = time.monotonic()
            got, final, code, details = 0, None, grpc.StatusCode.OK, ""
            try:
                for m in stub.Generate(req, timeout=DEADLINE_S):
                    got += len(m.token_ids)
                    if m.finish_reason:
                        final = m
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
            took = time.monotonic() - t0
            why = None
            if took > DEADLINE_S + SLACK_S:
                why = "took %.2f s, deadline %.2f s" % (took, DEADLINE_S)
            elif code == grpc.StatusCode.OK:
                if final is None or got != n or final.finish_reason != pb.FINISH_REASON_LENGTH:
                    why = "OK with %d of %d tokens, final %r" % (got, n, final)
            elif code not in ALLOWED:
                why = "code %s after %d tokens, %.2f s: %s" % (code, got, took, details)
            elif got:
                why = "%s after %d tokens (refusals come before the first token)" % (code, got)
            with lock:
                if why:
                    bad.append((tid, why))
                elif code == grpc.StatusCode.OK:
                    outcomes["ok"] += 1
                    outcomes["tokens"] += got
                    outcomes["max_ok_s"] = round(max(outcomes["max_ok_s"], took), 3)
                else:
                    outcomes[code.name] = outcomes.get(code.name, 0) + 1
            if code != grpc.StatusCode.OK:
                time.sleep(BACKOFF_S)  # pacing the load, not waiting for a condition
        ch.close()

    ts = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(CLIENTS)]
    for t in ts:
        t.start()
    end = stop_at + DEADLINE_S + SLACK_S  # the last calls start before stop_at
    for t in ts:
        t.join(max(0.0, end - time.monotonic()))
    return outcomes, bad, sum(t.is_alive() for t in ts)


class Overload(unittest.TestCase):
    def test_twice_the_capacity_for_a_minute(self):
        flags = ["--slots", str(SLOTS), "--queue", str(QUEUE), "--threads", "1"]
        ws = [h.start_worker("overload_w%d" % i, extra=flags) for i in range(N_WORKERS)]
        r = h.start_router(ws, name="overload_router", extra=["--log-level", "warn"])
        c = h.Client(r.addr)
        wc = [h.Client(w.addr) for w in ws]
        try:
            t0 = time.monotonic()
            outcomes, bad, alive = storm(r.addr, SECONDS)
            wall = time.monotonic() - t0
            print("\nOVERLOAD clients=%d capacity=%d seconds=%.0f wall_s=%.1f deadline_s=%.2f "
                  "outcomes=%s bad=%d" % (CLIENTS, CAPACITY, SECONDS, wall, DEADLINE_S, outcomes,
                                          len(bad)))
            self.assertEqual(alive, 0, "client threads still in a call after deadline + slack")
            self.assertEqual(len(bad), 0, "%d calls broke a rule; the first: %s" % (
                len(bad), bad[:5]))
            self.assertGreater(outcomes["ok"], 0, outcomes)
            refused = sum(v for k, v in outcomes.items() if k not in ("ok", "tokens", "max_ok_s"))
            self.assertGreater(refused, 0, "never overloaded: %r" % (outcomes,))

            for p in ws + [r]:
                self.assertIsNone(p.p.poll(), "%s exited:\n%s" % (p.name, p.tail()))
            h.wait_until(lambda: all(l.running == 0 and l.waiting == 0 and
                                     l.free_slots == l.total_slots
                                     for l in (x.load() for x in wc)), 30,
                         "every worker slot free after the storm")

            with open(tiny_json()) as f:
                ref = json.load(f)["prompts"][0]
            msgs, ids, _, final = c.generate(ids=ref["ids"], max_tokens=len(ref["greedy"]),
                                             ignore_eos=True, timeout=30)
            self.assertEqual(ids, ref["greedy"])
            self.assertGreater(len(msgs), 1, "streamed, not one message")
            self.assertEqual(final.finish_reason, pb.FINISH_REASON_LENGTH)
        finally:
            c.close()
            for x in wc:
                x.close()
            r.stop()
            for w in ws:
                w.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
