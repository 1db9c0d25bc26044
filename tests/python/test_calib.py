"""Calibration through the C ABI (ctypes, CPU backend) against independent oracles:
NumPy computes the statistics of the same activations (planted maxima, NaN, inf,
zeros, subnormals), the `safetensors` package reads the statistics file and the scale
file, and the `qsakv` tool runs the offline chain end to end (summarize, envelope,
overlay make, overlay materialize, overlay verify). Needs QSAKV_LIB (and QSAKV_TOOL for
the command-line tests)."""
import ctypes
import hashlib
import json
import os
import subprocess

import numpy as np
import pytest

# Struct layouts: the declarations generated from include/qsakv.h (drift-checked).
from qsakv import _cdefs  # noqa: E402

ModelConfig = _cdefs.qsakv_model_config
ContextOptions = _cdefs.qsakv_context_options
CalibStats = _cdefs.qsakv_calib_stats


st_numpy = pytest.importorskip("safetensors.numpy")

BINS = 4096
QSA_LAYERS = [4 * i + 3 for i in range(12)]
FP16, BF16, E4M3 = 1, 2, 3
ERROR_INVALID_ARGUMENT = -1
ERROR_OVERLAY_INCOMPLETE = -21
ERROR_REVISION_MISMATCH = -26
ERROR_CALIB_NON_FINITE = -30


class Lib:
    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(path)
        lib.qsakv_last_error.restype = ctypes.c_char_p
        P = ctypes.c_void_p
        lib.qsakv_calib_create.argtypes = [ctypes.POINTER(P), P, ctypes.POINTER(ModelConfig)]
        lib.qsakv_calib_observe.argtypes = [P, ctypes.c_int32, P, P, ctypes.c_int64, P]
        lib.qsakv_calib_snapshot.argtypes = [ctypes.POINTER(P), P, P]
        lib.qsakv_calib_save.argtypes = [P, ctypes.c_char_p]
        lib.qsakv_calib_load.argtypes = [ctypes.POINTER(P), ctypes.c_char_p]
        lib.qsakv_calib_get_stats.argtypes = [P, ctypes.c_int32, ctypes.c_int,
                                              ctypes.POINTER(CalibStats), P]
        for f in ("qsakv_calib_start", "qsakv_calib_stop", "qsakv_calib_destroy",
                  "qsakv_context_destroy"):
            getattr(lib, f).argtypes = [P]
        lib.qsakv_calib_destroy.restype = None
        lib.qsakv_context_destroy.restype = None
        lib.qsakv_calib_scale_from_max.argtypes = [ctypes.c_float, ctypes.POINTER(ctypes.c_float)]
        opts = ContextOptions()
        self.check(lib.qsakv_context_options_init(ctypes.byref(opts)))
        opts.backend = 1  # CPU
        self.ctx = P()
        self.check(lib.qsakv_context_create(ctypes.byref(self.ctx), ctypes.byref(opts)))

    def check(self, status):
        if status != 0:
            raise RuntimeError(f"status {status}: {self.lib.qsakv_last_error().decode()}")

    def config(self, act=FP16, tp=1, rank=0, small=True):
        c = ModelConfig()
        self.check(self.lib.qsakv_model_config_preset(ctypes.byref(c), b"qwen4_exp"))
        if small:  # 2 QSA layers, 2 KV heads of 64
            c.num_layers, c.num_qsa_layers = 8, 2
            c.qsa_layers[0], c.qsa_layers[1] = 3, 7
            c.num_q_heads, c.num_kv_heads, c.head_dim = 8, 2, 64
            c.block_size = 16
        c.activation_dtype, c.tp_size, c.tp_rank = act, tp, rank
        return c

    def live(self, cfg):
        h = ctypes.c_void_p()
        self.check(self.lib.qsakv_calib_create(ctypes.byref(h), self.ctx, ctypes.byref(cfg)))
        self.check(self.lib.qsakv_calib_start(h))
        return h

    def observe(self, h, layer, k_bits, v_bits, tokens):
        k = np.ascontiguousarray(k_bits, dtype=np.uint16)
        v = np.ascontiguousarray(v_bits, dtype=np.uint16)
        self.check(self.lib.qsakv_calib_observe(h, layer, k.ctypes.data, v.ctypes.data,
                                                tokens, None))

    def snapshot(self, h):
        s = ctypes.c_void_p()
        self.check(self.lib.qsakv_calib_snapshot(ctypes.byref(s), h, None))
        return s

    def stats(self, h, layer, kind):
        st = CalibStats()
        st.struct_size = ctypes.sizeof(st)
        hist = np.zeros(BINS, dtype=np.uint64)
        self.check(self.lib.qsakv_calib_get_stats(h, layer, kind, ctypes.byref(st),
                                                  hist.ctypes.data))
        return st, hist


