"""Exceptions: one class per qsakv_status, all under QsakvError.

Every failing library call raises the class of its status, carrying the status and the
library's thread-local message (copied, then cleared, in the calling thread, by
qsakv._lib; this module imports nothing of it). The classes for the header's status
codes are declared here for readers and IDEs; a status added to the header later still
gets its own class (named from the enum, e.g. QSAKV_ERROR_CALIB_NON_FINITE ->
CalibNonFiniteError), so the mapping stays total.
"""
from __future__ import annotations

from . import _cdefs

__all__ = ["QsakvError", "OverlayError", "ClosedError", "CaptureError", "error_class",
           "raise_for_status"]


class QsakvError(Exception):
    """A libqsakv call failed. `status` is the qsakv_status code, `status_name` its
    name ("QSAKV_ERROR_OVERLAY_INCOMPLETE"), `message` the library's message (which
    names the field, layer, expected and actual values), `function` the C function."""

    status = None  # set on subclasses

    def __init__(self, message: str = "", status: int | None = None, function: str = ""):
        if status is not None:
            self.status = status
        self.message = message
        self.function = function
        super().__init__(message)

    @property
    def status_name(self) -> str:
        return _STATUS_NAMES.get(self.status, "QSAKV_ERROR_UNKNOWN")

    def __str__(self) -> str:
        if not self.function:  # raised by the binding's own argument checks
            return self.message
        return f"{self.function}: {self.status_name}: {self.message}"


class OverlayError(QsakvError):
    """Base of the fail-closed overlay refusals (missing, incomplete, bad scale, bad
    tensor, duplicate, unknown tensor, revision / hash mismatch, contract, not
    validated, unit scales not asked for)."""


# Every status but the *_MAX_ENUM sentinel (which only widens the C enum to 32 bits).
_STATUS_NAMES = {v: k for k, v in _cdefs.ENUMS["qsakv_status"].items()
                 if not k.endswith("_MAX_ENUM")}


def _class_name(status_name: str) -> str:
    words = status_name.replace("QSAKV_ERROR_", "").split("_")
    return "".join(w.capitalize() for w in words) + "Error"


# Explicit declarations (name, status, extra bases). A builtin mixes in where Python
# code conventionally catches one: ValueError for bad arguments, OSError for a file
# that is missing or unreadable, MemoryError for an allocation that failed.
_DECLARED = [
    ("InvalidArgumentError", "QSAKV_ERROR_INVALID_ARGUMENT", (ValueError,)),
    ("InvalidConfigError", "QSAKV_ERROR_INVALID_CONFIG", (ValueError,)),
    ("UnsupportedError", "QSAKV_ERROR_UNSUPPORTED", ()),
    ("NoDeviceError", "QSAKV_ERROR_NO_DEVICE", ()),
    ("OutOfMemoryError", "QSAKV_ERROR_OUT_OF_MEMORY", (MemoryError,)),
    ("CudaError", "QSAKV_ERROR_CUDA", ()),
    ("NcclError", "QSAKV_ERROR_NCCL", ()),
    ("IoError", "QSAKV_ERROR_IO", (OSError,)),
    ("FormatError", "QSAKV_ERROR_FORMAT", ()),
    ("StateError", "QSAKV_ERROR_STATE", ()),
    ("InternalError", "QSAKV_ERROR_INTERNAL", ()),
    ("OverlayMissingError", "QSAKV_ERROR_OVERLAY_MISSING", ()),
    ("OverlayIncompleteError", "QSAKV_ERROR_OVERLAY_INCOMPLETE", ()),
    ("OverlayBadScaleError", "QSAKV_ERROR_OVERLAY_BAD_SCALE", ()),
    ("OverlayBadTensorError", "QSAKV_ERROR_OVERLAY_BAD_TENSOR", ()),
    ("OverlayDuplicateError", "QSAKV_ERROR_OVERLAY_DUPLICATE", ()),
    ("OverlayUnknownTensorError", "QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR", ()),
    ("RevisionMismatchError", "QSAKV_ERROR_REVISION_MISMATCH", ()),
    ("HashMismatchError", "QSAKV_ERROR_HASH_MISMATCH", ()),
    ("ContractError", "QSAKV_ERROR_CONTRACT", ()),
    ("OverlayNotValidatedError", "QSAKV_ERROR_OVERLAY_NOT_VALIDATED", ()),
    ("OverlayUnitScalesError", "QSAKV_ERROR_OVERLAY_UNIT_SCALES", ()),
]
# -20..-29, and -32 (unit scales, added after the calibration and TP statuses).
_OVERLAY_STATUSES = (*range(-29, -19), -32)

_BY_STATUS: dict[int, type] = {}


def _make(name: str, status: int, extra: tuple) -> type:
    base = OverlayError if status in _OVERLAY_STATUSES else QsakvError
    doc = f"Raised for {_STATUS_NAMES[status]} ({status})."
    cls = type(name, (base, *extra), {"status": status, "__doc__": doc,
                                      "__module__": __name__})
    globals()[name] = cls
    __all__.append(name)
    _BY_STATUS[status] = cls
    return cls


for _name, _status_name, _extra in _DECLARED:
    if _status_name in _cdefs.ENUMS["qsakv_status"]:
        _make(_name, _cdefs.ENUMS["qsakv_status"][_status_name], _extra)
for _status, _status_name in _STATUS_NAMES.items():
    if _status != 0 and _status not in _BY_STATUS:
        _make(_class_name(_status_name), _status, ())


class ClosedError(globals()["StateError"]):
    """The object was closed (or its owner was): it cannot be used any more."""


class CaptureError(globals()["StateError"]):
    """A call aimed at a stream that is not capturing while torch's current stream is
    capturing a CUDA graph: it would run once, now, and be missing from the graph."""


def error_class(status: int) -> type:
    """The exception class of a status code (QsakvError for an unknown code)."""
    return _BY_STATUS.get(status, QsakvError)


def raise_for_status(status: int, message: str, function: str = "") -> None:
    """Raises the exception of `status` (a nonzero qsakv_status) carrying `message`: a
    pure mapping. Fetching and clearing the library's thread-local message is the
    caller's part (qsakv._lib does both for every failing call), so that this module
    depends on nothing but the generated declarations."""
    raise error_class(status)(message, status, function)


def argument_error(message: str) -> InvalidArgumentError:  # noqa: F821 (made above)
    """A Python-side check failed before the call (same class as the library's)."""
    return _BY_STATUS[_cdefs.QSAKV_ERROR_INVALID_ARGUMENT](message)
