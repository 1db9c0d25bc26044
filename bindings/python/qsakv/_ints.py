"""Python integers into C integers, checked.

ctypes converts a Python int to a C int32 / int64 / uint64 argument or struct field by
truncating it: layer 2**32 + 3 arrives as layer 3, a budget of -1 bytes as 2**64 - 1.
Every integer the package passes on from its caller goes through c_int() first, which
takes what operator.index takes (int, NumPy integers; not bool, float or str) and
refuses a value outside the C type's range, raising InvalidArgumentError (a ValueError)
that names the argument.
"""
from __future__ import annotations

import ctypes
import operator

from .errors import argument_error

__all__ = ["c_int", "set_field", "INT32_MIN", "INT32_MAX"]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

# ctypes integer type codes (c_int8 ... c_uint64, c_long, c_size_t, ...).
_INT_CODES = "bBhHiIlLqQ"
_LIMITS: dict[type, tuple[int, int, str]] = {}


def _limits(ctype) -> tuple[int, int, str]:
    lim = _LIMITS.get(ctype)
    if lim is None:
        bits = 8 * ctypes.sizeof(ctype)
        if ctype._type_.islower():  # signed
            lim = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1, f"int{bits}")
        else:
            lim = (0, (1 << bits) - 1, f"uint{bits}")
        _LIMITS[ctype] = lim
    return lim


def c_int(value, name: str, ctype=ctypes.c_int32) -> int:
    """`value` as a Python int in the range of the ctypes integer type `ctype` (int32
    by default): anything operator.index takes but bool. InvalidArgumentError naming
    `name` otherwise."""
    if isinstance(value, bool):
        raise argument_error(f"{name}: expected an integer, got bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise argument_error(f"{name}: expected an integer, got {type(value).__name__} "
                             f"{value!r}") from None
    lo, hi, cname = _limits(ctype)
    if not lo <= v <= hi:
        raise argument_error(f"{name}: {v} does not fit {cname} ({lo}..{hi})")
    return v


def is_int_type(ctype) -> bool:
    """Whether a struct field's ctypes type is a plain C integer (not an array, pointer,
    float or char)."""
    return (isinstance(ctype, type) and issubclass(ctype, ctypes._SimpleCData)
            and ctype._type_ in _INT_CODES)


def set_field(struct, field: str, value, what: str | None = None) -> None:
    """struct.field = value, an integer field checked by c_int (InvalidArgumentError
    naming `what`, default the field); a value ctypes refuses (a str for a float field)
    raises InvalidArgumentError too."""
    name = what or field
    ctype = dict(type(struct)._fields_)[field]
    if is_int_type(ctype):
        value = c_int(value, name, ctype)
    try:
        setattr(struct, field, value)
    except TypeError as e:
        raise argument_error(f"{name}: {e}") from None
