"""Context: the backend (CPU reference or CUDA) and device every other object uses."""
from __future__ import annotations

import ctypes

from . import _cdefs, _structs
from ._buffers import resolve_stream, stream_arg
from ._handle import Handle
from ._ints import set_field
from ._lib import lib
from .enums import by_c_name, choice

Backend = by_c_name["qsakv_backend"]
Decoder = by_c_name["qsakv_decoder"]


class Context(Handle):
    """A backend and device.

    Context(backend="auto" | "cpu" | "cuda", device=0, decoder="auto" | "hardware" |
    "software"); names are case-insensitive, anything else raises InvalidArgumentError (a
    ValueError) naming the valid choices. Blocking; may
    initialise the CUDA runtime. With "auto" and no usable GPU it picks the CPU backend
    and `info.fallback_reason` says why; "cuda" where there is none raises NoDeviceError.

    With the CPU backend, "device" buffers are host memory (NumPy arrays) and every call
    runs synchronously; with CUDA they are device memory (torch/CuPy tensors). Close it
    (or use `with`) to free it; closing it closes the caches and plans made on it.
    """

    _kind = "context"

    def __init__(self, backend="auto", device: int = 0, decoder="auto"):
        opts = _structs.filled(_cdefs.qsakv_context_options, lib.qsakv_context_options_init)
        opts.backend = choice(Backend, backend, "backend")
        set_field(opts, "device", device)
        opts.decoder = choice(Decoder, decoder, "decoder")
        out = ctypes.POINTER(_cdefs.qsakv_context)()
        lib.qsakv_context_create(ctypes.byref(out), ctypes.byref(opts))
        super().__init__(out, lib.qsakv_context_destroy)
        self._info = self._get_info()
        self._cuda = self._info.backend == Backend.CUDA
        self._device = self._info.device

    @property
    def info(self):
        """ContextInfo: backend and decoder chosen, device, SM version, memory, name,
        fallback_reason (read once at creation). ClosedError once closed."""
        self._p  # noqa: B018
        return self._info

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
        self._p  # noqa: B018
        return self._cuda

    def synchronize(self, stream=None) -> None:
        """Waits for `stream` (default: torch's current stream when torch is imported,
        else the legacy default stream; no-op on the CPU backend). Blocking."""
        self._p  # noqa: B018 (ClosedError first)
        s = resolve_stream(stream, self._cuda, self._device)
        lib.qsakv_stream_synchronize(self._p, stream_arg(s))


def built_with_cuda() -> bool:
    """Whether the loaded library has the CUDA backend."""
    return bool(lib.qsakv_built_with_cuda())
