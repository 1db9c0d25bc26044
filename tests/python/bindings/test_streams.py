"""Issue 15, item 2a: which stream a call runs on. Without torch in the process: the
legacy default stream (0). With torch imported and a CUDA context: torch's current
stream, and a call aimed at a non-capturing stream while torch's current stream
captures a CUDA graph raises CaptureError. torch is simulated here by a stand-in module
(the real one is exercised by test_gpu_torch.py and test_torch_ops.py on a GPU); the
package only looks torch up in sys.modules, never imports it."""
import sys
import types
from contextlib import contextmanager

import numpy as np
import pytest

import qsakv
from qsakv import _buffers


class FakeTorch(types.ModuleType):
    """torch's stream API as the package uses it: a current stream per thread, the set
    of capturing streams, torch.cuda.stream(ExternalStream(h))."""

    def __init__(self, current=0x5000, capturing=()):
        super().__init__("torch")
        self.current, self.capturing, self.calls = current, set(capturing), []
        fake = self

        class C:
            @staticmethod
            def _cuda_getCurrentRawStream(device):
                fake.calls.append(("current", device))
                return fake.current

            @staticmethod
            def _cuda_isCurrentStreamCapturing():
                return fake.current in fake.capturing

        class ExternalStream:
            def __init__(self, handle, device=None):
                self.cuda_stream = handle

        @contextmanager
        def stream(s):
            saved, fake.current = fake.current, s.cuda_stream
            try:
                yield
            finally:
                fake.current = saved

        self._C = C
        self.cuda = types.SimpleNamespace(ExternalStream=ExternalStream, stream=stream)


@pytest.fixture
def torch(monkeypatch):
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_without_torch_the_default_is_the_legacy_stream(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert _buffers.resolve_stream(None, True, 0) == 0
    assert _buffers.resolve_stream(0x77, True, 0) == 0x77
    assert _buffers.resolve_stream(None, False, -1) == 0


def test_with_torch_the_default_is_torchs_current_stream(torch):
    assert _buffers.resolve_stream(None, True, 3) == 0x5000
    assert torch.calls == [("current", 3)]  # the context's device
    assert _buffers.resolve_stream(0x6000, True, 0) == 0x6000  # explicit, no capture
    assert _buffers.resolve_stream(None, False, -1) == 0  # CPU contexts ignore torch
    torch.calls.clear()
    assert _buffers.resolve_stream(0x6000, False, -1) == 0x6000 and torch.calls == []


def test_a_call_aimed_away_from_a_capture_is_refused(torch):
    torch.capturing = {0x5000}  # torch.cuda.graph() is capturing on the current stream
    assert _buffers.resolve_stream(None, True, 0) == 0x5000  # captured: fine
    assert _buffers.resolve_stream(0x5000, True, 0) == 0x5000
    torch.capturing.add(0x7000)  # a stream forked into the capture (event wait)
    assert _buffers.resolve_stream(0x7000, True, 0) == 0x7000
    for other in (0x6000, 0, 2):  # another stream, the legacy and per-thread defaults
        with pytest.raises(qsakv.CaptureError, match=r"capturing a CUDA graph, but this "
                           r"call was aimed at stream 0x[0-9a-f]+, which is not capturing"):
            _buffers.resolve_stream(other, True, 0)
    assert torch.current == 0x5000  # the probe restored the current stream
    assert issubclass(qsakv.CaptureError, qsakv.StateError)


def test_every_call_resolves_its_stream(torch, cpu, small_cfg, monkeypatch):
    """Wiring: each call that takes stream= goes through resolve_stream. Here it is
    made to answer as for a CUDA context on device 0 (the CPU backend ignores the
    stream value), which shows that every call defaults to torch's current stream and
    refuses a non-capturing stream during a capture."""
    real = _buffers.resolve_stream
    for mod in ("cache", "plan", "context", "calibration"):
        monkeypatch.setattr(f"qsakv.{mod}.resolve_stream",
                            lambda stream, cuda, device: real(stream, True, 0))
    cfg = small_cfg.replace(kv_dtype="fp16")
    with qsakv.Cache(cpu, cfg, num_blocks=2) as cache, qsakv.Plan(cache, max_rows=1) as plan, \
            qsakv.Calibration(cpu, cfg) as calib:
        k = np.zeros((1, 1, 256), np.float16)
        s = np.zeros(1, np.int64)
        keys = np.zeros((1, 128), np.float16)
        iq = np.zeros((1, 4, 128), np.float16)
        q = np.zeros((1, 6, 256), np.float16)
        calls = {
            "store_kv": lambda **kw: cache.store_kv(3, k, k, s, **kw),
            "store_index_keys": lambda **kw: cache.store_index_keys(
                3, keys, np.zeros(1, np.int32), s, **kw),
            "store_compressed_keys": lambda **kw: cache.store_compressed_keys(3, keys, s, **kw),
            "note_external_codes": lambda **kw: cache.note_external_codes(3, **kw),
            "update": lambda **kw: plan.update(qsakv.Batch([0, 1], [1], np.zeros((1, 1),
                                                                                np.int32)), **kw),
            "select_topk": lambda **kw: plan.select_topk(3, iq, **kw),
            "attention": lambda **kw: plan.attention(3, q, np.zeros_like(q), **kw),
            "observe": lambda **kw: calib.observe(3, k, k, **kw),
            "synchronize": lambda **kw: cpu.synchronize(**kw),
        }
        for name, call in calls.items():
            torch.calls.clear()
            call()
            assert torch.calls == [("current", 0)], name  # the default: torch's current
        torch.capturing = {0x5000}
        for name, call in calls.items():
            call()  # the default stream is the capturing one
            with pytest.raises(qsakv.CaptureError):
                call(stream=0x6000)
