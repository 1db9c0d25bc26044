"""Issue 15, item 2 (c, d, e): ClosedError from every method and property after close(),
ValueError naming the valid choices, and the hot calls' argument checks cached per
Cache / Plan (the fast path never falls back to the general check for NumPy arrays,
and still refuses what the general check refuses)."""
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qsakv
from qsakv import _buffers

REPO = Path(__file__).resolve().parents[3]
# What stays usable on a closed object: closing again, asking whether it is closed,
# the parent links, and the static constructors / writers that need no open object.
ALLOWED_AFTER_CLOSE = {"close", "closed", "context", "cache", "load", "write", "materialize",
                       "merge", "create", "read_scale_file"}


def _public(obj):
    return [n for n in dir(type(obj)) if not n.startswith("_") and n not in ALLOWED_AFTER_CLOSE]


def _touch(obj, name):
    """Reads the attribute; calls it (with dummy arguments) when it is a method."""
    attr = getattr(obj, name)
    if callable(attr):
        params = [p for p in inspect.signature(attr).parameters.values()
                  if p.default is p.empty]
        attr(*[3] * sum(p.kind != p.KEYWORD_ONLY for p in params),
             **{p.name: 3 for p in params if p.kind == p.KEYWORD_ONLY})


def test_every_method_and_property_refuses_a_closed_object(small_cfg, tmp_path, checkpoint):
    cfg = small_cfg.replace(kv_dtype="fp16")
    qsakv.Overlay.write(tmp_path / "pack", {l: (0.01, 0.02) for l in cfg.qsa_layers},
                        base_index_path=checkpoint / "model.safetensors.index.json")
    ctx = qsakv.Context("cpu")
    cache = qsakv.Cache(ctx, cfg, num_blocks=2)
    plan = qsakv.Plan(cache, max_rows=4)
    ov = qsakv.Overlay.load(tmp_path / "pack" / "model-kvscales.safetensors")
    calib = qsakv.Calibration(ctx, cfg)
    objs = [plan, cache, ctx, ov, calib]
    names = {type(o).__name__: _public(o) for o in objs}
    assert "info" in names["Context"] and "layout" in names["Cache"]
    assert "store_kv" in names["Cache"] and "attention" in names["Plan"]
    assert "observe" in names["Calibration"]
    ov.close()
    calib.close()
    ctx.close()  # closes the plan and the cache first
    for o in objs:
        assert o.closed
        for name in names[type(o).__name__]:
            with pytest.raises(qsakv.ClosedError, match=f"{o._kind} is closed"):
                _touch(o, name)
    with pytest.raises(qsakv.ClosedError):
        ctx.info  # noqa: B018 (the issue's example)


def test_every_info_is_a_property_and_the_old_calls_warn(small_cfg, tmp_path, checkpoint):
    """Context, Calibration, Plan and Overlay all read `.info` as a property; Plan.info()
    and Overlay.info() (methods up to 0.1.0) still answer, with a DeprecationWarning."""
    cfg = small_cfg.replace(kv_dtype="fp16")
    qsakv.Overlay.write(tmp_path / "pack", {l: (0.01, 0.02) for l in cfg.qsa_layers},
                        base_index_path=checkpoint / "model.safetensors.index.json")
    for cls in (qsakv.Context, qsakv.Calibration, qsakv.Plan, qsakv.Overlay):
        assert isinstance(inspect.getattr_static(cls, "info"), property), cls.__name__
    with qsakv.Context("cpu") as ctx, qsakv.Cache(ctx, cfg, num_blocks=2) as cache, \
            qsakv.Plan(cache, max_rows=4) as plan, \
            qsakv.Overlay.load(tmp_path / "pack" / "model-kvscales.safetensors") as ov:
        for obj, field, want in ((plan, "max_rows", 4),
                                 (ov, "num_scales", 2 * len(cfg.qsa_layers))):  # K and V
            info = obj.info
            assert getattr(info, field) == want
            with pytest.warns(DeprecationWarning, match=r"\.info is a property"):
                called = info()
            assert called == info and getattr(called, field) == want
            assert info._replace(**{field: 0}) != info  # still a namedtuple


@pytest.mark.parametrize("make, what, valid", [
    (lambda: qsakv.Context("gpu"), "backend", "'auto', 'cpu', 'cuda'"),
    (lambda: qsakv.Context(7), "backend", "'auto', 'cpu', 'cuda'"),
    (lambda: qsakv.Context("cpu", decoder="fast"), "decoder", "'auto', 'hardware', 'software'"),
    (lambda: qsakv.ModelConfig(kv_dtype="fp8e5"), "dtype", "'e4m3'"),
])
def test_invalid_choices_name_the_valid_ones(make, what, valid):
    with pytest.raises(ValueError, match=f"^{what}: .* is not one of .*{valid}") as e:
        make()
    assert isinstance(e.value, qsakv.InvalidArgumentError)
    assert "case-insensitive" in str(e.value)


