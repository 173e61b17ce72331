"""The router splits a chat stream into the answer (`text`), the reasoning (`reasoning`) and
tool calls (`tool_calls`), exactly (model/chat_split.h, router/router_chat.h).

Demo model (a router and a real worker): for several conversations, the chat stream and a text
prompt of the same rendered text (the GGUF's own chat template rendered with jinja2 as Hugging
Face does, add_generation_prompt) give the same greedy tokens, and the chat stream's reasoning
and text, with the markers put back, are the text stream's text; stop strings too.

Forced output (the router on the demo model's tokenizer, the scripted fake worker returning the
token ids of a Qwen3.5-style output: a think block, an answer with literal "<" text, a tool call):
the stream's reasoning, text and tool_calls are that output split, with "call_" + 24 hex ids; the
same tokens for a text prompt come back whole in text (non-chat streams are not split). The
final message's usage.reasoning_tokens is exact: the tokens through the one whose text completes
</think>, also when the fake worker sends several tokens a message (--per-message) and when a
stop string ends the output inside the reasoning or after it; 0 for a text prompt."""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import gguf  # noqa: E402
import jinja2.sandbox  # noqa: E402

pb = h.pb
DEMO = os.path.join("models", "demo-en-17m.gguf")  # runfiles (//models:demo)
N = 48

CONVERSATIONS = [
    [("user", "How do I install a package?")],
    [("system", "You answer briefly."), ("user", "What is apt?")],
    [("user", "Write <think> and </think> and <tool_call> as text."),
     ("assistant", "<think>\nok\n</think>\n\nSure: <tool_call>"),
     ("user", "Again, with a < b.")],
]


