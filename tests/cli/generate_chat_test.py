"""deltaserve generate --chat renders the prompt with the model's own chat template.

A copy of the tiny reference model carrying the Qwen3.5 template (tests/model/data): for the
thinking switch left to the template, on and off, `generate --chat --print-ids` gives the greedy
ids of `generate --ids` over transformers' rendering of the same one-turn conversation
(tokenized by `deltaserve tokenize`), and its summary line that many prompt tokens; on and off
differ. The output is split as the router splits it: with thinking on the prompt ends inside
<think>, so every generated token is reasoning: stdout carries an empty answer, stderr the text
(the detokenized ids) and "reasoning tokens N"; with thinking off stdout carries the text and 0
reasoning tokens. The tiny model's own ChatML template has no thinking switch: --thinking on
renders as the default. Errors: --thinking other than on/off or without --chat (exit 2), a
model without a template or with one the renderer cannot run (exit 1, one line naming why).
Needs the project venv (jinja2 through transformers, gguf-py's gguf-new-metadata)."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "testutil"))
import refcases  # noqa: E402

from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: E402

BIN = os.environ.get("DS_BIN", "deltaserve")
HERE = os.path.dirname(os.path.realpath(__file__))
QWEN = os.path.join(HERE, "..", "model", "data", "qwen35_chat_template.jinja")
PROMPT = "What is the capital of France?"
N = 8


def run(*args):
    return subprocess.run([BIN] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=300)


def rewrite(src, dst, args):
    tool = os.path.join(os.path.dirname(sys.executable), "gguf-new-metadata")
    subprocess.run([tool] + args + ["--force", src, dst], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one_line_error(r, code):
    err = r.stderr.decode()
    return r.returncode == code and err.count("\n") == 1, err


class GenerateChat(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.tiny = refcases.resolve_path("tiny-r2-tied", ".gguf")
        with open(QWEN) as f:
            cls.qwen_src = f.read()
        cls.qwen = os.path.join(cls.tmp.name, "qwen.gguf")
        rewrite(cls.tiny, cls.qwen, ["--chat-template", cls.qwen_src])
        cls.bare = os.path.join(cls.tmp.name, "bare.gguf")
        rewrite(cls.tiny, cls.bare, ["--remove-metadata", "tokenizer.chat_template"])
        cls.broken = os.path.join(cls.tmp.name, "broken.gguf")
        rewrite(cls.tiny, cls.broken, ["--chat-template", "{% include 'other.jinja' %}"])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def gen(self, model, *flags, ids=None):
        args = ["generate", "--model", model, "--max-tokens", str(N), "--temperature", "0"]
        args += ["--ids", ",".join(map(str, ids))] if ids is not None else ["--prompt", PROMPT]
        r = run(*(args + list(flags)))
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return r

    def want_ids(self, model, template, **kw):
        text = _compile_jinja_template(template).render(
            messages=[{"role": "user", "content": PROMPT}], add_generation_prompt=True, **kw)
        r = run("tokenize", "--model", model, "--text", text)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return text, json.loads(r.stdout)

    def check_prompt(self, model, template, flags, **kw):
        """The --chat run's greedy ids and prompt tokens against --ids of the rendering."""
        text, ids = self.want_ids(model, template, **kw)
        r = self.gen(model, "--chat", "--print-ids", *flags)
        self.assertIn("prompt tokens %d," % len(ids), r.stderr.decode(), (flags, text))
        want = json.loads(self.gen(model, "--print-ids", ids=ids).stdout)
        self.assertEqual(json.loads(r.stdout), want, flags)
        return ids, want

    def test_qwen_template_and_thinking(self):
        default, _ = self.check_prompt(self.qwen, self.qwen_src, [])
        on, _ = self.check_prompt(self.qwen, self.qwen_src, ["--thinking", "on"],
                                  enable_thinking=True)
        off, _ = self.check_prompt(self.qwen, self.qwen_src, ["--thinking", "off"],
                                   enable_thinking=False)
        self.assertEqual(default, on)  # Qwen3.5 thinks by default
        self.assertNotEqual(on, off)

    def detok(self, model, ids):
        r = run("detokenize", "--model", model, "--ids", ",".join(map(str, ids)))
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        return r.stdout

    def n_reasoning(self, err):
        m = re.search(r"generated tokens (\d+), reasoning tokens (\d+),", err)
        self.assertIsNotNone(m, err)
        return int(m.group(1)), int(m.group(2))

    def test_reasoning_apart_from_the_answer(self):
        # thinking on: the prompt ends inside <think>, the whole output is reasoning
        ids = json.loads(self.gen(self.qwen, "--chat", "--print-ids").stdout)
        text = self.detok(self.qwen, ids)
        self.assertNotIn(b"</think>", text)
        r = self.gen(self.qwen, "--chat")
        self.assertEqual(r.stdout, b"\n")
        self.assertTrue(r.stderr.startswith(text + b"\n"), (r.stderr, text))
        self.assertEqual(self.n_reasoning(r.stderr.decode("utf-8", "replace")),
                         (len(ids), len(ids)))
        # thinking off: the answer on stdout, no reasoning
        ids = json.loads(self.gen(self.qwen, "--chat", "--thinking", "off", "--print-ids").stdout)
        text = self.detok(self.qwen, ids)
        r = self.gen(self.qwen, "--chat", "--thinking", "off")
        self.assertEqual(r.stdout, text + b"\n")
        self.assertTrue(r.stderr.startswith(b"generate: "), r.stderr)
        self.assertEqual(self.n_reasoning(r.stderr.decode("utf-8", "replace")), (len(ids), 0))

    def test_chatml_template(self):
        chatml = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% endif %}")
        default, _ = self.check_prompt(self.tiny, chatml, [])
        on, _ = self.check_prompt(self.tiny, chatml, ["--thinking", "on"], enable_thinking=True)
        self.assertEqual(default, on)

    def test_errors(self):
        r = run("generate", "--model", self.qwen, "--chat", "--thinking", "maybe", "--prompt", "x")
        self.assertTrue(one_line_error(r, 2)[0] and b"--thinking" in r.stderr, r.stderr)
        r = run("generate", "--model", self.qwen, "--thinking", "on", "--prompt", "x")
        self.assertTrue(one_line_error(r, 2)[0] and b"--chat" in r.stderr, r.stderr)
        r = run("generate", "--model", self.bare, "--chat", "--prompt", "x")
        self.assertTrue(one_line_error(r, 1)[0] and b"no chat template" in r.stderr, r.stderr)
        r = run("generate", "--model", self.broken, "--chat", "--prompt", "x")
        self.assertTrue(one_line_error(r, 1)[0] and b"chat template cannot be rendered" in r.stderr
                        and b"include" in r.stderr, r.stderr)
        # without --chat a template-less model still generates
        self.gen(self.bare)


if __name__ == "__main__":
    unittest.main(verbosity=2)
