"""Workers addressed by name over TLS (docs/SECURITY.md), as in a cluster: the test re-runs itself
in a user + network + mount namespace (`unshare --user --map-root-user --net --mount`) with lo
up and /etc/hosts bind-mounted to a file that names two loopback addresses (127.0.0.1 and
127.0.0.2) as the headless Service deltaserve-worker.ns1.svc.cluster.local. Two workers listen on
port 50051 of those addresses with a certificate whose SANs are DNS names only (the Service name
and its wildcard, as cert-manager issues them); the router resolves --workers-dns to the IPs and
verifies each worker under the Service name.

Checks: a generation streams over TLS and over mTLS through both workers; a worker whose
certificate names another host is refused (the router's log names the certificate/name
problem and the client gets UNAVAILABLE); --workers-tls-name verifies workers given by IP
(--workers) under a name; a worker with --auth-token-file refuses Worker calls without the
token (UNAUTHENTICATED, saying what to send), serves a router with --worker-token-file, and a
router without it reports the worker unhealthy with that message. Without unshare (no user
namespaces where it runs) the test prints why and skips."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

grpc = h.grpc
NS = "ns1"
SVC = "deltaserve-worker.%s.svc.cluster.local" % NS
PORT = 50051
IPS = ("127.0.0.1", "127.0.0.2")
HEALTH_RE = r"health \(plaintext\) on (\S+?):(\d+)"
INSIDE = "DS_TLS_DNS_INSIDE"


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


class Certs:
    """A CA; "worker" with DNS SANs for the Service only; "wrong" for another name; "router"
    a client certificate (mTLS)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tlsdns-", dir=os.environ.get("TEST_TMPDIR"))
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                "ca.pem", "-days", "2", "-subj", "/CN=test-ca", cwd=self.dir)
        self.make("worker", "serverAuth", "DNS:%s,DNS:*.%s" % (SVC, SVC))
        self.make("wrong", "serverAuth", "DNS:other-service.%s.svc.cluster.local" % NS)
        self.make("router", "clientAuth", "DNS:deltaserve-router.%s.svc.cluster.local" % NS)

    def make(self, name, usage, san):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                name + ".csr", "-subj", "/CN=" + name, cwd=self.dir)
        with open(self.path(name + ".ext"), "w") as f:
            f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=%s\nsubjectAltName=%s\n"
                    % (usage, san))
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile",
                name + ".ext", cwd=self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)

    def read(self, name):
        with open(self.path(name), "rb") as f:
            return f.read()


def start_worker(certs, ip, cert="worker", mtls=False, token_file=None, name=None):
    name = name or "dns_w_%s_%s%s%s" % (ip.replace(".", "_"), cert, "_mtls" if mtls else "",
                                       "_tok" if token_file else "")
    argv = [h.binary(), "worker", "--model", h.tiny_model(), "--listen", "%s:%d" % (ip, PORT),
            "--name", "w" + ip.rsplit(".", 1)[1], "--threads", "1",
            "--tls-cert", certs.path(cert + ".pem"), "--tls-key", certs.path(cert + ".key"),
            "--health-listen", "%s:0" % ip]
    if mtls:
        argv += ["--tls-client-ca", certs.path("ca.pem")]
    if token_file:
        argv += ["--auth-token-file", token_file]
    w = h.Proc(name, argv)
    w.wait_listening()
    m = w.wait_line(HEALTH_RE)
    w.health = "%s:%s" % (m.group(1), m.group(2))
    h.wait_serving(w.health, "deltaserve.v1.Worker")
    return w


def start_router(certs, name, workers=None, mtls=False, extra=(), ready=True):
    argv = [h.binary(), "router", "--listen", "127.0.0.1:0", "--poll-ms", "100",
            "--model", h.tiny_model(), "--tls-ca", certs.path("ca.pem")]
    argv += ["--workers", workers] if workers else ["--workers-dns", "%s:%d" % (SVC, PORT)]
    if mtls:
        argv += ["--tls-client-cert", certs.path("router.pem"), "--tls-client-key",
                 certs.path("router.key")]
    r = h.Proc(name, argv + list(extra))
    r.wait_listening()
    if ready:
        h.wait_serving(r.addr, "deltaserve.v1.Generation")
    return r


def generate(addr, n=5):
    ch = grpc.insecure_channel(addr)
    try:
        stub = h.pb_grpc.GenerationStub(ch)
        return h.collect(stub.Generate(h.request(ids=[1, 2, 3], max_tokens=n, ignore_eos=True),
                                       timeout=60))
    finally:
        ch.close()


def served_by_all(testcase, addr, names, tries=40):
    """Generations through the router until each worker name served one."""
    seen = set()
    for _ in range(tries):
        _, ids, _, final = generate(addr)
        testcase.assertEqual(len(ids), 5)
        seen.add(final.served_by)
        if seen >= set(names):
            break
    testcase.assertEqual(seen, set(names))


def stop_all(*procs):
    for p in procs:
        if p is not None:
            p.stop()


