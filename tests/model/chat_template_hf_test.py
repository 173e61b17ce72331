"""Differential test: deltaserve's chat-template renderer against Hugging Face transformers.

For a set of OpenAI-shaped conversations (system, multi-turn, tools with several parameter
types, assistant tool calls with JSON-text arguments, consecutive tool results,
reasoning_content, <think> inside content, thinking on/off/default, no generation prompt) the
token ids chat_template_tool renders and tokenizes must equal transformers'
apply_chat_template(..., tokenize=True) on the same template text, for the Qwen3.5 template as
published (tests/model/data) and the demo model's own template (read from its GGUF). Errors
raised by the template (raise_exception) must carry the same message. A copy of the demo GGUF
with a different tokenizer.chat_template (gguf-new-metadata) must render by that template.

usage: chat_template_hf_test.py TOOL REFERENCE_DIR DEMO.gguf QWEN35_TEMPLATE ORACLE_TEST.py
"""
import copy
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import jinja2
from transformers import PreTrainedTokenizerFast

QWEN35_SHA256 = "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city \u00fc \"quoted\" / slash",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "ratio": {"type": "number", "default": 0.5},
        "metric": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
        "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}

CALL_ARGS_TEXT = {"id": "call_1", "type": "function", "function": {
    "name": "get_weather",
    "arguments": "{\"city\": \"Paris\", \"days\": 3, \"ratio\": 2.50, \"metric\": true, "
                 "\"tags\": [\"a\", \"b\"], \"where\": {\"lat\": 48.85}, \"unit\": null}"}}
CALL_ARGS_OBJ = {"id": "call_2", "type": "function", "function": {
    "name": "search", "arguments": {"q": "caf\u00e9 \"best\"\nnear me"}}}

CASES = [
    ("single user", [{"role": "user", "content": "Hello!"}], None),
    ("system", [{"role": "system", "content": "You are a helpful assistant.  \n"},
                {"role": "user", "content": "What is 2+2?"}], None),
    ("multi-turn", [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke.\n\n"}], None),
    ("think in content", [{"role": "user", "content": "Q1"},
                          {"role": "assistant", "content": "<think>\nreasoning one\n</think>\n\nAnswer one"},
                          {"role": "user", "content": "Q2"},
                          {"role": "assistant", "content": "<think>r2</think>A2"}], None),
    ("reasoning_content", [{"role": "user", "content": "Q"},
                           {"role": "assistant", "content": "A", "reasoning_content": "  because  "}],
     None),
    ("tools, no system", [{"role": "user", "content": "Weather in Paris?"}], [WEATHER, SEARCH]),
    ("tools + system", [{"role": "system", "content": "Use tools."},
                        {"role": "user", "content": "Weather in Paris?"}], [WEATHER]),
    ("tool calls and results", [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Weather in Paris, and search cafes"},
        {"role": "assistant", "content": "", "tool_calls": [CALL_ARGS_TEXT, CALL_ARGS_OBJ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5}"},
        {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "Cafe A, Cafe B"},
    ], [WEATHER, SEARCH]),
    ("tool call with text and reasoning", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "Need the tool.",
         "tool_calls": [CALL_ARGS_TEXT]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks"},
    ], [WEATHER]),
    ("null content with tool call", [
        {"role": "user", "content": "Search"},
        {"role": "assistant", "content": None, "tool_calls": [CALL_ARGS_OBJ]},
        {"role": "tool", "content": "results"},
    ], [SEARCH]),
    ("content parts", [{"role": "user", "content": [{"type": "text", "text": "Part one, "},
                                                     {"type": "text", "text": "part two."}]}], None),
    ("unicode", [{"role": "user", "content": "\u65e5\u672c\u8a9e \U0001f642 caf\u00e9\u00a0\t"}], None),
    ("image part", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
     None),
    ("no user query", [{"role": "system", "content": "only a system turn"}], None),
    ("system not first", [{"role": "user", "content": "hi"},
                          {"role": "system", "content": "late"}], None),
    ("unknown role", [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}],
     None),
]

PIECES = ["Hello", " world", "\n", "\n\n", "  ", "\t", "<think>", "</think>", "<tool_response>",
          "</tool_response>", "\u00e9", "\u65e5\u672c", "\U0001f642", "\u00a0", "'", '"', "{", "}",
          "<|im_end|>", "x" * 40, "1.5", "True", "None", "\\n"]


def random_conversations(rng, n):
    """Random but well-formed OpenAI conversations over awkward text pieces."""
    def text():
        return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 8)))
    out = []
    for i in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": text()})
        for _ in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": text()})
            r = rng.random()
            if r < 0.3:
                msgs.append({"role": "assistant", "content": text()})
            elif r < 0.5:
                msgs.append({"role": "assistant", "content": text(), "reasoning_content": text()})
            elif r < 0.7:
                args = {"q": text(), "n": rng.randint(-5, 5), "f": rng.choice([0.25, 1e-7, 3.0]),
                        "b": rng.random() < 0.5, "l": [text(), None], "o": {"k": text()}}
                msgs.append({"role": "assistant", "content": text() if rng.random() < 0.5 else "",
                             "tool_calls": [{"id": "c%d" % i, "type": "function", "function": {
                                 "name": "search",
                                 "arguments": json.dumps(args) if rng.random() < 0.5 else args}}]})
                for _ in range(rng.randint(1, 2)):
                    msgs.append({"role": "tool", "content": text()})
        out.append(("random %d" % i, msgs, [SEARCH] if rng.random() < 0.5 else None))
    return out


