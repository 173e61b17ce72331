"""The router's OpenAI-compatible HTTP door (docs/HTTP.md) driven by the official `openai`
package (project venv) and by curl, against a router and a CPU worker on the demo model:
chat and completions, streaming and not, usage, stop strings, n = 2, logprobs, the error
object (401 wrong token, 400 naming the field, NUL characters, 404 model and path, 405, 413,
429 when the worker is full, 504 past the deadline), the raw SSE shape (`curl -N`), a drain with
a stream in flight, and TLS with certificates made by openssl at test time."""
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import httpx2  # noqa: E402  (the HTTP client the openai package is built on)
import openai  # noqa: E402

DEMO = os.path.join("models", "demo-en-17m.gguf")  # runfiles (//models:demo)
HTTP_RE = r"HTTP \(OpenAI API\) on (https?)://(\S+?):(\d+)/v1"
TOKEN = "http-token-0123456789abcdef"
MODEL = "demo-en-17m"
PROMPT = "Once upon a time"
CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Tell me about the sea."}]


def demo():
    p = DEMO if os.path.isfile(DEMO) else os.path.join(h.repo_root(), DEMO)
    return os.path.abspath(p)


def tmpdir():
    return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def start(worker_extra=(), router_extra=(), name="http"):
    w = h.start_worker(name + "-w", model=demo(), extra=list(worker_extra))
    r = h.start_router([w], model=demo(), name=name + "-r",
                       extra=["--http-listen", "127.0.0.1:0"] + list(router_extra))
    m = r.wait_line(HTTP_RE)
    return w, r, "%s://%s:%s/v1" % (m.group(1), m.group(2), m.group(3))


