"""k8s/ checked offline: every overlay renders (kubectl kustomize where installed, and always the
fallback renderer kustomize_lite.py, which must give the same objects), every object validates
against the Kubernetes schemas of K8S_VERSION (kubernetes-validate, strict: unknown fields are
errors), and the manifests agree with the binary they run:

  - every --flag in a container's args is in `deltaserve <subcommand> --help`, every DS_*
    environment variable (env, envFrom ConfigMaps) is one of that subcommand's fallbacks;
  - each gRPC probe's port is the container's "grpc" port and the port of its effective
    --listen (args > env > --help default), which listens on every interface;
  - probe service names: liveness "", readiness/startup the ones a running worker and router
    answer SERVING to over grpc.health.v1 (checked against the real processes);
  - the metrics port: --metrics-listen = containerPort "metrics" = prometheus.io/port;
  - the router's HTTP API: --http-listen on every interface = containerPort "http", and each
    Service of the router pods has a port "http" to it;
  - terminationGracePeriodSeconds >= preStop sleep + --grace-seconds + the 10 s final flush;
  - references resolve (serviceName, selectors, --workers-dns, ConfigMaps, volumes, HPA/PDB
    targets); non-root, read-only root filesystem; GPUs per overlay.

Then it breaks copies of the rendered objects on purpose and requires each check to fail.

    run_test.sh k8s_manifests_test.py DELTASERVE_BIN K8S_DIR_OR_A_FILE_IN_IT
"""
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import kustomize_lite  # noqa: E402

# The Kubernetes version the manifests are validated for (kubernetes-validate==1.37.0, pinned in
# tools/setup, ships the schemas up to 1.37). 1.32: preStop `sleep` (1.30+) and gRPC probes (1.27+).
K8S_VERSION = "1.32.0"
# Flags allowed to be missing from --help, in PENDING_OVERLAYS only (an overlay that uses a flag
# before the binary has it). Empty: every overlay's flags are checked against --help.
PENDING_FLAGS = set()
PENDING_OVERLAYS = set()
FLUSH_S = 10  # WORKER_SERVICE_FLUSH_MS, ROUTER_DRAIN_FLUSH_MS: final statuses after the grace
EXPECTED_GPUS = {"cpu": 0, "gpu": 1, "tp2": 2, "hostpath-model": 1, "monitoring": 1, "tls": 1}
# A ServiceMonitor is a CRD that kubernetes-validate has no schema for: checked against this
# hand-written subset of monitoring.coreos.com/v1 (the fields k8s/ uses), strictly.
SERVICEMONITOR_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"], "additionalProperties": False,
                     "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                                    "labels": {"type": "object",
                                               "additionalProperties": {"type": "string"}}}},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
                 "properties": {
                     "selector": {"type": "object", "additionalProperties": False, "properties": {
                         "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
                     "endpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["port"],
                         "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                        "interval": {"type": "string",
                                                     "pattern": "^([0-9]+(ms|s|m|h))+$"}}}}}},
    },
}
# cert-manager's Issuer and Certificate (cert-manager.io/v1, k8s/cert-manager): CRDs too, checked
# strictly against the subset of their schemas that the example uses.
_CM_META = {"type": "object", "required": ["name"], "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                           "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
_CM_DURATION = {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$"}
ISSUER_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": "Issuer"},
        "metadata": _CM_META,
        "spec": {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
                 "properties": {
                     "selfSigned": {"type": "object", "additionalProperties": False},
                     "ca": {"type": "object", "additionalProperties": False, "required": ["secretName"],
                            "properties": {"secretName": {"type": "string"}}}}},
    },
}
CERTIFICATE_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"}, "kind": {"const": "Certificate"},
        "metadata": _CM_META,
        "spec": {"type": "object", "additionalProperties": False, "required": ["secretName", "issuerRef"],
                 "properties": {
                     "secretName": {"type": "string"},
                     "isCA": {"type": "boolean"},
                     "commonName": {"type": "string", "maxLength": 64},
                     "duration": _CM_DURATION, "renewBefore": _CM_DURATION,
                     "dnsNames": {"type": "array", "items": {"type": "string"}},
                     "usages": {"type": "array", "items": {"enum": [
                         "digital signature", "key encipherment", "server auth", "client auth",
                         "cert sign", "crl sign"]}},
                     "privateKey": {"type": "object", "additionalProperties": False, "properties": {
                         "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                         "size": {"type": "integer"},
                         "rotationPolicy": {"enum": ["Never", "Always"]}}},
                     "issuerRef": {"type": "object", "additionalProperties": False, "required": ["name"],
                                   "properties": {"name": {"type": "string"},
                                                  "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                                                  "group": {"const": "cert-manager.io"}}}}},
    },
}
CRD_SCHEMAS = {"ServiceMonitor": SERVICEMONITOR_SCHEMA, "Issuer": ISSUER_SCHEMA,
               "Certificate": CERTIFICATE_SCHEMA}
# Overlays that must close the worker port: TLS with client certificates and/or the router's
# token on the worker, a NetworkPolicy, certificate names matching the name dialled.
SECURE_OVERLAYS = {"tls"}
# The example certificates for SECURE_OVERLAYS (a kustomization beside overlays/).
CERT_DIR = "cert-manager"
HELP_FLAG_RE = re.compile(r"^\s+--([a-z0-9-]+)(?: V)?\s+(.*)$")


# ---------------------------------------------------------------------------------------------
# What the binary says and serves


def parse_help(text):
    """--help text -> {flag: {"env": DS_X or None, "default": str or None}}."""
    flags = {}
    for line in text.splitlines():
        m = HELP_FLAG_RE.match(line)
        if not m:
            continue
        env = default = None
        paren = re.search(r"\(([^()]*)\)\s*$", m.group(2))
        if paren:
            for part in paren.group(1).split(", "):
                if part.startswith("$DS_"):
                    env = part[1:]
                elif part.startswith("default "):
                    default = part[len("default "):]
        flags[m.group(1)] = {"env": env, "default": default}
    return flags


def binary_helps(binary):
    helps = {}
    for sub in ("worker", "router"):
        out = subprocess.run([binary, sub, "--help"], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError("%s %s --help exited %d" % (binary, sub, out.returncode))
        helps[sub] = parse_help(out.stdout)
        if len(helps[sub]) < 5 or "listen" not in helps[sub]:
            raise RuntimeError("could not parse `%s --help`:\n%s" % (sub, out.stdout))
    return helps


class Servers:
    """A worker (tiny synthetic model) and a router over it, on loopback; answers which health
    service names each one reports SERVING (grpc.health.v1 Watch, until SERVING or 60 s)."""

    def __init__(self, binary, tmp):
        self.procs = []
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([binary, "gguf", "synth", "--preset", "tiny", "--quant", "f32", "--seed", "1",
                        "-o", model], check=True, capture_output=True, timeout=60)
        self.addr = {}
        self.logs = {}
        self.addr["worker"] = self._start(binary, tmp, "worker", ["worker", "--model", model, "--listen",
                                                                  "127.0.0.1:0", "--threads", "1",
                                                                  "--metrics-listen", "127.0.0.1:0"])
        self.addr["router"] = self._start(binary, tmp, "router", [
            "router", "--listen", "127.0.0.1:0", "--workers", self.addr["worker"], "--model", model,
            "--poll-ms", "100", "--metrics-listen", "127.0.0.1:0"])

    def _start(self, binary, tmp, name, args):
        log = open(os.path.join(tmp, name + ".log"), "w+")
        self.logs[name] = log
        p = subprocess.Popen([binary] + args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=log, start_new_session=True)
        self.procs.append(p)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            log.seek(0)
            m = re.search(r"listening on (\S+?):(\d+)", log.read())
            if m:
                return "127.0.0.1:%s" % m.group(2)
            if p.poll() is not None:
                break
            time.sleep(0.05)  # polls the log for the line the process prints once bound
        log.seek(0)
        raise RuntimeError("%s did not start:\n%s" % (name, log.read()))

    def metric_names(self, sub):
        """The series names `deltaserve <sub>` serves on /metrics (TYPE lines and samples)."""
        import urllib.request
        log = self.logs[sub]
        deadline = time.monotonic() + 30
        while True:
            log.seek(0)
            m = re.search(r"metrics on (http://\S+/metrics)", log.read())
            if m or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # the line follows "listening on" once the HTTP port is bound
        if not m:
            raise RuntimeError("%s logged no 'metrics on' line" % sub)
        text = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        names = set()
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                names.add(line.split()[2])
            elif line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, 1)[0])
        return names

    def status(self, sub, service):
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        names = health_pb2.HealthCheckResponse.ServingStatus.Name
        with grpc.insecure_channel(self.addr[sub]) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            last = None
            try:
                for r in stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=60):
                    last = names(r.status)
                    if last in ("SERVING", "SERVICE_UNKNOWN"):
                        break
            except grpc.RpcError as e:
                return last or e.code().name
            return last

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


