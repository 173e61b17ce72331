"""cuda_configure: the CUDA toolkit as the repository @cuda, or a stub when there is none.

    load("//tools:cuda_configure.bzl", "cuda_configure")
    cuda_configure(name = "cuda", build_file = "//third_party:cuda.BUILD")

The toolkit is $CUDA_PATH when that is set, else /usr/local/cuda; it counts as found when it has
bin/nvcc and include/cuda_runtime.h. Found: the repository mirrors its top-level folders and
takes build_file as its BUILD. Not found: a stub whose targets are empty, and a DEBUG line at
build time says that the binary is CPU-only. Either way the repository defines defs.bzl:

    CUDA_FOUND   True or False: cli/BUILD picks //model:backends_all or //model:backends_cpu
    CUDA_PATH    the toolkit's folder ("" when not found)
    NVCC         its nvcc (tools/cuda.bzl); "" when not found

Without a toolkit, tools/cuda.bzl marks every CUDA target incompatible, so `bazel build //...`
and `bazel test //...` skip them and what depends on them. CUDA_PATH is in `environ`: changing
it refetches the repository.
"""

_STUB_BUILD = """# No CUDA toolkit was found (tools/cuda_configure.bzl): empty targets, so that the
# BUILD files that name them load; every target that needs CUDA is incompatible (tools/cuda.bzl).
package(default_visibility = ["//visibility:public"])

cc_library(name = "headers")

# Required by every CUDA target (tools/cuda.bzl) and held by no platform: they are incompatible.
constraint_setting(name = "toolkit")

constraint_value(
    name = "present",
    constraint_setting = ":toolkit",
)

cc_library(name = "cudart_static")
"""

def _cuda_configure_impl(ctx):
    env = ctx.os.environ.get("CUDA_PATH", "")
    root = env if env else "/usr/local/cuda"
    found = (ctx.path(root + "/bin/nvcc").exists and
             ctx.path(root + "/include/cuda_runtime.h").exists)
    if found:
        for child in ctx.path(root).readdir():
            ctx.symlink(child, child.basename)
        ctx.symlink(ctx.attr.build_file, "BUILD")
        ctx.file("defs.bzl", "CUDA_FOUND = True\nCUDA_PATH = %r\nNVCC = %r\n" % (
            root, root + "/bin/nvcc"))
    else:
        # buildifier: disable=print
        print(("deltaserve: no CUDA toolkit at %s (%s): building the CPU-only binary " +
               "(//model:backends_cpu); CUDA targets are skipped. For a GPU build install " +
               "the CUDA toolkit (README.md) or point CUDA_PATH at it.") % (
            root, "CUDA_PATH" if env else "CUDA_PATH unset, the default"))
        ctx.file("BUILD", _STUB_BUILD)
        ctx.file("defs.bzl", "CUDA_FOUND = False\nCUDA_PATH = \"\"\nNVCC = \"\"\n")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    attrs = {"build_file": attr.label(allow_single_file = True)},
    environ = ["CUDA_PATH"],
    local = True,
)