def curl(*args, timeout=60):
    p = subprocess.run(["curl", "-sS"] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8")


def sse_events(body):
    """The `data:` payloads of an SSE body, checking that every event is `data: ...\\n\\n`."""
    assert body.endswith("\n\n"), body[-200:]
    out = []
    for ev in body[:-2].split("\n\n"):
        assert ev.startswith("data: ") and "\n" not in ev, ev
        out.append(ev[len("data: "):])
    return out


class HttpApi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        d = tmpdir()
        tok = os.path.join(d, "token")
        with open(tok, "w") as f:
            f.write(TOKEN + "\n")
        cls.w, cls.r, cls.base = start(router_extra=["--auth-token-file", tok])
        cls.client = openai.OpenAI(base_url=cls.base, api_key=TOKEN, max_retries=0, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.r.stop()
        cls.w.stop()

    def curl_json(self, path, body=None, token=TOKEN, extra=()):
        args = ["-w", "\n%{http_code}", "-H", "Authorization: Bearer " + token]
        if body is not None:
            args += ["-H", "Content-Type: application/json", "--data-binary",
                     body if isinstance(body, str) else json.dumps(body)]
        rc, out, err = curl(*(args + list(extra) + [self.base + path]))
        self.assertEqual(rc, 0, err)
        text, code = out.rsplit("\n", 1)
        return int(code), json.loads(text)

    def assertError(self, code, body, status, param=None):
        self.assertEqual(code, status, body)
        e = body["error"]
        self.assertEqual(set(e), {"message", "type", "param", "code"})
        self.assertTrue(e["message"])
        if param is not None:
            self.assertEqual(e["param"], param, e)

    def test_models_and_health(self):
        ms = self.client.models.list()
        self.assertEqual([m.id for m in ms.data], [MODEL])
        self.assertGreater(ms.data[0].max_model_len, 0)  # the workers' context
        rc, out, _ = curl("-w", "\n%{http_code}", self.base.replace("/v1", "/health"))
        self.assertEqual(out.rsplit("\n", 1)[1], "200")
        self.assertEqual(json.loads(out.rsplit("\n", 1)[0])["status"], "ok")

    def test_chat(self):
        r = self.client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8,
                                                temperature=0)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(len(r.choices), 1)
        c = r.choices[0]
        self.assertEqual(c.message.role, "assistant")
        self.assertTrue(c.message.content)
        self.assertIn(c.finish_reason, ("stop", "length"))
        u = r.usage
        self.assertGreater(u.prompt_tokens, 10)
        self.assertGreaterEqual(u.completion_tokens, 1)
        self.assertLessEqual(u.completion_tokens, 8)
        self.assertEqual(u.total_tokens, u.prompt_tokens + u.completion_tokens)
        self.assertIsNotNone(u.prompt_tokens_details.cached_tokens)
        self.assertEqual(u.completion_tokens_details.reasoning_tokens, 0)
        # greedy: the same answer again, and the same text as a stream
        r2 = self.client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8,
                                                 temperature=0)
        self.assertEqual(r2.choices[0].message.content, c.message.content)
        stream = self.client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True})
        chunks = list(stream)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(text, c.message.content)
        finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        self.assertEqual(finals[-1], c.finish_reason)
        self.assertTrue(all(f is None for f in finals[:-1]))
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, u.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, u.prompt_tokens)
        self.assertGreater(chunks[-1].usage.prompt_tokens_details.cached_tokens, 0)

    def test_completions_match_grpc(self):
        r = self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12,
                                           temperature=0)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 12)
        # the same relay as gRPC: the same text as Generation/Generate
        cl = h.Client(self.r.addr)
        try:
            msgs = list(cl.gen.Generate(h.request(text=PROMPT, max_tokens=12), timeout=60,
                                        metadata=(("authorization", "Bearer " + TOKEN),)))
        finally:
            cl.close()
        self.assertEqual(r.choices[0].text, "".join(m.text for m in msgs))
        stream = self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12,
                                                temperature=0, stream=True)
        chunks = list(stream)
        self.assertEqual("".join(ch.choices[0].text for ch in chunks), r.choices[0].text)
        self.assertEqual(chunks[-1].choices[0].finish_reason, "length")

    def test_stop(self):
        full = self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                              temperature=0).choices[0].text
        word = full.split()[2]
        cut = full[:full.index(word)]
        for stop in (word, [word, "\u2603"]):
            r = self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                               temperature=0, stop=stop)
            self.assertEqual(r.choices[0].text, cut)
            self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_n2(self):
        r = self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, n=2,
                                           temperature=1.0, seed=7)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        a, b = r.choices[0].text, r.choices[1].text
        self.assertNotEqual(a, b)  # seeds 7 and 8
        self.assertEqual(r.usage.completion_tokens, 20)
        again = self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, n=2,
                                               temperature=1.0, seed=7)
        self.assertEqual([c.text for c in again.choices], [a, b])
        chunks = list(self.client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=6, n=2, seed=3, stream=True))
        got = {0: "", 1: ""}
        for ch in chunks:
            for c in ch.choices:
                got[c.index] += c.delta.content or ""
        self.assertTrue(got[0] and got[1])

    def test_logprobs(self):
        r = self.client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5,
                                                temperature=0, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)
            self.assertEqual(len(t.top_logprobs), 3)
            # greedy: the chosen token is the most likely one
            self.assertEqual(t.top_logprobs[0].token, t.token)
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=4)
        c = self.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5,
                                           temperature=0, logprobs=2)
        lp = c.choices[0].logprobs
        self.assertEqual("".join(lp.tokens), c.choices[0].text)
        self.assertEqual(len(lp.token_logprobs), 5)
        self.assertEqual(len(lp.top_logprobs), 5)
        self.assertTrue(all(len(t) == 2 for t in lp.top_logprobs))
        self.assertEqual(lp.text_offset[0], 0)
        self.assertEqual(lp.text_offset, sorted(lp.text_offset))

    def test_wrong_token_401(self):
        bad = openai.OpenAI(base_url=self.base, api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError) as cm:
            bad.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
        self.assertEqual(cm.exception.status_code, 401)
        bad.close()
        code, body = self.curl_json("/models", token="")
        self.assertError(code, body, 401)

    def test_bad_field_400(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.chat.completions.create(model=MODEL, messages=CHAT, temperature=-1)
        self.assertEqual(cm.exception.status_code, 400)
        self.assertEqual(cm.exception.body["param"], "temperature")
        cases = [
            ({"messages": CHAT, "max_tokens": "x"}, "max_tokens"),
            ({"messages": CHAT, "top_p": 1.5}, "top_p"),
            ({"messages": CHAT, "n": 0}, "n"),
            ({"messages": [{"content": "hi"}]}, "messages[0].role"),
            ({"messages": CHAT, "tool_choice": "required"}, "tool_choice"),
            ({"messages": CHAT, "stop": [1]}, "stop[0]"),
            ({"messages": CHAT, "top_logprobs": 2}, "top_logprobs"),
            ({"messages": CHAT, "chat_template_kwargs": {"enable_thinking": "yes"}},
             "chat_template_kwargs.enable_thinking"),
            ({"messages": CHAT, "tools": [{"type": "function", "function": {}}]},
             "tools[0].function.name"),
            ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
             "messages[0].content[0]"),
            ({}, "messages"),
        ]
        for body, param in cases:
            code, out = self.curl_json("/chat/completions", body)
            self.assertError(code, out, 400, param)
        code, out = self.curl_json("/completions", {"prompt": PROMPT, "max_tokens": 100000})
        self.assertError(code, out, 400, "max_tokens")
        code, out = self.curl_json("/completions", '{"prompt": "x", "max_tokens": 1}\n\n')
        self.assertEqual(code, 200, out)  # white space after the value is fine
        code, out = self.curl_json("/completions", '{"prompt": "x"} {}')
        self.assertError(code, out, 400)
        code, out = self.curl_json("/completions", '{"prompt": "x",')
        self.assertError(code, out, 400)
        self.assertIn("JSON", out["error"]["message"])

    def test_nul_refused(self):
        code, out = self.curl_json("/completions", '{"prompt": "Hello\\u0000 and a long tail"}')
        self.assertError(code, out, 400, "prompt")
        self.assertIn("U+0000", out["error"]["message"])
        code, out = self.curl_json(
            "/chat/completions", '{"messages": [{"role": "user", "content": "a\\u0000b"}]}')
        self.assertError(code, out, 400, "messages[0].content")
        code, out = self.curl_json("/completions", '{"prompt": "x", "stop": ["a\\u0000"]}')
        self.assertError(code, out, 400, "stop[0]")

    def test_not_found_and_method(self):
        with self.assertRaises(openai.NotFoundError) as cm:
            self.client.chat.completions.create(model="gpt-4o", messages=CHAT)
        self.assertEqual(cm.exception.body["param"], "model")
        code, out = self.curl_json("/embeddings", {"input": "x"})
        self.assertError(code, out, 404)
        code, out = self.curl_json("/chat/completions")  # GET
        self.assertError(code, out, 405)

    def test_body_too_large_413(self):
        d = tmpdir()
        path = os.path.join(d, "big.json")
        with open(path, "w") as f:
            f.write('{"prompt": "%s"}' % ("a" * (9 << 20)))
        code, out = self.curl_json("/completions", extra=["--data-binary", "@" + path])
        self.assertError(code, out, 413)

    def test_deadline_504(self):
        code, out = self.curl_json("/completions",
                                   {"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True},
                                   extra=["-H", "X-Request-Timeout: 0.1"])
        self.assertError(code, out, 504)

    def test_curl_sse_shape(self):
        rc, out, err = curl("-N", "-H", "Authorization: Bearer " + TOKEN, "-H",
                            "Content-Type: application/json", "-D", "/dev/stderr",
                            "--data-binary",
                            json.dumps({"model": MODEL, "messages": CHAT, "max_tokens": 6,
                                        "stream": True,
                                        "stream_options": {"include_usage": True}}),
                            self.base + "/chat/completions")
        self.assertEqual(rc, 0, err)
        self.assertIn("content-type: text/event-stream", err.lower())
        events = sse_events(out)
        self.assertEqual(events[-1], "[DONE]")
        objs = [json.loads(e) for e in events[:-1]]
        ids = {o["id"] for o in objs}
        self.assertEqual(len(ids), 1)
        self.assertTrue(all(o["object"] == "chat.completion.chunk" for o in objs))
        self.assertEqual(objs[-1]["choices"], [])
        self.assertEqual(objs[-1]["usage"]["total_tokens"],
                         objs[-1]["usage"]["prompt_tokens"] + objs[-1]["usage"]["completion_tokens"])
        self.assertTrue(all(o["usage"] is None for o in objs[:-1]))
        self.assertIn(objs[-2]["choices"][0]["finish_reason"], ("stop", "length"))


class HttpFull(unittest.TestCase):
    """A worker with one slot and no queue: a second request while one runs gets 429."""

    def test_429_when_full(self):
        w, r, base = start(worker_extra=["--slots", "1", "--queue", "0"], name="full")
        try:
            client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)
            started, checked = threading.Event(), threading.Event()
            out = {}

            def long_stream():
                s = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3000,
                                              stream=True, extra_body={"ignore_eos": True})
                n = 0
                for ch in s:
                    n += 1
                    if n == 2:
                        started.set()
                        checked.wait(60)  # the slot stays taken until the 429 was seen
                        break
                s.close()
                out["n"] = n

            t = threading.Thread(target=long_stream)
            t.start()
            try:
                self.assertTrue(started.wait(60))
                with self.assertRaises(openai.RateLimitError) as cm:
                    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
                self.assertEqual(cm.exception.status_code, 429)
                self.assertEqual(cm.exception.body["code"], "resource_exhausted")
            finally:
                checked.set()
                t.join(60)
            self.assertEqual(out.get("n"), 2)
            # the slot is free again once the stream was closed (the relay was cancelled)
            h.wait_until(lambda: _ok(client), timeout=30, what="the slot freed", interval=0.2)
            client.close()
        finally:
            r.stop()
            w.stop()


