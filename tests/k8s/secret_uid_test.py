"""The tls overlay's router and worker, run as the pods run them: under the pods' uid/gid
(65532, with fsGroup as a supplementary group, through setpriv), reading copies of their
Secrets laid out as kubelet lays them out (owner root, group fsGroup, the overlay's
defaultMode; tests/k8s/k8s_manifests_test.py secret_file_owner), with the overlay's args (paths
under the copies; loopback ports; the CPU and the demo model instead of a GPU and the PVC; the
worker dialled as localhost, the DNS name its test certificate carries). Checks that both start
and that a generation through the router, over TLS with the clients' token, streams tokens,
and that the router's HTTP port (--http-listen) answers GET /v1/models over TLS with that token
and 401 without it.
Then the control: the same files mounted as the issue found them (0440 root:root, no fsGroup)
make the router exit with "Permission denied".

Needs root (to set file owners and switch uid) and setpriv; skips with a printed reason without.

    run_test.sh secret_uid_test.py DELTASERVE_BIN K8S_README DSPROTO_PY MODEL_FILES...
                                        (the first *.gguf of MODEL_FILES is run)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import kustomize_lite  # noqa: E402
import k8s_manifests_test as mt  # noqa: E402

OVERLAY = "tls"
CLIENT_TOKEN = "client-token-0123456789"
WORKER_TOKEN = "worker-token-9876543210"


def openssl(d, *args):
    subprocess.run(["openssl"] + list(args), cwd=d, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def make_certs(d):
    """ca.pem; worker.{pem,key} (server auth, DNS:localhost); router.{pem,key} (server and client
    auth, DNS:localhost), as k8s/cert-manager's Certificates are made."""
    openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=deltaserve-ca")
    for name, usage in (("worker", "serverAuth"), ("router", "serverAuth,clientAuth")):
        openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                name + ".csr", "-subj", "/CN=" + name)
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=%s\nsubjectAltName=DNS:localhost\n"
                    % usage)
        openssl(d, "x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext")


def secret_files(certs):
    """The Secrets' keys -> contents, for the Secret names the overlay mounts."""
    def rd(n):
        with open(os.path.join(certs, n), "rb") as f:
            return f.read()
    return {
        "deltaserve-worker-tls": {"tls.crt": rd("worker.pem"), "tls.key": rd("worker.key"),
                                  "ca.crt": rd("ca.pem")},
        "deltaserve-router-tls": {"tls.crt": rd("router.pem"), "tls.key": rd("router.key"),
                                  "ca.crt": rd("ca.pem")},
        "deltaserve-worker-token": {"token": WORKER_TOKEN.encode()},
        "deltaserve-auth-token": {"token": CLIENT_TOKEN.encode()},
    }


def mount_secrets(w, root, secrets, fsgroup_override=False):
    """Writes each Secret mounted into w's container under root + mountPath, as kubelet would:
    owner root, group fsGroup (or root), the volume's mode. Returns {mountPath: host dir}."""
    psc = mt.pod_spec(w).get("securityContext", {})
    fsgroup = None if fsgroup_override else psc.get("fsGroup")
    uid, gid = mt.secret_file_owner(fsgroup)
    out = {}
    for c, path, secret, modes in mt.secret_mounts(w):
        d = root + path
        os.makedirs(d, exist_ok=True)
        for key, data in secrets[secret].items():
            f = os.path.join(d, key)
            with open(f, "wb") as fh:
                fh.write(data)
            os.chown(f, uid, gid)
            os.chmod(f, 0o440 if fsgroup_override else modes[0])
        out[path] = d
    return out


def local_args(args, mounts, workers=None):
    """The overlay's args for a run on loopback: mounted paths mapped to the copies, ports 0 on
    127.0.0.1, the CPU, --workers-dns replaced by the local worker."""
    out = []
    for a in args:
        k, _, v = a.partition("=")
        if k in ("--listen", "--health-listen", "--http-listen"):
            a = "%s=127.0.0.1:0" % k
        elif k in ("--metrics-listen",):
            continue
        elif k == "--device":
            a = "--device=cpu"
        elif k == "--workers-dns":
            a = "--workers=%s" % workers
        else:
            for mpath, host in mounts.items():
                if v.startswith(mpath + "/"):
                    a = "%s=%s" % (k, host + v[len(mpath):])
        out.append(a)
    return out


def start(tmp, name, binary, args, env, uid, gid, groups):
    log = open(os.path.join(tmp, name + ".log"), "w+")
    cmd = ["setpriv", "--reuid", str(uid), "--regid", str(gid)]
    cmd += ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
    p = subprocess.Popen(cmd + ["--", binary] + args, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=tmp,
                         start_new_session=True)
    return p, log


