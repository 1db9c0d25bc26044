"""qsakv.torch_ops' own code (registration, handle ids, the ordering token, the views,
the kernels' argument order) on the CPU backend with a stand-in torch whose tensors are
NumPy arrays and whose dispatcher calls the registered CPU kernel. It runs with or
without PyTorch; test_torch_ops.py runs the same operators through the real torch."""
import importlib
import sys
import types

import numpy as np
import pytest

import qsakv
from reference import make_world


class FakeLibrary:
    registry = {}

    def __init__(self, ns, kind):
        assert (ns, kind) == ("qsakv", "DEF")
        self.defs = {}

    def define(self, schema):
        name = schema.split("(")[0]
        self.defs[name] = schema
        FakeLibrary.registry[name] = {"schema": schema}

    def impl(self, name, fn, key):
        FakeLibrary.registry[name][key] = fn


def _fake_torch():
    t = types.ModuleType("torch")
    t.Tensor = type("Tensor", (), {})
    t.int32, t.bfloat16 = np.int32, "bfloat16"
    t.library = types.SimpleNamespace(Library=FakeLibrary)  # no register_fake: Meta path
    t.zeros = lambda n, dtype, device: np.zeros(n, dtype)
    t.from_numpy = lambda a: a
    t.as_tensor = lambda obj, device: pytest.fail("CPU backend views are NumPy arrays")

    class Ops:
        def __getattr__(self, name):
            return lambda *args: FakeLibrary.registry[name]["CPU"](*args)

    t.ops = types.SimpleNamespace(qsakv=Ops())
    return t


@pytest.fixture
def qops(monkeypatch):
    FakeLibrary.registry = {}
    from qsakv import _buffers

    monkeypatch.setattr(_buffers, "_TORCH_TENSOR", _buffers._TORCH_TENSOR)  # restored after
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.delitem(sys.modules, "qsakv.torch_ops", raising=False)
    monkeypatch.setattr(qsakv, "torch_ops", None, raising=False)
    mod = importlib.import_module("qsakv.torch_ops")
    yield mod
    sys.modules.pop("qsakv.torch_ops", None)


def test_registration(qops):
    reg = FakeLibrary.registry
    assert set(reg) == {"store_kv", "store_index_keys", "store_compressed_keys", "store_step",
                        "select_topk", "attention"}
    for name, entry in reg.items():
        assert entry["schema"] == qops.SCHEMAS[name]
        assert {"CPU", "CUDA", "Meta"} <= set(entry)
        # The fake kernel takes every argument of the schema and returns nothing.
        assert entry["Meta"](*range(entry["schema"].count(",") + 1)) is None
        assert "Tensor(a!)" in entry["schema"]  # every operator is mutable: never dropped


