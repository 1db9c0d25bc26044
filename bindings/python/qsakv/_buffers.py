"""Array arguments and streams, checked before they reach the library.

Accepted buffers (nothing is copied; the caller keeps them alive, and for async calls
unchanged, until the stream has run the work):
- CPU backend: NumPy arrays (and anything with __array_interface__ or a CPU DLPack
  capsule), CPU torch tensors;
- CUDA backend: torch tensors on a CUDA device, anything with __cuda_array_interface__
  (CuPy, Numba, ...) or __dlpack__ with a CUDA device.
torch and CuPy are never imported here: objects are recognised by their protocols.

Streams: None (the legacy default stream), an int (a cudaStream_t value), an object
with __cuda_stream__ (the CUDA stream protocol), a torch.cuda.Stream (.cuda_stream) or a
cupy.cuda.Stream (.ptr).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from . import _cdefs
from .errors import argument_error

ANY = None  # a dimension that may take any size

# DLPack (dlpack.h): just what locating a tensor needs.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_CODES = {(0, 32): "int32", (0, 64): "int64", (0, 8): "int8", (1, 8): "uint8",
             (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
             (4, 16): "bfloat16", (1, 16): "uint16"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclass(frozen=True)
class Buffer:
    """What a call needs of an array: its address and what to check."""

    ptr: int
    dtype: str
    shape: tuple
    contiguous: bool
    device: str  # "cpu" or "cuda"
    device_id: int
    kind: str  # for messages: "NumPy array", "torch tensor", ...


def _contiguous(shape, strides, itemsize) -> bool:
    """C-contiguous (strides in bytes; None means contiguous)."""
    if strides is None:
        return True
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _from_numpy_like(a, kind) -> Buffer:
    import numpy as np

    a = np.asarray(a)
    return Buffer(a.__array_interface__["data"][0], a.dtype.name, tuple(a.shape),
                  bool(a.flags.c_contiguous), "cpu", -1, kind)


def _from_torch(t) -> Buffer:
    dev = t.device
    return Buffer(int(t.data_ptr()), str(t.dtype).replace("torch.", ""), tuple(t.shape),
                  bool(t.is_contiguous()), "cuda" if dev.type == "cuda" else dev.type,
                  dev.index if dev.index is not None else -1, "torch tensor")


def _from_cai(obj) -> Buffer:
    import numpy as np

    cai = obj.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    return Buffer(int(cai["data"][0] or 0), dtype.name, shape,
                  _contiguous(shape, cai.get("strides"), dtype.itemsize), "cuda", -1,
                  f"{type(obj).__name__} (__cuda_array_interface__)")


def _from_dlpack(obj) -> Buffer:
    dev_type, dev_id = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (0, 0)
    capsule = obj.__dlpack__()  # dropped unconsumed: its destructor frees the tensor ref
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    dev_type = t.device.device_type
    shape = tuple(t.shape[i] for i in range(t.ndim))
    itemsize = max(1, t.dtype.bits // 8)
    strides = None if not t.strides else tuple(t.strides[i] * itemsize for i in range(t.ndim))
    dtype = _DL_CODES.get((t.dtype.code, t.dtype.bits), f"dlpack{t.dtype.code}:{t.dtype.bits}")
    device = {_DL_CPU: "cpu", _DL_CUDA: "cuda", _DL_CUDA_MANAGED: "cuda",
              _DL_CUDA_HOST: "cuda_host"}.get(dev_type, f"dlpack device {dev_type}")
    return Buffer((t.data or 0) + t.byte_offset, dtype, shape,
                  _contiguous(shape, strides, itemsize) and t.dtype.lanes == 1, device,
                  t.device.device_id if device == "cuda" else -1,
                  f"{type(obj).__name__} (__dlpack__)")


def describe(obj) -> Buffer:
    """A Buffer for any supported array object; InvalidArgumentError otherwise."""
    mod = type(obj).__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "data_ptr"):
        return _from_torch(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        try:
            return _from_cai(obj)
        except (TypeError, AttributeError):
            pass  # e.g. a dtype the interface cannot express: try DLPack
    if hasattr(obj, "__array_interface__"):
        return _from_numpy_like(obj, "NumPy array")
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj)
    raise TypeError(f"{type(obj).__name__} is not an array (NumPy, torch, CuPy, DLPack)")


def _dims(shape) -> str:
    return "[" + ", ".join("n" if d is ANY else str(d) for d in shape) + "]"


def check(obj, name: str, dtype: str, shape: tuple, *, backend_cuda: bool,
          device_id: int | None = None, min_rows: int | None = None) -> Buffer:
    """Checks one array argument and returns its description (.ptr, .shape).

    shape: ints and ANY; min_rows: the first dimension must be at least this (buffers
    sized for a maximum shape are fine). Messages name the argument, e.g.
    "k: expected float16 [n, 1, 256] contiguous, got float32 [7, 256]".
    """
    if obj is None:
        raise argument_error(f"{name}: expected an array, got None")
    try:
        b = describe(obj)
    except TypeError as e:
        raise argument_error(f"{name}: {e}") from None
    want_dev = "cuda" if backend_cuda else "cpu"
    expected = f"{dtype} {_dims(shape)} contiguous"
    got = f"{b.dtype} {list(b.shape)}".replace("'", "")
    ok = (b.dtype == dtype and len(b.shape) == len(shape) and b.contiguous
          and all(w is ANY or w == g for w, g in zip(shape, b.shape)))
    if ok and min_rows is not None and b.shape[0] < min_rows:
        raise argument_error(f"{name}: expected at least {min_rows} rows (the plan's "
                             f"last update), got {got}")
    if not ok:
        extra = "" if b.contiguous else " non-contiguous"
        raise argument_error(f"{name}: expected {expected}, got {got}{extra}")
    if b.device != want_dev:
        where = "CUDA device memory (CUDA backend)" if backend_cuda else \
            "host memory (CPU backend)"
        raise argument_error(f"{name}: expected {where}, got a {b.kind} on {b.device}")
    if backend_cuda and device_id is not None and b.device_id not in (-1, device_id):
        raise argument_error(f"{name}: expected CUDA device {device_id}, got device "
                             f"{b.device_id}")
    return b


def stream_handle(stream) -> int:
    """The cudaStream_t value of a stream object (0: the legacy default stream)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return int(value[1] if isinstance(value, tuple) else value)
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, Numba
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
        if value is not None and hasattr(value, "value"):  # ctypes c_void_p
            return int(value.value or 0)
    raise argument_error(f"stream: expected None, an int, an object with __cuda_stream__, "
                         f"a torch or CuPy stream; got {type(stream).__name__}")


def as_stream(stream):
    """A qsakv_stream_t for a call."""
    h = stream_handle(stream)
    return ctypes.cast(ctypes.c_void_p(h), _cdefs.qsakv_stream_t) if h else None


def typed(ptr: int, ctype):
    """An address as a ctypes pointer argument (NULL for 0)."""
    return ctypes.cast(ctypes.c_void_p(ptr), ctypes.POINTER(ctype)) if ptr else None