def test_choices_are_case_insensitive(small_cfg):
    with qsakv.Context("CPU") as a, qsakv.Context("Cpu", decoder="SOFTWARE") as b:
        assert a.backend == b.backend == qsakv.Backend.CPU
    with qsakv.Context("cpu") as ctx, \
            qsakv.Cache(ctx, small_cfg.replace(kv_dtype="fp16"), num_blocks=2) as cache, \
            qsakv.Plan(cache, max_rows=1) as plan:
        plan.update(qsakv.Batch([0, 1], [1], np.zeros((1, 1), np.int32)))
        q = np.zeros((1, 6, 256), np.float16)
        plan.attention(3, q, np.zeros_like(q), mode="DENSE")
        plan.attention(3, q, np.zeros_like(q), mode=qsakv.AttentionMode.DENSE)
        with pytest.raises(ValueError, match=r"^mode: 'causal' is not one of 'sparse', "
                                             r"'dense'"):
            plan.attention(3, q, np.zeros_like(q), mode="causal")


@pytest.fixture
def pipeline(cpu, small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    with qsakv.Cache(cpu, cfg, num_blocks=4) as cache, \
            qsakv.Plan(cache, max_rows=2) as plan:
        plan.update(qsakv.Batch([0, 1], [4], np.zeros((1, 1), np.int32)))
        yield cache, plan


def test_hot_calls_take_the_fast_path_for_numpy(pipeline, monkeypatch):
    cache, plan = pipeline
    k = np.ones((2, 1, 256), np.float16)
    slots = np.array([0, 1], np.int64)
    iq = np.ones((1, 4, 128), np.float16)
    q = np.ones((1, 6, 256), np.float16)
    topk = np.full((1, 2051), -1, np.int32)

    def calls():
        cache.store_kv(3, k, k, slots)
        cache.store_compressed_keys(3, np.ones((2, 128), np.float16), slots)
        cache.store_index_keys(3, np.ones((2, 128), np.float16), np.zeros(2, np.int32), slots)
        plan.select_topk(3, iq)
        plan.select_topk(3, iq, topk)
        plan.attention(3, q, np.zeros_like(q))
        plan.attention(3, q, np.zeros_like(q), topk=topk)

    calls()
    slow = []
    monkeypatch.setattr(_buffers, "check", lambda *a, **kw: slow.append(a[1]))
    monkeypatch.setattr("qsakv.plan.check", lambda *a, **kw: slow.append(a[1]))
    calls()
    assert slow == [], f"general checks ran per call for {slow}"


def test_fast_path_refuses_what_the_general_check_refuses(pipeline):
    cache, plan = pipeline
    k = np.ones((2, 1, 256), np.float16)
    slots = np.array([0, 1], np.int64)
    bad = {
        r"k: expected float16 \[n, 1, 256\] contiguous, got float32": (k.astype(np.float32),
                                                                      k, slots),
        r"v: expected float16 \[2, 1, 256\] contiguous, got float16 \[3, 1, 256\]":
            (k, np.ones((3, 1, 256), np.float16), slots),
        r"k: .* non-contiguous": (np.ones((2, 1, 512), np.float16)[:, :, ::2], k, slots),
        r"slot_mapping: expected int64 \[2\] contiguous, got int32 \[2\]":
            (k, k, slots.astype(np.int32)),
        r"slot_mapping: expected int64 \[2\] contiguous, got int64 \[1\]": (k, k, slots[:1]),
    }
    for msg, args in bad.items():
        with pytest.raises(qsakv.InvalidArgumentError, match=msg):
            cache.store_kv(3, *args)
    with pytest.raises(qsakv.InvalidArgumentError, match=r"q: expected at least 1 rows"):
        plan.attention(3, np.ones((0, 6, 256), np.float16), np.ones((0, 6, 256), np.float16))
    with pytest.raises(qsakv.InvalidArgumentError, match=r"topk: expected int32 \[n, >= 2051\]"):
        plan.select_topk(3, np.ones((1, 4, 128), np.float16), np.ones((1, 2000), np.int32))
    # Read-only arrays are fine (the address comes from the array interface then).
    ro = k.copy()
    ro.flags.writeable = False
    cache.store_kv(3, ro, ro, slots)
    np.testing.assert_array_equal(cache.read_kv(3)[0, 0, :2], ro)


def test_outputs_byte_order_layer_and_batch_are_checked(pipeline):
    """What would reach the library wrong without a Python error: a read-only output (the
    library would write through it), a big-endian input (read as native values), a float
    layer (a ctypes error, not the package's), batch values that do not fit int32 or are
    not integers (an unchecked cast wraps or truncates them)."""
    cache, plan = pipeline
    k = np.ones((2, 1, 256), np.float16)
    slots = np.array([0, 1], np.int64)
    q = np.ones((1, 6, 256), np.float16)
    ro_out = np.zeros_like(q)
    ro_out.flags.writeable = False
    with pytest.raises(qsakv.InvalidArgumentError, match=r"out: the library writes it, got a "
                       r"read-only NumPy array"):
        plan.attention(3, q, ro_out)
    ro_topk = np.full((1, 2051), -1, np.int32)
    ro_topk.flags.writeable = False
    with pytest.raises(qsakv.InvalidArgumentError, match=r"topk: the library writes it"):
        plan.select_topk(3, np.ones((1, 4, 128), np.float16), ro_topk)
    assert (ro_topk == -1).all() and (ro_out == 0).all()
    with pytest.raises(qsakv.InvalidArgumentError,
                       match=r"k: expected float16 \[n, 1, 256\] contiguous, got float16 "
                             r"\(byte order >\)"):
        cache.store_kv(3, k.astype(">f2"), k, slots)
    with pytest.raises(qsakv.InvalidArgumentError,
                       match=r"^layer: expected an integer, got float 3\.0$"):
        cache.store_kv(3.0, k, k, slots)
    with pytest.raises(qsakv.InvalidArgumentError, match=r"^layer: expected an integer, got str"):
        plan.attention("3", q, np.zeros_like(q))
    bt = np.zeros((1, 1), np.int32)
    with pytest.raises(qsakv.InvalidArgumentError,
                       match=r"batch.query_start: values 0\.\.4294967297 do not fit int32"):
        plan.update(qsakv.Batch([0, 2**32 + 1], [4], bt))
    with pytest.raises(qsakv.InvalidArgumentError,
                       match=r"batch.query_start: expected int32 \[2\], got float64 \[2\]"):
        plan.update(qsakv.Batch([0, 1.9], [4], bt))
    plan.update(qsakv.Batch(np.array([0, 1], np.int64), [4], bt))  # integers that fit: taken
    assert plan.info.num_rows == 1


def test_every_c_function_has_a_wrapper():
    """Every function of the header is reached from the package, or is listed here with
    why not: a caller should not need the raw qsakv.lib for a documented step (the header
    requires tp_consensus on every TP rank, for one)."""
    from qsakv import _cdefs

    not_wrapped = {
        "qsakv_malloc": "device memory comes from torch, CuPy or NumPy",
        "qsakv_free": "(qsakv_malloc's pair)",
        "qsakv_dtype_name": "DType(...).name",
    }
    src = "".join(p.read_text() for p in (REPO / "bindings/python/qsakv").glob("*.py")
                  if p.name != "_cdefs.py")
    unreached = sorted(n for n in _cdefs.FUNCTIONS if n not in src and n not in not_wrapped)
    assert unreached == [], f"no Python wrapper for {unreached}"
    assert all(n in _cdefs.FUNCTIONS for n in not_wrapped)


def test_tp_consensus_checkpoint_config_and_scale_file(cpu, small_cfg, tmp_path, checkpoint):
    """The wrappers of three C calls that had none: tp_consensus (CUDA only: the CPU
    backend refuses it by status), ModelConfig.from_checkpoint and
    Overlay.read_scale_file."""
    with pytest.raises(qsakv.UnsupportedError):
        qsakv.tp_consensus(cpu, small_cfg, None, 0x1234)
    with pytest.raises(qsakv.InvalidArgumentError, match="nccl_comm"):
        qsakv.tp_consensus(cpu, small_cfg, None, None)
    ckpt = REPO / "tests/data/hf_config/qwen4_exp"
    cfg = qsakv.ModelConfig.from_checkpoint(ckpt, tp_size=4, max_batched_tokens=64,
                                            max_requests=8, max_model_len=8192)
    assert cfg == small_cfg  # the geometry of the preset, the runtime fields given
    with pytest.raises(qsakv.FormatError, match="num_key_value_heads"):
        qsakv.ModelConfig.from_checkpoint(REPO / "tests/data/hf_config/missing_kv_heads.json")
    qsakv.Overlay.write(tmp_path / "pack", {3: (0.5, 0.25), 7: (2.0, 1.0)},
                        base_index_path=checkpoint / "model.safetensors.index.json")
    files = sorted((tmp_path / "pack").glob("*kvscales*.safetensors"))
    scales, sha = qsakv.Overlay.read_scale_file(files[0])
    assert scales == {3: (0.5, 0.25), 7: (2.0, 1.0)}
    assert len(sha) == 64 and int(sha, 16) >= 0


def test_overhead_benchmark_runs(tmp_path):
    """The benchmark script behind the README's per-call figures runs and reports
    package, raw and overhead times for the three hot calls."""
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(REPO / "bindings/python/tools/bench_overhead.py"),
                        "--calls", "200", "--json", str(out)], capture_output=True, text=True,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    res = json.loads(out.read_text())
    assert set(res["per_call_us"]) == {"store_kv", "select_topk", "attention"}
    for v in res["per_call_us"].values():
        assert v["package"] > 0 and v["raw"] > 0