def _ok(client):
    try:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        return True
    except openai.RateLimitError:
        return False


FORCED = ("<think>\nThe user wants the weather; a < b holds.\n</think>\n\n"
          "Let me check.\n\n"
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
          "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}]


class HttpForcedOutput(unittest.TestCase):
    """The scripted fake worker returns a Qwen3.5-style output (a think block, an answer, a tool
    call), several tokens a message: the HTTP answer has it split into reasoning_content, content
    and tool_calls, and completion_tokens_details.reasoning_tokens is exact (the tokens through
    the one whose text completes </think>), streamed or not."""

    @classmethod
    def setUpClass(cls):
        rc, out, err = h.run_cli(["tokenize", "--model", demo(), "--text", FORCED], check=True)
        cls.ids = [int(x) for x in out.strip().strip("[]").split(",")]
        cls.w = h.start_fake_worker("http_fake", extra=[
            "--tokens", ",".join(map(str, cls.ids)), "--vocab", "8192",
            "--per-message", "4,1,3,6"])
        n = 1  # the fewest tokens whose text completes </think>
        while "</think>" not in h.run_cli(["detokenize", "--model", demo(), "--ids",
                                            ",".join(map(str, cls.ids[:n]))], check=True)[1]:
            n += 1
        cls.n_reasoning = n
        cls.r = h.start_router([cls.w], model=demo(), name="http_fake_r",
                               extra=["--http-listen", "127.0.0.1:0"])
        m = cls.r.wait_line(HTTP_RE)
        cls.client = openai.OpenAI(base_url="http://%s:%s/v1" % (m.group(2), m.group(3)),
                                   api_key="none", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.r.stop()
        cls.w.stop()

    def check_call(self, calls):
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0]["name"], "get_weather")
        self.assertEqual(json.loads(calls[0]["arguments"]), {"city": "Paris", "days": 3})
        self.assertTrue(calls[0]["id"].startswith("call_"))

    def test_split(self):
        msgs = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
        r = self.client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                                max_tokens=len(self.ids))
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "tool_calls")
        self.assertEqual(c.message.reasoning_content.strip(),
                         "The user wants the weather; a < b holds.")
        self.assertEqual(c.message.content.strip(), "Let me check.")
        self.check_call([{"id": t.id, "name": t.function.name,
                          "arguments": t.function.arguments} for t in c.message.tool_calls])
        self.assertEqual(r.usage.completion_tokens, len(self.ids))
        self.assertEqual(r.usage.completion_tokens_details.reasoning_tokens, self.n_reasoning)
        # streamed: the same pieces as deltas
        reasoning, content, calls, finish, usage = "", "", {}, None, None
        for ch in self.client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                                      max_tokens=len(self.ids), stream=True,
                                                      stream_options={"include_usage": True}):
            if ch.usage:
                usage = ch.usage
            if not ch.choices:
                continue
            d = ch.choices[0].delta
            reasoning += getattr(d, "reasoning_content", None) or ""
            content += d.content or ""
            for t in d.tool_calls or []:
                calls[t.index] = {"id": t.id, "name": t.function.name,
                                  "arguments": t.function.arguments}
            finish = ch.choices[0].finish_reason or finish
        self.assertEqual(reasoning, c.message.reasoning_content)
        self.assertEqual(content, c.message.content)
        self.check_call([calls[i] for i in sorted(calls)])
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(usage.completion_tokens_details.reasoning_tokens, self.n_reasoning)