@pytest.fixture(scope="module")
def lib():
    path = os.environ.get("QSAKV_LIB")
    if not path:
        pytest.skip("QSAKV_LIB is not set")
    return Lib(path)


def tool():
    path = os.environ.get("QSAKV_TOOL")
    if not path or not os.path.exists(path):
        pytest.skip("QSAKV_TOOL is not set or not built")
    return path


# ---- the NumPy oracle -----------------------------------------------------------------

def to_f64(bits, act):
    bits = np.asarray(bits, dtype=np.uint16)
    if act == FP16:
        return bits.view(np.float16).astype(np.float64)
    with np.errstate(invalid="ignore"):  # NaN patterns convert to NaN, as intended
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def reference(bits, act):
    x = to_f64(bits, act).ravel()
    finite = x[np.isfinite(x)]
    a = np.abs(finite[finite != 0])
    b = np.clip(np.floor((np.log2(a) + 24.0) * 4096.0 / 40.0), 0, BINS - 1).astype(np.int64)
    return {"count": x.size, "finite": finite.size, "nonzero": a.size,
            "max": float(a.max()) if a.size else 0.0,
            "hist": np.bincount(b, minlength=BINS).astype(np.uint64)}


def activations(rng, n, act, scale, peak, specials=True):
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    x[rng.random(n) < 0.03] = 0.0
    small = rng.random(n) < 0.03
    x[small] *= 1e-6  # subnormal FP16 and deep small bins
    x[rng.integers(n)] = peak * rng.choice([-1, 1])
    if act == FP16:
        bits = x.astype(np.float16).view(np.uint16).copy()
    else:  # round to nearest even into BF16 (no NaN inputs here)
        u = x.view(np.uint32).astype(np.uint64)
        bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    if specials:
        nan, inf = (0x7E00, 0xFC00) if act == FP16 else (0x7FC0, 0xFF80)
        bits[rng.integers(n)] = nan
        bits[rng.integers(n)] = inf
    return bits


def merged(refs):
    out = dict(refs[0])
    for r in refs[1:]:
        for k in ("count", "finite", "nonzero"):
            out[k] += r[k]
        out["max"] = max(out["max"], r["max"])
        out["hist"] = out["hist"] + r["hist"]
    return out


@pytest.mark.parametrize("act", [FP16, BF16])
def test_statistics_match_numpy(lib, tmp_path, act):
    rng = np.random.default_rng()
    cfg = lib.config(act)
    row = 2 * 64
    h = lib.live(cfg)
    want = {}
    for layer in (3, 7):
        for _ in range(3):
            tokens = int(rng.integers(1, 60))
            k = activations(rng, tokens * row, act, 2.0, 5e4 if act == FP16 else 3e6)
            v = activations(rng, tokens * row, act, 0.3, 9.0)
            lib.observe(h, layer, k, v, tokens)
            want.setdefault((layer, 0), []).append(reference(k, act))
            want.setdefault((layer, 1), []).append(reference(v, act))
    s = lib.snapshot(h)
    path = tmp_path / "stats.safetensors"
    lib.check(lib.lib.qsakv_calib_save(s, str(path).encode()))
    # The file through the reference safetensors reader.
    f = st_numpy.load_file(str(path))
    assert f["words"].dtype == np.uint64 and f["words"].shape == (2, 2, BINS + 3)
    assert f["max_abs"].dtype == np.float32 and f["ranks"].tolist() == [1]
    for qi, layer in enumerate((3, 7)):
        for kind in (0, 1):
            r = merged(want[(layer, kind)])
            st, hist = lib.stats(s, layer, kind)
            assert (st.count, st.finite_count, st.nonzero_count) == \
                (r["count"], r["finite"], r["nonzero"])
            assert st.max_abs == np.float32(r["max"])
            np.testing.assert_array_equal(hist, r["hist"])
            w = f["words"][qi, kind]
            assert (int(w[0]), int(w[1]), int(w[2])) == (r["count"], r["finite"], r["nonzero"])
            np.testing.assert_array_equal(w[3:], r["hist"])
            assert f["max_abs"][qi, kind] == np.float32(r["max"])
    lib.lib.qsakv_calib_destroy(s)
    lib.lib.qsakv_calib_destroy(h)