def test_torch_tensors_take_the_fast_path(monkeypatch):
    """ArgSpec's torch branch, with a stand-in torch.Tensor (the real one runs in
    test_gpu_torch.py): a matching tensor gives its data_ptr without the general check;
    any mismatch (dtype, device, device id, contiguity, shape, rows) falls back to it."""
    import types

    class Tensor:
        def __init__(self, shape, dtype, cuda=True, device=0, contiguous=True, ptr=0x9000):
            self.shape, self.dtype, self.is_cuda = tuple(shape), dtype, cuda
            self._device, self._contiguous, self._ptr = device, contiguous, ptr
            self.device = types.SimpleNamespace(type="cuda" if cuda else "cpu", index=device)

        def is_contiguous(self):
            return self._contiguous

        def get_device(self):  # torch: -1 for a CPU tensor
            return self._device if self.is_cuda else -1

        def data_ptr(self):
            return self._ptr

    Tensor.__module__ = "torch"
    fake = types.ModuleType("torch")
    fake.Tensor, fake.float16, fake.int64 = Tensor, object(), object()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(_buffers, "_TORCH_TENSOR", None)
    spec = _buffers.ArgSpec("k", "float16", (1, 256), cuda=True, device_id=0)
    slow = []
    real_check = _buffers.check
    monkeypatch.setattr(_buffers, "check", lambda *a, **kw: slow.append(a[1]) or
                        real_check(*a, **kw))
    assert spec.ptr(Tensor((5, 1, 256), fake.float16)) == (0x9000, 5)
    assert spec.ptr(Tensor((5, 1, 256), fake.float16), rows=5, min_rows=3) == (0x9000, 5)
    assert slow == []
    bad = [Tensor((5, 1, 256), fake.int64), Tensor((5, 1, 256), fake.float16, cuda=False),
           Tensor((5, 1, 256), fake.float16, device=1),
           Tensor((5, 1, 256), fake.float16, contiguous=False),
           Tensor((5, 2, 256), fake.float16)]
    for t in bad:
        with pytest.raises(qsakv.InvalidArgumentError):
            spec.ptr(t)
    with pytest.raises(qsakv.InvalidArgumentError, match=r"k: expected float16 \[4, 1, 256\]"):
        spec.ptr(Tensor((5, 1, 256), fake.float16), rows=4)
    assert len(slow) == len(bad) + 1  # every refusal worded by the general check


def test_hot_call_prototypes_agree_with_the_generated_declarations():
    """The hot calls use hand-written prototypes (int addresses as c_void_p): they must
    stay in step with the header's declarations (_cdefs.py, generated, drift-tested)."""
    import ctypes

    from qsakv import _cdefs, cache, calibration, plan

    def kind(t):
        if t is ctypes.c_void_p or t is ctypes.c_char_p or (
                isinstance(t, type) and issubclass(t, ctypes._Pointer)):
            return "pointer"
        return ("int", ctypes.sizeof(t))

    raw = {"qsakv_store_kv": cache._store_kv, "qsakv_store_index_keys": cache._store_index_keys,
           "qsakv_store_compressed_keys": cache._store_compressed_keys,
           "qsakv_select_topk": plan._select_topk, "qsakv_attention_run": plan._attention_run,
           "qsakv_calib_observe": calibration._observe}
    for name, fn in raw.items():
        declared = _cdefs.FUNCTIONS[name]
        assert [kind(t) for t in fn.argtypes] == [kind(t) for t in declared.argtypes], name
        assert fn.restype is ctypes.c_int and declared.c_restype == "qsakv_status", name
