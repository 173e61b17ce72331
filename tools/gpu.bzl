"""gpu_bench: a GPU benchmark step that is one command line, for tools/gpu-test.

    load("//tools:gpu.bzl", "gpu_bench")
    gpu_bench(
        name = "bench_decode_4b",
        cmd = ["cli/deltaserve", "bench", "decode", "--model", "synth/4b.gguf"],
        data = ["//cli:deltaserve"],   # what cmd runs, at its runfiles path
        timeout_s = 120,               # the step's limit on the GPU host
        synth = "4b",                  # reads synth/4b.gguf (tools/gpu-test makes it first)
        gpus = 1,                      # GPUs it needs (tools/gpu-test skips it on a host with fewer)
    )

An sh_binary of //tests/gpu:gpu_run.sh (or src) with cmd as its args, tagged "gpu_bench" and "manual"
(`bazel build //...` and CI leave it alone). cmd's paths are relative to the runfiles root, the
working directory of every GPU step (`bazel run` here, the unpacked pack on the GPU host).
The tags tools/gpu-test reads: "timeout_s=N", "synth=SIZE", "gpus=N" (tools/gpu-test's header).
"""

def gpu_bench(name, cmd, timeout_s, data = [], synth = None, gpus = 1, tags = [], setup = False,
              src = "//tests/gpu:gpu_run.sh"):
    """A GPU bench step: src (a script; gpu_run.sh runs cmd) with cmd as its args.

    setup = True: a step that makes an input of others (the synthetic models), tagged gpu_setup.
    """
    t = ["gpu_setup" if setup else "gpu_bench", "manual", "timeout_s=%d" % timeout_s]
    if synth:
        t.append("synth=" + synth)
    if gpus > 1:
        t.append("gpus=%d" % gpus)
    native.sh_binary(
        name = name,
        srcs = [src],
        args = cmd,
        data = data + ["//tests/gpu:gpu_lib.sh"],
        tags = t + tags,
    )