@pytest.mark.parametrize("act", [FP16, BF16])
def test_every_bit_pattern(lib, act):
    """All 65536 patterns: the library's precomputed bin table against NumPy's log2."""
    cfg = lib.config(act)
    h = lib.live(cfg)
    bits = np.arange(65536, dtype=np.uint16)
    lib.observe(h, 3, bits, bits, 65536 // 128)
    s = lib.snapshot(h)
    r = reference(bits, act)
    st, hist = lib.stats(s, 3, 0)
    assert (st.count, st.finite_count, st.nonzero_count) == (r["count"], r["finite"], r["nonzero"])
    assert st.max_abs == np.float32(r["max"])
    np.testing.assert_array_equal(hist, r["hist"])
    lib.lib.qsakv_calib_destroy(s)
    lib.lib.qsakv_calib_destroy(h)


def test_scale_rounds_up(lib):
    """scale = the smallest float32 s with s >= m / 448 exactly (checked in exact
    rational arithmetic through float64, where float32 * 448 is exact)."""
    rng = np.random.default_rng()
    ms = np.concatenate([
        np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32),
        rng.uniform(1e-30, 1e30, 20000).astype(np.float32)])
    out = ctypes.c_float()
    for m in ms:
        lib.check(lib.lib.qsakv_calib_scale_from_max(float(m), ctypes.byref(out)))
        s = np.float32(out.value)
        assert float(s) * 448.0 >= float(m)
        assert float(np.nextafter(s, np.float32(0))) * 448.0 < float(m)
        assert np.float32(m) / s <= np.float32(448.0)


# ---- the command-line chain -------------------------------------------------------------

