#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws the JSON of `qsakv_bench --json` (tools/bench/qsakv_bench.c) as PNG figures.

    python3 tools/plot_bench.py BENCH_JSON [BENCH_JSON ...] --out DIR [--prefix NAME-]

One figure per section found in any input, written to DIR/<prefix><name>.png:
  decode.png    'attention': decode time (us) and bandwidth (GB/s) against rows, per
                dtype; the copy ceiling (copy_gbs) and, where the JSON has it, the read
                floor of the same bytes (one call, L2 flushed)
  select.png    'select': selection time against context length, per kind and rows
  multirow.png  'multirow': auto / decode / grouped route time against rows
  overlap.png   'overlap': auto / decode / grouped route time against the shared
                fraction f, one panel per workload
A section absent (or empty) in every input is skipped with a message on stderr. Exits 1
on an unreadable file or when no input has any of the sections. Needs matplotlib."""
import argparse
import io
import json
import math
import os
import sys

SECTIONS = ("attention", "select", "multirow", "overlap")
ROUTES = (("auto_us", "auto", "tab:green"), ("decode_us", "decode route", "tab:blue"),
          ("grouped_us", "grouped route", "tab:red"))
DTYPE_STYLE = {"e4m3": "-", "fp16": "--"}


def load(paths):
    """[(label, dict)] of the inputs; raises SystemExit with a message on a bad one."""
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"plot_bench: cannot read {path}: {e}")
        if not isinstance(data, dict):
            sys.exit(f"plot_bench: {path}: not a qsakv_bench JSON object")
        runs.append((os.path.splitext(os.path.basename(path))[0], data))
    if not any(run.get(s) for _, run in runs for s in SECTIONS):
        sys.exit("plot_bench: no input has any of the sections " + ", ".join(SECTIONS))
    return runs


def num(v):
    """v as a float, or None where the bench wrote null or a negative 'not measured'."""
    return float(v) if isinstance(v, (int, float)) and v >= 0 and math.isfinite(v) else None


def series(records, x, y):
    """(xs, ys) of the records with both fields measured, sorted by x."""
    pts = sorted((num(r.get(x)), num(r.get(y))) for r in records
                 if num(r.get(x)) is not None and num(r.get(y)) is not None)
    return [p[0] for p in pts], [p[1] for p in pts]


def device(runs):
    return ", ".join(sorted({run.get("device", "unknown device") for _, run in runs}))


def tag(label, runs):
    """The run's name in a legend, only when several inputs hold the section."""
    return f" [{label}]" if len(runs) > 1 else ""


