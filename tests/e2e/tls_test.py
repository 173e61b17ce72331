"""TLS and mTLS on the service (README "Security"): a CA, server and client certificates are
made with openssl into TEST_TMPDIR; a worker serves TLS (and, in the mTLS fixture, requires
client certificates signed by the CA) with a plaintext health-only port for the probes; a
router serves TLS, calls the worker over TLS (presenting its client certificate in mTLS).
Checks: a TLS client streams a generation; a plaintext client to the TLS port is refused; a
client trusting another CA fails, and `deltaserve client` says so naming TLS/certificate; the
health-only port answers health and nothing else. Errors that say what is wrong: a plaintext
`deltaserve client` on the TLS port is told the server speaks TLS, a TLS one on a plaintext port
that it is not using TLS, and a router calling a plaintext port with --tls-ca logs the same; a
--tls-ca (or --tls-cert, --tls-client-ca) file that is unreadable or not PEM stops the router or
worker at start-up with a message naming the flag and the file."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

grpc = h.grpc
HEALTH_RE = r"health \(plaintext\) on (\S+?):(\d+)"


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
            name + ".pem", "-days", "2", "-subj", "/CN=" + name, cwd=d)


def make_cert(d, ca, name, usage):
    """A certificate for name signed by ca; usage serverAuth or clientAuth."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
            name + ".csr", "-subj", "/CN=" + name, cwd=d)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=%s\n"
                "subjectAltName=DNS:localhost,IP:127.0.0.1\n" % usage)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
            "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext",
            cwd=d)


