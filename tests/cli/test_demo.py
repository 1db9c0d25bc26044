"""The C demo (examples/c/demo.c): prints its working directory and keeps it with
--keep, explains its capacity columns, labels CPU-backend timings, calibrates through
the library's calibration API (the overlay's scales are the merged statistics' scales),
and says "no NVIDIA driver found" where there is none.
Needs QSAKV_DEMO (qsakv_demo) and QSAKV_TOOL (qsakv)."""
import ctypes
import json
import os
import re
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tools():
    demo, tool = os.environ.get("QSAKV_DEMO"), os.environ.get("QSAKV_TOOL")
    if not demo or not tool:
        pytest.skip("QSAKV_DEMO and QSAKV_TOOL must be set")
    return demo, tool


def run(*args):
    return subprocess.run([*map(str, args)], capture_output=True, text=True, timeout=600)


def workdir(out: str) -> Path:
    m = re.search(r"^working directory: (\S+) \(", out, re.M)
    assert m, out
    return Path(m.group(1))


@pytest.fixture(scope="module")
def kept(tools):
    demo, _ = tools
    r = run(demo, "--keep")
    assert r.returncode == 0, r.stderr
    d = workdir(r.stdout)
    yield r.stdout, d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def test_keep_prints_and_keeps_the_working_directory(kept):
    out, d = kept
    assert d.is_dir()
    assert f"kept working directory {d}" in out
    for i in range(4):
        assert (d / "calib" / f"rank{i}.safetensors").is_file()
    assert (d / "kvscales" / "qsakv-overlay.json").is_file()
    assert (d / "model.safetensors.index.json").is_file()


def test_without_keep_prints_and_removes_it(tools):
    demo, _ = tools
    r = run(demo)
    assert r.returncode == 0, r.stderr
    d = workdir(r.stdout)
    assert f"removed working directory {d} (--keep keeps it)" in r.stdout
    assert not d.exists()
    assert run(demo, "--bogus").returncode == 2
    h = run(demo, "--help")
    assert h.returncode == 0 and "--keep" in h.stdout


def test_columns_explained(kept):
    out, _ = kept
    for column in ("B/token", "main B/token", "tokens", "top-k (MiB)"):
        assert re.search(rf"^    {re.escape(column)} +\S", out, re.M), column


def test_timings_labelled(kept):
    out, _ = kept
    if "backend: CPU reference" in out:
        assert "these timings say nothing about GPU speed" in out
    else:
        assert "backend: CUDA" in out and "make bench" in out


def test_no_driver_message(kept):
    out, _ = kept
    try:
        ctypes.CDLL("libcuda.so.1")
        have_driver = True
    except OSError:
        have_driver = False
    if not have_driver and "built with CUDA" in out:
        assert "backend: CPU reference (no NVIDIA driver found (cudaError" in out
    assert "insufficient" not in out


def test_overlay_comes_from_the_calibration_api(kept, tools):
    """The scale pack holds exactly the scales `calib summarize` computes from the rank
    files the demo saved: the demo calibrated through qsakv_calib_*, not by hand."""
    out, d = kept
    _, tool = tools
    assert "Calibration (qsakv_calib_*)" in out
    ranks = sorted((d / "calib").glob("rank*.safetensors"))
    s = run(tool, "calib", "summarize", *ranks, "--json")
    assert s.returncode == 0, s.stderr
    summary = json.loads(s.stdout)
    assert summary["tp_size"] == 4 and summary["ranks_covered"] == 4
    i = run(tool, "overlay", "inspect", d / "kvscales", "--json")
    assert i.returncode == 0, i.stderr
    overlay = json.loads(i.stdout)
    assert overlay["bound"] is True and overlay["contract"]["tp_size"] == 4
    scales = {(e["layer"], e["kind"]): e["scale"] for e in summary["layers"]}
    assert len(overlay["layers"]) == 12
    for e in overlay["layers"]:
        assert e["k_scale"] == scales[(e["layer"], "k")]
        assert e["v_scale"] == scales[(e["layer"], "v")]
