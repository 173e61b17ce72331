"""The router renders gRPC chat prompts with the model's own chat template: a copy of the tiny
model carrying the Qwen3.5 template (tests/model/data) renders tools, tool calls, tool results
and the thinking switch as transformers' apply_chat_template does (the prompt the worker saw,
usage.prompt_tokens, against `deltaserve tokenize` of transformers' text); the template's
raise_exception is INVALID_ARGUMENT with its message; a model without a template makes chat
FAILED_PRECONDITION naming why, logged once at start, while text prompts still work.
GetModelInfo's template facts are the router's template's (the fake worker reports none).
Fixture: router (--model a rewritten tiny GGUF) + the fake worker.
Run: .venv/bin/python chat_template_e2e_test.py (Bazel: //tests/e2e:chat_template_e2e_test)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402
from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: E402

pb = h.pb
QWEN = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", ""),
                    "tests/model/data/qwen35_chat_template.jinja")
if not os.path.exists(QWEN):
    QWEN = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "model", "data",
                        "qwen35_chat_template.jinja")


def rewrite(src, dst, args):
    tool = os.path.join(os.path.dirname(sys.executable), "gguf-new-metadata")
    subprocess.run([tool] + args + ["--force", src, dst], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def n_tokens(text):
    rc, out, err = h.run_cli(["tokenize", "--model", h.tiny_model(), "--text", text])
    assert rc == 0, err
    return len(json.loads(out))


def code_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


class ChatTemplates(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        with open(QWEN) as f:
            cls.qwen_src = f.read()
        cls.qwen_gguf = os.path.join(cls.tmp.name, "qwen-template.gguf")
        rewrite(h.tiny_model(), cls.qwen_gguf, ["--chat-template", cls.qwen_src])
        cls.bare_gguf = os.path.join(cls.tmp.name, "no-template.gguf")
        rewrite(h.tiny_model(), cls.bare_gguf, ["--remove-metadata", "tokenizer.chat_template"])
        cls.w = h.start_fake_worker("w", ["--tokens", "5,6"])
        cls.rq = h.start_router([cls.w], model=cls.qwen_gguf, name="router_qwen")
        cls.rb = h.start_router([cls.w], model=cls.bare_gguf, name="router_bare")
        cls.cq = h.Client(cls.rq.addr)
        cls.cb = h.Client(cls.rb.addr)

    @classmethod
    def tearDownClass(cls):
        cls.cq.close()
        cls.cb.close()
        cls.rq.stop()
        cls.rb.stop()
        cls.w.stop()
        cls.tmp.cleanup()

    def prompt_tokens(self, req):
        _, _, _, final = h.collect(self.cq.gen.Generate(req, timeout=60))
        return final.usage.prompt_tokens

    def test_tools_calls_results_and_thinking(self):
        req = pb.GenerateRequest()
        req.stopping.max_new_tokens = 1
        req.chat.messages.add(role="system", content="Use tools.")
        req.chat.messages.add(role="user", content="Weather in Paris?")
        a = req.chat.messages.add(role="assistant", content="",
                                  reasoning_content="I need the tool.")
        a.tool_calls.add(id="call_1", name="get_weather",
                         arguments='{"city": "Paris", "days": 2}')
        req.chat.messages.add(role="tool", content="sunny", tool_call_id="call_1")
        req.chat.tools.add(name="get_weather", description="Weather by city",
                           parameters='{"type": "object", "properties": {"city": '
                                      '{"type": "string"}, "days": {"type": "integer"}}}')
        messages = [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "I need the tool.",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        ]
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather by city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                            "days": {"type": "integer"}}}}}]
        tmpl = _compile_jinja_template(self.qwen_src)
        for thinking, kw in ((pb.THINKING_DEFAULT, {}), (pb.THINKING_ON, {"enable_thinking": True}),
                             (pb.THINKING_OFF, {"enable_thinking": False})):
            req.chat.thinking = thinking
            want = tmpl.render(messages=messages, tools=tools, add_generation_prompt=True, **kw)
            self.assertEqual(self.prompt_tokens(req), n_tokens(want), (thinking, want))
        # off adds the empty think block: more tokens than on
        req.chat.thinking = pb.THINKING_OFF
        off = self.prompt_tokens(req)
        req.chat.thinking = pb.THINKING_ON
        self.assertGreater(off, self.prompt_tokens(req))

    def test_template_errors_are_invalid_argument(self):
        code, msg = code_of(lambda: self.cq.generate(chat=[("system", "only me")], max_tokens=1))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
        self.assertEqual(msg, "chat: No user query found in messages.")
        code, msg = code_of(lambda: self.cq.generate(chat=[("user", "hi"), ("robot", "beep")],
                                                     max_tokens=1))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
        self.assertEqual(msg, "chat: Unexpected message role.")

    def test_no_template_is_failed_precondition(self):
        code, msg = code_of(lambda: self.cb.generate(chat=[("user", "hi")], max_tokens=1))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION, msg)
        self.assertIn("the model has no chat template", msg)
        self.rb.wait_line(r"chat prompts will fail \(FAILED_PRECONDITION\): the model has no "
                          r"chat template", timeout=5)
        _, ids, _, _ = self.cb.generate(text="hi", max_tokens=2)
        self.assertEqual(ids, [5, 6])

    def test_model_info_template_facts(self):
        def info(c):
            try:
                return c.gen.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            except grpc.RpcError:
                return None
        q = h.wait_until(lambda: info(self.cq), 30, "the router's GetModelInfo")
        self.assertTrue(q.has_chat_template)
        self.assertTrue(q.thinking_default)  # Qwen3.5 thinks when not told
        b = h.wait_until(lambda: info(self.cb), 30, "the router's GetModelInfo")
        self.assertFalse(b.has_chat_template)
        self.assertFalse(b.thinking_default)


if __name__ == "__main__":
    unittest.main(verbosity=2)