class DnsNames(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.certs = Certs()

    def test_resolves_to_both_addresses(self):
        import socket
        got = sorted({ai[4][0] for ai in socket.getaddrinfo(SVC, PORT, socket.AF_INET,
                                                              socket.SOCK_STREAM)})
        self.assertEqual(got, list(IPS))

    def run_pair(self, mtls):
        ws = [start_worker(self.certs, ip, mtls=mtls) for ip in IPS]
        r = None
        try:
            r = start_router(self.certs, "dns_router%s" % ("_mtls" if mtls else ""), mtls=mtls)
            r.wait_line(r"worker certificates are verified against the name " + SVC.replace(
                ".", r"\."))
            served_by_all(self, r.addr, ["w1", "w2"])
        finally:
            stop_all(r, *ws)

    def test_tls_by_service_name(self):
        self.run_pair(mtls=False)

    def test_mtls_by_service_name(self):
        self.run_pair(mtls=True)

    def test_wrong_name_is_refused(self):
        w = start_worker(self.certs, IPS[0], cert="wrong")
        r = None
        try:
            r = start_router(self.certs, "dns_router_wrong", ready=False)
            m = r.wait_line(r"worker %s:%d is unhealthy: (.*)" % (IPS[0].replace(".", r"\."),
                                                                    PORT), timeout=30)
            self.assertRegex(m.group(1), r"(?i)peer name|certificate|handshake", m.group(1))
            self.assertIn(SVC, m.group(1))
            self.assertIn("--workers-tls-name", m.group(1))
            with self.assertRaises(grpc.RpcError) as cm:
                generate(r.addr)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        finally:
            stop_all(r, w)

    def test_workers_tls_name_overrides(self):
        # the wrong-name worker verifies under the name its certificate carries; the
        # Service-name worker dialled by IP verifies under the Service name
        w = start_worker(self.certs, IPS[0], cert="wrong")
        w2 = start_worker(self.certs, IPS[1])
        r = r2 = None
        try:
            r = start_router(self.certs, "dns_router_override", extra=[
                "--workers-tls-name", "other-service.%s.svc.cluster.local" % NS])
            _, ids, _, final = generate(r.addr)
            self.assertEqual((len(ids), final.served_by), (5, "w1"))
            r2 = start_router(self.certs, "ip_router_named", workers="%s:%d" % (IPS[1], PORT),
                              extra=["--workers-tls-name", SVC])
            _, ids, _, final = generate(r2.addr)
            self.assertEqual((len(ids), final.served_by), (5, "w2"))
        finally:
            stop_all(r, r2, w, w2)

    def test_worker_token(self):
        d = tempfile.mkdtemp(prefix="wtok-", dir=os.environ.get("TEST_TMPDIR"))
        tok = os.path.join(d, "token")
        with open(tok, "w") as f:
            f.write("router-to-worker-0123456789\n")
        ws = [start_worker(self.certs, ip, mtls=True, token_file=tok) for ip in IPS]
        r = r2 = None
        try:
            # straight to a worker with the router's client certificate but no token
            creds = grpc.ssl_channel_credentials(
                root_certificates=self.certs.read("ca.pem"),
                private_key=self.certs.read("router.key"),
                certificate_chain=self.certs.read("router.pem"))
            ch = grpc.secure_channel("%s:%d" % (IPS[0], PORT), creds,
                                     options=(("grpc.ssl_target_name_override", SVC),))
            try:
                stub = h.pb_grpc.WorkerStub(ch)
                with self.assertRaises(grpc.RpcError) as cm:
                    stub.GetLoad(h.pb.GetLoadRequest(), timeout=10)
                self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                self.assertIn("authorization: Bearer", cm.exception.details())
                stub.GetLoad(h.pb.GetLoadRequest(), timeout=10,  # the scheme in any case
                             metadata=(("authorization", "bearer router-to-worker-0123456789"),))
            finally:
                ch.close()
            r = start_router(self.certs, "dns_router_token", mtls=True,
                             extra=["--worker-token-file", tok])
            served_by_all(self, r.addr, ["w1", "w2"])
            r2 = start_router(self.certs, "dns_router_no_token", mtls=True, ready=False)
            m = r2.wait_line(r"worker \S+ is unhealthy: (.*)", timeout=30)
            self.assertIn("token", m.group(1))
            with self.assertRaises(grpc.RpcError) as cm:
                generate(r2.addr)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        finally:
            stop_all(r, r2, *ws)


def reexec_in_namespace():
    """Runs this file again inside a user + network + mount namespace; returns its exit code,
    or None (with the reason printed) where such namespaces cannot be made."""
    unshare = shutil.which("unshare")
    why = None
    if not unshare:
        why = "no unshare binary"
    else:
        p = subprocess.run([unshare, "--user", "--map-root-user", "--net", "--mount", "true"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            why = "unshare --user --map-root-user --net --mount: %s" % p.stdout.decode(
                "utf-8", "replace").strip()
    if why:
        print("SKIP tls_dns_test: cannot make a network namespace (%s)" % why, flush=True)
        return None
    d = tempfile.mkdtemp(prefix="hosts-", dir=os.environ.get("TEST_TMPDIR"))
    hosts = os.path.join(d, "hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1 localhost\n")
        for ip in IPS:
            f.write("%s %s\n" % (ip, SVC))
    script = ('set -e; ip link set lo up; mount --bind "$1" /etc/hosts; shift; exec "$@"')
    env = dict(os.environ, **{INSIDE: "1"})
    return subprocess.call([unshare, "--user", "--map-root-user", "--net", "--mount", "sh", "-c",
                            script, "sh", hosts, sys.executable, os.path.realpath(__file__)]
                           + sys.argv[1:], env=env)


if __name__ == "__main__":
    if os.environ.get(INSIDE) != "1":
        rc = reexec_in_namespace()
        sys.exit(0 if rc is None else rc)
    unittest.main()
