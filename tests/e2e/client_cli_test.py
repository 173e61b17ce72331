"""`deltaserve client` against a router + one worker on the tiny reference model: output
formats (text, --print-ids, --json), prompts (--prompt, --ids, --chat), stop strings
(repeated and comma lists), --worker direct mode, --model-info and --abort, and exit codes (0 ok, 1 non-OK status with
"deltaserve client: CODE: message", 2 usage)."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

with open(h.tiny_json()) as f:
    REF = json.load(f)


class ClientCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = h.start_worker("cli_w", extra=["--threads", "1"])
        cls.r = h.start_router([cls.w], name="cli_router")

    @classmethod
    def tearDownClass(cls):
        cls.r.stop()
        cls.w.stop()

    def client(self, *args):
        return h.run_cli(["client", "--addr", self.r.addr] + list(args))

    def test_print_ids_is_the_reference_greedy(self):
        p = REF["prompts"][0]
        rc, out, err = self.client("--ids", ",".join(map(str, p["ids"])), "--max-tokens",
                                   str(len(p["greedy"])), "--ignore-eos", "--print-ids")
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out), p["greedy"])

    def test_text_output_is_the_detokenized_greedy(self):
        p = REF["prompts"][1]
        rc, out, err = self.client("--prompt", p["text"], "--max-tokens", str(len(p["greedy"])),
                                   "--ignore-eos")
        self.assertEqual(rc, 0, err)
        rc2, want, err2 = h.run_cli(["detokenize", "--model", h.tiny_model(), "--ids",
                                     ",".join(map(str, p["greedy"]))])
        self.assertEqual(rc2, 0, err2)
        self.assertEqual(out, want)  # exactly the text: no newline added when not a terminal

    def test_worker_direct(self):
        p = REF["prompts"][2]
        rc, out, err = h.run_cli(["client", "--worker", "--addr", self.w.addr, "--ids",
                                  ",".join(map(str, p["ids"])), "--max-tokens", "24",
                                  "--ignore-eos"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out), p["greedy"][:24])

    def test_model_info_and_abort(self):
        # the router's GetModelInfo equals the worker's; printed as one JSON object
        rc, out, err = h.run_cli(["client", "--worker", "--addr", self.w.addr, "--model-info"])
        self.assertEqual(rc, 0, err)
        want = json.loads(out)
        self.assertGreater(want["vocab_size"], 0)
        self.assertGreater(want["max_context"], 0)
        got = h.wait_until(lambda: (lambda r: r[0] == 0 and json.loads(r[1]))(
            self.client("--model-info")), 30, "the router's model info")
        self.assertEqual(got, want)
        rc, out, err = self.client("--abort", "cli-no-such-request")
        self.assertEqual((rc, json.loads(out)), (0, {"found": False}), err)
        rc, out, err = self.client("--abort", "")
        self.assertEqual(rc, 1)
        self.assertIn("INVALID_ARGUMENT: request_id", err)
        rc, _, err = self.client("--model-info", "--ids", "1")
        self.assertEqual(rc, 2, err)

    def test_json_and_logprobs(self):
        rc, out, err = self.client("--ids", "1,2,3", "--max-tokens", "4", "--ignore-eos",
                                   "--logprobs", "2", "--json")
        self.assertEqual(rc, 0, err)
        lines = [json.loads(l) for l in out.splitlines()]
        ids = [t for l in lines for t in l["token_ids"]]
        self.assertEqual(len(ids), 4)
        self.assertEqual(lines[-1]["finish_reason"], "length")
        self.assertEqual(lines[-1]["usage"]["completion_tokens"], 4)
        lps = [lp for l in lines for lp in l.get("logprobs", [])]
        self.assertEqual([lp["token_id"] for lp in lps], ids)
        self.assertTrue(all(len(lp["top"]) == 2 for lp in lps))

    def test_chat_and_stop_strings(self):
        rc, out, err = self.client("--chat", "Hello", "--max-tokens", "8", "--verbose")
        self.assertEqual(rc, 0, err)
        self.assertIn("finish_reason=", err)
        p = REF["prompts"][3]
        ids = ",".join(map(str, p["ids"]))
        rc, full, err = self.client("--ids", ids, "--max-tokens", "24", "--ignore-eos")
        self.assertEqual(rc, 0, err)
        stop = full[len(full) // 2:len(full) // 2 + 2]
        want = full[:full.find(stop)]
        for args in (["--stop", "\u2603nope", "--stop", stop], ["--stop", "\u2603nope," + stop],
                     ["--stop=" + stop]):
            rc, out, err = self.client("--ids", ids, "--max-tokens", "24", "--ignore-eos",
                                       "--verbose", *args)
            self.assertEqual(rc, 0, err)
            # --verbose ends the text's line before the summary
            nl = "\n" if want and not want.endswith("\n") else ""
            self.assertEqual(out, want + nl, args)
            self.assertIn('stop_string="%s"' % stop, err)

    def test_error_status_exits_1_with_the_code(self):
        rc, out, err = self.client("--prompt", "")
        self.assertEqual(rc, 1)
        self.assertIn("deltaserve client: INVALID_ARGUMENT: text", err)
        rc, out, err = self.client("--ids", "1", "--max-tokens", "4000", "--ignore-eos",
                                   "--timeout-ms", "50")
        self.assertEqual(rc, 1)
        self.assertIn("DEADLINE_EXCEEDED", err)
        rc, out, err = h.run_cli(["client", "--addr", "127.0.0.1:1", "--ids", "1",
                                  "--timeout-ms", "5000"])
        self.assertEqual(rc, 1)
        self.assertIn("UNAVAILABLE", err)

    def test_usage_errors_exit_2(self):
        for args in ([], ["--prompt", "a", "--ids", "1"], ["--ids", "1,x"],
                     ["--worker", "--prompt", "a"], ["--bogus"]):
            rc, out, err = self.client(*args)
            self.assertEqual(rc, 2, (args, err))
            self.assertTrue(err.startswith("deltaserve client"), err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
