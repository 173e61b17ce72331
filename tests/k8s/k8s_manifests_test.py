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
        self.addr["worker"] = self._start(binary, tmp, "worker", ["worker", "--model", model, "--listen",
                                                                  "127.0.0.1:0", "--threads", "1"])
        self.addr["router"] = self._start(binary, tmp, "router", [
            "router", "--listen", "127.0.0.1:0", "--workers", self.addr["worker"], "--model", model,
            "--poll-ms", "100"])

    def _start(self, binary, tmp, name, args):
        log = open(os.path.join(tmp, name + ".log"), "w+")
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
    kubectl = shutil.which("kubectl") or next(
        (p for p in ("/usr/bin/kubectl", "/usr/local/bin/kubectl") if os.access(p, os.X_OK)), None)
    out, errors = {}, []
    for o in overlays:
        d = os.path.join(src, "overlays", o)
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
    print("rendered %d overlays (%s) with kustomize_lite.py%s" % (
        len(overlays), ", ".join(overlays),
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
            if o.get("kind") == "ServiceMonitor":
                jsonschema.validate(o, SERVICEMONITOR_SCHEMA)
            else:
                kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            c = getattr(e, "caused_by", e)
            errs.append("%s: schema (Kubernetes %s): %s at %s" % (
                obj_id(o), K8S_VERSION, getattr(c, "message", c), "/".join(map(str, getattr(c, "path", [])))))
        except jsonschema.ValidationError as e:
            errs.append("%s: schema (ServiceMonitor subset): %s at %s" % (
                obj_id(o), e.message, "/".join(map(str, e.path))))
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
    ("schema: unknown field", "schema",
     lambda o: container_of(o, "StatefulSet").update(livenessProbes={})),
    ("schema: wrong type", "schema",
     lambda o: find(o, "StatefulSet")["spec"].update(replicas="two")),
]


def self_test(objs, helps, served):
    """Applies each breakage to a copy of the gpu overlay: each must be reported."""
    bad = []
    for label, expect, mutate in BREAKAGES:
        o = copy.deepcopy(objs)
        mutate(o)
        errs = schema_errors(o) + check_overlay("gpu", o, helps, served)
        if not any(expect in e for e in errs):
            bad.append("breakage '%s' was not caught (expected '%s'; got %s)" % (label, expect, errs))
    return bad


# ---------------------------------------------------------------------------------------------


def main():
    binary, k8s_dir = sys.argv[1], sys.argv[2]
    if os.path.isfile(k8s_dir):
        k8s_dir = os.path.dirname(k8s_dir)
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
            errs = schema_errors(objs) + check_overlay(name, objs, helps, served)
            pending = sorted({k for w in workloads(objs) for c in pod_spec(w)["containers"]
                              for k, _ in split_args(c.get("args", []))[1]
                              if k in PENDING_FLAGS and k not in helps.get(c["args"][0], {})})
            print("%-15s %2d objects: %s%s" % (
                name, len(objs), "ok" if not errs else "%d errors" % len(errs),
                " (pending flags, not in --help yet: %s)" % ", ".join("--" + p for p in pending)
                if pending else ""))
            failures += ["%s: %s" % (name, e) for e in errs]
        print("health services answered by the running binaries: %s" % ", ".join(
            "%s %r=%s" % (s, n, v) for (s, n), v in sorted(cache.items())))
        if "gpu" not in rendered:
            failures.append("no gpu overlay to run the self-test on")
        else:
            st = self_test(rendered["gpu"], helps, served)
            print("self-test: %d of %d deliberate breakages caught" % (len(BREAKAGES) - len(st), len(BREAKAGES)))
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
