#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/ncu-sass-by-source.py on a synthetic disassembly, SASS export and sources: of the
functions that match any of several "|"-separated names, the one whose opcodes agree with
the export is picked (a profile's first kernel need not be the first name: run 47), its
instructions and stall samples are charged to the innermost source function of each
address's inline chain, and --src reads the sources from another checkout than the paths
the disassembly names."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "ncu-sass-by-source.py")

# Two kernels in the disassembly, with different opcodes at the same offsets; the
# profiled one is the second ("filter").
SOURCE = """\
__device__ void helper_a(int x) {
  x += 1;
}
__device__ void helper_b(int x) {
  x += 2;
}
__global__ void filter_kernel(int x) {
  helper_a(x);
  helper_b(x);
}
"""


def disassembly(path):
    src = "/nowhere/kernels/cuda/k.cu"  # a path that does not exist here: --src finds it
    lines = []
    for name, ops in (("_Z11topk_kerneli", ("IADD3", "IADD3", "EXIT")),
                      ("_Z13filter_kerneli", ("LDS", "BAR.SYNC", "EXIT"))):
        lines += ["//--------------------- .text." + name, name + ":"]
        frames = [(2, 8), (5, 9), (9, None)]  # helper_a at 8, helper_b at 9, the kernel's own
        for i, (op, (line, caller)) in enumerate(zip(ops, frames)):
            if caller:
                lines.append(f'\t//## File "{src}", line {line} inlined at "{src}", line {caller}')
            lines.append(f'\t//## File "{src}", line {caller or line}')
            lines.append(f"        /*{16 * i:04x}*/                   {op} R0, R0 ;")
    open(path, "w").write("\n".join(lines) + "\n")


def export(path):
    hdr = ['"Address"', '"Source"', '"Warp Stall Sampling (All Samples)"',
           '"Instructions Executed"']
    rows = [('"Kernel Name"', '"void filter_kernel(int)"'), hdr,
            ('"7f0000001000"', '"LDS R0, [R1]"', '"30"', '"100"'),
            ('"7f0000001010"', '"BAR.SYNC 0x0"', '"10"', '"300"'),
            ('"7f0000001020"', '"EXIT"', '"0"', '"600"')]
    open(path, "w").write("\n".join(",".join(r) for r in rows) + "\n")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "src", "kernels", "cuda"))
        open(os.path.join(tmp, "src", "kernels", "cuda", "k.cu"), "w").write(SOURCE)
        dis, csv = os.path.join(tmp, "k.dis"), os.path.join(tmp, "k.csv")
        disassembly(dis)
        export(csv)
        run = subprocess.run([sys.executable, TOOL, dis, csv, "topk_kernel|filter_kernel",
                              "--src", os.path.join(tmp, "src")],
                             capture_output=True, text=True)
        out = run.stdout + run.stderr
        failures = []
        if run.returncode != 0:
            failures.append(f"exit {run.returncode}")
        if "warning" in out:
            failures.append("the filter kernel's instance was not matched")
        want = {"helper_a < filter_kernel": ("10.0%", "75.0%"),
                "helper_b < filter_kernel": ("30.0%", "25.0%"),
                "filter_kernel": ("60.0%", "0.0%")}
        lines = out.splitlines()
        if not lines or "1000 warp instructions" not in lines[0] or "40 stall samples" not in lines[0]:
            failures.append("the totals line")
        for label, (ins, smp) in want.items():
            hit = [l for l in lines if l.rstrip().endswith("samples  " + label)]
            if len(hit) != 1 or not hit[0].lstrip().startswith(ins) or f"{smp} samples" not in hit[0]:
                failures.append(f"{label}: want {ins} of instructions and {smp} of samples")
        if failures:
            print(out)
            sys.exit("ncu_sass_tool: FAIL: " + "; ".join(failures))
        print("ncu_sass_tool: the filter kernel matched among two names; 3 functions charged")


if __name__ == "__main__":
    main()
