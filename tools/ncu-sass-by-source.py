#!/usr/bin/env python3
"""Where a kernel's instructions and stall samples go, by source function and line.

Nsight Compute's SASS page (`ncu -i REP --page source --csv --print-source sass`) counts
executed instructions and stall samples per SASS address; the build's line information
(`-lineinfo`) says which source line, and through which inlined calls, each address
comes from. This joins the two: a kernel's addresses are matched by offset from its first
instruction against the disassembly of the same build (`nvdisasm -c -gi CUBIN`, the cubin
from `cuobjdump -xelf all libqsakv.so`), and each instruction is charged to the innermost
source function of its inline chain (the nearest definition above its line), labelled
with its caller ("helper < caller"), so that a shared helper shows once per call site.

Usage: ncu-sass-by-source.py DISASM SASS_CSV FUNCTION [--per N] [--lines FILE:LO-HI]
                             [--src DIR]
  SASS_CSV         the export; of several kernels in it, the first
  FUNCTION         a substring of the kernel's mangled name in DISASM, or several
                   separated by "|" (of the functions that match any, the one whose
                   opcodes agree with the profile's: profile.sh passes its regex of the
                   hot kernels, whichever of them the export holds first)
  --per N          also give counts per N (e.g. per row of the batch profiled)
  --lines F:LO-HI  instead, every line of file F (basename) in LO..HI on some inline frame
  --src DIR        read the sources below DIR (kernels/, src/, include/) instead of the
                   paths the disassembly names: a checkout of the profiled commit, when
                   the tree at those paths has changed since (git worktree add DIR REV)
"""
import collections
import csv
import os
import re
import sys

# A definition: a line with __device__ or __global__ (every device function of ours has
# one), the name the identifier before the first "(" once attributes are removed; the
# signature may run onto the next lines.
ATTR = re.compile(r"__launch_bounds__\s*\([^)]*\)|__(?:forceinline|noinline|host|device|global)__")
NAME = re.compile(r"([A-Za-z_]\w*)\s*\(")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_disasm(path, function):
    """{function name: {offset: (inline chain [(file, line)...] innermost first, opcode)}}
    for every function of the disassembly whose mangled name contains one of the
    "|"-separated substrings of `function`."""
    wanted = [w for w in function.split("|") if w]
    funcs, cur, chain, pending = {}, None, [], []
    for l in open(path, errors="replace"):
        if l.startswith("//----"):
            cur = None
            continue
        if cur is None:
            m = re.match(r"^([A-Za-z_]\w*):\s*$", l)
            if m and any(w in m.group(1) for w in wanted):
                cur = funcs.setdefault(m.group(1), {})
                chain, pending = [], []
            continue
        m = re.match(r'\s*//## File "(.*?)", line (\d+)( inlined at)?', l)
        if m:
            pending.append((m.group(1), int(m.group(2))))
            if not m.group(3):  # the outermost frame ends a chain
                chain, pending = pending, []
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", l)
        if m:
            cur[int(m.group(1), 16)] = (chain, m.group(2))
    if not funcs:
        sys.exit(f"no function matching {function!r} in {path}")
    return funcs


def pick_function(funcs, sass):
    """The function whose opcodes agree with the profile's at the most offsets (several
    instances of a template match one name)."""
    def score(f):
        return sum(1 for off, op in sass if off in f and f[off][1] == op)
    best = max(funcs.values(), key=score)
    if score(best) < 0.9 * len(sass):
        print(f"warning: only {score(best)} of {len(sass)} opcodes agree with the closest "
              "function of the disassembly: a different build?", file=sys.stderr)
    return best


