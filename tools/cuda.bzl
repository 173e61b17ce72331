"""cuda_library: one nvcc genrule per .cu, the objects wrapped in a cc_library (docs/TOOLCHAIN.md §3).

    load("//tools:cuda.bzl", "cuda_library")
    cuda_library(
        name = "dequant",
        srcs = ["dequant.cu"],
        hdrs = ["dequant.h"],                # C headers, exported to C callers
        cu_hdrs = ["cuda_check.cuh", "//common:status.h"],  # every other header a .cu includes
        deps = [":cuda_device", "//common"],
        sm90a = False,                        # True: also build sm_90a (wgmma, setmaxnreg)
    )

A genrule has no header scanning and the sandbox hides undeclared files: list in hdrs/cu_hdrs
every header the .cu files include (CUDA's own are read by absolute path). Objects are
alwayslink and carry cudart_static; link them into cc_test/cc_binary with linkstatic = True.
"""

load("@cuda//:defs.bzl", "CUDA_FOUND", "NVCC")

# Without a CUDA toolkit (tools/cuda_configure.bzl) every target here is incompatible: `bazel
# build //...` skips it and everything that depends on it.
_COMPAT = [] if CUDA_FOUND else ["@cuda//:present"]

# sm_90 machine code; with ptx = True also compute_90 PTX (a newer chip's driver can JIT it, at
# the price of much larger binaries); sm_90a when asked for.
_GENCODE = "-gencode=arch=compute_90,code=sm_90"
_GENCODE_PTX = "-gencode=arch=compute_90,code=[sm_90,compute_90]"
_GENCODE_90A = "-gencode=arch=compute_90a,code=sm_90a"

def cuda_library(name, srcs, hdrs = [], cu_hdrs = [], deps = [], copts = [], sm90a = False,
                 ptx = False, **kwargs):
    gencode = (_GENCODE_PTX if ptx else _GENCODE) + (" " + _GENCODE_90A if sm90a else "")
    objs = []
    for src in srcs:
        stem = src.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        out = "_cuda_objs/%s/%s.pic.o" % (name, stem)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + cu_hdrs,
            outs = [out],
            # nvcc names its temporaries /tmp/tmpxft_<pid>_...; in linux-sandbox every action
            # has its own PID namespace, so two nvcc running at once collide on the same names
            # (CI: "cc1plus: fatal error: /tmp/tmpxft_00000002_..._attn.cudafe1.cpp: No such
            # file"). Each compile gets a private TMPDIR.
            cmd = ("T=$$(mktemp -d \"$${TMPDIR:-/tmp}/nvcc.XXXXXXXX\") && " +
                   "TMPDIR=$$T %s -O3 -std=c++17 -Xcompiler=-fPIC -Xcompiler=-O3 -I. %s %s " +
                   "-c $(location %s) -o $@; rc=$$?; rm -rf \"$$T\"; exit $$rc") % (
                NVCC, gencode, " ".join(copts), src),
            message = "nvcc %s" % src,
            target_compatible_with = _COMPAT,
        )
        objs.append(out)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart_static"],
        alwayslink = True,
        target_compatible_with = _COMPAT,
        **kwargs
    )