def gguf_template(path):
    r = gguf.GGUFReader(path)
    f = r.fields["tokenizer.chat_template"]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def render(template, conv):
    """The GGUF's template as transformers' apply_chat_template renders it."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[{"role": r, "content": c} for r, c in conv], add_generation_prompt=True)


def joined(msgs):
    """(reasoning, text, calls, think_closed): the stream's fields joined in order; whether some
    text followed reasoning (the reasoning was closed by </think>)."""
    reasoning, text, calls, closed = "", "", [], False
    for m in msgs:
        if reasoning and m.text:
            closed = True
        reasoning += m.reasoning
        text += m.text
        calls.extend(m.tool_calls)
    return reasoning, text, calls, closed


def chat_request(conv, tools=(), **kw):
    req = h.request(chat=conv, **kw)
    for name, params in tools:
        req.chat.tools.add(name=name, parameters=params)
    return req


class DemoModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.template = gguf_template(DEMO)
        cls.w = h.start_worker("split_w", model=DEMO, extra=["--threads", "1"])
        cls.r = h.start_router([cls.w], model=DEMO, name="split_router")
        cls.c = h.Client(cls.r.addr)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.r.stop()
        cls.w.stop()

    def check(self, conv, stop=()):
        prompt = render(self.template, conv)
        kw = dict(max_tokens=N, temperature=0.0, ignore_eos=True, stop=stop)
        cmsgs = list(self.c.gen.Generate(h.request(chat=conv, **kw), timeout=120))
        _, tids, ttext, tfinal = self.c.generate(text=prompt, timeout=120, **kw)
        cids = [t for m in cmsgs for t in m.token_ids]
        self.assertEqual(cids, tids, conv)
        self.assertEqual(cmsgs[-1].finish_reason, tfinal.finish_reason)
        self.assertEqual(cmsgs[-1].usage.prompt_tokens, tfinal.usage.prompt_tokens)
        reasoning, text, calls, closed = joined(cmsgs)
        self.assertEqual(calls, [])
        # the demo template's prompt ends outside <think>: reasoning only if the output opens it
        if reasoning:
            self.assertTrue(ttext.startswith("<think>"), ttext)
            whole = "<think>" + reasoning + ("</think>" if closed else "") + text
        else:
            whole = text
        self.assertEqual(whole, ttext, conv)
        return ttext

    def test_chat_equals_rendered_text(self):
        for conv in CONVERSATIONS:
            out = self.check(conv)
            self.assertGreater(len(out), 0)

    def test_with_stop_strings(self):
        out = self.check(CONVERSATIONS[0])
        words = re.findall(r"[a-z]{4,}", out)
        if not words:
            self.skipTest("no word to stop on in %r" % out)
        stopped = self.check(CONVERSATIONS[0], stop=[" " + words[len(words) // 2]])
        self.assertLess(len(stopped), len(out))


FORCED = ("<think>\nThe user wants the weather; a < b holds.\n</think>\n\n"
          "Let me check <b>that</b>.\n\n"
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
          "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
TOOLS = [("get_weather", '{"type": "object", "properties": {"city": {"type": "string"}, '
                         '"days": {"type": "integer"}}}')]


class ForcedOutput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rc, out, err = h.run_cli(["tokenize", "--model", DEMO, "--text", FORCED], check=True)
        cls.ids = [int(x) for x in out.strip().strip("[]").split(",")]
        cls.w = h.start_fake_worker("split_fake", extra=[
            "--tokens", ",".join(map(str, cls.ids)), "--vocab", "8192"])
        cls.r = h.start_router([cls.w], model=DEMO, name="split_fake_router")
        cls.c = h.Client(cls.r.addr)
        # the same output, several tokens a message
        cls.wm = h.start_fake_worker("split_fake_multi", extra=[
            "--tokens", ",".join(map(str, cls.ids)), "--vocab", "8192",
            "--per-message", "3,1,5,2,7"])
        cls.rm = h.start_router([cls.wm], model=DEMO, name="split_fake_multi_router")
        cls.cm = h.Client(cls.rm.addr)

    @classmethod
    def tearDownClass(cls):
        for c in (cls.c, cls.cm):
            c.close()
        for p in (cls.r, cls.rm, cls.w, cls.wm):
            p.stop()

    def detok(self, n):
        return h.run_cli(["detokenize", "--model", DEMO, "--ids",
                          ",".join(map(str, self.ids[:n]))], check=True)[1]

    def first_with(self, s):
        """The fewest forced tokens whose text contains s."""
        lo, hi = 1, len(self.ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if s in self.detok(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def test_reasoning_tokens(self):
        n_close = self.first_with("</think>")
        self.assertGreater(n_close, 3)
        self.assertLess(n_close, len(self.ids))
        for c in (self.c, self.cm):
            req = chat_request([("user", "Weather?")], tools=TOOLS, max_tokens=len(self.ids))
            msgs = list(c.gen.Generate(req, timeout=60))
            if c is self.cm:
                self.assertGreater(max(len(m.token_ids) for m in msgs), 1)
            u = msgs[-1].usage
            self.assertEqual(u.completion_tokens, len(self.ids))
            self.assertEqual(u.reasoning_tokens, n_close)
            # cut inside the reasoning: all of it is reasoning
            req = chat_request([("user", "Weather?")], max_tokens=n_close - 1)
            u = list(c.gen.Generate(req, timeout=60))[-1].usage
            self.assertEqual((u.completion_tokens, u.reasoning_tokens), (n_close - 1,) * 2)
            # a stop string inside the reasoning ends it there; one in the answer after it
            n_stop = self.first_with("a < b")
            req = chat_request([("user", "Weather?")], max_tokens=len(self.ids), stop=["a < b"])
            u = list(c.gen.Generate(req, timeout=60))[-1].usage
            self.assertEqual((u.completion_tokens, u.reasoning_tokens), (n_stop, n_stop))
            req = chat_request([("user", "Weather?")], max_tokens=len(self.ids), stop=["check"])
            m = list(c.gen.Generate(req, timeout=60))[-1]
            self.assertEqual(m.usage.completion_tokens, self.first_with("check"))
            self.assertEqual(m.usage.reasoning_tokens, n_close)
            # a text prompt is not split: no reasoning tokens
            _, _, _, final = c.generate(text="Weather?", max_tokens=len(self.ids))
            self.assertEqual(final.usage.reasoning_tokens, 0)

    def test_split(self):
        req = chat_request([("user", "Weather in Paris for 3 days?")], tools=TOOLS,
                           max_tokens=len(self.ids))
        msgs = list(self.c.gen.Generate(req, timeout=60))
        self.assertEqual([t for m in msgs for t in m.token_ids], self.ids)
        reasoning, text, calls, closed = joined(msgs)
        self.assertEqual(reasoning, "\nThe user wants the weather; a < b holds.\n")
        self.assertEqual(text, "\n\nLet me check <b>that</b>.\n\n")
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0].name, "get_weather")
        self.assertEqual(calls[0].arguments, '{"city": "Paris", "days": 3}')
        self.assertRegex(calls[0].id, r"^call_[0-9a-f]{24}$")
        # the call comes with the token that closes it, the last one
        self.assertEqual(len(msgs[-1].tool_calls), 1)
        self.assertEqual(msgs[-1].finish_reason, pb.FINISH_REASON_LENGTH)

    def test_ids_differ_per_call(self):
        req = chat_request([("user", "Weather?")], tools=TOOLS, max_tokens=len(self.ids))
        a = joined(self.c.gen.Generate(req, timeout=60))[2]
        b = joined(self.c.gen.Generate(req, timeout=60))[2]
        self.assertNotEqual(a[0].id, b[0].id)

    def test_text_prompt_not_split(self):
        _, ids, text, final = self.c.generate(text="Weather?", max_tokens=len(self.ids))
        self.assertEqual(ids, self.ids)
        self.assertEqual(text, FORCED)

    def cut(self, n):
        """(chat stream fields joined, the text stream's text) of the first n forced tokens."""
        req = chat_request([("user", "Weather?")], tools=TOOLS, max_tokens=n)
        got = joined(self.c.gen.Generate(req, timeout=60))
        _, _, whole, _ = self.c.generate(text="Weather?", max_tokens=n)
        return got, whole

    def test_cut_short_call(self):
        # the longest prefix of the output without </function>: the block comes back as text
        detok = lambda n: h.run_cli(["detokenize", "--model", DEMO, "--ids",
                                     ",".join(map(str, self.ids[:n]))], check=True)[1]
        n = len(self.ids) - 1
        while "</function>" in detok(n):
            n -= 1
        (reasoning, text, calls, _), whole = self.cut(n)
        self.assertEqual(calls, [])
        self.assertEqual("<think>" + reasoning + "</think>" + text, whole)
        self.assertTrue(text.endswith(whole[whole.index("<tool_call>"):]), text)
        # with its </function> but not its </tool_call>, the call stands
        (reasoning, text, calls, _), whole = self.cut(n + 1)
        self.assertNotIn("</tool_call>", whole)
        self.assertEqual([c.arguments for c in calls], ['{"city": "Paris", "days": 3}'])
        self.assertEqual(text, "\n\nLet me check <b>that</b>.\n\n")

    def test_bad_tool_schema_names_the_field(self):
        req = chat_request([("user", "Weather?")], tools=[("get_weather", "{not json")],
                           max_tokens=4)
        code, details = None, ""
        try:
            list(self.c.gen.Generate(req, timeout=60))
        except h.grpc.RpcError as e:
            code, details = e.code(), e.details()
        self.assertEqual(code, h.grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("chat.tools[0].parameters", details)


if __name__ == "__main__":
    unittest.main(verbosity=2)
