"""Versioned structs: making them ready for a call, and reading them into records.

Every option/info struct starts with struct_size and version; new() fills both (the
version from the header's <STRUCT>_VERSION macro). record() turns a filled struct into
an immutable namedtuple of its fields (minus struct_size/version), with char arrays as
str, enum fields as the Python enums and int arrays as tuples, so the records grow
with the header without edits here.
"""
from __future__ import annotations

import ctypes
import warnings
from collections import namedtuple

from . import _cdefs
from .enums import by_c_name

_RECORDS: dict[type, type] = {}
_CALLABLE_RECORDS: dict[type, type] = {}
_HEADER_FIELDS = ("struct_size", "version")


def new(cls):
    s = cls()
    names = [f for f, _ in cls._fields_]
    if names[:2] == list(_HEADER_FIELDS):
        s.struct_size = ctypes.sizeof(cls)
        s.version = getattr(_cdefs, cls.__name__.upper() + "_VERSION", 1)
    return s


_FILL_SCRATCH_BYTES = 4096


def filled(cls, fill):
    """A `cls` filled by `fill(pointer)`, a C call that writes the whole struct as the
    *library's* header declares it (the *_init functions, the config presets,
    qsakv_model_config_from_checkpoint): into a 4 KiB scratch, of which this package's
    struct is copied and given its own struct_size and version, as the header's
    QSAKV_*_INIT macros do. A newer library's larger struct would overrun one filled in
    place, and its struct_size would make the library read past it when passed back."""
    assert ctypes.sizeof(cls) <= _FILL_SCRATCH_BYTES, cls.__name__
    scratch = (ctypes.c_uint64 * (_FILL_SCRATCH_BYTES // 8))()  # zeroed, 8-byte aligned
    fill(ctypes.cast(scratch, ctypes.POINTER(cls)))
    s = cls.from_buffer_copy(scratch)  # the first sizeof(cls) bytes
    fresh = new(cls)
    s.struct_size, s.version = fresh.struct_size, fresh.version
    return s


def record_type(cls, name: str) -> type:
    if cls not in _RECORDS:
        fields = [f for f, _ in cls._fields_ if f not in _HEADER_FIELDS]
        _RECORDS[cls] = namedtuple(name, fields)
        _RECORDS[cls].__doc__ = f"Fields of {cls.__name__} (see qsakv.h)."
    return _RECORDS[cls]


def value(struct, field: str):
    ftype = dict(struct._fields_)[field]
    v = getattr(struct, field)
    enum_c = _cdefs.ENUM_FIELDS.get(type(struct).__name__, {}).get(field)
    if enum_c is not None:
        try:
            return by_c_name[enum_c](v)
        except ValueError:
            return v
    if isinstance(ftype, type) and issubclass(ftype, ctypes.Array):
        if ftype._type_ is ctypes.c_char:
            return v.decode("utf-8", "replace")  # c_char arrays read as bytes up to NUL
        return tuple(v)
    if ftype is ctypes.c_char_p:
        return None if v is None else v.decode("utf-8", "replace")
    if isinstance(ftype, type) and issubclass(ftype, ctypes._Pointer):
        return ctypes.cast(v, ctypes.c_void_p).value or 0
    return v


def record(struct, name: str):
    cls = record_type(type(struct), name)
    return cls(*(value(struct, f) for f in cls._fields))


def callable_record(rec, where: str):
    """`rec` as a record that may also be called, returning itself with a
    DeprecationWarning: `Plan.info` and `Overlay.info` were methods up to 0.1.0 and are
    properties now, like every other `.info`; `plan.info()` keeps working meanwhile."""
    base = type(rec)
    cls = _CALLABLE_RECORDS.get(base)
    if cls is None:
        def __call__(self):
            warnings.warn(f"{where} is a property: write {where.split('.')[-1]} without "
                          "(); calling it will stop working in a later version",
                          DeprecationWarning, stacklevel=2)
            return self

        cls = _CALLABLE_RECORDS[base] = type(base.__name__, (base,),
                                             {"__slots__": (), "__call__": __call__,
                                              "__doc__": base.__doc__})
    return cls(*rec)
