"""The reference cases of the Python tests (the twin of tests/model/ref_cases.h).

shared_dir(): the shared folder: $DS_REFERENCE_DIR, else $DS_REPO_ROOT/../shared/reference, else
<repository>/../shared/reference (this file's real path). own_dir(): the repository's own folder:
$DS_REPO_REFERENCE_DIR, else tests/reference under the working directory (the runfiles root under
bazel, when the test lists //tests/reference:cases), else <repository>/tests/reference.
resolve(shared_name): for the tests that name a shared case ("tiny-r2-tied", "tiny-r1-untied"):
(name, folder) of that case in the shared folder when present there, else of the repository's own
case of the same shapes, seeds and prompts ("own-r2-tied", "own-r1-untied": made by
tools/refgen, different weights and vocabulary), so a bare clone runs the tests too.
Import it with sys.path.insert(0, <dirname of realpath(__file__)>/../testutil)."""
import os

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def shared_dir():
    if os.environ.get("DS_REFERENCE_DIR"):
        return os.environ["DS_REFERENCE_DIR"]
    if os.environ.get("DS_REPO_ROOT"):
        return os.path.join(os.environ["DS_REPO_ROOT"], "..", "shared", "reference")
    return os.path.join(_REPO, "..", "shared", "reference")


def own_dir():
    if os.environ.get("DS_REPO_REFERENCE_DIR"):
        return os.environ["DS_REPO_REFERENCE_DIR"]
    if os.path.isdir("tests/reference"):
        return "tests/reference"
    return os.path.join(_REPO, "tests", "reference")


def _has(d, name):
    return all(os.path.isfile(os.path.join(d, name + s)) for s in (".gguf", ".json"))


def resolve(shared_name):
    """(name, folder) of shared_name in the shared folder, else of its own equivalent."""
    if _has(shared_dir(), shared_name):
        return shared_name, shared_dir()
    own = "own-" + shared_name[5:] if shared_name.startswith("tiny-") else shared_name
    if _has(own_dir(), own):
        return own, own_dir()
    raise FileNotFoundError("reference case %s: not in %s, and %s not in %s"
                            % (shared_name, shared_dir(), own, own_dir()))


def resolve_path(shared_name, suffix):
    """"<folder>/<name><suffix>" of resolve(shared_name), e.g. ("tiny-r2-tied", ".gguf")."""
    name, d = resolve(shared_name)
    return os.path.join(d, name + suffix)
