"""Context: the backend (CPU reference or CUDA) and device every other object uses."""
from __future__ import annotations

import ctypes

from . import _cdefs, _structs
from ._buffers import as_stream
from ._handle import Handle
from ._lib import lib
from .enums import by_c_name

Backend = by_c_name["qsakv_backend"]
Decoder = by_c_name["qsakv_decoder"]


def _enum(cls, value):
    return cls[value.upper()] if isinstance(value, str) else cls(value)


class Context(Handle):
    """A backend and device.

    Context(backend="auto" | "cpu" | "cuda", device=0, decoder="auto"). Blocking; may
    initialise the CUDA runtime. With "auto" and no usable GPU it picks the CPU backend
    and `info.fallback_reason` says why; "cuda" where there is none raises NoDeviceError.

    With the CPU backend, "device" buffers are host memory (NumPy arrays) and every call
    runs synchronously; with CUDA they are device memory (torch/CuPy tensors). Close it
    (or use `with`) to free it; closing it closes the caches and plans made on it.
    """

    _kind = "context"

    def __init__(self, backend="auto", device: int = 0, decoder="auto"):
        opts = _structs.new(_cdefs.qsakv_context_options)
        lib.qsakv_context_options_init(ctypes.byref(opts))
        opts.backend = _enum(Backend, backend)
        opts.device = device
        opts.decoder = _enum(Decoder, decoder)
        out = ctypes.POINTER(_cdefs.qsakv_context)()
        lib.qsakv_context_create(ctypes.byref(out), ctypes.byref(opts))
        super().__init__(out, lib.qsakv_context_destroy)
        self.info = self._get_info()
        """ContextInfo: backend and decoder chosen, device, SM version, memory, name,
        fallback_reason (read once at creation)."""

    def _get_info(self):
        info = _structs.new(_cdefs.qsakv_context_info)
        lib.qsakv_context_get_info(self._p, ctypes.byref(info))
        return _structs.record(info, "ContextInfo")

    @property
    def backend(self):
        """The backend chosen (never AUTO)."""
        return self.info.backend

    @property
    def is_cuda(self) -> bool:
        return self.info.backend == Backend.CUDA

    def synchronize(self, stream=None) -> None:
        """Waits for `stream` (no-op on the CPU backend). Blocking."""
        lib.qsakv_stream_synchronize(self._p, as_stream(stream))


def built_with_cuda() -> bool:
    """Whether the loaded library has the CUDA backend."""
    return bool(lib.qsakv_built_with_cuda())