MODES = [(-1, True), (0, True), (1, True), (-1, False)]

OTHER_TEMPLATE = ("{%- for m in messages %}### {{ m.role | upper }}: {{ m.content | trim }}\n"
                  "{% endfor %}{% if add_generation_prompt %}### ASSISTANT:{% endif %}")


def load_oracle(path):
    spec = importlib.util.spec_from_file_location("tokenizer_oracle_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def hf_normalise(messages):
    """What vLLM does before HF's renderer: tool-call arguments given as JSON text parsed."""
    out = copy.deepcopy(messages)
    for m in out:
        for tc in m.get("tool_calls") or []:
            if isinstance(tc["function"].get("arguments"), str):
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
    return out


def hf_render(tok, template, messages, tools, thinking, gen):
    kwargs = {} if thinking < 0 else {"enable_thinking": bool(thinking)}
    try:
        enc = tok.apply_chat_template(hf_normalise(messages), tools=tools, chat_template=template,
                                      add_generation_prompt=gen, tokenize=True, **kwargs)
        ids = enc["input_ids"] if not isinstance(enc, list) else enc
        text = tok.apply_chat_template(hf_normalise(messages), tools=tools,
                                       chat_template=template, add_generation_prompt=gen,
                                       tokenize=False, **kwargs)
        return {"ids": list(ids), "text": text}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


def run_tool(tool, model, template_path, records):
    args = [tool, model] + ([template_path] if template_path else [])
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    res = subprocess.run(args, input=data, stdout=subprocess.PIPE, check=True)
    lines = [json.loads(l) for l in res.stdout.decode().splitlines()]
    return lines[0]["thinking_default"], lines[1:]


def compare(name, tool, tok, model, template_path, template, cases, failures):
    records, expected = [], []
    for label, msgs, tools in cases:
        for thinking, gen in MODES:
            rec = {"messages": msgs, "thinking": thinking, "add_generation_prompt": gen}
            if tools:
                rec["tools"] = tools
            records.append(rec)
            expected.append((f"{name}: {label} (thinking {thinking}, gen {gen})",
                             hf_render(tok, template, msgs, tools, thinking, gen)))
    thinking_default, got = run_tool(tool, model, template_path, records)
    n_ok = 0
    for (label, want), have in zip(expected, got):
        if "error" in want:
            if have.get("error") != want["error"]:
                failures.append(f"{label}: HF raised {want['error']!r}, deltaserve gave {have}")
                continue
        elif have.get("ids") != want["ids"]:
            failures.append(f"{label}: ids differ\n  HF:         {want['text']!r}\n"
                            f"  deltaserve: {have.get('text', have.get('error'))!r}")
            continue
        n_ok += 1
    print(f"{name}: {n_ok}/{len(expected)} renders equal transformers'")
    return thinking_default, got


def main():
    tool, _ref, demo, qwen_path, oracle_path = sys.argv[1:6]
    with open(qwen_path, "rb") as f:
        qwen_src = f.read()
    assert hashlib.sha256(qwen_src).hexdigest() == QWEN35_SHA256, "Qwen3.5 template fixture changed"
    qwen_src = qwen_src.decode()
    oracle = load_oracle(oracle_path)
    hf_tk, _specials, _n = oracle.build_hf(demo)
    tok = PreTrainedTokenizerFast(tokenizer_object=hf_tk)
    failures = []

    thinking_default, got = compare("qwen3.5", tool, tok, demo, qwen_path, qwen_src, CASES,
                                    failures)
    if thinking_default is not True:
        failures.append("qwen3.5: thinking_default should be true")
    # the generation prompt with thinking on or by default ends inside <think>, off does not
    modes = {(t, g): i for i, (t, g) in enumerate(MODES)}
    first = got[:len(MODES)]
    import random
    compare("qwen3.5 random", tool, tok, demo, qwen_path, qwen_src,
            random_conversations(random.Random(29), 60), failures)
    if not (first[modes[(-1, True)]]["in_reasoning"] and first[modes[(1, True)]]["in_reasoning"]
            and not first[modes[(0, True)]]["in_reasoning"]
            and not first[modes[(-1, False)]]["in_reasoning"]):
        failures.append(f"qwen3.5: in_reasoning wrong: {first}")

    # the demo model's own template, read from its GGUF by the tool
    import gguf
    r = gguf.GGUFReader(demo)
    fld = r.fields["tokenizer.chat_template"]
    demo_src = bytes(fld.parts[fld.data[0]]).decode()
    plain = [c for c in CASES if c[2] is None and not isinstance(c[1][0]["content"], list)]
    td, _ = compare("demo", tool, tok, demo, None, demo_src, plain, failures)
    if td is not False:
        failures.append("demo: a template without a thinking switch does not think by default")

    # a GGUF whose template differs renders by it
    with tempfile.TemporaryDirectory() as d:
        other = os.path.join(d, "other.gguf")
        bindir = os.path.dirname(sys.executable)
        subprocess.run([os.path.join(bindir, "gguf-new-metadata"), "--chat-template",
                        OTHER_TEMPLATE, "--force", demo, other], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, got_other = compare("other", tool, tok, other, None, OTHER_TEMPLATE, plain[:3],
                               failures)
        if not got_other or "### USER: Hello!" not in got_other[0].get("text", ""):
            failures.append(f"other: the GGUF's own template was not used: {got_other[:1]}")

    for f in failures:
        print("FAIL", f)
    if failures:
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
