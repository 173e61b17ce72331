"""--auth-token-file on the router (README "Security"): a Generation/Generate call without
"authorization: Bearer <token>" or with a wrong token gets UNAUTHENTICATED and reaches no
worker; the right token streams, the scheme in any case ("bearer", "BEARER"); `deltaserve
client --auth-token-file` sends it (and without it is refused, saying what to send); rewriting the token file switches tokens (the new one works,
the old one is refused); health is open without a token; reflection is open by default and
needs the token with --reflection-auth."""
import os
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

grpc = h.grpc
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
LIST_SERVICES = b"\x3a\x00"  # ServerReflectionRequest{list_services: ""}


def bearer(token):
    return (("authorization", "Bearer " + token),)


class Auth(unittest.TestCase):
    REFLECTION_AUTH = False

    @classmethod
    def setUpClass(cls):
        d = tempfile.mkdtemp(prefix="auth-", dir=os.environ.get("TEST_TMPDIR"))
        cls.token_file = os.path.join(d, "token")
        cls.write_token("first-token-0123456789")
        cls.current = "first-token-0123456789"
        cls.w = h.start_worker("auth_w", extra=["--threads", "1", "--metrics-listen",
                                                "127.0.0.1:0"])
        m = cls.w.wait_line(r"metrics on http://(\S+?):(\d+)/metrics")
        cls.metrics = "%s:%s" % (m.group(1), m.group(2))
        extra = ["--auth-token-file", cls.token_file]
        if cls.REFLECTION_AUTH:
            extra.append("--reflection-auth")
        cls.r = h.start_router([cls.w], name="auth_router" + ("_refl" if cls.REFLECTION_AUTH
                                                              else ""), extra=extra)
        cls.ch = grpc.insecure_channel(cls.r.addr)
        cls.gen = h.pb_grpc.GenerationStub(cls.ch)

    @classmethod
    def tearDownClass(cls):
        cls.ch.close()
        cls.r.stop()
        cls.w.stop()

    @classmethod
    def write_token(cls, token):
        tmp = cls.token_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(token + "\n")
        os.replace(tmp, cls.token_file)  # as a Secret update does: a new file

    def generate(self, metadata=None):
        req = h.request(ids=[1, 2, 3], max_tokens=3, ignore_eos=True)
        return h.collect(self.gen.Generate(req, timeout=30, metadata=metadata))

    def assert_unauthenticated(self, metadata):
        with self.assertRaises(grpc.RpcError) as cm:
            self.generate(metadata)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED, metadata)

    def prompt_tokens(self):
        url = "http://%s/metrics" % self.metrics
        with urllib.request.urlopen(url, timeout=10) as f:
            text = f.read().decode()
        return sum(float(l.split()[-1]) for l in text.splitlines()
                   if l.startswith("deltaserve:prompt_tokens_total"))

    def reflection(self, metadata=None):
        call = self.ch.stream_stream(REFLECTION)
        return list(call(iter([LIST_SERVICES]), timeout=10, metadata=metadata))


class AuthDefault(Auth):
    def test_tokens(self):
        token = "first-token-0123456789"
        self.assert_unauthenticated(None)
        self.assert_unauthenticated(bearer("wrong-token-0123456789"))
        self.assert_unauthenticated(bearer(token + "x"))
        self.assert_unauthenticated(bearer(token[:-1]))
        self.assert_unauthenticated((("authorization", token),))  # no "Bearer "
        _, ids, _, final = self.generate(bearer(token))
        self.assertEqual(len(ids), 3)
        self.assertIsNotNone(final)

        # rewritten: the new token works once re-read (at most a second), the old one is refused
        new = "second-token-abc"
        self.write_token(new)

        def new_works():
            try:
                self.generate(bearer(new))
                return True
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAUTHENTICATED:
                    raise
                return False

        h.wait_until(new_works, timeout=10, what="the rewritten token to be accepted",
                     interval=0.1)
        self.assert_unauthenticated(bearer(token))
        self.assert_unauthenticated(None)
        type(self).current = new

    def test_refused_calls_reach_no_worker(self):
        # the worker's prompt-token counter moves with every request it admits
        before = self.prompt_tokens()
        self.generate(bearer(self.current))
        h.wait_until(lambda: self.prompt_tokens() > before, what="the counter to move")
        before = self.prompt_tokens()
        for _ in range(20):
            self.assert_unauthenticated(bearer("nope"))
            self.assert_unauthenticated(None)
        self.assertEqual(self.prompt_tokens(), before)

    def test_scheme_in_any_case(self):
        for scheme in ("bearer", "BEARER", "BeArEr"):
            _, ids, _, _ = self.generate((("authorization", scheme + " " + self.current),))
            self.assertEqual(len(ids), 3, scheme)
        self.assert_unauthenticated((("authorization", "Bearer " + self.current.upper()),))

    def test_client_cli_sends_the_token(self):
        argv = ["client", "--addr", self.r.addr, "--ids", "1,2,3", "--max-tokens", "3",
                "--ignore-eos", "--print-ids", "--timeout-ms", "30000"]
        rc, out, err = h.run_cli(argv + ["--auth-token-file", self.token_file])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(out.strip().strip("[]").split(",")), 3, out)
        rc, out, err = h.run_cli(argv)
        self.assertEqual(rc, 1, err)
        self.assertIn("UNAUTHENTICATED", err)
        self.assertIn("authorization: Bearer", err)
        rc, out, err = h.run_cli(argv + ["--auth-token-file", self.token_file + ".missing"])
        self.assertEqual(rc, 1, err)
        self.assertIn("--auth-token-file %s.missing" % self.token_file, err)

    def test_health_is_open(self):
        r = h.hpb_grpc.HealthStub(self.ch).Check(
            h.hpb.HealthCheckRequest(service="deltaserve.v1.Generation"), timeout=10)
        self.assertEqual(r.status, h.hpb.HealthCheckResponse.SERVING)

    def test_reflection_open_by_default(self):
        msgs = self.reflection()
        self.assertEqual(len(msgs), 1)
        self.assertIn(b"deltaserve.v1.Generation", msgs[0])


class AuthReflection(Auth):
    REFLECTION_AUTH = True

    def test_reflection_needs_the_token(self):
        with self.assertRaises(grpc.RpcError) as cm:
            self.reflection()
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        msgs = self.reflection(bearer("first-token-0123456789"))
        self.assertIn(b"deltaserve.v1.Generation", msgs[0])

    def test_health_is_open(self):
        r = h.hpb_grpc.HealthStub(self.ch).Check(h.hpb.HealthCheckRequest(service=""), timeout=10)
        self.assertEqual(r.status, h.hpb.HealthCheckResponse.SERVING)


del Auth

if __name__ == "__main__":
    unittest.main(verbosity=2)
