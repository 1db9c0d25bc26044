#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compiles the SM70 tier's kernels to sm_70 SASS with NVRTC 12.9 (and its ptxas), failing
on any error or warning, register spills included. Usage:

    sm70_check.py CUDA12_ROOT REPO OUT_DIR

CUDA12_ROOT is where tools/install-deps.sh --cuda12 put the PyPI packages (nvidia/...).
Prints one line per kernel with its registers. Exit 0: built clean; 1: failure."""
import ctypes
import os
import re
import shutil
import subprocess
import sys

# Every kernel the SM70 tier launches that is built from a header (the name expressions
# instantiate the templates), and the tensor-core attention kernels (see below). The top-k kernel (select.cu) and the calibration kernels
# (calib.cu) live in .cu files with host code, which NVRTC cannot take.
ACTS = ["__half", "__nv_bfloat16"]
KERNELS = []
for act in ACTS:
    kvs = ["qsakv::cuda::KvKind::kE4M3",
           "qsakv::cuda::KvKind::kBf16" if act == "__nv_bfloat16" else "qsakv::cuda::KvKind::kFp16"]
    for kv in kvs:
        for d in (64, 128, 256):
            KERNELS.append(f"&qsakv::cuda::decode_attention_simt_kernel<{act}, {kv}, {d}>")
for d in (64, 128, 256):
    for fp8 in ("false", "true"):
        KERNELS.append(f"&qsakv::cuda::select_score_simt_kernel<{d}, {fp8}>")
# The tensor-core kernels too: never launched on SM70, but a V100 build (CUDA 12,
# QSAKV_CUDA_ARCHS=70) compiles them, their SM75+ instructions behind __CUDA_ARCH__ guards.
for act in ACTS:
    k16 = "kBf16" if act == "__nv_bfloat16" else "kFp16"
    for kv, dec in (("kE4M3", "kSoftware"), ("kE4M3", "kHardware"), (k16, "kSoftware")):
        for d in (64, 128, 256):
            KERNELS.append(f"&qsakv::cuda::decode_attention_kernel<{act}, "
                           f"qsakv::cuda::KvKind::{kv}, {d}, qsakv::cuda::Decoder::{dec}>")
            KERNELS.append(f"&qsakv::cuda::grouped_attention_kernel<{act}, "
                           f"qsakv::cuda::KvKind::{kv}, {d}, qsakv::cuda::Decoder::{dec}>")
KERNELS += [
    "&qsakv::cuda::grouped_union_kernel<false>",
    "&qsakv::cuda::grouped_union_kernel<true>",
    "&qsakv::cuda::store_kv_kernel<__half, true, false>",
    "&qsakv::cuda::store_kv_kernel<__nv_bfloat16, true, false>",
    "&qsakv::cuda::store_kv_kernel<__half, false>",
    "&qsakv::cuda::store_ring_kernel",
    "&qsakv::cuda::store_compressed_kernel<false>",
    "&qsakv::cuda::store_compressed_kernel<true>",
]


def main():
    root, repo, out = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out, exist_ok=True)
    nvrtc = ctypes.CDLL(os.path.join(root, "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"))
    # qsakv.h includes the CMake-generated qsakv_version.h: any version will do here.
    gen = os.path.join(out, "include")
    os.makedirs(gen, exist_ok=True)
    with open(os.path.join(repo, "include/qsakv_version.h.in")) as f:
        text = re.sub(r"@[A-Z_]+@", "0", f.read())
    with open(os.path.join(gen, "qsakv_version.h"), "w") as f:
        f.write(text)
    # The check must be able to fail: an SM75 instruction (movmatrix, which the tensor-core
    # tier uses) built for sm_70 has to be refused, or this NVRTC is not targeting sm_70.
    canary = (b'extern "C" __global__ void canary(unsigned* p) { unsigned y; asm volatile('
              b'"movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(p[0])); '
              b'p[1] = y; }')
    cprog = ctypes.c_void_p()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(cprog), canary, b"canary.cu", 0, None, None))
    copt = (ctypes.c_char_p * 1)(b"--gpu-architecture=sm_70")
    if nvrtc.nvrtcCompileProgram(cprog, 1, copt) == 0:
        print("sm70-check: an SM75 instruction built for sm_70: this NVRTC does not check sm_70")
        return 1
    print("sm70-check: canary ok (movmatrix refused for sm_70)")
    src_path = os.path.join(repo, "tools/sm70/sm70_kernels.cu")
    with open(src_path, "rb") as f:
        src = f.read()
    prog = ctypes.c_void_p()
    check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, src_path.encode(), 0, None, None))
    for k in KERNELS:
        check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, k.encode()))
    opts = ["--gpu-architecture=sm_70", "-std=c++17", "-default-device", 
            "-Xptxas=-warn-spills", "-Xptxas=-warn-lmem-usage", "-Xptxas=-v",
            "-I" + os.path.join(repo, "kernels"), "-I" + os.path.join(repo, "src"),
            "-I" + os.path.join(repo, "include"), "-I" + gen,
            "-I" + os.path.join(root, "nvidia/cuda_runtime/include"),
            "-I" + os.path.join(root, "nvidia/cuda_nvcc/include"),
            "-I" + os.path.join(repo, "tools/sm70/shim")]
    copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), copts)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    log = log.value.decode(errors="replace")
    with open(os.path.join(out, "nvrtc.log"), "w") as f:
        f.write(log)
    if rc != 0:
        print(log)
        print("sm70-check: NVRTC 12.9 failed to build the SM70 tier for sm_70")
        return 1
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin))
    with open(os.path.join(out, "sm70_kernels.cubin"), "wb") as f:
        f.write(cubin.raw)
    # ptxas -v's "info" lines are the per-kernel report; anything else is a warning.
    # NVRTC 12.9 always notes that sm_70 is deprecated: that one line is expected.
    bad = [l for l in log.splitlines()
           if l.strip() and not l.startswith("ptxas info") and "bytes stack frame" not in l
           and "Architectures prior to '<compute/sm>_75' are deprecated" not in l]
    for l in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", l)
        if m:
            print("  " + m.group(1), end="")
        elif "Used" in l:
            print(": " + l.split(":", 1)[1].strip())
    spills = [l for l in log.splitlines() if "bytes stack frame" in l and
              not re.search(r"0 bytes spill stores, 0 bytes spill loads", l)]
    if bad or spills:
        print("\n".join(bad + spills))
        print("sm70-check: warnings in the sm_70 build (see above)")
        return 1
    print(f"sm70-check: {len(KERNELS)} kernels built for sm_70 by NVRTC 12.9, no warning, no spill")
    cu = retargeted_ptx_check(repo, root, gen, out)
    if cu is False:
        print("sm70-check: the .cu kernels failed for sm_70 (see above)")
        return 1
    if cu is None and os.environ.get("QSAKV_REQUIRE_SM70_CHECK") == "1":
        print("sm70-check: FAILED: QSAKV_REQUIRE_SM70_CHECK=1 and the .cu kernels were not checked")
        return 1
    if cu:
        print(f"sm70-check: {len(CU_KERNELS)} kernels of .cu files assembled for sm_70 by ptxas 12.9")
    return 0


# Kernels the SM70 tier launches from .cu files that also hold host code (NVRTC cannot
# take those): compiled by the CUDA 13 nvcc of the normal build at compute_75 -- their
# code has no branch on the SM below SM90 -- then the PTX is retargeted to sm_70 and
# assembled by ptxas 12.9, which refuses any instruction SM70 lacks.
CU_KERNELS = [("kernels/cuda/select.cu", "select_topk_kernel"),
              ("kernels/cuda/select.cu", "select_filter_kernel"),
              ("kernels/cuda/calib.cu", "calib_observe_kernel")]
# Kernels whose spills are known and printed instead of failing (none today).
KNOWN_SPILLS = []


def retargeted_ptx_check(repo, root, gen, out):
    nvcc = os.environ.get("QSAKV_NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        print("sm70-check: SKIPPED the .cu kernels (no CUDA 13 nvcc for their PTX):",
              ", ".join(k for _, k in CU_KERNELS))
        return None
    ptxas = os.path.join(root, "nvidia/cuda_nvcc/bin/ptxas")
    ok = True
    for cu, kernel in CU_KERNELS:
        base = os.path.join(out, os.path.basename(cu))
        r = subprocess.run([nvcc, "-std=c++17", "-arch=compute_75", "-ptx",
                            "--expt-relaxed-constexpr", "-I" + os.path.join(repo, "kernels"),
                            "-I" + os.path.join(repo, "src"), "-I" + os.path.join(repo, "include"),
                            "-I" + gen, "-o", base + ".ptx", os.path.join(repo, cu)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            return False
        lines = open(base + ".ptx").read().split("\n")
        first = next(i for i, l in enumerate(lines) if re.match(r"^(\.visible )?\.entry ", l))
        keep, i, found = lines[:first], first, 0
        while i < len(lines):
            m = re.match(r"^(\.visible )?\.entry (\S+)\(", lines[i])
            if not m:
                i += 1
                continue
            j = i
            while lines[j] != "}":
                j += 1
            if kernel in m.group(2):
                keep += lines[i:j + 1]
                found += 1
            i = j + 1
        text = "\n".join(keep)
        text = re.sub(r"(?m)^\.version .*$", ".version 8.8", text)
        text = re.sub(r"(?m)^\.target sm_75$", ".target sm_70", text)
        with open(base + ".sm70.ptx", "w") as f:
            f.write(text)
        r = subprocess.run([ptxas, "-arch=sm_70", "-warn-spills", "-warn-lmem-usage", "-v",
                            "-o", base + ".sm70.cubin", base + ".sm70.ptx"],
                           capture_output=True, text=True)
        log = r.stdout + r.stderr
        for l in log.splitlines():
            if "Used" in l:
                print(f"  {kernel} ({found} instance(s), {cu}, PTX retargeted): "
                      + l.split(":", 1)[1].strip())
        warnings = [l for l in log.splitlines() if "warning" in l or "error" in l]
        known = kernel in KNOWN_SPILLS
        if r.returncode != 0 or found == 0 or (warnings and not known):
            print(log if found else f"sm70-check: no entry {kernel} in {cu}'s PTX")
            ok = False
        elif warnings:
            print("  KNOWN spills: " + "; ".join(
                w.split("'")[0] + w.split("'")[-1] for w in warnings))
    return ok


def check(nvrtc, rc):
    if rc != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise SystemExit("sm70-check: NVRTC error: " + nvrtc.nvrtcGetErrorString(rc).decode())


if __name__ == "__main__":
    sys.exit(main())