class HttpDrain(unittest.TestCase):
    """SIGTERM with an HTTP stream in flight: the stream ends normally, new requests get 503,
    the router exits 0."""

    def test_drain(self):
        w, r, base = start(name="drain", router_extra=["--grace-seconds", "60"])
        try:
            client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)
            s = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=300,
                                          stream=True, extra_body={"ignore_eos": True},
                                          stream_options={"include_usage": True})
            it = iter(s)
            text = next(it).choices[0].text
            r.signal(signal.SIGTERM)
            r.wait_line("draining")
            rc, body, err = curl("-w", "\n%{http_code}", "-H", "Content-Type: application/json",
                                 "--data-binary", json.dumps({"prompt": "x", "max_tokens": 2}),
                                 base + "/completions")
            if rc == 0:  # the door may already be closed once the stream ended
                text_body, code = body.rsplit("\n", 1)
                self.assertEqual(code, "503", body)
                self.assertIn("draining", json.loads(text_body)["error"]["message"])
            last = None
            usage = None
            for ch in it:
                if ch.usage is not None:
                    usage = ch.usage
                if ch.choices:
                    last = ch.choices[0].finish_reason or last
            self.assertEqual(last, "length")
            # Every token came, though tokens of one step may share a chunk.
            self.assertEqual(usage.completion_tokens, 300)
            self.assertEqual(r.wait(60), 0)
            client.close()
        finally:
            r.stop()
            w.stop()