def log_ticks(ax, xs, y=True):
    """Log axes labelled with plain numbers: x at the measured values, y by matplotlib."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
    ax.set_xscale("log")
    ax.set_xticks(sorted(set(xs)), [f"{x:g}" for x in sorted(set(xs))], fontsize=7,
                  rotation=45 if len(set(xs)) > 6 else 0)
    ax.xaxis.set_minor_formatter(NullFormatter())
    if y:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())


def routes(ax, recs, x, ls="-", suffix=""):
    """auto / decode / grouped time against x; auto drawn wide below the forced routes,
    so that it shows where it coincides with one of them."""
    for field, name, color in ROUTES:
        look = (dict(lw=5, marker="o", ms=8, alpha=0.35) if field == "auto_us"
                else dict(marker="o", ms=3))
        ax.plot(*series(recs, x, field), ls, color=color, label=name + suffix, **look)


def grid(plt, n, width=3.6, height=2.9, max_cols=5):
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.6),
                             squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, list(axes.flat)


def fig_decode(plt, runs):
    fig, (at, bw) = plt.subplots(1, 2, figsize=(12, 4.6))
    for i, (label, run) in enumerate(runs):
        recs, t = run["attention"], tag(label, runs)
        # One run: E4M3 blue, FP16 orange, lines black and gray; more: a tab10 pair each.
        pair = [f"C{(2 * i) % 10}", f"C{(2 * i + 1) % 10}"]
        ink = ("black", "gray") if len(runs) == 1 else (pair[0], pair[0])
        for dt, size, color in (("e4m3", 1, pair[0]), ("fp16", 2, pair[1])):
            style = dict(color=color, marker="o", ms=4)
            xs, ys = series(recs, "rows", f"{dt}_us")
            if xs:
                at.plot(xs, ys, "-", label=f"{dt.upper()}, graph of 64{t}", **style)
                bw.plot(*series(recs, "rows", f"{dt}_gbs"), "-",
                        label=f"{dt.upper()}, graph of 64{t}", **style)
            flushed = [r for r in recs if num(r.get(f"{dt}_us_l2_flushed"))]
            if flushed:
                style["marker"] = "s"
                at.plot(*series(flushed, "rows", f"{dt}_us_l2_flushed"), "--",
                        label=f"{dt.upper()}, one call, L2 flushed{t}", **style)
                gbs = sorted((r["rows"], size * r["e4m3_bytes"] / r[f"{dt}_us_l2_flushed"] / 1e3)
                             for r in flushed)
                bw.plot(*zip(*gbs), "--", label=f"{dt.upper()}, one call, L2 flushed{t}",
                        **style)
        floor = [r for r in recs if num(r.get("e4m3_read_floor_us_l2_flushed"))]
        if floor:
            at.plot(*series(floor, "rows", "e4m3_read_floor_us_l2_flushed"), ":", color=ink[1],
                    marker=".", label=f"read floor of the E4M3 bytes, L2 flushed{t}")
            gbs = sorted((r["rows"], r["e4m3_bytes"] / r["e4m3_read_floor_us_l2_flushed"] / 1e3)
                         for r in floor)
            bw.plot(*zip(*gbs), ":", color=ink[1], marker=".",
                    label=f"read floor of the E4M3 bytes, L2 flushed{t}")
        if num(run.get("copy_gbs")):
            bw.axhline(run["copy_gbs"], color=ink[0], lw=0.8,
                       label=f"copy ceiling {run['copy_gbs']:.0f} GB/s{t}")
    rows = [r["rows"] for _, run in runs for r in run["attention"]]
    log_ticks(at, rows)
    log_ticks(bw, rows, y=False)
    at.set(xlabel="rows (decode queries)", ylabel="time per call (us)",
           title="decode attention time")
    bw.set(xlabel="rows (decode queries)", ylabel="K/V bytes read (GB/s)",
           title="achieved bandwidth")
    for ax in (at, bw):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Decode attention, 2051 tokens per row -- {device(runs)}")
    return fig


def fig_select(plt, runs):
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label, run in runs:
        # Runs before E4M3 index keys have no "index_keys": their keys were FP16.
        def ikeys(r):
            return r.get("index_keys", "fp16")
        keys = sorted({(r["kind"], r["requests"], r["rows"], ikeys(r)) for r in run["select"]})
        for kind, reqs, rows, ik in keys:
            recs = [r for r in run["select"] if (r["kind"], r["requests"], r["rows"], ikeys(r)) ==
                    (kind, reqs, rows, ik)]
            shape = f"{reqs} x {rows // reqs} rows" if kind != "decode" else f"{rows} rows"
            ax.plot(*series(recs, "tokens", "us_l2_flushed"), marker="o",
                    linestyle="--" if ik == "e4m3" else "-",
                    label=f"{kind}, {shape}, {ik} keys{tag(label, runs)}")
    log_ticks(ax, [r["tokens"] for _, run in runs for r in run["select"]])
    ax.set(xlabel="context length (tokens)",
           ylabel="selection time, one call, L2 flushed (us)",
           title=f"Indexer top-512 selection -- {device(runs)}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return fig


def workload(r, label, runs):
    return (r["kind"], r["requests"], r["context"]) + ((label,) if len(runs) > 1 else ())


def fig_multirow(plt, runs):
    recs = [(workload(r, label, runs), r) for label, run in runs for r in run["multirow"]]
    keys = sorted({k for k, _ in recs})
    fig, axes = grid(plt, len(keys), max_cols=4)
    for ax, key in zip(axes, keys):
        for dt in sorted({r["dtype"] for k, r in recs if k == key}):
            sel = [r for k, r in recs if k == key and r["dtype"] == dt]
            routes(ax, sel, "rows", DTYPE_STYLE.get(dt, "-."), f", {dt.upper()}")
        kind, reqs, ctx = key[:3]
        ax.set_title(f"{kind}, {reqs} request(s), {ctx // 1024}K context"
                     + (f" [{key[3]}]" if len(key) > 3 else ""), fontsize=9)
        log_ticks(ax, [r["rows"] for k, r in recs if k == key])
        ax.set(xlabel="rows in the call", ylabel="time, one call, L2 flushed (us)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.suptitle(f"Multi-row attention routes -- {device(runs)}")
    return fig


def fig_overlap(plt, runs):
    recs = [(workload(r, label, runs) + (r["rows"], r["dtype"]), r)
            for label, run in runs for r in run["overlap"]]
    keys = sorted({k for k, _ in recs}, key=lambda k: (k[-1], k))
    fig, axes = grid(plt, len(keys))
    for ax, key in zip(axes, keys):
        sel = [r for k, r in recs if k == key]
        routes(ax, sel, "f")
        kind, reqs, ctx, rows, dt = key[0], key[1], key[2], key[-2], key[-1]
        ax.set_title(f"{kind}, {reqs} x {rows // reqs} rows, {ctx // 1024}K, {dt.upper()}"
                     + (f" [{key[3]}]" if len(key) > 5 else ""), fontsize=9)
        ax.set(xlabel="shared fraction f of each row's groups", ylabel="time per call (us)",
               ylim=(0, None))
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Overlap sweep, one call, L2 flushed -- {device(runs)}")
    return fig


def save(fig, path, dpi):
    """A PNG of 256 colours (Pillow comes with matplotlib): a third of the RGBA size."""
    from PIL import Image
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(256).save(path, optimize=True)


FIGURES = (("attention", "decode", fig_decode), ("select", "select", fig_select),
           ("multirow", "multirow", fig_multirow), ("overlap", "overlap", fig_overlap))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", metavar="BENCH_JSON")
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for the PNGs")
    ap.add_argument("--prefix", default="", help="file name prefix, e.g. run26-")
    ap.add_argument("--dpi", type=int, default=100)
    args = ap.parse_args(argv)
    runs = load(args.inputs)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_bench: matplotlib is not installed (pip install matplotlib)")
    os.makedirs(args.out, exist_ok=True)
    for section, name, draw in FIGURES:
        have = [(label, run) for label, run in runs if run.get(section)]
        if not have:
            print(f"plot_bench: no '{section}' records in the input(s); {name}.png skipped",
                  file=sys.stderr)
            continue
        try:
            fig = draw(plt, have)
        except (KeyError, TypeError, ValueError) as e:
            sys.exit(f"plot_bench: malformed '{section}' records: {e!r}")
        fig.tight_layout()
        path = os.path.join(args.out, f"{args.prefix}{name}.png")
        save(fig, path, args.dpi)
        plt.close(fig)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
