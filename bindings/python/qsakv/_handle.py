"""Ownership of library handles.

A Handle owns one C object and destroys it exactly once: on close(), on leaving a
`with` block, or, as a backstop, when it is garbage collected (weakref.finalize, which
also runs at interpreter exit, newest first). A handle keeps its parent alive (a Cache
its Context, a Plan its Cache), so collection never destroys a parent first; closing a
parent explicitly closes its open children first, so no C object outlives the one it
depends on. Using a closed handle raises ClosedError; close() twice is a no-op.
"""
from __future__ import annotations

import threading
import weakref

from .errors import ClosedError

_live = 0
_live_lock = threading.Lock()


def live_handles() -> int:
    """Number of C objects this package created and has not destroyed yet."""
    return _live


def _destroy(destroy, ptr) -> None:
    global _live
    destroy(ptr)
    with _live_lock:
        _live -= 1


class Handle:
    """Base of Context, Overlay, Cache and Plan."""

    _kind = "handle"

    def __init__(self, ptr, destroy, parent: "Handle | None" = None):
        global _live
        with _live_lock:
            _live += 1
        self._ptr = ptr
        #: The C address as an int for the hot calls; 0 once closed (see _a).
        self._addr = _address(ptr)
        self._parent = parent
        self._children: "weakref.WeakSet[Handle]" = weakref.WeakSet()
        self._finalizer = weakref.finalize(self, _destroy, destroy, ptr)
        if parent is not None:
            parent._children.add(self)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def _p(self):
        """The C pointer, for a call. Raises ClosedError when closed."""
        if not self._addr:
            self._closed_error()
        return self._ptr

    def _closed_error(self):
        raise ClosedError(f"this {self._kind} is closed")

    def close(self) -> None:
        """Destroys the C object (children first). Idempotent."""
        for child in list(self._children):
            child.close()
        self._addr = 0
        self._finalizer()

    def __enter__(self):
        if not self._addr:
            self._closed_error()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"at 0x{_address(self._ptr):x}"
        return f"<qsakv.{type(self).__name__} {state}>"


def _address(ptr) -> int:
    import ctypes

    return ctypes.cast(ptr, ctypes.c_void_p).value or 0
