"""Python stubs of deltaserve's protos, generated on first use with grpc_tools (Debian
python3-grpc-tools, run under /usr/bin/python3, or the project venv) into a cache directory.

health.proto is compiled from a copy under `dshealth/`, so the generated module is
`dshealth.health_pb2` and does not shadow the real `grpc` package (the wire names stay
grpc.health.v1.*); where PyPI grpcio-health-checking is installed its module is used instead
(two modules may not register the same proto names)."""
import os
import shutil
import sys
import tempfile


def repo_root():
    r = os.environ.get("DS_REPO_ROOT")
    if r and os.path.isdir(os.path.join(r, "proto")):
        return r
    d = os.path.dirname(os.path.realpath(__file__))
    while d != "/":
        if os.path.isfile(os.path.join(d, "WORKSPACE")) and os.path.isdir(os.path.join(d, "proto")):
            return d
        d = os.path.dirname(d)
    raise RuntimeError("cannot find the repository root (set DS_REPO_ROOT)")


def load(out_dir=None):
    """Returns (deltaserve_pb2, deltaserve_pb2_grpc, health_pb2, health_pb2_grpc)."""
    root = repo_root()
    out_dir = out_dir or os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(prefix="dsproto")
    stub = os.path.join(out_dir, "dsstubs")
    if not os.path.isfile(os.path.join(stub, "ok")):
        from grpc_tools import protoc
        src = os.path.join(out_dir, "dsproto_src")
        os.makedirs(os.path.join(src, "deltaserve", "v1"), exist_ok=True)
        os.makedirs(os.path.join(src, "dshealth"), exist_ok=True)
        os.makedirs(stub, exist_ok=True)
        shutil.copy(os.path.join(root, "proto/deltaserve/v1/deltaserve.proto"),
                    os.path.join(src, "deltaserve/v1/deltaserve.proto"))
        shutil.copy(os.path.join(root, "proto/grpc/health/v1/health.proto"),
                    os.path.join(src, "dshealth/health.proto"))
        for f in ("deltaserve/v1/deltaserve.proto", "dshealth/health.proto"):
            rc = protoc.main(["protoc", "-I" + src, "--python_out=" + stub,
                              "--grpc_python_out=" + stub, f])
            if rc != 0:
                raise RuntimeError("grpc_tools.protoc failed on " + f)
        for d in ("deltaserve", "deltaserve/v1", "dshealth"):
            open(os.path.join(stub, d, "__init__.py"), "a").close()
        open(os.path.join(stub, "ok"), "w").close()
    if stub not in sys.path:
        sys.path.insert(0, stub)
    from deltaserve.v1 import deltaserve_pb2, deltaserve_pb2_grpc
    try:  # PyPI grpcio-health-checking (the venv) registers grpc.health.v1 itself: reuse it
        from grpc_health.v1 import health_pb2, health_pb2_grpc
    except ImportError:
        from dshealth import health_pb2, health_pb2_grpc
    return deltaserve_pb2, deltaserve_pb2_grpc, health_pb2, health_pb2_grpc
