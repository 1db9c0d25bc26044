"""Buffer and stream adaptation without torch or CuPy: the protocols themselves
(__array_interface__, __cuda_array_interface__, __dlpack__, __cuda_stream__) on
stand-in objects, and the device checks against the backend."""
import ctypes
import weakref

import ml_dtypes
import numpy as np
import pytest

import qsakv
from qsakv import _buffers
from conftest import run_isolated


class DLPackOnly:
    """Exposes only the DLPack protocol of a NumPy array."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class FakeCuda:
    """A __cuda_array_interface__ (v3) description; no memory behind it."""

    def __init__(self, shape, typestr, strides=None, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, False), "strides": strides,
                                         "version": 3}


def test_numpy_description():
    a = np.zeros((4, 2, 8), np.float16)
    b = _buffers.describe(a)
    assert (b.ptr, b.dtype, b.shape, b.contiguous, b.device) == \
        (a.ctypes.data, "float16", (4, 2, 8), True, "cpu")
    assert not _buffers.describe(a[:, :, ::2]).contiguous
    assert _buffers.describe(np.zeros(3, ml_dtypes.bfloat16)).dtype == "bfloat16"


def test_dlpack_description_matches_numpy():
    a = np.arange(24, dtype=np.int64).reshape(2, 3, 4)[1:]
    b = _buffers.describe(DLPackOnly(a))
    assert (b.ptr, b.dtype, b.shape, b.contiguous, b.device) == \
        (a.ctypes.data, "int64", (1, 3, 4), True, "cpu")
    t = np.zeros((3, 4), np.float32).T  # Fortran order
    assert not _buffers.describe(DLPackOnly(t)).contiguous


def test_cuda_array_interface_device_and_read_only():
    """The interface does not name the GPU: DLPack's device query (CuPy) or .device.id
    does, so an array on another GPU than the context's is refused; a read-only one is
    refused as an output."""
    class OnGpu(FakeCuda):
        def __init__(self, dev, readonly=False):
            super().__init__((5, 1, 256), "<f2")
            self.__cuda_array_interface__["data"] = (0x7F0000000000, readonly)
            self.dev = dev

        def __dlpack_device__(self):
            return (2, self.dev)  # kDLCUDA

    assert _buffers.describe(OnGpu(1)).device_id == 1
    with pytest.raises(qsakv.InvalidArgumentError, match=r"k: expected CUDA device 0, got "
                       r"device 1"):
        _buffers.check(OnGpu(1), "k", "float16", (5, 1, 256), backend_cuda=True, device_id=0)
    _buffers.check(OnGpu(0), "k", "float16", (5, 1, 256), backend_cuda=True, device_id=0)
    with pytest.raises(qsakv.InvalidArgumentError, match=r"out: the library writes it"):
        _buffers.check(OnGpu(0, readonly=True), "out", "float16", (5, 1, 256),
                       backend_cuda=True, device_id=0, writable=True)
    assert _buffers.describe(FakeCuda((5, 256), "<f2")).device_id == -1  # unknown: allowed


def test_cuda_array_interface_description():
    b = _buffers.describe(FakeCuda((5, 1, 256), "<f2"))
    assert (b.dtype, b.shape, b.contiguous, b.device) == ("float16", (5, 1, 256), True, "cuda")
    strided = FakeCuda((5, 256), "<f2", strides=(1024, 2))
    assert not _buffers.describe(strided).contiguous
    assert _buffers.describe(FakeCuda((5, 256), "<f2", strides=(512, 2))).contiguous


def test_check_messages():
    kw = dict(backend_cuda=False)
    a = np.zeros((3, 1, 256), np.float16)
    assert _buffers.check(a, "k", "float16", (None, 1, 256), **kw).ptr == a.ctypes.data
    with pytest.raises(qsakv.InvalidArgumentError,
                       match=r"^k: expected float16 \[n, 1, 256\] contiguous, got int32 \[3\]$"):
        _buffers.check(np.zeros(3, np.int32), "k", "float16", (None, 1, 256), **kw)
    with pytest.raises(qsakv.InvalidArgumentError,
                       match=r"q: expected host memory \(CPU backend\), got a .* on cuda"):
        _buffers.check(FakeCuda((3, 1, 256), "<f2"), "q", "float16", (None, 1, 256), **kw)
    with pytest.raises(qsakv.InvalidArgumentError,
                       match=r"q: expected CUDA device memory \(CUDA backend\), got a NumPy"):
        _buffers.check(a, "q", "float16", (None, 1, 256), backend_cuda=True)
    with pytest.raises(qsakv.InvalidArgumentError, match=r"q: expected at least 5 rows"):
        _buffers.check(a, "q", "float16", (None, 1, 256), min_rows=5, **kw)


def test_streams():
    class Proto:
        def __cuda_stream__(self):
            return (0, 0xABC)

    class TorchLike:
        cuda_stream = 0x123

    class CupyLike:
        ptr = 0x456

    assert _buffers.stream_handle(None) == 0
    assert _buffers.stream_handle(77) == 77
    assert _buffers.stream_handle(Proto()) == 0xABC
    assert _buffers.stream_handle(TorchLike()) == 0x123
    assert _buffers.stream_handle(CupyLike()) == 0x456
    s = _buffers.as_stream(Proto())
    assert ctypes.cast(s, ctypes.c_void_p).value == 0xABC
    assert _buffers.as_stream(None) is None
    with pytest.raises(qsakv.InvalidArgumentError, match="stream"):
        _buffers.stream_handle(1.5)


def test_store_through_dlpack_on_cpu(cpu, small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    with qsakv.Cache(cpu, cfg, num_blocks=1) as cache:
        k = np.random.default_rng(0).standard_normal((3, 1, 256)).astype(np.float16)
        slots = np.array([5, -1, 7], np.int64)
        cache.store_kv(3, DLPackOnly(k), DLPackOnly(-k), DLPackOnly(slots))
        kv = cache.read_kv(3)
        np.testing.assert_array_equal(kv[0, 0, [5, 7]], k[[0, 2]])
        np.testing.assert_array_equal(kv[0, 1, [5, 7]], -k[[0, 2]])
        assert not kv[0, :, 6].any()  # -1 skipped, the cache started zeroed


def test_torch_tensor_description_without_torch():
    """The torch adapter reads data_ptr/dtype/shape/device/is_contiguous; a stand-in
    with torch's module name and attribute spelling exercises it without torch."""

    class Device:
        def __init__(self, type_, index):
            self.type, self.index = type_, index

    class Tensor:
        __module__ = "torch"

        def __init__(self, dtype, shape, device, contiguous=True):
            self.dtype, self.shape, self.device = dtype, shape, device
            self._contiguous = contiguous

        def data_ptr(self):
            return 0x1000

        def is_contiguous(self):
            return self._contiguous

    t = Tensor("torch.bfloat16", (4, 1, 256), Device("cuda", 1))
    b = _buffers.describe(t)
    assert (b.ptr, b.dtype, b.shape, b.contiguous, b.device, b.device_id) == \
        (0x1000, "bfloat16", (4, 1, 256), True, "cuda", 1)
    with pytest.raises(qsakv.InvalidArgumentError, match="q: expected CUDA device 0, got device 1"):
        _buffers.check(t, "q", "bfloat16", (None, 1, 256), backend_cuda=True, device_id=0)
    cpu_t = Tensor("torch.float16", (4, 1, 256), Device("cpu", None), contiguous=False)
    with pytest.raises(qsakv.InvalidArgumentError, match="non-contiguous"):
        _buffers.check(cpu_t, "k", "float16", (None, 1, 256), backend_cuda=False)