class HttpTls(unittest.TestCase):
    """--tls-cert/--tls-key serve the HTTP door over TLS; the client trusts the test CA."""

    def test_tls(self):
        d = tmpdir()

        def openssl(*args):
            subprocess.run(["openssl"] + list(args), cwd=d, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                "ca.pem", "-days", "2", "-subj", "/CN=test-ca")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
                "server.csr", "-subj", "/CN=server")
        with open(os.path.join(d, "server.ext"), "w") as f:
            f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
                    "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
        w = h.start_worker("tls-w", model=demo())
        r = h.start_router([w], model=demo(), name="tls-r", ready=False,
                           extra=["--http-listen", "127.0.0.1:0",
                                  "--tls-cert", os.path.join(d, "server.pem"),
                                  "--tls-key", os.path.join(d, "server.key")])
        try:
            m = r.wait_line(HTTP_RE)
            self.assertEqual(m.group(1), "https")
            base = "https://%s:%s/v1" % (m.group(2), m.group(3))
            hc = httpx2.Client(verify=ssl.create_default_context(cafile=os.path.join(d, "ca.pem")))
            client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, http_client=hc)
            h.wait_until(lambda: _health(base, d), timeout=30, what="TLS router ready")
            res = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4,
                                                 stream=True)
            self.assertTrue("".join(c.choices[0].delta.content or "" for c in res if c.choices))
            client.close()
            # a client without the CA refuses the certificate
            plain = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
            with self.assertRaises(openai.APIConnectionError):
                plain.models.list()
            plain.close()
        finally:
            r.stop()
            w.stop()


def _health(base, d):
    rc, out, _ = curl("--cacert", os.path.join(d, "ca.pem"), "-w", "\n%{http_code}",
                      base.replace("/v1", "/health"))
    return rc == 0 and out.endswith("\n200")


if __name__ == "__main__":
    unittest.main(verbosity=2)
