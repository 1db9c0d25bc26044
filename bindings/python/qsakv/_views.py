"""Views of library-owned memory as arrays (never bare addresses).

- CPU backend (host memory): NumPy arrays over the cache's memory (no copy);
- CUDA backend (device memory): DeviceArray, an object with __cuda_array_interface__
  (version 3), which torch.as_tensor(x, device="cuda"), cupy.asarray(x) and Numba take
  without a copy.

A view holds its Cache's keeper (_handle.py): the memory it shows stays allocated until
the view is gone, even after the Cache (or its Context) was closed. Memory the C API
declares const (qsakv_layer_buffers.scales) is shown read-only: a NumPy array with
flags.writeable False (which cannot be set True), or a DeviceArray whose
__cuda_array_interface__ says read-only (data = (ptr, True)).
"""
from __future__ import annotations

# Element types: NumPy name -> __array_interface__ typestr. E4M3 is exposed as raw
# bytes (uint8; torch: .view(torch.float8_e4m3fn)); bfloat16 as uint16 on the device
# (the CUDA array interface has no bfloat16; torch: .view(torch.bfloat16)).
_TYPESTR = {"uint8": "|u1", "float16": "<f2", "uint16": "<u2", "int32": "<i4",
            "float32": "<f4", "int64": "<i8"}
_ITEMSIZE = {"uint8": 1, "float16": 2, "uint16": 2, "bfloat16": 2, "int32": 4,
             "float32": 4, "int64": 8}


class DeviceArray:
    """A typed, shaped view of device memory owned by the library.

    Attributes: ptr (the device address), shape, strides (bytes), dtype (a NumPy dtype
    name), nbytes, device (CUDA ordinal), readonly (memory the C API declares const: the
    interface's data says so, and torch.as_tensor refuses it; qsakv.torch_ops.as_tensor
    gives a copy); __cuda_array_interface__ for consumers:
    torch.as_tensor(view, device="cuda"), cupy.asarray(view).
    """

    __slots__ = ("ptr", "shape", "strides", "dtype", "nbytes", "device", "readonly",
                 "_owner")

    def __init__(self, ptr: int, shape, dtype: str, *, strides=None, device: int = 0,
                 owner=None, readonly: bool = False):
        self.ptr, self.shape, self.dtype, self.device = ptr, tuple(shape), dtype, device
        self.readonly = bool(readonly)
        size = _ITEMSIZE[dtype]
        self.strides = None if strides is None else tuple(s * size for s in strides)
        n = 1
        for d in self.shape:
            n *= d
        self.nbytes = n * size
        self._owner = owner

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": _TYPESTR[self.dtype],
                "data": (self.ptr, self.readonly), "strides": self.strides, "version": 3,
                "stream": None}  # library memory: zeroed and synchronised at creation

    def __repr__(self) -> str:
        return (f"<qsakv.DeviceArray {self.dtype} {list(self.shape)} at 0x{self.ptr:x} "
                f"on cuda:{self.device}{', read-only' if self.readonly else ''}>")


class _HostOwner:
    """The base of a host view: keeps the Cache referenced, describes the memory."""

    def __init__(self, ptr, shape, typestr, strides, owner, readonly=False):
        self._owner = owner
        self.__array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                    "data": (ptr, bool(readonly)), "strides": strides,
                                    "version": 3}


def host_view(ptr: int, shape, dtype: str, *, strides=None, owner=None,
              readonly: bool = False):
    """A NumPy array over host memory at `ptr` (strides in elements), whose base keeps
    `owner` referenced; read-only (writeable False, for good) when `readonly`."""
    import numpy as np

    if dtype == "bfloat16":
        try:
            import ml_dtypes

            base = host_view(ptr, shape, "uint16", strides=strides, owner=owner,
                             readonly=readonly)
            return base.view(ml_dtypes.bfloat16)
        except ImportError:
            dtype = "uint16"
    size = _ITEMSIZE[dtype]
    byte_strides = None if strides is None else tuple(s * size for s in strides)
    return np.asarray(_HostOwner(ptr, shape, _TYPESTR[dtype], byte_strides, owner,
                                 readonly))


def view(ptr: int, shape, dtype: str, *, cuda: bool, device: int, strides=None,
         owner=None, readonly: bool = False):
    """A host NumPy view or a DeviceArray, by backend; `readonly` for memory the C API
    declares const."""
    if cuda:
        return DeviceArray(ptr, shape, "uint16" if dtype == "bfloat16" else dtype,
                           strides=strides, device=device, owner=owner, readonly=readonly)
    return host_view(ptr, shape, dtype, strides=strides, owner=owner, readonly=readonly)


def address(obj) -> int:
    """The address of a view (DeviceArray or NumPy array)."""
    if isinstance(obj, DeviceArray):
        return obj.ptr
    return obj.__array_interface__["data"][0] if obj is not None else 0