class Temporary:
    """A DLPack producer whose every export is of a fresh array that only the capsule
    references (a lazily materialised tensor, say): the memory lives exactly as long as
    the capsule. `refs` are weak references to the arrays exported."""

    def __init__(self, make):
        self.make, self.refs = make, []

    def __dlpack__(self, **kw):
        a = self.make()
        self.refs.append(weakref.ref(a))
        return a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)


def test_dlpack_export_is_the_memory_itself_or_refused():
    """__dlpack__ is asked for copy=False: a producer that may copy (copy=None lets it,
    per the DLPack spec) made the library write `out` into a copy freed at once (a
    segfault, or an output that never arrives), in a subprocess for that reason. A
    refusal (BufferError: NumPy's read-only arrays) is an InvalidArgumentError naming
    the argument; a producer older than the keyword is asked without it."""
    r = run_isolated("""
        import numpy as np
        import qsakv
        cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4, max_batched_tokens=64,
                                       max_requests=8, max_model_len=8192, kv_dtype="fp16")
        cache = qsakv.Cache(qsakv.Context("cpu"), cfg, num_blocks=16)
        plan = qsakv.Plan(cache, max_rows=64)
        layer = cfg.qsa_layers[0]
        class CopyingProducer:
            def __init__(self, a):
                self.a, self.kw = a, []
            def __dlpack__(self, **kw):
                self.kw.append(kw)
                if kw.get("copy") is False:
                    return self.a.__dlpack__(copy=False)
                return self.a.copy().__dlpack__()
            def __dlpack_device__(self):
                return self.a.__dlpack_device__()
        plan.update(qsakv.Batch([0, 1], [1], np.zeros((1, 1), np.int32)))
        one = np.ones((1, 1, 256), np.float16)
        cache.store_kv(layer, one, one, np.array([0]))
        out = np.zeros((1, 6, 256), np.float16)
        p = CopyingProducer(out)
        plan.attention(layer, np.ones((1, 6, 256), np.float16), p, mode="dense")
        print(p.kw, float(out.min()), float(out.max()))
        """)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip() == "[{'copy': False}] 1.0 1.0"

    ro = np.zeros((1, 1, 256), np.float16)
    ro.flags.writeable = False
    with pytest.raises(qsakv.InvalidArgumentError, match=r"^k: .*readonly"):
        _buffers.check(DLPackOnly(ro), "k", "float16", (None, 1, 256), backend_cuda=False)

    class OldProducer:  # __dlpack__(stream=None) only, as before DLPack 2023.12
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

    a = np.zeros((2, 1, 256), np.float16)
    assert _buffers.check(OldProducer(a), "k", "float16", (None, 1, 256),
                          backend_cuda=False).ptr == a.ctypes.data


