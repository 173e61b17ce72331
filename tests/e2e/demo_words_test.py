"""The demo model (models/README.md) writes English through the service: 64 greedy tokens from a
fixed prompt, streamed by a router from a worker, are at least 85 % dictionary words (Debian's
wamerican list, /usr/share/dict/american-english, installed by tools/setup).

A word is a run of ASCII letters (with inner apostrophes: "don't", "package's"); it counts when
its lower-case form is in the list (lower-cased). The same check on the random tiny model
(`deltaserve gguf synth --preset tiny --quant f32 --seed 1`, what tools/run served before the
demo model) through the same router + worker path must fail: the check can tell text from
gibberish (measured: 1.00 for the demo model, 0.30-0.65 for the random one)."""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

PROMPT = "The Debian project"
N_TOKENS = 64
THRESHOLD = 0.85
DICT = "/usr/share/dict/american-english"
DEMO = os.path.join("models", "demo-en-17m.gguf")  # runfiles (//models:demo)


def word_rate(text, words):
    """(fraction of the words of text in the list, the words, the ones not in it)."""
    found = re.findall(r"[A-Za-z]+(?:'[A-Za-z]+)*", text)
    missing = [w for w in found if w.lower() not in words]
    return (len(found) - len(missing)) / max(1, len(found)), found, missing


def greedy_through_router(model, name):
    """N_TOKENS greedy tokens of PROMPT from a router + one worker serving model: (ids, text)."""
    w = h.start_worker(name + "_w", model=model, extra=["--threads", "1"])
    r = h.start_router([w], model=model, name=name + "_router")
    try:
        c = h.Client(r.addr)
        try:
            _, ids, text, final = c.generate(text=PROMPT, max_tokens=N_TOKENS, temperature=0.0,
                                             ignore_eos=True)
        finally:
            c.close()
    finally:
        r.stop()
        w.stop()
    return ids, text, final


class DemoWords(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(DICT, encoding="utf-8", errors="replace") as f:
            cls.words = {line.strip().lower() for line in f if line.strip()}

    def check_model(self, model, name):
        ids, text, final = greedy_through_router(model, name)
        self.assertIsNotNone(final)
        self.assertEqual(len(ids), N_TOKENS, text)
        rate, found, missing = word_rate(text, self.words)
        print("%s: %.3f of %d words in %s; not in it: %s\n%r" %
              (name, rate, len(found), DICT, missing, PROMPT + text), flush=True)
        self.assertGreaterEqual(len(found), 20, text)  # words, not one long token run
        return rate

    def test_demo_model_writes_dictionary_words(self):
        self.assertGreaterEqual(self.check_model(DEMO, "demo"), THRESHOLD)

    def test_random_model_fails_the_check(self):
        tmp = os.environ.get("TEST_TMPDIR") or h.log_dir()
        rnd = os.path.join(tmp, "random-tiny.gguf")
        h.run_cli(["gguf", "synth", "--preset", "tiny", "--quant", "f32", "--seed", "1", "-o", rnd],
                  check=True)
        self.assertLess(self.check_model(rnd, "random"), THRESHOLD)


if __name__ == "__main__":
    if not os.path.isfile(DICT):
        print("%s missing: install wamerican (tools/setup)" % DICT, file=sys.stderr)
        sys.exit(1)
    unittest.main(verbosity=2)