def write_rank_files(lib, tmp, tp, run_seed, peak_scale=1.0, bad_layer=None):
    """Per-rank statistics of the reference model (12 QSA layers) at TP `tp`."""
    rng = np.random.default_rng(run_seed)
    paths, refs = [], {}
    for rank in range(tp):
        cfg = lib.config(FP16, tp, rank, small=False)
        row = max(1, 2 // tp) * 256
        h = lib.live(cfg)
        for li, layer in enumerate(QSA_LAYERS):
            tokens = 16
            k = activations(rng, tokens * row, FP16, 1.0, peak_scale * (10 + li), specials=False)
            v = activations(rng, tokens * row, FP16, 0.5, peak_scale * (3 + li), specials=False)
            if layer == bad_layer:
                v[5] = 0x7E00
            lib.observe(h, layer, k, v, tokens)
            refs.setdefault((layer, 0), []).append(reference(k, FP16))
            refs.setdefault((layer, 1), []).append(reference(v, FP16))
        s = lib.snapshot(h)
        p = tmp / f"run{run_seed}-rank{rank}.safetensors"
        lib.check(lib.lib.qsakv_calib_save(s, str(p).encode()))
        lib.lib.qsakv_calib_destroy(s)
        lib.lib.qsakv_calib_destroy(h)
        paths.append(str(p))
    return paths, {k: merged(v) for k, v in refs.items()}


def run(*args):
    return subprocess.run([tool(), *map(str, args)], capture_output=True, text=True)


def scale_of(lib, m):
    out = ctypes.c_float()
    lib.check(lib.lib.qsakv_calib_scale_from_max(float(m), ctypes.byref(out)))
    return np.float32(out.value)


def test_cli_end_to_end(lib, tmp_path):
    run_a, ref_a = write_rank_files(lib, tmp_path, 2, 1)
    run_b, ref_b = write_rank_files(lib, tmp_path, 2, 2, peak_scale=3.0)
    # summarize: the two ranks of run A merge; the report matches NumPy's numbers.
    r = run("calib", "summarize", *run_a, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["tp_size"] == 2 and rep["ranks_covered"] == 2 and rep["num_runs"] == 1
    assert len(rep["layers"]) == 24
    for e in rep["layers"]:
        w = ref_a[(e["layer"], 0 if e["kind"] == "k" else 1)]
        assert e["count"] == w["count"] and e["nonzero_count"] == w["nonzero"]
        assert np.float32(e["max_abs"]) == np.float32(w["max"])
        assert np.float32(e["scale"]) == scale_of(lib, w["max"])
        assert e["saturate_fraction"] == 0.0
        assert e["p99_9"] <= e["p99_99"] <= e["max_abs"]
    # One rank alone is refused: a scale is the max over every rank.
    r = run("calib", "summarize", run_a[0])
    assert r.returncode == 1 and "QSAKV_ERROR_OVERLAY_INCOMPLETE" in r.stderr
    assert "missing rank(s) 1" in r.stderr
    # merge, then envelope of the two runs: max of maxima.
    ma, mb, env = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "env.st"
    assert run("calib", "merge", ma, *run_a).returncode == 0
    assert run("calib", "merge", mb, *run_b).returncode == 0
    r = run("calib", "envelope", env, ma, mb)
    assert r.returncode == 0, r.stderr
    r = run("calib", "envelope", tmp_path / "x.st", *run_a)  # incomplete inputs
    assert r.returncode == 1 and "envelope pools complete runs" in r.stderr
    f = st_numpy.load_file(str(env))
    for li, layer in enumerate(QSA_LAYERS):
        for kind in (0, 1):
            m = max(ref_a[(layer, kind)]["max"], ref_b[(layer, kind)]["max"])
            assert f["max_abs"][li, kind] == np.float32(m)
    # overlay make -> materialize -> verify.
    base = tmp_path / "base"
    base.mkdir()
    index = base / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 4},
                                 "weight_map": {"lm_head.weight": "model-00001.safetensors"}}))
    (base / "model-00001.safetensors").write_bytes(b"abcd")
    pack, ckpt = tmp_path / "pack", tmp_path / "ckpt"
    r = run("overlay", "make", "--stats", env, "--base-index", index, pack)
    assert r.returncode == 0, r.stderr
    scales = st_numpy.load_file(str(pack / "model-kvscales.safetensors"))
    assert len(scales) == 24
    for li, layer in enumerate(QSA_LAYERS):
        for kind, name in ((0, "k_scale"), (1, "v_scale")):
            t = scales[f"model.layers.{layer}.self_attn.{name}"]
            assert t.dtype == np.float32 and t.shape == ()
            assert t == scale_of(lib, f["max_abs"][li, kind])
    manifest = json.loads((pack / "qsakv-overlay.json").read_text())
    assert manifest["contract"]["tp_size"] == 2
    assert manifest["contract"]["activation_dtype"] == "fp16"
    r = run("overlay", "materialize", base, pack, ckpt)
    assert r.returncode == 0, r.stderr
    rev = hashlib.sha256(index.read_bytes()).hexdigest()
    r = run("overlay", "verify", ckpt, "--revision", rev, "--tp", 2, "--rank", 1, "--act", "fp16")
    assert r.returncode == 0, r.stderr + r.stdout
    r = run("overlay", "verify", ckpt, "--revision", rev, "--tp", 4)
    assert r.returncode == 1 and "QSAKV_ERROR_CONTRACT" in r.stderr
    # materialize refuses another base revision before writing anything.
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    r = run("overlay", "materialize", other, pack, tmp_path / "never")
    assert r.returncode == 1 and "QSAKV_ERROR_REVISION_MISMATCH" in r.stderr
    assert not (tmp_path / "never").exists()
    assert not any(p.name.startswith("never") for p in tmp_path.iterdir())


def test_cli_refusals_and_usage(lib, tmp_path):
    paths, _ = write_rank_files(lib, tmp_path, 1, 7, bad_layer=31)
    r = run("calib", "summarize", *paths)
    assert r.returncode == 1
    assert "QSAKV_ERROR_CALIB_NON_FINITE" in r.stderr and "layer 31 V" in r.stderr
    assert r.stdout == ""
    r = run("overlay", "make", "--stats", *paths, "--base-index", tmp_path / "none", tmp_path / "p")
    assert r.returncode == 1 and "QSAKV_ERROR_CALIB_NON_FINITE" in r.stderr
    assert run("calib", "summarize").returncode == 2
    assert run("calib", "frobnicate", paths[0]).returncode == 2
    assert run("overlay", "make", "--stats", *paths).returncode == 2
    assert run("capacity", "--kv", "e5m2").returncode == 2
    r = run("calib", "--help")
    assert r.returncode == 0 and "exit codes" in r.stdout


def test_cli_capacity(lib):
    r = run("capacity", "--preset", "qwen4_exp", "--tp", 4, "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    # DOMAIN.md section 2: reference geometry at TP4.
    assert c["bytes_per_token"] == 6912 and c["fp16_bytes_per_token"] == 13056
    assert abs(c["ideal_ratio"] - 13056 / 6912) < 1e-12
    r = run("capacity", "--tp", 4, "--kv", "fp16", "--budget-gib", 80)
    assert r.returncode == 0 and "13056" in r.stdout
