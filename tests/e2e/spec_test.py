"""Speculative decoding end to end (issue 30): a worker with --speculative-k 2 on a synthetic
tiny model with an MTP head (`gguf synth --mtp`), beside a worker on the same model without
speculation, and a router (gRPC and the HTTP door) in front of the speculating one:

- greedy outputs are token-identical with and without speculation, and the final message's
  timings say verify runs were made (spec_verify_runs, spec_drafted <= 2 per run, spec_accepted
  <= spec_drafted);
- GetLoad's totals (speculative, spec_*) and the /metrics counters move by exactly what the
  requests' timings say; the worker without speculation reports none;
- a request with no_speculation (Generation through the router, and the HTTP door's
  "speculative": false) gets the same tokens, zero drafts in its timings, and moves no counter;
  a non-boolean "speculative" is a 400 naming the field;
- a seeded sampled request speculates and gives the tokens of the worker without speculation;
  one with a penalty makes no verify run and gives the tokens of the worker without it;
- the rolling acceptance rule: a worker with --spec-min-acceptance 0.99 stops each request's
  speculation after exactly 8 verify runs (the tokens those of the worker without it) and counts
  each in deltaserve:spec_switched_off_total; the speculating worker above runs with the rule off
  (0: its synthetic head accepts nothing, so every request speculates to its end) and exposes the
  counter at 0;
- --speculative-k outside 0..4, and --spec-min-acceptance outside 0..1, are refused at start with
  one line."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

pb = h.pb
K = 2
PROMPTS = [[1, 5, 9, 2, 7, 3], [4, 4, 8, 1, 0, 6, 2, 2], [11, 3, 2, 9, 5, 1, 30, 31, 7]]
N_NEW = 24
HTTP_RE = re.compile(r"HTTP \(OpenAI API\) on (https?)://(\S+?):(\d+)/v1")
METRICS = {"spec_verify_runs": "deltaserve:spec_verify_steps_total",
           "spec_drafted": "deltaserve:spec_draft_tokens_total",
           "spec_accepted": "deltaserve:spec_accepted_tokens_total"}
SWITCHED = "deltaserve:spec_switched_off_total"
MIN_RUNS = 8  # verify runs before the rolling acceptance may switch a request off


def metric(url, name):
    """The value of the unlabelled series name at url's /metrics (None: absent)."""
    with urllib.request.urlopen(url, timeout=10) as f:
        text = f.read().decode()
    vals = [float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ")]
    return vals[0] if len(vals) == 1 else None


def spec_timings(final):
    t = final.timings
    return (t.spec_verify_runs, t.spec_drafted, t.spec_accepted)


class Speculative(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"), prefix="ds-spec-")
        cls.model = os.path.join(cls.tmp, "tiny-mtp.gguf")
        h.run_cli(["gguf", "synth", "--preset", "tiny", "--quant", "f32", "--seed", "7", "--mtp",
                   "--threads", "2", "-o", cls.model], check=True)
        # the prefix cache off: a sequence resumed from a cached prefix does not speculate (the
        # MTP head has no rows for it), and these tests send the same prompts again
        common = ["--threads", "1", "--slots", "4", "--ctx", "512", "--prefix-cache-mb", "0"]
        cls.ws = h.start_worker("spec_on", model=cls.model,
                                extra=common + ["--speculative-k", str(K),
                                                "--spec-min-acceptance", "0",
                                                "--spec-gate=false",
                                                "--metrics-listen", "127.0.0.1:0"])
        m = cls.ws.wait_line(r"metrics on http://(\S+?):(\d+)/metrics")
        cls.metrics_url = "http://%s:%s/metrics" % (m.group(1), m.group(2))
        cls.wp = h.start_worker("spec_off", model=cls.model, extra=common)
        cls.r = h.start_router([cls.ws], model=cls.model, name="spec_router",
                               extra=["--http-listen", "127.0.0.1:0"])
        m = cls.r.wait_line(HTTP_RE.pattern)
        cls.http = "%s://%s:%s/v1" % (m.group(1), m.group(2), m.group(3))
        cls.cs, cls.cp, cls.cr = h.Client(cls.ws.addr), h.Client(cls.wp.addr), h.Client(cls.r.addr)
        cls.plain = [cls.cp.worker_generate(p, max_tokens=N_NEW, ignore_eos=True)[1]
                     for p in PROMPTS]

    @classmethod
    def tearDownClass(cls):
        for c in (cls.cs, cls.cp, cls.cr):
            c.close()
        cls.r.stop()
        cls.ws.stop()
        cls.wp.stop()

    def totals(self):
        """(GetLoad's spec totals, /metrics' counters) of the speculating worker, both as a
        dict keyed like the timings."""
        h.wait_until(lambda: self.cs.load().running == 0, 30, "the worker idle")
        load = self.cs.load()
        self.assertTrue(load.speculative)
        got = {k: getattr(load, k) for k in METRICS}
        with urllib.request.urlopen(self.metrics_url, timeout=10) as f:
            text = f.read().decode()
        mx = {}
        for k, name in METRICS.items():
            vals = [float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ")]
            self.assertEqual(len(vals), 1, "%s in /metrics:\n%s" % (name, text))
            mx[k] = int(vals[0])
        return got, mx

    def test_greedy_same_tokens_and_counters_move(self):
        before, _ = self.totals()
        runs = drafted = accepted = 0
        for p, want in zip(PROMPTS, self.plain):
            _, ids, _, final = self.cs.worker_generate(p, max_tokens=N_NEW, ignore_eos=True)
            self.assertEqual(ids, want, "greedy tokens differ with speculation on")
            self.assertEqual(len(ids), N_NEW)
            v, d, a = spec_timings(final)
            self.assertGreater(v, 0, "no verify run for a greedy request")
            self.assertLessEqual(d, K * v)
            self.assertGreaterEqual(d, v)
            self.assertLessEqual(a, d)
            # each run yields its accepted drafts and one more; the first token comes from the
            # prompt's row
            self.assertLessEqual(v + a, N_NEW - 1)
            runs, drafted, accepted = runs + v, drafted + d, accepted + a
        after, mx = self.totals()
        self.assertEqual(after["spec_verify_runs"] - before["spec_verify_runs"], runs)
        self.assertEqual(after["spec_drafted"] - before["spec_drafted"], drafted)
        self.assertEqual(after["spec_accepted"] - before["spec_accepted"], accepted)
        self.assertEqual(mx, after, "/metrics and GetLoad disagree")
        print("greedy: %d verify runs, %d drafted, %d accepted" % (runs, drafted, accepted))

    def test_sampled_requests(self):
        """A seeded sampled request speculates and gives the tokens of the worker without
        speculation (and repeats its counts); one with a penalty makes no verify run and gives
        that worker's tokens too."""
        runs = []
        for _ in range(2):
            _, ids, _, final = self.cs.worker_generate(PROMPTS[0], max_tokens=N_NEW, seed=11,
                                                       temperature=0.9, ignore_eos=True)
            v, d, a = spec_timings(final)
            self.assertGreater(v, 0, "no verify run for a sampled request")
            self.assertLessEqual(a, d)
            self.assertEqual(len(ids), N_NEW)
            runs.append((ids, (v, d, a)))
        self.assertEqual(runs[0], runs[1], "a seed gave other tokens the second time")
        _, plain, _, final = self.cp.worker_generate(PROMPTS[0], max_tokens=N_NEW, seed=11,
                                                     temperature=0.9, ignore_eos=True)
        self.assertEqual(spec_timings(final), (0, 0, 0))
        self.assertEqual(runs[0][0], plain, "speculation changed a sampled request's tokens")
        outs = []
        for c in (self.cs, self.cp):
            req = pb.WorkerGenerateRequest(prompt_token_ids=PROMPTS[0])
            h.fill_common(req, max_tokens=N_NEW, seed=11, temperature=0.9, ignore_eos=True)
            req.sampling.repetition_penalty = 1.2
            _, ids, _, final = h.collect(c.worker.Generate(req, timeout=60))
            self.assertEqual(spec_timings(final), (0, 0, 0))
            outs.append(ids)
        self.assertEqual(outs[0], outs[1])

    def test_worker_without_speculation_reports_none(self):
        _, ids, _, final = self.cp.worker_generate(PROMPTS[0], max_tokens=8, ignore_eos=True)
        self.assertEqual(spec_timings(final), (0, 0, 0))
        load = self.cp.load()
        self.assertFalse(load.speculative)
        self.assertEqual((load.spec_verify_runs, load.spec_drafted, load.spec_accepted), (0, 0, 0))

    def test_no_speculation_through_the_router(self):
        before, _ = self.totals()
        req = h.request(ids=PROMPTS[1], max_tokens=N_NEW, ignore_eos=True)
        req.no_speculation = True
        _, ids, _, final = h.collect(self.cr.gen.Generate(req, timeout=60))
        self.assertEqual(ids, self.plain[1])
        self.assertEqual(spec_timings(final), (0, 0, 0))
        after, _ = self.totals()
        self.assertEqual(after, before, "a no_speculation request moved the counters")
        # the same request without it speculates, through the router too
        _, ids, _, final = self.cr.generate(ids=PROMPTS[1], max_tokens=N_NEW, ignore_eos=True)
        self.assertEqual(ids, self.plain[1])
        self.assertGreater(final.timings.spec_verify_runs, 0)
        self.assertLessEqual(final.timings.spec_accepted, final.timings.spec_drafted)
        self.assertEqual(self.totals()[0]["spec_verify_runs"] - after["spec_verify_runs"],
                         final.timings.spec_verify_runs)

    def post(self, body):
        req = urllib.request.Request(self.http + "/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as f:
                return f.status, json.loads(f.read().decode())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode())

    def test_http_speculative_false(self):
        with urllib.request.urlopen(self.http + "/models", timeout=10) as f:
            model = json.loads(f.read().decode())["data"][0]["id"]
        body = {"model": model, "prompt": PROMPTS[2], "max_tokens": N_NEW, "temperature": 0,
                "ignore_eos": True}
        before, _ = self.totals()
        code, off = self.post(dict(body, speculative=False))
        self.assertEqual(code, 200, off)
        self.assertEqual(off["usage"]["completion_tokens"], N_NEW)
        self.assertEqual(self.totals()[0], before, '"speculative": false moved the counters')
        code, on = self.post(dict(body, speculative=True))
        self.assertEqual(code, 200, on)
        self.assertEqual(on["choices"][0]["text"], off["choices"][0]["text"])
        self.assertGreater(self.totals()[0]["spec_verify_runs"], before["spec_verify_runs"])
        code, bad = self.post(dict(body, speculative="no"))
        self.assertEqual(code, 400, bad)
        self.assertEqual(bad["error"]["param"], "speculative", bad)

    def test_rolling_acceptance_switches_off(self):
        # the worker above: the rule off, the counter exposed at 0 and GetLoad's the same
        h.wait_until(lambda: self.cs.load().running == 0, 30, "the worker idle")
        self.assertEqual(self.cs.load().spec_switched_off, 0)
        self.assertEqual(metric(self.metrics_url, SWITCHED), 0)
        w = h.start_worker("spec_strict", model=self.model,
                           extra=["--threads", "1", "--slots", "4", "--ctx", "512",
                                  "--prefix-cache-mb", "0", "--speculative-k", str(K),
                                  "--spec-min-acceptance", "0.99", "--spec-gate=false",
                                  "--metrics-listen", "127.0.0.1:0"])
        try:
            m = w.wait_line(r"metrics on http://(\S+?):(\d+)/metrics")
            url = "http://%s:%s/metrics" % (m.group(1), m.group(2))
            self.assertEqual(metric(url, SWITCHED), 0)
            c = h.Client(w.addr)
            try:
                for p, want in zip(PROMPTS, self.plain):
                    _, ids, _, final = c.worker_generate(p, max_tokens=N_NEW, ignore_eos=True)
                    self.assertEqual(ids, want, "greedy tokens differ once switched off")
                    v, d, a = spec_timings(final)
                    # the first 8 runs would have to accept nearly every draft to stay on
                    self.assertEqual((v, d), (MIN_RUNS, K * MIN_RUNS), final.timings)
                    self.assertLess(v + a, N_NEW - 1, "no plain decode step after the switch")
                h.wait_until(lambda: c.load().running == 0, 30, "the worker idle")
                load = c.load()
                self.assertEqual(load.spec_verify_runs, MIN_RUNS * len(PROMPTS))
                self.assertEqual(load.spec_switched_off, len(PROMPTS))
            finally:
                c.close()
            self.assertEqual(metric(url, SWITCHED), len(PROMPTS))
        finally:
            w.stop()

    def test_bad_min_acceptance_refused(self):
        for v in ("1.5", "-0.1"):
            p = subprocess.run([h.binary(), "worker", "--model", self.model, "--listen",
                                "127.0.0.1:0", "--speculative-k", "2", "--spec-min-acceptance", v],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
            err = p.stderr.decode()
            self.assertEqual(p.returncode, 2, err)
            self.assertIn("--spec-min-acceptance must be 0..1", err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_bad_k_refused(self):
        for k in ("5", "-1"):
            p = subprocess.run([h.binary(), "worker", "--model", self.model, "--listen",
                                "127.0.0.1:0", "--speculative-k", k], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=60)
            err = p.stderr.decode()
            self.assertEqual(p.returncode, 2, err)
            self.assertIn("--speculative-k 0..4", err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)


if __name__ == "__main__":
    unittest.main()
