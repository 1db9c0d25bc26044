"""Array arguments and streams, checked before they reach the library.

Accepted buffers (nothing is copied; the caller keeps them alive, and for async calls
unchanged, until the stream has run the work):
- CPU backend: NumPy arrays (and anything with __array_interface__ or a CPU DLPack
  capsule), CPU torch tensors;
- CUDA backend: torch tensors on a CUDA device, anything with __cuda_array_interface__
  (CuPy, Numba, ...) or __dlpack__ with a CUDA device.
DLPack producers are asked for their memory itself (__dlpack__(copy=False); a producer
older than the keyword is asked without it): one that can only export a copy, or refuses
(a read-only array), raises InvalidArgumentError. The capsule is kept with the address
(Exported) until the call returns, or as long as the library keeps the address (a
Cache's memory, a Plan's block table).
torch and CuPy are never imported here: objects are recognised by their protocols.

Streams: None (the default: see resolve_stream), an int (a cudaStream_t value), an
object with __cuda_stream__ (the CUDA stream protocol), a torch.cuda.Stream
(.cuda_stream) or a cupy.cuda.Stream (.ptr).

The hot calls (store, select, attention) check their arguments through ArgSpec objects
that a Cache / Plan builds once: NumPy arrays and torch tensors that pass take a fast
path of a few attribute reads; anything else, and anything that fails, goes through
check(), which accepts every protocol above and words the error.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

from . import _cdefs
from ._ints import c_int
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


class Exported(int):
    """The address of a DLPack export, holding its capsule: the producer's memory stays
    exported (the capsule's deleter is not called) while this int is referenced, e.g.
    by the locals of a call or by the object that keeps the address."""

    def __new__(cls, address: int, capsule):
        self = super().__new__(cls, address)
        self.capsule = capsule
        return self


@dataclass(frozen=True)
class Buffer:
    """What a call needs of an array: its address and what to check."""

    ptr: int
    dtype: str
    shape: tuple
    contiguous: bool
    device: str  # "cpu" or "cuda"
    device_id: int  # -1: not known (CPU, or an interface that does not say)
    kind: str  # for messages: "NumPy array", "torch tensor", ...
    writable: bool = True  # False: a read-only NumPy array or CUDA array interface


def _dtype_name(dtype) -> str:
    """A NumPy dtype's name, marked where its byte order is not the machine's (the
    library reads native values: a big-endian float16 is another type to it)."""
    return dtype.name if dtype.isnative else f"{dtype.name} (byte order {dtype.byteorder})"


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
    return Buffer(a.__array_interface__["data"][0], _dtype_name(a.dtype), tuple(a.shape),
                  bool(a.flags.c_contiguous), "cpu", -1, kind, bool(a.flags.writeable))


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
    # The interface does not say which GPU holds the data; DLPack's device query (CuPy
    # has it) or a .device.id attribute (CuPy, Numba) does.
    device_id = -1
    try:
        if hasattr(obj, "__dlpack_device__"):
            dev_type, dev_id = obj.__dlpack_device__()
            if int(dev_type) in (_DL_CUDA, _DL_CUDA_MANAGED):
                device_id = int(dev_id)
        elif hasattr(obj, "device") and hasattr(obj.device, "id"):
            device_id = int(obj.device.id)
    except (TypeError, ValueError, AttributeError):
        device_id = -1
    return Buffer(int(cai["data"][0] or 0), _dtype_name(dtype), shape,
                  _contiguous(shape, cai.get("strides"), dtype.itemsize), "cuda", device_id,
                  f"{type(obj).__name__} (__cuda_array_interface__)", not cai["data"][1])


def _from_dlpack(obj) -> Buffer:
    dev_type, dev_id = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (0, 0)
    try:
        # The producer's memory, never a copy: the library writes outputs in place.
        capsule = obj.__dlpack__(copy=False)
    except TypeError:  # a producer older than the copy keyword (DLPack 2023.12)
        capsule = obj.__dlpack__()
    # Never consumed: the capsule's destructor releases the export, so the address
    # (Exported) holds the capsule for as long as it is used.
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    dev_type = t.device.device_type
    shape = tuple(t.shape[i] for i in range(t.ndim))
    itemsize = max(1, t.dtype.bits // 8)
    strides = None if not t.strides else tuple(t.strides[i] * itemsize for i in range(t.ndim))
    dtype = _DL_CODES.get((t.dtype.code, t.dtype.bits), f"dlpack{t.dtype.code}:{t.dtype.bits}")
    device = {_DL_CPU: "cpu", _DL_CUDA: "cuda", _DL_CUDA_MANAGED: "cuda",
              _DL_CUDA_HOST: "cuda_host"}.get(dev_type, f"dlpack device {dev_type}")
    return Buffer(Exported((t.data or 0) + t.byte_offset, capsule), dtype, shape,
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
          device_id: int | None = None, min_rows: int | None = None,
          writable: bool = False) -> Buffer:
    """Checks one array argument and returns its description (.ptr, .shape).

    shape: ints and ANY; min_rows: the first dimension must be at least this (buffers
    sized for a maximum shape are fine); writable: the library writes it (an output), so
    a read-only array is refused. Messages name the argument, e.g.
    "k: expected float16 [n, 1, 256] contiguous, got float32 [7, 256]".
    """
    if obj is None:
        raise argument_error(f"{name}: expected an array, got None")
    try:
        b = describe(obj)
    except (TypeError, ValueError, BufferError) as e:  # BufferError: DLPack's refusal
        raise argument_error(f"{name}: {e}") from None
    want_dev = "cuda" if backend_cuda else "cpu"
    ok = (b.dtype == dtype and len(b.shape) == len(shape) and b.contiguous
          and all(w is ANY or w == g for w, g in zip(shape, b.shape)))
    if not ok or (min_rows is not None and b.shape[0] < min_rows):
        got = f"{b.dtype} {list(b.shape)}".replace("'", "")
        if ok:
            raise argument_error(f"{name}: expected at least {min_rows} rows (the plan's "
                                 f"last update), got {got}")
        extra = "" if b.contiguous else " non-contiguous"
        raise argument_error(f"{name}: expected {dtype} {_dims(shape)} contiguous, got "
                             f"{got}{extra}")
    if b.device != want_dev:
        where = "CUDA device memory (CUDA backend)" if backend_cuda else \
            "host memory (CPU backend)"
        raise argument_error(f"{name}: expected {where}, got a {b.kind} on {b.device}")
    if backend_cuda and device_id is not None and b.device_id not in (-1, device_id):
        raise argument_error(f"{name}: expected CUDA device {device_id}, got device "
                             f"{b.device_id}")
    if writable and not b.writable:
        raise argument_error(f"{name}: the library writes it, got a read-only {b.kind}")
    return b


_addressof = ctypes.addressof
_from_buffer = ctypes.c_byte.from_buffer
_NDARRAY = None      # numpy.ndarray, once NumPy is imported
_TORCH_TENSOR = None  # torch.Tensor, once a torch tensor was seen


def _fast_types():
    global _NDARRAY, _TORCH_TENSOR
    np = sys.modules.get("numpy")
    if np is not None:
        _NDARRAY = np.ndarray
    torch = sys.modules.get("torch")
    if torch is not None:
        _TORCH_TENSOR = getattr(torch, "Tensor", None)


class ArgSpec:
    """One array argument of a hot call: name, dtype and trailing dimensions are fixed
    when the Cache / Plan is made, so a call only reads the array's attributes.

    ptr(obj, rows=None, min_rows=None) -> (address, number of rows): the first dimension
    is free, equal to `rows`, or at least `min_rows`; the others equal `tail`.
    writable: an output (read-only arrays refused).
    """

    __slots__ = ("name", "dtype", "tail", "ndim", "cuda", "device_id", "np_dtype",
                 "torch_dtype", "shape", "writable")

    def __init__(self, name: str, dtype: str, tail: tuple, *, cuda: bool,
                 device_id: int | None, writable: bool = False):
        self.name, self.dtype, self.tail = name, dtype, tuple(tail)
        self.writable = writable
        self.ndim = 1 + len(self.tail)
        self.shape = (ANY,) + self.tail
        self.cuda, self.device_id = cuda, device_id
        self.np_dtype = self.torch_dtype = None
        try:
            import numpy as np

            self.np_dtype = np.dtype(dtype)
        except TypeError:
            pass  # bfloat16 without ml_dtypes: the slow path handles it
        _fast_types()

    def ptr(self, obj, rows=None, min_rows=None):
        t = type(obj)
        if t is _NDARRAY:
            if not self.cuda and obj.dtype is self.np_dtype and obj.flags.c_contiguous:
                shape = obj.shape
                if len(shape) == self.ndim and shape[1:] == self.tail:
                    n = shape[0]
                    if (rows is None or n == rows) and (min_rows is None or n >= min_rows):
                        try:
                            return _addressof(_from_buffer(obj)), n
                        except (TypeError, ValueError, BufferError):  # read-only, empty
                            if not self.writable or obj.flags.writeable:
                                return obj.__array_interface__["data"][0], n
                            # a read-only output: check() below says so
        elif t is _TORCH_TENSOR and t is not None:
            # Each torch attribute is a call into C++ (~0.3 us): as few as the checks need.
            dt = self.torch_dtype
            if dt is None:
                dt = self.torch_dtype = getattr(sys.modules["torch"], self.dtype, False)
            if obj.dtype is dt and obj.is_contiguous():
                dev = obj.get_device()  # -1 for a CPU tensor
                if (dev == self.device_id if self.cuda and self.device_id is not None
                        else (dev >= 0) == self.cuda):
                    shape = obj.shape  # torch.Size: a tuple, compared as one
                    if len(shape) == self.ndim and shape[1:] == self.tail:
                        n = shape[0]
                        if (rows is None or n == rows) and (min_rows is None or n >= min_rows):
                            return obj.data_ptr(), n
        shape = self.shape if rows is None else (rows,) + self.tail
        b = check(obj, self.name, self.dtype, shape, backend_cuda=self.cuda,
                  device_id=self.device_id, min_rows=min_rows, writable=self.writable)
        if _TORCH_TENSOR is None or _NDARRAY is None:
            _fast_types()
        return b.ptr, b.shape[0]


def stream_handle(stream) -> int:
    """The cudaStream_t value of a stream object (0: the legacy default stream)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return _stream_value(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return _stream_value(int(value[1] if isinstance(value, tuple) else value))
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, Numba
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return _stream_value(value)
        if value is not None and hasattr(value, "value"):  # ctypes c_void_p
            return int(value.value or 0)
    raise argument_error(f"stream: expected None, an int, an object with __cuda_stream__, "
                         f"a torch or CuPy stream; got {type(stream).__name__}")


def _stream_value(handle: int) -> int:
    """A cudaStream_t value: an address, so 0 .. 2**64 - 1 (a negative int would wrap)."""
    return c_int(handle, "stream", ctypes.c_uint64)


def as_stream(stream):
    """A qsakv_stream_t for a call (None: NULL, the legacy default stream)."""
    return stream_arg(stream_handle(stream))


def stream_arg(handle: int):
    """A stream handle (int) as a qsakv_stream_t argument of the generated prototypes."""
    return ctypes.cast(ctypes.c_void_p(handle), _cdefs.qsakv_stream_t) if handle else None


def typed(ptr: int, ctype):
    """An address as a ctypes pointer argument (NULL for 0)."""
    return ctypes.cast(ctypes.c_void_p(ptr), ctypes.POINTER(ctype)) if ptr else None


_RAW_STREAM = [None, None]  # (the torch module, its raw current-stream getter)


def _torch_current_stream(torch, device: int) -> int:
    if _RAW_STREAM[0] is not torch:  # looked up once per torch module
        _RAW_STREAM[:] = [torch, getattr(torch._C, "_cuda_getCurrentRawStream", None)]
    get = _RAW_STREAM[1]
    if get is not None:
        return get(device)
    return torch.cuda.current_stream(device).cuda_stream


def _torch_is_capturing(torch) -> bool:
    get = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    if get is not None:
        return bool(get())
    return bool(torch.cuda.is_current_stream_capturing())


def _stream_is_capturing(torch, handle: int, device: int) -> bool:
    """Whether stream `handle` is capturing (torch asks cudaStreamIsCapturing)."""
    if handle in (0, 1, 2):  # the legacy and per-thread default streams never capture
        return False        # while another stream does (global capture mode refuses)
    with torch.cuda.stream(torch.cuda.ExternalStream(handle, device=device)):
        return _torch_is_capturing(torch)


def resolve_stream(stream, cuda: bool, device: int) -> int:
    """The cudaStream_t value a call runs on.

    None: on a CUDA context, torch's current stream of the context's device when the
    process has imported torch (as FlashInfer and vLLM's ops do), else the legacy
    default stream (0); on a CPU context 0 (nothing is asynchronous there).
    An explicit stream while torch's current stream is capturing a CUDA graph must be
    that stream or another capturing one: otherwise CaptureError (the call would run
    now, once, and be missing from the graph). torch is never imported here.
    """
    if not cuda:
        return 0 if stream is None else stream_handle(stream)
    torch = sys.modules.get("torch")
    if stream is None:
        return 0 if torch is None else _torch_current_stream(torch, device)
    h = stream_handle(stream)
    if torch is not None and _torch_is_capturing(torch):
        current = _torch_current_stream(torch, device)
        if h != current and not _stream_is_capturing(torch, h, device):
            from .errors import CaptureError

            raise CaptureError(
                f"stream: torch's current stream (0x{current:x}) is capturing a CUDA "
                f"graph, but this call was aimed at stream 0x{h:x}, which is not "
                "capturing: it would run now, once, and be missing from the graph. "
                "Pass stream=None (torch's current stream) or the capturing stream.")
    return h