class Functions:
    """Source line -> the name of the function defined nearest above it."""

    def __init__(self, src=None):
        self.cache = {}  # path -> names per line, or None (unreadable)
        self.src = src  # a checkout to read instead of the disassembly's paths

    def name(self, path, line):
        # The CUDA toolkit's headers (intrinsics, atomics) are not where time is decided:
        # charged to the caller in our sources.
        if "/cuda" in path and "/include/" in path:
            return None
        if path not in self.cache and (self.src or not os.path.exists(path)):
            # A disassembly from another machine (or --src): the same file in this checkout.
            for part in ("/kernels/", "/src/", "/include/"):
                if part in path:
                    local = os.path.join(self.src or REPO, part.strip("/"), path.rsplit(part, 1)[1])
                    if os.path.exists(local):
                        self.cache[path] = self.cache.get(local) or self._read(local)
                        break
        if path not in self.cache:
            self.cache[path] = self._read(path)
        names = self.cache[path]
        if names is None or not 0 < line <= len(names) or names[line - 1] is None:
            return None  # not our source, or above every definition
        return names[line - 1]

    @staticmethod
    def _read(path):
        names, cur = [], None
        try:
            src = open(path, errors="replace").read().split("\n")
        except OSError:
            return None
        for i, text in enumerate(src):
            code = text.split("//")[0]
            if ("__device__" in code or "__global__" in code) and not code.lstrip().startswith("#"):
                m = NAME.search(ATTR.sub(" ", " ".join(t.split("//")[0] for t in src[i:i + 3])))
                if m:
                    cur = m.group(1)
            names.append(cur)
        return names


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    disasm, sass_csv, function = argv[1:4]
    per = 1.0
    lines_sel = None
    src = None
    rest = argv[4:]
    while rest:
        if rest[0] == "--per":
            per = float(rest[1])
        elif rest[0] == "--lines":
            f, rng = rest[1].rsplit(":", 1)
            lo, hi = (int(x) for x in rng.split("-"))
            lines_sel = (f, lo, hi)
        elif rest[0] == "--src":
            src = rest[1]
        else:
            sys.exit(__doc__)
        rest = rest[2:]
    rows = list(csv.reader(open(sass_csv, errors="replace")))
    hdr_i = next((i for i, r in enumerate(rows) if "Address" in r), None)
    if hdr_i is None:  # the report has no kernel of that name (e.g. the case launched others)
        first = " ".join(rows[0])[:120] if rows else "(empty)"
        sys.exit(f"{sass_csv}: no SASS table for {function}; the export begins: {first}")
    hdr, body = rows[hdr_i], []
    for r in rows[hdr_i + 1:]:  # the first kernel of the export only
        if r and r[0] in ("Kernel Name", "Address"):
            break
        if len(r) > 2:
            body.append(r)
    col = {name: hdr.index(name) for name in ("Address", "Source", "Instructions Executed")}
    samp = next(i for i, c in enumerate(hdr) if c.startswith("Warp Stall Sampling (All"))
    base = int(body[0][col["Address"]], 16)
    opcode = re.compile(r"\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
    sass = [(int(r[col["Address"]], 16) - base, (opcode.match(r[col["Source"]]) or [None, None])[1])
            for r in body]
    chains = {off: v[0] for off, v in pick_function(parse_disasm(disasm, function), sass).items()}

    def num(s):
        try:
            return float(s.replace(",", ""))
        except ValueError:
            return 0.0

    fn = Functions(src)
    agg = collections.defaultdict(lambda: [0.0, 0.0])
    unmatched = 0
    for r in body:
        chain = chains.get(int(r[col["Address"]], 16) - base)
        if chain is None:
            unmatched += 1
            continue
        ins, smp = num(r[col["Instructions Executed"]]), num(r[samp])
        if lines_sel:
            f, lo, hi = lines_sel
            hit = next(((p, ln) for p, ln in chain if os.path.basename(p) == f and lo <= ln <= hi), None)
            if hit:
                agg[hit][0] += ins
                agg[hit][1] += smp
            continue
        # The innermost frame in our sources, labelled with the next different caller.
        names = [n for n in (fn.name(p, ln) for p, ln in chain) if n] or ["?"]
        caller = next((n for n in names[1:] if n != names[0]), None)
        key = f"{names[0]} < {caller}" if caller else names[0]
        agg[key][0] += ins
        agg[key][1] += smp
    if unmatched:
        print(f"warning: {unmatched} of {len(body)} addresses not in the disassembly "
              "(a different build?)", file=sys.stderr)
    ti = sum(v[0] for v in agg.values()) or 1.0
    ts = sum(v[1] for v in agg.values()) or 1.0
    if lines_sel:
        for (p, ln), (i, s) in sorted(agg.items(), key=lambda x: x[0][1]):
            text = open(p, errors="replace").read().split("\n")[ln - 1].strip() if os.path.exists(p) else ""
            print(f"{ln:5d} {i / per:10.0f} instr  {100 * s / ts:5.1f}% samples  {text[:80]}")
        return
    print(f"{ti:.0f} warp instructions ({ti / per:.0f} per {per:g}), {ts:.0f} stall samples")
    for k, (i, s) in sorted(agg.items(), key=lambda x: -x[1][0]):
        print(f"{100 * i / ti:5.1f}% instr ({i / per:9.0f})  {100 * s / ts:5.1f}% samples  {k}")


if __name__ == "__main__":
    try:
        main(sys.argv)
    except BrokenPipeError:  # a reader such as `head` stopped early
        os._exit(0)
