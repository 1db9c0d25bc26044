#!/usr/bin/env python3
"""Compares two qsakv_bench JSON files of the same tables (a base build's and a change's,
from one device call so that both saw the same GPU and clocks): every timing field of
every record, change / base, the fastest and slowest few, and the records more than
--limit (default 2%) slower.

  tools/bench_compare.py BASE.json NEW.json [BASE2.json NEW2.json ...] [--limit 0.02]

Exit status 0 either way: a comparison is a measurement, not a test."""
import argparse
import json


# The fields that name a record (what was measured); everything else is a result, and
# results (a split count, a group count) may differ between the two builds.
IDENTITY = ("kind", "requests", "rows", "context", "tokens", "dtype", "cache", "index_keys", "f")


def is_timing(field):
    """A measured time in us (e4m3_us, us_l2_flushed, step_us_graph, ...), not a floor."""
    parts = field.split("_")
    return "us" in parts and "floor" not in parts


def timings(path):
    """(table, record name, field) -> microseconds; fails on two records of one name."""
    out = {}
    with open(path) as f:
        data = json.load(f)
    for table, records in data.items():
        if not isinstance(records, list):
            continue
        names = set()
        for i, r in enumerate(records):
            if not isinstance(r, dict):
                continue
            name = " ".join(f"{k}={r[k]}" for k in IDENTITY if k in r) or f"#{i}"
            if name in names:
                raise SystemExit(f"{path}: table {table} has two records named '{name}'")
            names.add(name)
            for field, v in r.items():
                if is_timing(field) and isinstance(v, (int, float)) and v > 0:
                    out[(table, name, field)] = v
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="pairs: BASE.json NEW.json ...")
    ap.add_argument("--limit", type=float, default=0.02, help="slower than this is flagged")
    ap.add_argument("--show", type=int, default=8, help="rows of each end to print")
    a = ap.parse_args()
    if len(a.files) % 2:
        ap.error("files come in pairs: BASE.json NEW.json")
    ratios, one_sided = [], []
    for base_path, new_path in zip(a.files[0::2], a.files[1::2]):
        base, new = timings(base_path), timings(new_path)
        for k, v in base.items():
            if k in new:
                ratios.append((new[k] / v, f"{k[0]} {k[1]} {k[2]}: {v:.2f} -> {new[k]:.2f}"))
        one_sided += [f"base only: {' '.join(map(str, k))}" for k in base if k not in new]
        one_sided += [f"new only: {' '.join(map(str, k))}" for k in new if k not in base]
    for s in one_sided:
        print(s)
    if not ratios:
        print("nothing compared (no timing field common to both sides)")
        return
    ratios.sort()
    print(f"compared {len(ratios)} timings; median ratio {ratios[len(ratios) // 2][0]:.3f}")
    print("fastest:")
    for r, s in ratios[:a.show]:
        print(f"  {s} ({r:.3f})")
    print("slowest:")
    for r, s in ratios[-a.show:]:
        print(f"  {s} ({r:.3f})")
    over = [s for r, s in ratios if r > 1 + a.limit]
    print(f"more than {a.limit:.0%} slower: {len(over)}")
    for s in over:
        print(f"  {s}")


if __name__ == "__main__":
    main()
