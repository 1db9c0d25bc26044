"""`qsakv overlay verify|inspect` agree with the C API on valid and invalid overlays:
same verdict, the status name and the library's own message on stderr, exit codes as
documented in `qsakv --help`. Needs QSAKV_LIB (libqsakv.so) and QSAKV_TOOL (qsakv)."""
import ctypes
import json
import os
import subprocess

import pytest

from cli_support import QSA_LAYERS, run_tool, write_pack
from qsakv import _cdefs

ModelConfig = _cdefs.qsakv_model_config


def api_verdict(lib, path, revision, tp=1):
    """(status name, message) of load + validate through the C API."""
    handle = ctypes.POINTER(_cdefs.qsakv_overlay)()
    status = lib.qsakv_overlay_load(ctypes.byref(handle), str(path).encode(), None)
    if status == 0:
        cfg = ModelConfig()
        assert lib.qsakv_model_config_preset(ctypes.byref(cfg), b"qwen4_exp") == 0
        cfg.tp_size = tp
        status = lib.qsakv_overlay_validate(handle, ctypes.byref(cfg), revision.encode())
        lib.qsakv_overlay_destroy(handle)
    return lib.qsakv_status_string(status).decode(), lib.qsakv_last_error().decode()


def test_help_documents_exit_codes(env):
    _, tool = env
    r = run_tool(tool, "--help")
    assert r.returncode == 0 and "exit codes" in r.stdout
    assert run_tool(tool, "--version").returncode == 0
    assert run_tool(tool, "nosucharea").returncode == 2
    assert run_tool(tool, "overlay", "verify", "x").returncode == 2  # no --revision


def test_valid_overlay(env, tmp_path):
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path)
    assert api_verdict(lib, pack, rev)[0] == "QSAKV_SUCCESS"
    r = run_tool(tool, "overlay", "verify", pack, "--revision", rev)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK:")


@pytest.mark.parametrize("case", ["revision", "incomplete", "contract", "missing"])
def test_invalid_overlay_agrees_with_api(env, tmp_path, case):
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path, num_layers=11 if case == "incomplete" else 12,
                           tp=4 if case == "contract" else 0)
    if case == "revision":
        rev = "0" * 64
    if case == "missing":
        pack = tmp_path / "nowhere"
    status, message = api_verdict(lib, pack, rev)
    expected = {"revision": "QSAKV_ERROR_REVISION_MISMATCH",
                "incomplete": "QSAKV_ERROR_OVERLAY_INCOMPLETE",
                "contract": "QSAKV_ERROR_CONTRACT",
                "missing": "QSAKV_ERROR_OVERLAY_MISSING"}[case]
    assert status == expected, message
    r = run_tool(tool, "overlay", "verify", pack, "--revision", rev)
    assert r.returncode == 1
    assert r.stderr.strip() == f"{status}: {message}"


def test_inspect_json_matches_written_scales(env, tmp_path):
    lib, tool = env
    pack, rev = write_pack(lib, tmp_path, tp=4)
    r = run_tool(tool, "overlay", "inspect", pack, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["base_index_sha256"] == rev
    assert doc["contract"]["tp_size"] == 4 and doc["contract"]["min_sm"] is None
    assert [e["layer"] for e in doc["layers"]] == QSA_LAYERS
    for i, e in enumerate(doc["layers"]):
        assert e["k_scale"] == pytest.approx(0.01 * (i + 1), rel=1e-7)
    text = run_tool(tool, "overlay", "inspect", pack)
    assert text.returncode == 0 and "tp_size 4" in text.stdout


def test_materialize_non_utf8_base_is_refused_clearly(env, tmp_path):
    """A base directory whose name is not UTF-8 cannot be recorded in the JSON provenance:
    a clear INVALID_ARGUMENT naming base_checkpoint_dir, never INTERNAL; the same base under
    a UTF-8 name materialises."""
    lib, tool = env
    pack, _ = write_pack(lib, tmp_path)
    index = (tmp_path / "model.safetensors.index.json").read_bytes()
    bad = os.path.join(os.fsencode(tmp_path), b"base-\xff\xfe")
    os.mkdir(bad)
    with open(os.path.join(bad, b"model.safetensors.index.json"), "wb") as f:
        f.write(index)
    out = tmp_path / "out"
    r = subprocess.run([os.fsencode(tool), b"overlay", b"materialize", bad,
                        os.fsencode(pack), os.fsencode(out)], capture_output=True)
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode("utf-8")  # the message itself is UTF-8 (the bytes are escaped)
    assert err.startswith("QSAKV_ERROR_INVALID_ARGUMENT: base_checkpoint_dir"), err
    assert "\\xff" in err and not out.exists()
    good = tmp_path / "base-\u00e9"
    good.mkdir()
    (good / "model.safetensors.index.json").write_bytes(index)
    r = run_tool(tool, "overlay", "materialize", good, pack, out)
    assert r.returncode == 0, r.stderr
    assert (out / "qsakv-provenance.json").exists()


def test_materialize_removes_staging_left_by_a_killed_run(env, tmp_path):
    """A materialize killed with SIGKILL leaves OUT.staging-XXXXXX behind; the next one to
    the same destination removes it (its owner is gone) and succeeds."""
    import signal
    import time
    lib, tool = env
    pack, _ = write_pack(lib, tmp_path)
    base = tmp_path / "base"
    base.mkdir()
    (base / "model.safetensors.index.json").write_bytes(
        (tmp_path / "model.safetensors.index.json").read_bytes())
    # Many base files make the staging phase (one link each) long enough to interrupt.
    for i in range(20000):
        (base / f"model-{i:05d}.safetensors").write_bytes(b"")
    out = tmp_path / "out"
    stale = []
    for _ in range(50):
        p = subprocess.Popen([tool, "overlay", "materialize", base, pack, out],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline and p.poll() is None:
            stale = [n for n in os.listdir(tmp_path) if n.startswith("out.staging-")]
            if stale and (tmp_path / stale[0] / ".qsakv-staging-owner").exists():
                break
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()
        import shutil
        stale = [n for n in os.listdir(tmp_path) if n.startswith("out.staging-")]
        # Killed after its owner record was written (the window before it is a few
        # instructions; a directory without one is, by design, not cleaned up).
        if (len(stale) == 1 and not out.exists()
                and (tmp_path / stale[0] / ".qsakv-staging-owner").exists()):
            break
        for n in stale:
            shutil.rmtree(tmp_path / n, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        stale = []
    if not stale:
        pytest.skip("could not interrupt a materialize during its staging phase")
    r = run_tool(tool, "overlay", "materialize", base, pack, out)
    assert r.returncode == 0, r.stderr
    assert not [n for n in os.listdir(tmp_path) if n.startswith("out.staging-")]
    assert not (out / ".qsakv-staging-owner").exists()
