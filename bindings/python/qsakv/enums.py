"""Python enums made from the header's enums (so a new enum or value needs no edit):
qsakv_dtype -> DType (FP16, BF16, E4M3, ...), qsakv_backend -> Backend (AUTO, CPU, CUDA),
qsakv_decoder -> Decoder, qsakv_attention_mode -> AttentionMode (SPARSE, DENSE),
qsakv_status -> Status, qsakv_copy_kind -> CopyKind, and any later one likewise."""
from __future__ import annotations

import enum
import os

from . import _cdefs

__all__ = ["by_c_name", "dtype_of", "choice", "ARRAY_DTYPE_NAMES"]

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


def _invalid(what: str, value, valid) -> ValueError:
    from .errors import argument_error  # InvalidArgumentError: also a ValueError

    return argument_error(f"{what}: {value!r} is not one of {', '.join(valid)} "
                          "(names are case-insensitive)")


def choice(cls, value, what: str):
    """A member of the enum `cls` from a member, an int value or a name, matched
    case-insensitively ("cuda", "CUDA"). Anything else raises InvalidArgumentError (a
    ValueError) naming `what` and the valid choices."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        member = cls.__members__.get(value.upper())
        if member is not None:
            return member
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return cls(value)
        except ValueError:
            pass
    raise _invalid(what, value, [repr(n.lower()) for n in cls.__members__])


def dtype_of(value) -> "DType":  # noqa: F821 (made above)
    """A DType from a DType, an int, or a name ("fp16", "bfloat16", "e4m3", ...),
    case-insensitive; InvalidArgumentError (a ValueError) naming the valid names."""
    DType = by_c_name["qsakv_dtype"]
    if isinstance(value, str):
        key = _ALIASES.get(value.lower().removeprefix("torch."))
        if key is None:
            raise _invalid("dtype", value, [repr(a) for a in sorted(_ALIASES)])
        return DType[key]
    return choice(DType, value, "dtype")