def test_operators_run_the_pipeline_like_the_methods(qops, cpu, small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = make_world(cfg, cfg.rank_geometry(), rows=(1, 3), lens=(300, 40), seed=3)
    layer = cfg.qsa_layers[0]
    width = cfg.rank_geometry().topk_width
    results = []
    for use_ops in (False, True):
        with qsakv.Cache(cpu, cfg, num_blocks=w.num_blocks) as cache, \
                qsakv.Plan(cache, max_rows=w.num_rows) as plan:
            out = np.zeros_like(w.q)
            if use_ops:
                qops.store_kv(cache, layer, w.k, w.v, w.slots)
                qops.store_compressed_keys(cache, layer, w.ck, w.cslots)
                plan.update(qsakv.Batch(w.query_start, w.lens, w.bt))
                qops.select_topk(plan, layer, w.iq)  # the shared buffer
                qops.attention(plan, layer, w.q, out)
                topk = qops.topk_buffer(cache, layer)[: w.num_rows]
                assert qops.kv_cache(cache, layer) is qops.kv_cache(cache, layer)  # cached
                assert qops.token(cache).shape == (1,)
                assert qops.handle_id(cache) != qops.handle_id(plan)
                assert qops.handle_id(plan) == qops.handle_id(plan)
            else:
                cache.store_kv(layer, w.k, w.v, w.slots)
                cache.store_compressed_keys(layer, w.ck, w.cslots)
                plan.update(qsakv.Batch(w.query_start, w.lens, w.bt))
                topk = np.full((w.num_rows, width), -7, np.int32)
                plan.select_topk(layer, w.iq, topk)
                plan.attention(layer, w.q, out, topk=topk)
            results.append((cache.read_kv(layer), topk.copy(), out))
            dense = np.zeros_like(w.q)
            if use_ops:
                qops.attention(plan, layer, w.q, dense, mode="dense")
            else:
                plan.attention(layer, w.q, dense, mode="dense")
            results[-1] += (dense,)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_attention_mode_names_values_and_members(qops, cpu, small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = make_world(cfg, cfg.rank_geometry(), rows=(2,), lens=(100,), seed=5)
    layer = cfg.qsa_layers[0]
    with qsakv.Cache(cpu, cfg, num_blocks=w.num_blocks) as cache, \
            qsakv.Plan(cache, max_rows=w.num_rows) as plan:
        cache.store_kv(layer, w.k, w.v, w.slots)
        plan.update(qsakv.Batch(w.query_start, w.lens, w.bt))
        outs = []
        for mode in ("dense", "DENSE", 1, qsakv.AttentionMode.DENSE):
            out = np.full_like(w.q, np.nan)
            qops.attention(plan, layer, w.q, out, mode=mode)
            outs.append(out)
        assert np.isfinite(outs[0]).all()
        for out in outs[1:]:
            np.testing.assert_array_equal(out, outs[0])
        with pytest.raises(qsakv.InvalidArgumentError, match="mode: 'denser' is not one of"):
            qops.attention(plan, layer, w.q, outs[0], mode="denser")
        with pytest.raises(qsakv.InvalidArgumentError, match="mode: 7 is not one of"):
            qops.attention(plan, layer, w.q, outs[0], mode=7)


def _ring_world(cfg, w):
    n = len(w.cslots)
    return (w.ck, (np.arange(n) % cfg.max_requests).astype(np.int32),
            np.arange(n, dtype=np.int64))


def test_store_operators_store_the_bytes_of_the_methods(qops, cpu, small_cfg):
    """store_index_keys and store_step (every part, and parts left out as None) store
    what the Cache methods store."""
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = make_world(cfg, cfg.rank_geometry(), rows=(1, 3), lens=(300, 40), seed=4)
    layer = cfg.qsa_layers[0]
    keys, req, pos = _ring_world(cfg, w)

    def stored(fn):
        with qsakv.Cache(cpu, cfg, num_blocks=w.num_blocks) as cache:
            fn(cache)
            lb = cache.layer_buffers(layer)
            ring = qops.index_key_ring(cache, layer)
            assert ring.shape == lb.ring_keys.shape and ring.dtype == np.float16
            return tuple(np.asarray(b).tobytes() for b in (lb.kv, lb.ring_keys,
                                                           lb.compressed_keys))

    def by_methods(cache, kv=True, ring=True, comp=True):
        if kv:
            cache.store_kv(layer, w.k, w.v, w.slots)
        if ring:
            cache.store_index_keys(layer, keys, req, pos)
        if comp:
            cache.store_compressed_keys(layer, keys, w.cslots)

    def by_operators(cache):
        qops.store_kv(cache, layer, w.k, w.v, w.slots)
        qops.store_index_keys(cache, layer, keys, req, pos)
        qops.store_compressed_keys(cache, layer, keys, w.cslots)

    everything = stored(by_methods)
    assert any(everything[1])  # the ring part stored something (its bytes not all 0)
    assert stored(by_operators) == everything
    for kv, ring, comp in [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)]:
        def step(cache):
            qops.store_step(cache, layer,
                            **(dict(k=w.k, v=w.v, slot_mapping=w.slots) if kv else {}),
                            **(dict(index_keys=keys, request_slots=req, positions=pos)
                               if ring else {}),
                            **(dict(compressed_keys=keys, compressed_slot_mapping=w.cslots)
                               if comp else {}))

        assert stored(step) == stored(lambda c: by_methods(c, kv, ring, comp)), (kv, ring, comp)


def test_a_closed_or_unknown_handle_is_refused(qops, cpu, small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    cache = qsakv.Cache(cpu, cfg, num_blocks=2)
    cid = qops.handle_id(cache)
    k = np.zeros((1, 1, 256), np.float16)
    s = np.zeros(1, np.int64)
    token = qops.token(cache)
    sys.modules["torch"].ops.qsakv.store_kv(token, k, k, s, cid, 3)
    cache.close()
    with pytest.raises(qsakv.ClosedError, match="cache is closed"):
        sys.modules["torch"].ops.qsakv.store_kv(token, k, k, s, cid, 3)
    with pytest.raises(qsakv.ClosedError, match="no cache with id 999999"):
        sys.modules["torch"].ops.qsakv.store_kv(token, k, k, s, 999999, 3)


def test_as_tensor_of_a_read_only_view_is_a_copy(qops, cpu, small_cfg, monkeypatch):
    """layer_buffers().scales is read-only (const in the C API); torch has no read-only
    tensors, so as_tensor copies it: a write to the tensor never reaches the cache."""
    from qsakv._views import DeviceArray

    with qsakv.Cache(cpu, small_cfg.replace(kv_dtype="fp16"), num_blocks=2) as cache:
        b = cache.layer_buffers(small_cfg.qsa_layers[0])
        t = qops.as_tensor(b.scales)  # the stand-in's from_numpy returns the array itself
        assert t.flags.writeable and not np.shares_memory(t, b.scales)
        t[:] = 9.0
        assert b.scales.tolist() == [1.0, 1.0]
        assert np.shares_memory(qops.as_tensor(b.kv), b.kv)  # writable views: shared
    # A read-only DeviceArray: torch.as_tensor refuses the interface's read-only flag, so
    # it sees a writable alias of the same memory, whose tensor is cloned at once.
    seen = []

    class Tensor:
        def clone(self):
            seen.append("clone")
            return "copy"

    def as_tensor(obj, device):
        cai = obj.__cuda_array_interface__
        seen.append((cai["data"], cai["shape"], cai["typestr"], device))
        return Tensor()

    monkeypatch.setattr(qops.torch, "as_tensor", as_tensor)
    r = DeviceArray(0x2000, (2,), "float32", device=1, readonly=True)
    assert qops.as_tensor(r) == "copy"
    assert seen == [((0x2000, False), (2,), "<f4", "cuda:1"), "clone"]
    w = DeviceArray(0x3000, (2,), "float32", device=1)
    assert isinstance(qops.as_tensor(w), Tensor) and seen[-1][0] == (0x3000, False)