def wait_listening(p, log, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log.seek(0)
        text = log.read()
        m = re.search(r"listening on (\S+?):(\d+)", text)
        if m:
            return int(m.group(2))
        if p.poll() is not None:
            break
        time.sleep(0.05)  # polls the log for the line printed once bound
    log.seek(0)
    raise RuntimeError("exited %s before listening:\n%s" % (p.poll(), log.read()[-3000:]))


def generate(port, ca):
    import grpc
    import dsproto
    pb, pb_grpc, _, _ = dsproto.load()
    with open(ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    with grpc.secure_channel("localhost:%d" % port, creds) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        req = pb.GenerateRequest(text="Once upon a time")
        req.stopping.max_new_tokens = 8
        req.stopping.ignore_eos = True
        deadline = time.monotonic() + 60
        while True:  # the router answers UNAVAILABLE until its health poll has seen the worker
            try:
                msgs = list(pb_grpc.GenerationStub(ch).Generate(
                    req, timeout=60, metadata=[("authorization", "Bearer " + CLIENT_TOKEN)]))
                return [t for m in msgs for t in m.token_ids], msgs[-1].finish_reason if msgs else None
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def http_models(url, ca, token):
    """(status, body) of GET url/models over TLS verified with ca, with the token if given."""
    import ssl
    import urllib.error
    import urllib.request
    ctx = ssl.create_default_context(cafile=ca)
    req = urllib.request.Request(url + "/models")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def main():
    binary, k8s_dir, dsproto_py = (os.path.realpath(a) for a in sys.argv[1:4])
    model = os.path.realpath(next(a for a in sys.argv[4:] if a.endswith(".gguf")))
    if os.path.isfile(k8s_dir):
        k8s_dir = os.path.dirname(k8s_dir)
    if os.geteuid() != 0:
        print("SKIP: not root: cannot give the copies kubelet's owners or switch to the pods' uid")
        return 0
    if not shutil.which("setpriv"):
        print("SKIP: setpriv (util-linux) is not installed")
        return 0
    sys.path.insert(0, os.path.dirname(dsproto_py))
    objs = kustomize_lite.render(os.path.join(k8s_dir, "overlays", OVERLAY))
    worker = next(o for o in objs if o["kind"] == "StatefulSet")
    router = next(o for o in objs if o["kind"] == "Deployment")
    # /tmp, not TEST_TMPDIR: the unprivileged uid must reach every folder above the files
    tmp = tempfile.mkdtemp(prefix="k8s-secret-uid-", dir="/tmp")
    procs = []
    try:
        probe = os.path.join(tmp, "probe")
        open(probe, "w").close()
        try:
            os.chown(probe, 65532, 65532)
        except OSError as e:
            print("SKIP: cannot give files to uid 65532 here (%s): a user namespace without it "
                  "mapped (run outside Bazel's sandbox: the target is tagged no-sandbox)" % e)
            return 0
        os.chmod(tmp, 0o755)
        certs = os.path.join(tmp, "certs")
        os.makedirs(certs)
        make_certs(certs)
        secrets = secret_files(certs)
        shutil.copy(binary, os.path.join(tmp, "deltaserve"))
        shutil.copy(model, os.path.join(tmp, "model.gguf"))
        for f in ("deltaserve", "model.gguf"):
            os.chmod(os.path.join(tmp, f), 0o755)
        exe = os.path.join(tmp, "deltaserve")
        env = {"PATH": "/usr/bin:/bin", "DS_MODEL": os.path.join(tmp, "model.gguf"),
               "DS_THREADS": "2", "DS_LOG_LEVEL": "info"}

        def ids(w):
            psc = mt.pod_spec(w)["securityContext"]
            return psc["runAsUser"], psc["runAsGroup"], [g for g in [psc.get("fsGroup")] if g is not None]

        wmounts = mount_secrets(worker, os.path.join(tmp, "worker"), secrets)
        wargs = local_args(mt.pod_spec(worker)["containers"][0]["args"], wmounts)
        print("worker (uid %d gid %d groups %s): %s" % (*ids(worker), " ".join(wargs)))
        p, log = start(tmp, "worker", exe, wargs, env, *ids(worker))
        procs.append(p)
        wport = wait_listening(p, log)
        rmounts = mount_secrets(router, os.path.join(tmp, "router"), secrets)
        rargs = local_args(mt.pod_spec(router)["containers"][0]["args"], rmounts,
                           workers="localhost:%d" % wport)
        print("router (uid %d gid %d groups %s): %s" % (*ids(router), " ".join(rargs)))
        p, log = start(tmp, "router", exe, rargs, env, *ids(router))
        procs.append(p)
        rport = wait_listening(p, log)
        toks, finish = generate(rport, os.path.join(certs, "ca.pem"))
        print("generation through the router: %d tokens, finish_reason %s" % (len(toks), finish))
        if len(toks) != 8:
            print("FAIL: expected 8 tokens")
            return 1
        log.seek(0)
        m = re.search(r"HTTP \(OpenAI API\) on (https?)://\S+?:(\d+)/v1", log.read())
        if not m or m.group(1) != "https":
            print("FAIL: the router logged no https HTTP API line (--http-listen with TLS)")
            return 1
        url = "https://localhost:%s/v1" % m.group(2)
        ca = os.path.join(certs, "ca.pem")
        ok, body = http_models(url, ca, CLIENT_TOKEN)
        no, _ = http_models(url, ca, None)
        print("HTTP API %s: /v1/models %d with the token, %d without" % (url, ok, no))
        if ok != 200 or '"object":"list"' not in body.replace(" ", "") or no != 401:
            print("FAIL: expected 200 with a model list and 401 without the token: %s" % body)
            return 1
        # control: the files as the issue found them (0440 root:root, no fsGroup)
        bad = mount_secrets(router, os.path.join(tmp, "router-root"), secrets, fsgroup_override=True)
        bargs = local_args(mt.pod_spec(router)["containers"][0]["args"], bad,
                           workers="localhost:%d" % wport)
        p, log = start(tmp, "router-root", exe, bargs, env, *ids(router)[:2], [])
        procs.append(p)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            print("FAIL: the router read 0440 root:root secrets as uid %d" % ids(router)[0])
            return 1
        log.seek(0)
        text = log.read()
        if p.returncode == 0 or "Permission denied" not in text:
            print("FAIL: control run exited %s without 'Permission denied':\n%s" % (p.returncode, text))
            return 1
        print("control: 0440 root:root without fsGroup: router exited %d (%s)" % (
            p.returncode, next(l for l in text.splitlines() if "Permission denied" in l).strip()))
        print("secret uid test: ok")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