def test_dlpack_exports_live_as_long_as_their_use(monkeypatch, cpu, small_cfg):
    """The capsule was dropped once the address was read, releasing the producer's
    memory before the library used it. It is held until the call returns, and as long
    as the library keeps the address: a Plan's block table, a Cache's memory and
    external top-k array."""
    import gc

    from qsakv import cache as cache_mod
    cfg = small_cfg.replace(kv_dtype="fp16")
    k = Temporary(lambda: np.full((2, 1, 256), 3.0, np.float16))
    slots = Temporary(lambda: np.array([1, 2], np.int64))
    real = cache_mod._store_kv
    alive = []

    def store_kv(*args):
        gc.collect()
        alive.append([r() is not None for r in k.refs + slots.refs])
        if not all(alive[-1]):  # the library would read freed memory
            raise AssertionError("an export was released before the library ran")
        return real(*args)

    with qsakv.Cache(cpu, cfg, num_blocks=2) as cache:
        monkeypatch.setattr(cache_mod, "_store_kv", store_kv)
        cache.store_kv(3, k, k, slots)
        assert alive == [[True] * 3], "an export was released before the library ran"
        assert (cache.read_kv(3)[0, :, 1:3] == 3.0).all()
        with qsakv.Plan(cache, max_rows=1) as plan:
            bt = Temporary(lambda: np.array([[0, 1]], np.int32))
            plan.update(qsakv.Batch([0, 1], [3], bt))
            gc.collect()
            assert bt.refs[-1]() is not None, "the plan let its block table go"

    layout = qsakv.layout_for(cfg, num_blocks=2)
    shapes = qsakv.memory_shapes(cfg, layout)
    mem = [{f: Temporary(lambda s=s, d=d: np.zeros(s, np.dtype(d[0])))
            for f, (s, d) in shapes.items()} for _ in cfg.qsa_layers]
    topk = Temporary(lambda: np.zeros((cfg.max_batched_tokens,
                                       cfg.rank_geometry().topk_width), np.int32))
    cache = qsakv.Cache(cpu, cfg, num_blocks=2, memory=mem, external_topk=topk)
    gc.collect()
    refs = [r for e in mem for t in e.values() for r in t.refs] + topk.refs
    assert refs and all(r() is not None for r in refs), "the cache let an export go"
    cache.close()
    gc.collect()
    assert all(r() is None for r in refs)
