"""e2e_test: an end-to-end Python test NAME.py run by run_py.sh under Debian's python3
("system") or the project venv ("venv"), with the deltaserve binary, the protos and the
harness as data."""

E2E_DATA = [
    "dsproto.py",
    "harness.py",
    "fake_worker.py",
    "//cli:deltaserve",
    "//proto:protos",
]

def e2e_test(name, py = "system", size = "medium", extra_data = [], **kwargs):
    native.sh_test(
        name = name,
        size = size,
        srcs = ["run_py.sh"],
        args = [py, "$(location %s.py)" % name],
        data = E2E_DATA + [name + ".py"] + extra_data,
        **kwargs
    )
