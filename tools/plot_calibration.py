#!/usr/bin/env python3
"""Plots a calibration report: per QSA layer, the log2 histograms of |K| and |V| with
the 448 x scale line (the largest value the E4M3 cache represents at that scale).

    qsakv calib summarize STATS... --json --histograms > report.json
    python3 tools/plot_calibration.py report.json calibration.png

Needs matplotlib (not needed by any test); without it, says so and exits 0."""
import json
import math
import sys


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_calibration: matplotlib is not installed; nothing plotted")
        return 0
    with open(argv[1]) as f:
        report = json.load(f)
    lo, hi, bins = report["hist_log2_min"], report["hist_log2_max"], report["hist_bins"]
    width = (hi - lo) / bins
    layers = sorted({e["layer"] for e in report["layers"]})
    if any("histogram" not in e for e in report["layers"]):
        print("plot_calibration: the report has no histograms (use --histograms)",
              file=sys.stderr)
        return 2
    cols = 4
    rows = math.ceil(len(layers) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.flat[len(layers):]:
        ax.axis("off")
    for ax, layer in zip(axes.flat, layers):
        for e in (x for x in report["layers"] if x["layer"] == layer):
            color = "tab:blue" if e["kind"] == "k" else "tab:orange"
            xs = [lo + (b + 0.5) * width for b, _ in e["histogram"]]
            ys = [c for _, c in e["histogram"]]
            ax.step(xs, ys, where="mid", color=color, lw=0.8,
                    label=f"|{e['kind'].upper()}|, max {e['max_abs']:.4g}")
            ax.axvline(math.log2(448.0 * e["scale"]), color=color, ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("log2 |x|  (dashed: 448 x scale)", fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(f"TP{report['tp_size']}, {report['num_runs']} run(s), "
                 f"{report['activation_dtype']} activations", fontsize=10)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=120)
    print(f"plot_calibration: wrote {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