# ---------------------------------------------------------------------------------------------
# Rendering and schema validation


def render_all(k8s_dir, tmp):
    """{overlay: objects}; renders a copy of k8s/ with symlinks resolved (Bazel's runfiles are
    symlinks, which kustomize's load restrictor may refuse)."""
    src = os.path.join(tmp, "k8s")
    shutil.copytree(k8s_dir, src, symlinks=False)
    overlays = sorted(d for d in os.listdir(os.path.join(src, "overlays"))
                      if os.path.isdir(os.path.join(src, "overlays", d)))
    dirs = {o: os.path.join(src, "overlays", o) for o in overlays}
    dirs[CERT_DIR] = os.path.join(src, CERT_DIR)
    kubectl = shutil.which("kubectl") or next(
        (p for p in ("/usr/bin/kubectl", "/usr/local/bin/kubectl") if os.access(p, os.X_OK)), None)
    out, errors = {}, []
    for o, d in sorted(dirs.items()):
        objs = kustomize_lite.render(d)
        out[o] = objs
        if kubectl:
            r = subprocess.run([kubectl, "kustomize", d], capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                errors.append("%s: kubectl kustomize failed: %s" % (o, r.stderr.strip()[:2000]))
                continue
            ref = [x for x in yaml.safe_load_all(r.stdout) if x]
            if by_id(ref) != by_id(objs):
                errors.append("%s: kustomize_lite.py and kubectl kustomize render different objects"
                              % o)
    print("rendered %d overlays (%s) and %s/ with kustomize_lite.py%s" % (
        len(overlays), ", ".join(overlays), CERT_DIR,
        " and %s kustomize (identical objects required)" % kubectl if kubectl else
        "; kubectl not installed: fallback renderer only"))
    return out, errors


def obj_id(o):
    return "%s/%s" % (o.get("kind"), o.get("metadata", {}).get("name"))


def by_id(objs):
    return {(o["apiVersion"], o["kind"], o["metadata"]["name"]): o for o in objs}


def schema_errors(objs):
    import jsonschema
    import kubernetes_validate
    errs = []
    for o in objs:
        try:
            if o.get("kind") in CRD_SCHEMAS:
                jsonschema.validate(o, CRD_SCHEMAS[o["kind"]])
            else:
                kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            c = getattr(e, "caused_by", e)
            errs.append("%s: schema (Kubernetes %s): %s at %s" % (
                obj_id(o), K8S_VERSION, getattr(c, "message", c), "/".join(map(str, getattr(c, "path", [])))))
        except jsonschema.ValidationError as e:
            errs.append("%s: schema (%s subset): %s at %s" % (
                obj_id(o), o.get("kind"), e.message, "/".join(map(str, e.path))))
        except kubernetes_validate.SchemaNotFoundError as e:
            errs.append("%s: no Kubernetes %s schema for %s" % (obj_id(o), K8S_VERSION, e))
    return errs


# ---------------------------------------------------------------------------------------------
# Consistency with the binary and between objects


def pod_spec(o):
    return o.get("spec", {}).get("template", {}).get("spec")


def workloads(objs):
    return [o for o in objs if o["kind"] in ("StatefulSet", "Deployment")]


def split_args(args):
    """['worker', '--a=1', '--b', '2'] -> ('worker', [('a', '1'), ('b', '2')], errors)."""
    if not args:
        return None, [], ["no args (the subcommand comes first)"]
    sub, flags, errs, i = args[0], [], [], 1
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            errs.append("argument '%s' is not a --flag" % a)
            i += 1
            continue
        if "=" in a:
            k, v = a[2:].split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            k, v = a[2:], args[i + 1]
            i += 2
        else:
            k, v = a[2:], None
            i += 1
        flags.append((k, v))
    return sub, flags, errs


def container_env(c, configmaps):
    """Literal env values seen by the container: envFrom ConfigMaps, then env (which wins)."""
    env, refs = {}, []
    for ef in c.get("envFrom", []):
        name = ef.get("configMapRef", {}).get("name")
        if name is None:
            continue
        refs.append(name)
        env.update(configmaps.get(name, {}).get("data", {}))
    for e in c.get("env", []):
        env[e["name"]] = e.get("value", "<from %s>" % sorted(e.get("valueFrom", {}).keys()))
    return env, refs


def effective(flag, flags, env, help_):
    for k, v in flags:
        if k == flag:
            return v
    spec = help_.get(flag, {})
    if spec.get("env") and spec["env"] in env:
        return env[spec["env"]]
    return spec.get("default")


def hostport(v):
    if not v or ":" not in v:
        return None, None
    h, p = v.rsplit(":", 1)
    return h, int(p) if p.isdigit() else None


def cuda_devices(device, tp):
    """The GPU indices `--device D --tp N` runs on (worker/backend.c): cuda = 0..N-1, cuda:K =
    K..K+N-1, cuda:A,B,... = that list; None for cpu; a string for a malformed value."""
    if device == "cpu":
        return None
    if device == "cuda":
        return list(range(tp))
    if not device or not device.startswith("cuda:"):
        return "not cpu, cuda, cuda:N or cuda:A,B,..."
    try:
        devs = [int(x) for x in device[5:].split(",")]
    except ValueError:
        return "not cpu, cuda, cuda:N or cuda:A,B,..."
    return list(range(devs[0], devs[0] + tp)) if len(devs) == 1 else devs


def check_gpus(c, flags, env, help_):
    """The worker's --tp = its nvidia.com/gpu (1 without GPUs), its --device list names that many
    GPUs, all of them inside the pod's (the container sees its GPUs as 0..n-1)."""
    errs = []
    res = c.get("resources", {})
    gpus = int(res.get("limits", {}).get("nvidia.com/gpu", 0))
    req = res.get("requests", {}).get("nvidia.com/gpu")
    if req is not None and int(req) != gpus:
        errs.append("nvidia.com/gpu request %s != limit %d" % (req, gpus))
    device = effective("device", flags, env, help_)
    tp = effective("tp", flags, env, help_)
    tp = int(tp) if tp and str(tp).isdigit() else 1
    if tp != max(gpus, 1):
        errs.append("--tp %d with nvidia.com/gpu %d: one rank per GPU" % (tp, gpus))
    devs = cuda_devices(device, tp)
    if isinstance(devs, str):
        errs.append("--device %s: %s" % (device, devs))
    elif (devs is not None) != (gpus > 0):
        errs.append("--device %s with %d GPUs" % (device, gpus))
    elif devs is not None:
        if len(devs) != tp:
            errs.append("--device %s lists %d GPUs for --tp %d" % (device, len(devs), tp))
        if len(set(devs)) != len(devs) or any(d < 0 or d >= gpus for d in devs):
            errs.append("--device %s: the pod's %d GPUs are cuda:0..%d" % (device, gpus, gpus - 1))
    return errs


def check_http(w, c, flags, env, help_, services):
    """The router's OpenAI HTTP API: --http-listen on every interface, its port the
    containerPort "http", reached by a port "http" of every Service of the router's pods."""
    errs = []
    hh, hp = hostport(effective("http-listen", flags, env, help_))
    if hp is None:
        return ["no --http-listen (the OpenAI-compatible HTTP API)"]
    if hh not in ("0.0.0.0", "[::]", "::"):
        errs.append("--http-listen host %s is not every interface" % hh)
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if hp != ports.get("http"):
        errs.append("--http-listen port %s != containerPort http %s" % (hp, ports.get("http")))
    labels = w["spec"]["template"]["metadata"].get("labels", {})
    for svc in services.values():
        sel = svc["spec"].get("selector")
        if not sel or not selects(sel, labels) or svc["spec"].get("clusterIP") == "None":
            continue
        http = [p for p in svc["spec"]["ports"] if p.get("name") == "http"]
        if not http or http[0].get("targetPort") not in ("http", hp):
            errs.append("Service %s has no port http to the --http-listen port %s"
                        % (svc["metadata"]["name"], hp))
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if "grpc" not in c.get(kind, {}):
            errs.append("%s is not a gRPC probe" % kind)
    return errs


def check_overlay(name, objs, helps, served):
    """Every consistency check on one rendered overlay: a list of error strings."""
    errs = []
    ids = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    pending_ok = name in PENDING_OVERLAYS
    gpus_seen = {}
    for w in workloads(objs):
        wid = obj_id(w)
        spec = pod_spec(w)
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        sel = w["spec"]["selector"].get("matchLabels", {})
        if any(labels.get(k) != v for k, v in sel.items()):
            errs.append("%s: selector %s does not match the pod labels" % (wid, sel))
        psc = spec.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True:
            errs.append("%s: pod securityContext.runAsNonRoot is not true" % wid)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            pvc = v.get("persistentVolumeClaim")
            if pvc and ("PersistentVolumeClaim", pvc["claimName"]) not in ids:
                errs.append("%s: volume %s: no PersistentVolumeClaim %s" % (wid, v["name"], pvc["claimName"]))
        if w["kind"] == "StatefulSet":
            svc = services.get(w["spec"].get("serviceName"))
            if not svc or svc["spec"].get("clusterIP") != "None":
                errs.append("%s: serviceName %s is not a headless Service here" % (wid, w["spec"].get("serviceName")))
        for c in spec.get("containers", []):
            cid = "%s container %s" % (wid, c["name"])
            sub, flags, aerrs = split_args(c.get("args", []))
            errs += ["%s: %s" % (cid, e) for e in aerrs]
            if sub not in helps:
                errs.append("%s: args[0] '%s' is not a served subcommand (worker, router)" % (cid, sub))
                continue
            help_ = helps[sub]
            for k, _ in flags:
                if k not in help_ and not (pending_ok and k in PENDING_FLAGS):
                    errs.append("%s: --%s is not a flag of `deltaserve %s --help`" % (cid, k, sub))
            env, refs = container_env(c, configmaps)
            for r in refs:
                if r not in configmaps:
                    errs.append("%s: envFrom ConfigMap %s does not exist" % (cid, r))
            fallbacks = {s["env"] for s in help_.values() if s["env"]}
            for k in env:
                if k.startswith("DS_") and k not in fallbacks:
                    errs.append("%s: %s is not an environment fallback of `deltaserve %s`" % (cid, k, sub))
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    errs.append("%s: volumeMount %s has no volume" % (cid, m["name"]))
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            # gRPC port, probes and service names
            lh, lp = hostport(effective("listen", flags, env, help_))
            if lh not in ("0.0.0.0", "[::]", "::"):
                errs.append("%s: --listen host %s is not every interface (kubelet probes the pod IP)" % (cid, lh))
            if lp != ports.get("grpc"):
                errs.append("%s: --listen port %s != containerPort grpc %s" % (cid, lp, ports.get("grpc")))
            # kubelet's gRPC probes speak plaintext: with --health-listen (the plaintext
            # health-only port beside a TLS --listen) they go there, containerPort "health"
            hh, hp = hostport(effective("health-listen", flags, env, help_))
            if hp is not None and hh not in ("0.0.0.0", "[::]", "::"):
                errs.append("%s: --health-listen host %s is not every interface" % (cid, hh))
            if hp is not None and hp != ports.get("health"):
                errs.append("%s: --health-listen port %s != containerPort health %s"
                            % (cid, hp, ports.get("health")))
            if effective("tls-cert", flags, env, help_) and hp is None:
                errs.append("%s: --tls-cert without --health-listen: kubelet's gRPC probes "
                            "cannot speak TLS" % cid)
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                pr = c.get(kind)
                if not pr or "grpc" not in pr:
                    errs.append("%s: no gRPC %s" % (cid, kind))
                    continue
                port, service = pr["grpc"].get("port"), pr["grpc"].get("service", "")
                if hp is not None:
                    if port != hp:
                        errs.append("%s: %s port %s != --health-listen port %s"
                                    % (cid, kind, port, hp))
                elif port != lp or port != ports.get("grpc"):
                    errs.append("%s: %s port %s != --listen port %s / containerPort grpc %s"
                                % (cid, kind, port, lp, ports.get("grpc")))
                if kind == "livenessProbe" and service != "":
                    errs.append("%s: livenessProbe service %r: liveness is \"\"" % (cid, service))
                if kind == "readinessProbe" and service == "":
                    errs.append("%s: readinessProbe on \"\" (liveness), not the API service" % cid)
                st = served(sub, service)
                if st != "SERVING":
                    errs.append("%s: %s service %r: a running `deltaserve %s` answers %s"
                                % (cid, kind, service, sub, st))
            # metrics
            mh, mp = hostport(effective("metrics-listen", flags, env, help_))
            ann = w["spec"]["template"]["metadata"].get("annotations", {})
            if mp is None:
                errs.append("%s: no --metrics-listen" % cid)
            elif mp != ports.get("metrics") or str(mp) != ann.get("prometheus.io/port"):
                errs.append("%s: --metrics-listen port %s, containerPort metrics %s, prometheus.io/port %s differ"
                            % (cid, mp, ports.get("metrics"), ann.get("prometheus.io/port")))
            # drain
            grace = effective("grace-seconds", flags, env, help_)
            stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
            tgps = spec.get("terminationGracePeriodSeconds", 30)
            if grace is None or tgps < stop + int(grace) + FLUSH_S:
                errs.append("%s: terminationGracePeriodSeconds %s < preStop %s + --grace-seconds %s + flush %s"
                            % (cid, tgps, stop, grace, FLUSH_S))
            # security
            sc = c.get("securityContext", {})
            if sc.get("readOnlyRootFilesystem") is not True or sc.get("allowPrivilegeEscalation") is not False:
                errs.append("%s: needs readOnlyRootFilesystem: true and allowPrivilegeEscalation: false" % cid)
            # router -> headless worker Service
            if sub == "router":
                dns = effective("workers-dns", flags, env, help_)
                dh, dp = hostport(dns)
                svc = services.get((dh or "").split(".")[0])
                if not svc or svc["spec"].get("clusterIP") != "None":
                    errs.append("%s: --workers-dns %s is not a headless Service here" % (cid, dns))
                elif dp not in [p["port"] for p in svc["spec"]["ports"] if p.get("name") == "grpc"]:
                    errs.append("%s: --workers-dns port %s is not the grpc port of Service %s" % (cid, dp, dh))
            if sub == "router":
                errs += ["%s: %s" % (cid, e) for e in check_http(w, c, flags, env, help_, services)]
            if sub == "worker":
                errs += ["%s: %s" % (cid, e) for e in check_gpus(c, flags, env, help_)]
                gpus_seen[wid] = int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
    if name in EXPECTED_GPUS and list(gpus_seen.values()) != [EXPECTED_GPUS[name]]:
        errs.append("overlay %s: worker GPUs %s, expected [%d]" % (name, list(gpus_seen.values()), EXPECTED_GPUS[name]))
    # Services, PDBs, HPAs, ServiceMonitors select something that exists
    pods = [w["spec"]["template"]["metadata"].get("labels", {}) for w in workloads(objs)]
    def selects(sel):
        return sel and any(all(p.get(k) == v for k, v in sel.items()) for p in pods)
    for o in objs:
        if o["kind"] == "Service" and not selects(o["spec"].get("selector")):
            errs.append("%s: selector matches no pod template" % obj_id(o))
        if o["kind"] == "PodDisruptionBudget" and not selects(o["spec"]["selector"].get("matchLabels")):
            errs.append("%s: selector matches no pod template" % obj_id(o))
        if o["kind"] == "HorizontalPodAutoscaler":
            t = o["spec"]["scaleTargetRef"]
            if (t["kind"], t["name"]) not in ids:
                errs.append("%s: scaleTargetRef %s/%s does not exist" % (obj_id(o), t["kind"], t["name"]))
        if o["kind"] == "ServiceMonitor":
            sel = o["spec"]["selector"].get("matchLabels", {})
            hit = [s for s in services.values() if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
            if not hit or any(e["port"] not in [p.get("name") for p in s["spec"]["ports"]]
                              for s in hit for e in o["spec"]["endpoints"]):
                errs.append("%s: selects no Service with the named port" % obj_id(o))
    return errs


# ---------------------------------------------------------------------------------------------
# Secrets readable by the pods, the closed worker port, certificate names


def secret_file_owner(fsgroup):
    """(uid, gid) of the files kubelet writes into a Secret volume: root, group fsGroup if set."""
    return 0, fsgroup if fsgroup is not None else 0


def secret_file_readable(mode, uid, gid, fsgroup, supplemental=()):
    """Whether a process uid:gid (fsGroup and supplementalGroups added to its groups, as kubelet
    does) reads a Secret file of this mode."""
    ouid, ogid = secret_file_owner(fsgroup)
    groups = {gid, *supplemental} | ({fsgroup} if fsgroup is not None else set())
    if uid == ouid:
        return bool(mode & 0o400)
    if ogid in groups:
        return bool(mode & 0o040)
    return bool(mode & 0o004)


def secret_mounts(w):
    """[(container, mountPath, secretName, [file modes])] of a workload's Secret volumes."""
    spec = pod_spec(w)
    vols = {v["name"]: v["secret"] for v in spec.get("volumes", []) if "secret" in v}
    out = []
    for c in spec.get("containers", []):
        for m in c.get("volumeMounts", []):
            sv = vols.get(m["name"])
            if sv is None:
                continue
            default = sv.get("defaultMode", 0o644)
            modes = [i.get("mode", default) for i in sv.get("items", [])] or [default]
            out.append((c, m["mountPath"], sv.get("secretName"), modes))
    return out


def check_secret_modes(objs):
    """Every Secret mounted into a container is readable by the user the container runs as."""
    errs = []
    for w in workloads(objs):
        psc = pod_spec(w).get("securityContext", {})
        for c, path, secret, modes in secret_mounts(w):
            csc = c.get("securityContext", {})
            uid = csc.get("runAsUser", psc.get("runAsUser", 0))
            gid = csc.get("runAsGroup", psc.get("runAsGroup", 0))
            for mode in modes:
                if not secret_file_readable(mode, uid, gid, psc.get("fsGroup"),
                                            psc.get("supplementalGroups", [])):
                    errs.append("%s container %s: Secret %s at %s, mode %04o owned %d:%d, is "
                                "unreadable by uid %d gid %d (set fsGroup or defaultMode)" % (
                                    obj_id(w), c["name"], secret, path, mode,
                                    *secret_file_owner(psc.get("fsGroup")), uid, gid))
    return errs


def secret_of(w, c, path):
    """The Secret whose volume holds the file path in container c (None: not in a Secret)."""
    for cc, mpath, secret, _ in secret_mounts(w):
        if cc is c and path and path.startswith(mpath.rstrip("/") + "/"):
            return secret
    return None


def dns_covers(pattern, host):
    """X.509 DNS name matching: exact, or a wildcard standing for one whole left-most label."""
    if pattern.startswith("*."):
        head, _, rest = host.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == host


def selects(selector, labels):
    """A label selector with only matchLabels (an empty one selects everything)."""
    if selector.get("matchExpressions"):
        return None
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def check_netpol(worker, router, objs):
    """Ingress to the worker pods: its gRPC port from router pods only, its metrics port from a
    labelled scraper only, no rule for every port; at least the router admitted."""
    errs = []
    wl = worker["spec"]["template"]["metadata"]["labels"]
    rl = router["spec"]["template"]["metadata"]["labels"]
    c = pod_spec(worker)["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    grpc_port, metrics_port = ports.get("grpc"), ports.get("metrics")
    nps = [o for o in objs if o["kind"] == "NetworkPolicy" and selects(o["spec"]["podSelector"], wl)]
    if not any("Ingress" in np["spec"].get("policyTypes", ["Ingress"]) for np in nps):
        return ["no NetworkPolicy restricts ingress to the worker pods (%s)" % wl]
    router_ok = False
    for np in nps:
        for i, rule in enumerate(np["spec"].get("ingress", [])):
            where = "%s ingress[%d]" % (obj_id(np), i)
            rports = rule.get("ports")
            if not rports:
                errs.append("%s admits every port of the workers" % where)
                continue
            covered = set()
            for p in rports:
                n = ports.get(p.get("port")) if isinstance(p.get("port"), str) else p.get("port")
                if n is None:
                    errs.append("%s: port %s is not a worker port" % (where, p.get("port")))
                    continue
                covered |= set(range(n, p.get("endPort", n) + 1))
            peers = rule.get("from") or []
            if not peers:
                errs.append("%s admits every source" % where)
                continue
            for peer in peers:
                if "ipBlock" in peer:
                    errs.append("%s: an ipBlock peer" % where)
                    continue
                ps, ns = peer.get("podSelector"), peer.get("namespaceSelector")
                if grpc_port in covered:
                    if ns is not None or ps is None or selects(ps, rl) is not True or selects(ps, wl) is not False:
                        errs.append("%s admits %s to the worker's gRPC port %s: only router pods may"
                                    % (where, peer, grpc_port))
                    else:
                        router_ok = True
                elif metrics_port in covered:
                    if not (ps or {}).get("matchLabels") and not (ns or {}).get("matchLabels"):
                        errs.append("%s admits %s to the metrics port: name the scraper by labels"
                                    % (where, peer))
                other = covered - {grpc_port, metrics_port}
                if other:
                    errs.append("%s opens worker ports %s" % (where, sorted(other)))
    if not router_ok:
        errs.append("no NetworkPolicy rule admits the router to the worker's gRPC port %s" % grpc_port)
    return errs


def check_router_netpol(router, objs):
    """Ingress to the router pods, where a NetworkPolicy restricts it: the public APIs (ports
    grpc and http) from every source, the metrics port from a labelled scraper only, no rule for
    every port or for another port."""
    errs = []
    rl = router["spec"]["template"]["metadata"]["labels"]
    c = pod_spec(router)["containers"][0]
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    public = {ports.get("grpc"), ports.get("http")} - {None}
    nps = [o for o in objs if o["kind"] == "NetworkPolicy" and selects(o["spec"]["podSelector"], rl)]
    if not any("Ingress" in np["spec"].get("policyTypes", ["Ingress"]) for np in nps):
        return ["no NetworkPolicy restricts ingress to the router pods (%s)" % rl]
    open_ = set()
    for np in nps:
        for i, rule in enumerate(np["spec"].get("ingress", [])):
            where = "%s ingress[%d]" % (obj_id(np), i)
            if not rule.get("ports"):
                errs.append("%s admits every port of the router" % where)
                continue
            covered = set()
            for p in rule["ports"]:
                n = ports.get(p.get("port")) if isinstance(p.get("port"), str) else p.get("port")
                if n is None:
                    errs.append("%s: port %s is not a router port" % (where, p.get("port")))
                    continue
                covered |= set(range(n, p.get("endPort", n) + 1))
            peers = rule.get("from") or []
            if not peers:
                open_ |= covered
                if covered - public:
                    errs.append("%s admits every source to router ports %s (only grpc and http "
                                "are public)" % (where, sorted(covered - public)))
                continue
            for peer in peers:
                ps, ns = peer.get("podSelector"), peer.get("namespaceSelector")
                if "ipBlock" in peer or (not (ps or {}).get("matchLabels")
                                         and not (ns or {}).get("matchLabels")):
                    errs.append("%s admits %s: name the scraper by labels" % (where, peer))
    for n in sorted(public - open_):
        errs.append("the router NetworkPolicy closes the router's public port %s (grpc, http)" % n)
    return errs


def check_secure(objs, certs, helps):
    """An overlay in SECURE_OVERLAYS: the worker's port needs the router's client certificate
    (mTLS) and/or its token, and the router has them; every key, certificate and token is a file
    of a mounted Secret; the router dials the worker Service by its full name, which the
    workers' Certificate (k8s/cert-manager) covers; the NetworkPolicy (check_netpol)."""
    errs = []
    worker = next((w for w in workloads(objs) if w["kind"] == "StatefulSet"), None)
    router = next((w for w in workloads(objs) if w["kind"] == "Deployment"), None)
    if worker is None or router is None:
        return ["no worker StatefulSet and router Deployment"]
    configmaps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
    val = {}
    for w, sub in ((worker, "worker"), (router, "router")):
        c = pod_spec(w)["containers"][0]
        _, flags, _ = split_args(c.get("args", []))
        env, _ = container_env(c, configmaps)
        val[sub] = (w, c, lambda f, flags=flags, env=env, sub=sub: effective(f, flags, env, helps[sub]))
    ww, wc, W = val["worker"]
    rw, rc, R = val["router"]
    mtls = bool(W("tls-cert") and W("tls-client-ca"))
    token = bool(W("auth-token-file"))
    if not (mtls or token):
        errs.append("the worker's gRPC port is open: neither client certificates (--tls-client-ca) "
                    "nor a token (--auth-token-file) required")
    if mtls and not (R("tls-client-cert") and R("tls-client-key")):
        errs.append("the worker requires client certificates; the router presents none "
                    "(--tls-client-cert/--tls-client-key)")
    if token and not R("worker-token-file"):
        errs.append("the worker requires a token; the router sends none (--worker-token-file)")
    if W("tls-cert") and not R("tls-ca"):
        errs.append("the worker serves TLS; the router does not dial TLS (--tls-ca)")
    for w, c, get, names in (
            (ww, wc, W, ("tls-cert", "tls-key", "tls-client-ca", "auth-token-file")),
            (rw, rc, R, ("tls-cert", "tls-key", "tls-ca", "tls-client-cert", "tls-client-key",
                         "worker-token-file", "auth-token-file"))):
        for f in names:
            if get(f) and secret_of(w, c, get(f)) is None:
                errs.append("%s: --%s %s is not a file of a mounted Secret" % (obj_id(w), f, get(f)))
    if token and secret_of(ww, wc, W("auth-token-file")) != secret_of(rw, rc, R("worker-token-file")):
        errs.append("the worker's --auth-token-file and the router's --worker-token-file are not "
                    "the same Secret")
    # the name dialled and verified
    ns = rw["metadata"].get("namespace")
    svc = worker["spec"].get("serviceName")
    host, _ = hostport(R("workers-dns"))
    full = "%s.%s.svc.cluster.local" % (svc, ns)
    if host != full:
        errs.append("--workers-dns host %s is not the worker Service's full name %s (namespace %s)"
                    % (host, full, ns))
    name = R("workers-tls-name") or host
    by_secret = {c["spec"]["secretName"]: c for c in certs if c["kind"] == "Certificate"}
    if W("tls-cert"):
        wcert = by_secret.get(secret_of(ww, wc, W("tls-cert")))
        if wcert is None:
            errs.append("no Certificate in k8s/%s issues the worker's Secret %s" % (
                CERT_DIR, secret_of(ww, wc, W("tls-cert"))))
        else:
            dns = wcert["spec"].get("dnsNames", [])
            if not any(dns_covers(d, name) for d in dns):
                errs.append("%s: dnsNames %s do not cover %s, the name the router verifies"
                            % (obj_id(wcert), dns, name))
            if "server auth" not in wcert["spec"].get("usages", ["server auth"]):
                errs.append("%s: no 'server auth' usage" % obj_id(wcert))
            if wcert["metadata"].get("namespace") != ns:
                errs.append("%s: namespace %s, the overlay's is %s" % (
                    obj_id(wcert), wcert["metadata"].get("namespace"), ns))
            if mtls:
                rcert = by_secret.get(secret_of(rw, rc, R("tls-client-cert")))
                if rcert is None:
                    errs.append("no Certificate in k8s/%s issues the router's client certificate"
                                % CERT_DIR)
                elif "client auth" not in rcert["spec"].get("usages", ["client auth"]):
                    errs.append("%s: no 'client auth' usage: the workers refuse it" % obj_id(rcert))
                elif rcert["spec"]["issuerRef"] != wcert["spec"]["issuerRef"]:
                    errs.append("%s and %s have different issuers: the workers' --tls-client-ca "
                                "is their own CA" % (obj_id(rcert), obj_id(wcert)))
    errs += check_netpol(worker, router, objs)
    errs += check_router_netpol(router, objs)
    return errs


# ---------------------------------------------------------------------------------------------
# k8s/README.md against the manifests and the binary

# Flags of other tools that the runbook's commands use.
OTHER_TOOL_FLAGS = {"from-file", "raw", "ignore-daemonsets", "replicas"}


def _cell(v):
    return v.strip().strip("`").replace('""', "")


def table_rows(text, header):
    """The rows (lists of cells) of the Markdown table whose header row starts with header."""
    lines = text.splitlines()
    for i, l in enumerate(lines):
        if l.startswith("| " + header):
            rows = []
            for r in lines[i + 2:]:
                if not r.startswith("|"):
                    break
                rows.append([_cell(c) for c in r.strip().strip("|").split("|")])
            return rows
    return None


def check_readme(text, rendered, helps, metrics):
    """Every value k8s/README.md names is the manifests' or the binary's: --flags (and each
    --flag=value it quotes, verbatim in a container's args), ports, metric series, the probe
    table, the HPA metric, the sizing table's GPUs and memory per overlay."""
    errs = []
    overlays = {k: v for k, v in rendered.items() if k != CERT_DIR}
    args = {a for objs in overlays.values() for w in workloads(objs) for c in pod_spec(w)["containers"]
            for a in c.get("args", [])}
    known = set(helps["worker"]) | set(helps["router"]) | OTHER_TOOL_FLAGS | {
        a[2:].split("=", 1)[0] for a in args}
    for f in sorted(set(re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*)", text)) - known):
        errs.append("README names --%s: not a flag of the binary nor in the manifests" % f)
    for a in sorted(set(re.findall(r"`(--[a-z0-9-]+=[^`\s]+)`", text)) - args):
        errs.append("README quotes %s: no container's args hold it" % a)
    ports = {p["containerPort"] for objs in overlays.values() for w in workloads(objs)
             for c in pod_spec(w)["containers"] for p in c.get("ports", [])}
    for n in sorted({int(x) for x in re.findall(r"(?:\bport `?|[a-z0-9.]:)(\d{4,5})\b", text)} - ports):
        errs.append("README names port %d: no container has it" % n)
    served = metrics["worker"] | metrics["router"]
    for m in sorted(set(re.findall(r"deltaserve:[a-z0-9]+_[a-z0-9_]+", text)) - served):
        errs.append("README names metric %s: neither process serves it" % m)
    hpa = find(overlays["gpu"], "HorizontalPodAutoscaler")
    for mt_ in hpa["spec"]["metrics"]:
        name = mt_["pods"]["metric"]["name"]
        src = "deltaserve:" + name[len("deltaserve_"):]
        if "`%s`" % name not in text and "**`%s`**" % name not in text:
            errs.append("README does not name the HPA's metric %s" % name)
        if src not in metrics["worker"]:
            errs.append("the HPA's %s comes from %s, which the worker does not serve" % (name, src))
    # probes
    rows = table_rows(text, "workload | probe | port | service")
    if not rows:
        errs.append("README has no probe table (| workload | probe | port | service | ...)")
    else:
        kinds = {"StatefulSet": "worker", "Deployment": "router"}
        seen = set()
        for w in workloads(overlays["gpu"]):
            c = pod_spec(w)["containers"][0]
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                g = c[kind]["grpc"]
                seen.add((kinds[w["kind"]], kind[:-len("Probe")], str(g["port"]), g.get("service", "")))
        table = {tuple(r[:4]) for r in rows}
        for x in sorted(seen ^ table):
            errs.append("probe table row %s %s" % (x, "missing" if x in seen else "not in the gpu overlay"))
        m = re.search(r"In `tls` every probe is on port (\d+)", text)
        tls_ports = {pod_spec(w)["containers"][0][k]["grpc"]["port"] for w in workloads(overlays["tls"])
                     for k in ("startupProbe", "readinessProbe", "livenessProbe")}
        if not m or tls_ports != {int(m.group(1))}:
            errs.append("README's tls probe port %s; the tls overlay's %s" % (m and m.group(1), tls_ports))
    # sizing
    rows = table_rows(text, "model | GGUF | GPU memory | overlay")
    if not rows:
        errs.append("README has no sizing table (| model | GGUF | GPU memory | overlay | ...)")
    for r in rows or []:
        _, _, _, ov, gpus, mem = r[:6]
        if ov not in overlays:
            errs.append("sizing row %s: no overlay %s" % (r, ov))
            continue
        c = container_of(overlays[ov], "StatefulSet")
        res = c.get("resources", {})
        got = (str(res.get("limits", {}).get("nvidia.com/gpu", 0)),
               "%s / %s" % (res.get("requests", {}).get("memory"), res.get("limits", {}).get("memory")))
        if (gpus, mem) != got:
            errs.append("sizing row %s: overlay %s has nvidia.com/gpu %s, memory %s" % (r[0], ov, *got))
    return errs


# ---------------------------------------------------------------------------------------------
# The checks must be able to fail


def find(objs, kind):
    return next(o for o in objs if o["kind"] == kind)


def container_of(objs, kind):
    return pod_spec(find(objs, kind))["containers"][0]


def set_arg(c, flag, value):
    c["args"] = [a for a in c["args"] if not a.startswith("--%s=" % flag)] + ["--%s=%s" % (flag, value)]


BREAKAGES = [
    ("unknown flag", "is not a flag of",
     lambda o: container_of(o, "StatefulSet")["args"].append("--no-such-flag=1")),
    ("TLS without a plaintext health port", "cannot speak TLS",
     lambda o: container_of(o, "Deployment")["args"].append("--tls-cert=/x")),
    ("probe not on --health-listen", "--health-listen port",
     lambda o: container_of(o, "StatefulSet")["args"].append("--health-listen=0.0.0.0:50052")),
    ("unknown env fallback", "DS_NO_SUCH is not an environment fallback",
     lambda o: find(o, "ConfigMap")["data"].update(DS_NO_SUCH="1")),
    ("readiness probe port", "readinessProbe port",
     lambda o: container_of(o, "StatefulSet")["readinessProbe"]["grpc"].update(port=50052)),
    ("--listen port", "--listen port",
     lambda o: set_arg(container_of(o, "Deployment"), "listen", "0.0.0.0:50099")),
    ("--listen loopback", "is not every interface",
     lambda o: set_arg(container_of(o, "StatefulSet"), "listen", "127.0.0.1:50051")),
    ("readiness service name", "answers SERVICE_UNKNOWN",
     lambda o: container_of(o, "StatefulSet")["readinessProbe"]["grpc"].update(service="deltaserve.v1.Generation")),
    ("liveness on the API service", "liveness is",
     lambda o: container_of(o, "Deployment")["livenessProbe"]["grpc"].update(service="deltaserve.v1.Generation")),
    ("metrics port", "--metrics-listen port",
     lambda o: find(o, "StatefulSet")["spec"]["template"]["metadata"]["annotations"].update({"prometheus.io/port": "9091"})),
    ("grace period", "terminationGracePeriodSeconds",
     lambda o: pod_spec(find(o, "StatefulSet")).update(terminationGracePeriodSeconds=30)),
    ("--workers-dns", "is not a headless Service",
     lambda o: set_arg(container_of(o, "Deployment"), "workers-dns", "deltaserve-router:50051")),
    ("GPU count", "worker GPUs",
     lambda o: container_of(o, "StatefulSet")["resources"]["limits"].update({"nvidia.com/gpu": 2})),
    ("root filesystem", "readOnlyRootFilesystem",
     lambda o: container_of(o, "Deployment")["securityContext"].update(readOnlyRootFilesystem=False)),
    ("--http-listen port", "--http-listen port",
     lambda o: set_arg(container_of(o, "Deployment"), "http-listen", "0.0.0.0:8081")),
    ("no --http-listen", "no --http-listen",
     lambda o: _drop_arg(o, "Deployment", "http-listen")),
    ("Service without the http port", "has no port http",
     lambda o: next(s for s in o if s["kind"] == "Service" and s["metadata"]["name"] == "deltaserve-router")
     ["spec"]["ports"].pop(1)),
    ("schema: unknown field", "schema",
     lambda o: container_of(o, "StatefulSet").update(livenessProbes={})),
    ("schema: wrong type", "schema",
     lambda o: find(o, "StatefulSet")["spec"].update(replicas="two")),
]


def _args(o, kind):
    return container_of(o, kind)["args"]


def _drop_arg(o, kind, flag):
    c = container_of(o, kind)
    c["args"] = [a for a in c["args"] if not a.startswith("--%s=" % flag)]


def _netpol(o):
    return find(o, "NetworkPolicy")["spec"]["ingress"]


def _router_netpol(o):
    return next(n for n in o if n["kind"] == "NetworkPolicy"
                and n["metadata"]["name"] == "deltaserve-router")["spec"]["ingress"]


def _cert(r, name):
    return next(c for c in r[CERT_DIR] if c["metadata"]["name"] == name)


def _volume(o, kind, name):
    return next(v for v in pod_spec(find(o, kind))["volumes"] if v["name"] == name)


# Breakages of other overlays: (overlay, label, expected error, mutation of the rendered copies).
OVERLAY_BREAKAGES = [
    ("tp2", "--tp missing", "--tp 1 with nvidia.com/gpu 2",
     lambda r: _drop_arg(r["tp2"], "StatefulSet", "tp")),
    ("tp2", "--device lists 3 GPUs", "lists 3 GPUs for --tp 2",
     lambda r: set_arg(container_of(r["tp2"], "StatefulSet"), "device", "cuda:0,1,2")),
    ("tp2", "--device outside the pod", "the pod's 2 GPUs",
     lambda r: set_arg(container_of(r["tp2"], "StatefulSet"), "device", "cuda:1,2")),
    ("tls", "worker port open", "the worker's gRPC port is open",
     lambda r: [_drop_arg(r["tls"], "StatefulSet", f) for f in ("tls-client-ca", "auth-token-file")]),
    ("tls", "router without a client certificate", "presents none",
     lambda r: [_drop_arg(r["tls"], "Deployment", f) for f in ("tls-client-cert", "tls-client-key")]),
    ("tls", "router without the worker token", "sends none",
     lambda r: _drop_arg(r["tls"], "Deployment", "worker-token-file")),
    ("tls", "token outside a Secret", "is not a file of a mounted Secret",
     lambda r: set_arg(container_of(r["tls"], "StatefulSet"), "auth-token-file", "/tmp/token")),
    ("tls", "--workers-dns short name", "is not the worker Service's full name",
     lambda r: set_arg(container_of(r["tls"], "Deployment"), "workers-dns", "deltaserve-worker:50051")),
    ("tls", "certificate for another name", "do not cover",
     lambda r: _cert(r, "deltaserve-worker-tls")["spec"].update(dnsNames=["deltaserve-worker.other.svc.cluster.local"])),
    ("tls", "router certificate without client auth", "no 'client auth' usage",
     lambda r: _cert(r, "deltaserve-router-tls")["spec"].update(usages=["server auth"])),
    ("tls", "no NetworkPolicy", "no NetworkPolicy restricts ingress",
     lambda r: r.update(tls=[o for o in r["tls"] if o["kind"] != "NetworkPolicy"])),
    ("tls", "gRPC port from any pod", "only router pods may",
     lambda r: _netpol(r["tls"])[0]["from"][0].update(podSelector={})),
    ("tls", "gRPC port from every namespace", "only router pods may",
     lambda r: _netpol(r["tls"])[0]["from"][0].update(namespaceSelector={})),
    ("tls", "a rule for every port", "admits every port",
     lambda r: _netpol(r["tls"])[1].pop("ports")),
    ("tls", "metrics from anyone", "admits every source",
     lambda r: _netpol(r["tls"])[1].pop("from")),
    ("tls", "router's http port closed", "closes the router's public port 8080",
     lambda r: _router_netpol(r["tls"])[0].update(ports=[{"port": "grpc", "protocol": "TCP"}])),
    ("tls", "router's metrics port public", "only grpc and http are public",
     lambda r: _router_netpol(r["tls"])[1].pop("from")),
    ("tls", "no router NetworkPolicy", "no NetworkPolicy restricts ingress to the router",
     lambda r: r.update(tls=[o for o in r["tls"] if o["metadata"]["name"] != "deltaserve-router"
                             or o["kind"] != "NetworkPolicy"])),
    ("tls", "secrets 0400 root", "unreadable by uid 65532",
     lambda r: _volume(r["tls"], "Deployment", "auth-token")["secret"].update(defaultMode=0o400)),
    ("tls", "no fsGroup", "unreadable by uid 65532",
     lambda r: pod_spec(find(r["tls"], "StatefulSet"))["securityContext"].pop("fsGroup")),
    (CERT_DIR, "unknown Certificate field", "schema (Certificate subset)",
     lambda r: _cert(r, "deltaserve-worker-tls")["spec"].update(dnsName=["x"])),
    (CERT_DIR, "issuer missing", "no Issuer",
     lambda r: _cert(r, "deltaserve-worker-tls")["spec"]["issuerRef"].update(name="nope")),
]


def check_certs(certs):
    """k8s/cert-manager: each Certificate's issuer is there; a CA Issuer's secret is issued."""
    errs = []
    issuers = {o["metadata"]["name"]: o for o in certs if o["kind"] == "Issuer"}
    secrets = {o["spec"]["secretName"]: o for o in certs if o["kind"] == "Certificate"}
    for o in certs:
        if o["kind"] == "Certificate":
            ref = o["spec"]["issuerRef"]
            if ref.get("kind", "Issuer") == "Issuer" and ref["name"] not in issuers:
                errs.append("%s: no Issuer %s here" % (obj_id(o), ref["name"]))
        if o["kind"] == "Issuer" and "ca" in o["spec"]:
            ca = secrets.get(o["spec"]["ca"]["secretName"])
            if ca is None or not ca["spec"].get("isCA"):
                errs.append("%s: Secret %s is not issued by an isCA Certificate here"
                            % (obj_id(o), o["spec"]["ca"]["secretName"]))
    return errs


# Edits of k8s/README.md that check_readme must report: (label, expected error, edit).
README_BREAKAGES = [
    ("unknown flag", "README names --tls-client-certificate",
     lambda t: t.replace("`--tls-client-cert`", "`--tls-client-certificate`", 1)),
    ("wrong port", "README names port 50053", lambda t: t.replace("port 50052", "port 50053", 1)),
    ("wrong metric", "README names metric deltaserve:num_requests_queued",
     lambda t: t.replace("deltaserve:num_requests_waiting", "deltaserve:num_requests_queued", 1)),
    ("probe service", "probe table row",
     lambda t: t.replace("| worker | readiness | 50051 | `deltaserve.v1.Worker`",
                         "| worker | readiness | 50051 | `\"\"`", 1)),
    ("sizing memory", "sizing row",
     lambda t: t.replace("| tp2 | 2 | 64Gi / 128Gi |", "| tp2 | 2 | 32Gi / 64Gi |", 1)),
    ("quoted value", "no container's args hold it",
     lambda t: t.replace("`--tp=2 --device=cuda:0,1`", "`--tp=4`", 1)),
]


def overlay_errors(name, rendered, helps, served):
    objs = rendered[name]
    if name == CERT_DIR:
        return schema_errors(objs) + check_certs(objs)
    errs = schema_errors(objs) + check_overlay(name, objs, helps, served) + check_secret_modes(objs)
    if name in SECURE_OVERLAYS:
        errs += check_secure(objs, rendered.get(CERT_DIR, []), helps)
    return errs


def self_test(rendered, helps, served):
    """Applies each breakage to a copy of the rendered objects: each must be reported."""
    bad = []
    cases = [("gpu", label, expect, lambda r, m=mutate: m(r["gpu"]))
             for label, expect, mutate in BREAKAGES] + OVERLAY_BREAKAGES
    for overlay, label, expect, mutate in cases:
        r = copy.deepcopy(rendered)
        mutate(r)
        errs = overlay_errors(overlay, r, helps, served)
        if overlay == CERT_DIR:
            errs += overlay_errors("tls", r, helps, served)
        if not any(expect in e for e in errs):
            bad.append("breakage '%s' of %s was not caught (expected '%s'; got %s)"
                       % (label, overlay, expect, errs))
    return bad, len(cases)


# ---------------------------------------------------------------------------------------------


def main():
    binary, k8s_dir = sys.argv[1], sys.argv[2]
    if os.path.isfile(k8s_dir):
        k8s_dir = os.path.dirname(k8s_dir)
    readme = os.path.join(os.path.realpath(k8s_dir), "README.md")
    binary, k8s_dir = os.path.realpath(binary), os.path.realpath(k8s_dir)
    tmp = tempfile.mkdtemp(prefix="k8s-test-", dir=os.environ.get("TEST_TMPDIR"))
    helps = binary_helps(binary)
    servers = Servers(binary, tmp)
    cache, lock = {}, threading.Lock()

    def served(sub, service):
        with lock:
            if (sub, service) not in cache:
                cache[(sub, service)] = servers.status(sub, service)
            return cache[(sub, service)]

    try:
        failures = []
        rendered, rerrs = render_all(k8s_dir, tmp)
        failures += rerrs
        for name, objs in rendered.items():
            errs = overlay_errors(name, rendered, helps, served)
            pending = sorted({k for w in workloads(objs) for c in pod_spec(w)["containers"]
                              for k, _ in split_args(c.get("args", []))[1]
                              if k in PENDING_FLAGS and k not in helps.get(c["args"][0], {})})
            print("%-15s %2d objects: %s%s" % (
                name, len(objs), "ok" if not errs else "%d errors" % len(errs),
                " (pending flags, not in --help yet: %s)" % ", ".join("--" + p for p in pending)
                if pending else ""))
            failures += ["%s: %s" % (name, e) for e in errs]
        with open(readme) as f:
            readme_text = f.read()
        metrics = {sub: servers.metric_names(sub) for sub in ("worker", "router")}
        rerrs = check_readme(readme_text, rendered, helps, metrics)
        print("k8s/README.md: %s" % ("ok" if not rerrs else "%d errors" % len(rerrs)))
        failures += ["README: %s" % e for e in rerrs]
        for label, expect, edit in README_BREAKAGES:
            bad = edit(readme_text)
            if bad == readme_text or not any(expect in e for e in check_readme(bad, rendered, helps, metrics)):
                failures.append("README breakage '%s' was not caught (expected '%s')" % (label, expect))
        print("health services answered by the running binaries: %s" % ", ".join(
            "%s %r=%s" % (s, n, v) for (s, n), v in sorted(cache.items())))
        if "gpu" not in rendered:
            failures.append("no gpu overlay to run the self-test on")
        else:
            st, n = self_test(rendered, helps, served)
            print("self-test: %d of %d deliberate breakages caught" % (n - len(st), n))
            failures += st
        try:
            kustomize_lite.smp_merge({"a": 1}, {"$retainKeys": ["a"]})
            failures.append("kustomize_lite accepted an unsupported patch directive")
        except kustomize_lite.KustomizeError:
            pass
    finally:
        servers.stop()
    for f in failures:
        print("FAIL:", f)
    print("k8s manifests: %s" % ("FAILED (%d)" % len(failures) if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