def read(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


class Certs:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tls-", dir=os.environ.get("TEST_TMPDIR"))
        make_ca(self.dir, "ca")
        make_ca(self.dir, "other_ca")
        make_cert(self.dir, "ca", "server", "serverAuth")
        make_cert(self.dir, "ca", "client", "clientAuth")
        make_cert(self.dir, "other_ca", "stranger", "clientAuth")

    def path(self, name):
        return os.path.join(self.dir, name)


def health_addr(proc):
    m = proc.wait_line(HEALTH_RE)
    return "%s:%s" % (m.group(1), m.group(2))


def start(certs, mtls):
    """A TLS worker and a TLS router over it; readiness through the plaintext health ports."""
    wextra = ["--threads", "1", "--tls-cert", certs.path("server.pem"), "--tls-key",
              certs.path("server.key"), "--health-listen", "127.0.0.1:0"]
    if mtls:
        wextra += ["--tls-client-ca", certs.path("ca.pem")]
    w = h.Proc("tls_w%s" % ("_mtls" if mtls else ""),
               [h.binary(), "worker", "--model", h.tiny_model(), "--listen", "127.0.0.1:0",
                "--name", "tls_w"] + wextra)
    w.wait_listening()
    h.wait_serving(health_addr(w), "deltaserve.v1.Worker")
    rextra = ["--tls-cert", certs.path("server.pem"), "--tls-key", certs.path("server.key"),
              "--tls-ca", certs.path("ca.pem"), "--health-listen", "127.0.0.1:0"]
    if mtls:
        rextra += ["--tls-client-cert", certs.path("client.pem"), "--tls-client-key",
                   certs.path("client.key")]
    r = h.Proc("tls_router%s" % ("_mtls" if mtls else ""),
               [h.binary(), "router", "--listen", "127.0.0.1:0", "--workers", w.addr,
                "--poll-ms", "100", "--model", h.tiny_model()] + rextra)
    r.wait_listening()
    r.health = health_addr(r)
    h.wait_serving(r.health, "deltaserve.v1.Generation")
    return w, r


def tls_channel(certs, addr, ca="ca.pem", client=None):
    kw = {"root_certificates": read(certs.dir, ca)}
    if client:
        kw["private_key"] = read(certs.dir, client + ".key")
        kw["certificate_chain"] = read(certs.dir, client + ".pem")
    return grpc.secure_channel(addr, grpc.ssl_channel_credentials(**kw))


def generate(ch, timeout=60):
    stub = h.pb_grpc.GenerationStub(ch)
    return h.collect(stub.Generate(h.request(ids=[1, 2, 3], max_tokens=5, ignore_eos=True),
                                   timeout=timeout))


class TlsBase:
    MTLS = False

    @classmethod
    def setUpClass(cls):
        cls.certs = Certs()
        cls.w, cls.r = start(cls.certs, cls.MTLS)

    @classmethod
    def tearDownClass(cls):
        cls.r.stop()
        cls.w.stop()

    def test_tls_client_streams(self):
        ch = tls_channel(self.certs, self.r.addr)
        try:
            msgs, ids, _, final = generate(ch)
        finally:
            ch.close()
        self.assertEqual(len(ids), 5)
        self.assertIsNotNone(final)
        self.assertEqual(final.served_by, "tls_w")

    def test_plaintext_client_is_refused(self):
        for addr in (self.r.addr, self.w.addr):
            ch = grpc.insecure_channel(addr)
            try:
                with self.assertRaises(grpc.RpcError) as cm:
                    generate(ch, timeout=10)
                self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, addr)
            finally:
                ch.close()

    def test_wrong_ca_fails(self):
        ch = tls_channel(self.certs, self.r.addr, ca="other_ca.pem")
        try:
            with self.assertRaises(grpc.RpcError) as cm:
                generate(ch, timeout=10)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        finally:
            ch.close()

    def test_client_cli_over_tls_and_wrong_ca(self):
        rc, out, err = h.run_cli(["client", "--addr", self.r.addr, "--tls-ca",
                                  self.certs.path("ca.pem"), "--ids", "1,2,3", "--max-tokens",
                                  "4", "--ignore-eos", "--print-ids"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(out.strip().strip("[]").split(",")), 4, out)
        rc, out, err = h.run_cli(["client", "--addr", self.r.addr, "--tls-ca",
                                  self.certs.path("other_ca.pem"), "--ids", "1,2,3",
                                  "--max-tokens", "4", "--timeout-ms", "10000"])
        self.assertEqual(rc, 1, err)
        lines = [l for l in err.splitlines() if l.startswith("deltaserve client:")]
        self.assertEqual(len(lines), 1, err)
        self.assertIn("UNAVAILABLE", lines[0])
        self.assertRegex(lines[0], "TLS|certificate", lines[0])

    def test_health_port_serves_only_health(self):
        ch = grpc.insecure_channel(self.r.health)
        try:
            r = h.hpb_grpc.HealthStub(ch).Check(h.hpb.HealthCheckRequest(service=""), timeout=10)
            self.assertEqual(r.status, h.hpb.HealthCheckResponse.SERVING)
            with self.assertRaises(grpc.RpcError) as cm:
                generate(ch, timeout=10)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        finally:
            ch.close()


class Tls(TlsBase, unittest.TestCase):
    MTLS = False

    def client_error(self, addr, tls):
        argv = ["client", "--addr", addr, "--ids", "1,2,3", "--max-tokens", "2",
                "--timeout-ms", "10000"]
        if tls:
            argv += ["--tls-ca", self.certs.path("ca.pem")]
        rc, out, err = h.run_cli(argv)
        self.assertEqual(rc, 1, err)
        lines = [l for l in err.splitlines() if l.startswith("deltaserve client:")]
        self.assertEqual(len(lines), 1, err)
        return lines[0]

    def test_plaintext_client_is_told_the_server_speaks_tls(self):
        for addr in (self.r.addr, self.w.addr):
            line = self.client_error(addr, tls=False)
            self.assertIn("UNAVAILABLE", line)
            self.assertIn("the server at %s speaks TLS: use --tls-ca" % addr, line)

    def test_tls_client_is_told_the_server_is_not_using_tls(self):
        line = self.client_error(self.r.health, tls=True)  # the plaintext health-only port
        self.assertIn("the server at %s is not using TLS" % self.r.health, line)

    def test_router_says_a_worker_is_not_using_tls(self):
        w_health = health_addr(self.w)
        r = h.Proc("tls_router_to_plaintext",
                   [h.binary(), "router", "--listen", "127.0.0.1:0", "--workers", w_health,
                    "--poll-ms", "100", "--tls-ca", self.certs.path("ca.pem")])
        try:
            r.wait_listening()
            m = r.wait_line(r"worker \S+ is unhealthy: (.*)", timeout=30)
            self.assertIn("the server at %s is not using TLS" % w_health, m.group(1))
        finally:
            r.stop()


class StartupErrors(unittest.TestCase):
    """A bad TLS file is a start-up error naming the flag and the file."""

    @classmethod
    def setUpClass(cls):
        cls.certs = Certs()
        cls.not_pem = cls.certs.path("not_pem.txt")
        with open(cls.not_pem, "w") as f:
            f.write("this is not a certificate\n")
        cls.missing = cls.certs.path("missing.pem")

    def run_router(self, flags):
        argv = ["router", "--listen", "127.0.0.1:0", "--workers", "127.0.0.1:1"] + flags
        return h.run_cli(argv, timeout=30)

    def test_router_tls_ca(self):
        for path, what in ((self.missing, "No such file"), (self.not_pem, "not a PEM file")):
            rc, _, err = self.run_router(["--tls-ca", path])
            self.assertNotEqual(rc, 0, err)
            self.assertIn("--tls-ca %s: %s" % (path, what), err)
            self.assertNotIn("cannot open a channel", err)

    def test_router_client_cert_and_workers_dns(self):
        rc, _, err = h.run_cli(["router", "--listen", "127.0.0.1:0", "--workers-dns",
                                "localhost:1", "--tls-ca", self.certs.path("ca.pem"),
                                "--tls-client-cert", self.not_pem, "--tls-client-key",
                                self.certs.path("client.key")], timeout=30)
        self.assertNotEqual(rc, 0, err)
        self.assertIn("--tls-client-cert %s: not a PEM file" % self.not_pem, err)

    def test_worker_tls_files(self):
        base = ["worker", "--model", h.tiny_model(), "--listen", "127.0.0.1:0", "--threads", "1"]
        cases = (
            (["--tls-cert", self.not_pem, "--tls-key", self.certs.path("server.key")],
             "--tls-cert %s: not a PEM file" % self.not_pem),
            (["--tls-cert", self.certs.path("server.pem"), "--tls-key",
              self.certs.path("server.key"), "--tls-client-ca", self.missing],
             "--tls-client-ca %s: No such file" % self.missing),
        )
        for flags, want in cases:
            rc, _, err = h.run_cli(base + flags, timeout=30)
            self.assertNotEqual(rc, 0, err)
            self.assertIn(want, err)


class MutualTls(TlsBase, unittest.TestCase):
    MTLS = True

    def test_worker_requires_a_client_certificate(self):
        def load(ch):
            return h.pb_grpc.WorkerStub(ch).GetLoad(h.pb.GetLoadRequest(), timeout=10)

        ch = tls_channel(self.certs, self.w.addr, client="client")
        try:
            load(ch)  # the CA's client certificate is accepted
        finally:
            ch.close()
        for client in (None, "stranger"):  # none, or one from another CA: refused
            ch = tls_channel(self.certs, self.w.addr, client=client)
            try:
                with self.assertRaises(grpc.RpcError) as cm:
                    load(ch)
                self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, client)
            finally:
                ch.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
