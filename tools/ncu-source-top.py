#!/usr/bin/env python3
"""Top source lines of an `ncu --page source --csv` export by warp-stall samples.
Usage: ncu-source-top.py FILE.csv [N]"""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
hdr_i = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
if hdr_i is None:  # not a source page with stall samples: say what it is instead
    print("no 'Warp Stall Sampling' column; the export begins:")
    for r in rows[:4]:
        print("  ", ",".join(r)[:300])
    sys.exit(1)
hdr = rows[hdr_i]
samp = next(i for i, c in enumerate(hdr) if "Warp Stall Sampling (All" in c)
src = next((i for i, c in enumerate(hdr) if c in ("Source", "Address Source")), 1)
line = next((i for i, c in enumerate(hdr) if c in ("#", "Line")), 0)
body = [r for r in rows[hdr_i + 1:] if len(r) > samp]
def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0
total = sum(num(r[samp]) for r in body) or 1.0
print("columns:", hdr[:12])
for r in sorted(body, key=lambda r: -num(r[samp]))[:n]:
    print(f"{100 * num(r[samp]) / total:5.1f}%  {r[line]:>5}  {r[src].strip()[:110]}")
