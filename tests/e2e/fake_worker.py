"""A scriptable stand-in for `deltaserve worker`, for router tests that need failures on cue
(die mid-stream, refuse with UNAVAILABLE or RESOURCE_EXHAUSTED) and exact timing control.

Serves deltaserve.v1.Worker (Generate, Abort, GetLoad, GetModelInfo) and grpc.health.v1
Check. Generation is deterministic: the tokens are --tokens cycled (default: the prompt ids
cycled), one every --token-ms, up to max_new_tokens (default 16); stop_token_ids end it. A
message carries one token, or with --per-message K1,K2,... K1 tokens, then K2, ... (cycled), as
a worker that sends the tokens of one step together.
A prefix cache is played by --cached-tokens N (usage.cached_tokens = min(N, prompt - 1), on the
first token's message and the final one, as the worker sends it) and --heads-of IDS (repeatable:
GetLoad lists the hash of the first GetLoadRequest.prefix_tokens of these ids among its
prefix_heads, as a worker whose cache holds that prefix). The first token's message also carries
served_by (--name) and timings with queue_ms FIRST_QUEUE_MS and prefill_ms FIRST_PREFILL_MS, as
the worker sends them.
Prints "listening on 127.0.0.1:PORT" on stderr once bound (port 0 picks one)."""
import argparse
import os
import sys
import threading
import time
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import dsproto  # noqa: E402

import grpc  # noqa: E402

pb, pb_grpc, hpb, hpb_grpc = dsproto.load()

M64 = (1 << 64) - 1
FIRST_QUEUE_MS, FIRST_PREFILL_MS = 0.25, 3.5  # exact in float32


def splitmix64_tokens(ids):
    """common/splitmix64.h's splitmix64_tokens: the router's prefix hash."""
    h = 0x9e3779b97f4a7c15
    for t in ids:
        z = h ^ (t & 0xffffffff)
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
        h = z ^ (z >> 31)
    return h


class Worker(pb_grpc.WorkerServicer):
    def __init__(self, a):
        self.a = a
        self.lock = threading.Lock()
        self.running = 0
        self.served = 0
        self.tokens_sent = 0
        self.heads = [[int(x) for x in h.split(",")] for h in a.heads_of]

    def Generate(self, req, ctx):
        a = self.a
        if a.mode == "unavailable":
            ctx.abort(grpc.StatusCode.UNAVAILABLE, "fake worker: unavailable")
        if a.mode == "exhausted":
            ctx.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "fake worker: queue full")
        with self.lock:
            self.served += 1
            self.running += 1
        try:
            t0 = time.time()
            ids = list(req.prompt_token_ids)
            if not ids:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt_token_ids: empty")
            src = [int(x) for x in a.tokens.split(",")] if a.tokens else ids
            n = req.stopping.max_new_tokens or 16
            stops = set(req.stopping.stop_token_ids)
            out = []
            cached = max(0, min(a.cached_tokens, len(ids) - 1))
            sizes = [int(x) for x in a.per_message.split(",")] if a.per_message else [1]
            m, n_msgs = None, 0
            for i in range(n):
                if a.token_ms:
                    time.sleep(a.token_ms / 1000.0)
                if not ctx.is_active():
                    return
                t = src[i % len(src)]
                out.append(t)
                with self.lock:
                    self.tokens_sent += 1
                    total = self.tokens_sent
                if a.die_after and total >= a.die_after:
                    os._exit(3)  # a crash mid-stream: no status, connection reset
                if m is None:
                    m = pb.GenerateResponse()
                m.token_ids.append(t)
                if req.logprobs:
                    m.logprobs.append(pb.TokenLogprob(
                        token_id=t, logprob=-0.5,
                        top=[pb.TopLogprob(token_id=(t + j) % a.vocab, logprob=-0.5 - j)
                             for j in range(req.logprobs)]))
                if n_msgs == 0 and len(m.token_ids) == 1:  # the first message: usage, timings
                    m.usage.prompt_tokens = len(ids)
                    m.usage.cached_tokens = cached
                    m.timings.queue_ms = FIRST_QUEUE_MS
                    m.timings.prefill_ms = FIRST_PREFILL_MS
                    m.timings.ttft_ms = (time.time() - t0) * 1e3
                    m.served_by = a.name
                last = i == n - 1 or t in stops
                if last:
                    m.finish_reason = pb.FINISH_REASON_STOP if t in stops else pb.FINISH_REASON_LENGTH
                    if t in stops:
                        m.stop_token_id = t
                    m.usage.prompt_tokens = len(ids)
                    m.usage.completion_tokens = len(out)
                    m.usage.cached_tokens = cached
                    m.timings.ttft_ms = 1.0
                    m.timings.total_ms = (time.time() - t0) * 1e3
                    m.request_id = req.request_id
                    m.seed = req.sampling.seed
                    m.served_by = a.name
                if last or len(m.token_ids) == sizes[n_msgs % len(sizes)]:
                    yield m
                    m, n_msgs = None, n_msgs + 1
                if last:
                    return
        finally:
            with self.lock:
                self.running -= 1

    def GetLoad(self, req, ctx):
        heads = []
        if req.prefix_tokens:
            heads = [splitmix64_tokens(x[:req.prefix_tokens]) for x in self.heads]
        with self.lock:
            return pb.Load(running=self.running, free_slots=max(0, self.a.slots - self.running),
                           total_slots=self.a.slots, queue_capacity=0,
                           prefix_cache=bool(self.heads or self.a.cached_tokens),
                           prefix_snapshots=len(self.heads), prefix_heads=heads)

    def GetModelInfo(self, req, ctx):
        return pb.ModelInfo(architecture="fake", vocab_size=self.a.vocab, max_context=4096)

    def Abort(self, req, ctx):
        return pb.AbortResponse(found=False)


class Health(hpb_grpc.HealthServicer):
    def Check(self, req, ctx):
        if req.service in ("", "deltaserve.v1.Worker"):
            return hpb.HealthCheckResponse(status=hpb.HealthCheckResponse.SERVING)
        ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown service")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--name", default="fake")
    p.add_argument("--tokens", default="")
    p.add_argument("--token-ms", type=float, default=0)
    p.add_argument("--vocab", type=int, default=1029)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--mode", default="ok", choices=["ok", "unavailable", "exhausted"])
    p.add_argument("--die-after", type=int, default=0, help="exit after this many tokens in all")
    p.add_argument("--per-message", default="",
                   help="tokens per message K1,K2,... cycled (default: 1)")
    p.add_argument("--cached-tokens", type=int, default=0,
                   help="usage.cached_tokens of every request (at most its prompt - 1)")
    p.add_argument("--heads-of", action="append", default=[],
                   help="ids A,B,...: GetLoad lists the head of this prefix (repeatable)")
    a = p.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=a.slots + 8))
    pb_grpc.add_WorkerServicer_to_server(Worker(a), server)
    hpb_grpc.add_HealthServicer_to_server(Health(), server)
    port = server.add_insecure_port(a.listen)
    server.start()
    print("listening on 127.0.0.1:%d" % port, file=sys.stderr, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
