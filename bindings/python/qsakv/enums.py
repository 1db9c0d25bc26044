"""Python enums made from the header's enums (so a new enum or value needs no edit):
qsakv_dtype -> DType (FP16, BF16, E4M3, ...), qsakv_backend -> Backend (AUTO, CPU, CUDA),
qsakv_decoder -> Decoder, qsakv_attention_mode -> AttentionMode (SPARSE, DENSE),
qsakv_status -> Status, qsakv_copy_kind -> CopyKind, and any later one likewise."""
from __future__ import annotations

import enum
import os

from . import _cdefs

__all__ = ["by_c_name", "dtype_of", "ARRAY_DTYPE_NAMES"]

_NAMES = {"dtype": "DType"}
by_c_name: dict[str, type] = {}


def _py_name(c_name: str) -> str:
    short = c_name[len("qsakv_"):] if c_name.startswith("qsakv_") else c_name
    return _NAMES.get(short) or "".join(w.capitalize() for w in short.split("_"))


for _c_name, _all in _cdefs.ENUMS.items():
    # *_MAX_ENUM only widens the C enum to 32 bits: not a value anyone passes.
    _members = {k: v for k, v in _all.items() if not k.endswith("_MAX_ENUM")}
    _prefix = os.path.commonprefix(list(_members)) if len(_members) > 1 else "QSAKV_"
    _prefix = _prefix[: _prefix.rfind("_") + 1]
    _cls = enum.IntEnum(_py_name(_c_name), {k[len(_prefix):]: v for k, v in _members.items()},
                        module=__name__)
    globals()[_cls.__name__] = _cls
    __all__.append(_cls.__name__)
    by_c_name[_c_name] = _cls

# Array dtype names (NumPy / PyTorch / DLPack spelling) of each library dtype.
ARRAY_DTYPE_NAMES = {
    "FP16": "float16", "BF16": "bfloat16", "E4M3": "float8_e4m3fn", "FP32": "float32",
    "INT32": "int32", "INT64": "int64",
}
_ALIASES = {"fp16": "FP16", "float16": "FP16", "half": "FP16", "bf16": "BF16",
            "bfloat16": "BF16", "e4m3": "E4M3", "fp8": "E4M3", "float8_e4m3fn": "E4M3",
            "fp32": "FP32", "float32": "FP32", "int32": "INT32", "int64": "INT64"}


def dtype_of(value) -> "DType":  # noqa: F821 (made above)
    """A DType from a DType, an int, or a name ("fp16", "bfloat16", "e4m3", ...)."""
    DType = by_c_name["qsakv_dtype"]
    if isinstance(value, str):
        key = _ALIASES.get(value.lower().removeprefix("torch."))
        if key is None:
            raise ValueError(f"unknown dtype {value!r}; one of {sorted(_ALIASES)}")
        return DType[key]
    return DType(value)
