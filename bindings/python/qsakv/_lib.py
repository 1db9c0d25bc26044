"""Finds and loads libqsakv, applies the generated prototypes, checks versions.

Search order: $QSAKV_LIBRARY, $QSAKV_LIB (a path to the shared object), a libqsakv.so*
next to this package, then the system paths (ctypes.util.find_library, the loader's
own search for libqsakv.so.<ABI>).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from . import _cdefs
from .errors import raise_for_status

__all__ = ["lib", "library_path", "missing_functions", "raw_function", "raise_status"]

_SONAME = f"libqsakv.so.{_cdefs.QSAKV_ABI_VERSION}"


def _candidates():
    for var in ("QSAKV_LIBRARY", "QSAKV_LIB"):
        value = os.environ.get(var)
        if value:
            yield value, f"${var}"
            return  # an explicit choice is never silently replaced by another library
    here = Path(__file__).resolve().parent
    for path in sorted(here.glob("libqsakv.so*")):
        yield str(path), "next to the package"
    found = ctypes.util.find_library("qsakv")
    if found:
        yield found, "system paths"
    yield _SONAME, "system paths"
    yield "libqsakv.so", "system paths"


def _load():
    tried = []
    for path, where in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"  {path} ({where}): {e}")
    raise ImportError("qsakv: cannot load libqsakv; set QSAKV_LIBRARY to its path. Tried:\n"
                      + "\n".join(tried))


def _raise_last_error(status: int, function: str) -> None:
    """Copies the calling thread's library message, clears it (so that a later failure
    never shows a stale one), raises the exception of `status` (git2-rs style)."""
    message = _lib.qsakv_last_error().decode("utf-8", "replace")
    _lib.qsakv_clear_error()
    raise_for_status(status, message, function)


def _errcheck(status, func, args):
    # Not kept by the traceback of a failure: the handles' pointers among the arguments
    # hold their C objects alive (see _handle.Handle._p).
    del args
    if status != 0:
        _raise_last_error(status, func.__name__)
    return status


def _missing_stub(name):
    def stub(*args):
        raise NotImplementedError(f"{name} is declared by qsakv.h but {library_path} does "
                                  "not export it (a library older than the header?)")
    stub.__name__ = name
    return stub


def _bind(handle):
    missing = []
    for name, fn in _cdefs.FUNCTIONS.items():
        try:
            f = getattr(handle, name)
        except AttributeError:
            missing.append(name)
            setattr(handle, name, _missing_stub(name))
            continue
        f.restype = fn.restype
        f.argtypes = fn.argtypes
        if fn.c_restype == "qsakv_status":
            f.errcheck = _errcheck
    return missing


_lib, library_path = _load()
_missing = _bind(_lib)

_lib_version, _lib_abi = _lib.qsakv_version(), _lib.qsakv_abi_version()
if (_lib_version, _lib_abi) != (_cdefs.QSAKV_VERSION_NUMBER, _cdefs.QSAKV_ABI_VERSION):
    raise ImportError(
        f"qsakv: {library_path} is version {_lib_version} (ABI {_lib_abi}) but this package "
        f"was generated from qsakv.h version {_cdefs.QSAKV_VERSION_NUMBER} "
        f"(ABI {_cdefs.QSAKV_ABI_VERSION}); install the matching library or package")

lib = _lib
#: Functions the header declares that the loaded library does not export; calling one
#: raises NotImplementedError. Empty for a library built from the same header.
missing_functions = tuple(_missing)


def raw_function(name: str, *argtypes):
    """`name` as a second foreign function for the hot calls: `argtypes` as given
    (c_void_p for every pointer, so int addresses pass as they are, with no cast), an
    int status result and no errcheck (the caller tests the status and calls
    raise_status). The generated prototypes on `lib` stay as they are."""
    if name in _missing:
        return _missing_stub(name)
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)((name, _lib))


def argument_type_error(function: str, error: Exception):
    """A hot call's ctypes refusal of its arguments as the library's argument error. The
    layer is checked before (_ints.c_int); what is left is an address or stream that
    some array or stream object gave out of range of a pointer."""
    from .errors import argument_error

    return argument_error(f"{function}: {error}")


def raise_status(status: int, function: str) -> None:
    """Raises the exception of a failed status, as lib's errcheck does."""
    _raise_last_error(status, function)
