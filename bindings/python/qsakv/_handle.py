"""Ownership of library handles.

A Handle owns one C object through a keeper, which destroys it exactly once, when the
last reference to the keeper goes: the handle's own until close() (or leaving a `with`
block, or garbage collection), its children's keepers', and the views of the memory the
object owns (weakref.finalize, which also runs at interpreter exit, newest first). So
close() destroys at once unless a view of the memory is still alive, in which case the
memory stays valid until the last such view is gone; and a parent's C object (a Cache's
Context, a Plan's Cache) outlives its children's. Closing a parent closes its open
children first. Using a closed handle raises ClosedError; close() twice is a no-op.

Every call into the library holds the keeper while it runs (a local reference: the
pointer `_p` gives carries one, the hot calls take `_keeper` and use its `addr`), so a
close() from another thread during a call only marks the handle closed, and the C
object (with its parents) is destroyed when the call returns, not under it.

The keeper also holds what the C object points into without owning it (`held`: a
Cache's caller-owned memory and external top-k array), so those arrays live exactly as
long as the C object and every view of its memory, whatever the caller does with its
own references (the weakref.finalize callback, and so the destroy, runs before the
keeper's slots are cleared).
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


def _destroy(destroy, ptr, parent) -> None:
    """The finalizer of a keeper. `parent` (the parent's keeper) is only held: the
    finalizer's reference keeps the parent's C object alive until the child's is
    destroyed, even when the garbage collector finds both keepers unreachable at once (a
    reference cycle through the handles or a call's arguments), where it runs their
    finalizers in no particular order."""
    global _live
    destroy(ptr)
    with _live_lock:
        _live -= 1


class _Keeper:
    """Holds a C object alive by being referenced (see the module's docstring): the
    owning handle, its children's keepers and the views of its memory reference it."""

    __slots__ = ("parent", "addr", "held", "__weakref__")

    def __init__(self, parent: "_Keeper | None", addr: int):
        self.parent = parent
        #: The C address as an int, for the hot calls, which read it from a keeper they
        #: hold for the call (so the object cannot be destroyed under them).
        self.addr = addr
        #: Objects the C object uses but does not own (caller-owned memory), released
        #: only after the C object was destroyed.
        self.held = None


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
        self._keeper = _Keeper(parent._keeper if parent is not None else None, self._addr)
        self._ptype = type(ptr)
        weakref.finalize(self._keeper, _destroy, destroy, ptr, self._keeper.parent)
        if parent is not None:
            parent._children.add(self)

    @property
    def closed(self) -> bool:
        return self._keeper is None

    def _pin(self) -> _Keeper:
        """What a view of this object's memory holds so that the memory outlives it."""
        if self._keeper is None:
            self._closed_error()
        return self._keeper

    @property
    def _p(self):
        """The C pointer, for a call; ClosedError when closed. A copy that references
        the keeper: passed to a call, it keeps the C object alive until the call
        returns, even when another thread closes the handle meanwhile."""
        keeper = self._keeper
        if keeper is None:
            self._closed_error()
        p = self._ptype.from_buffer_copy(self._ptr)
        p._keeper = keeper
        return p

    def _closed_error(self):
        raise ClosedError(f"this {self._kind} is closed")

    def close(self) -> None:
        """Destroys the C object (children first). Idempotent. Nothing is synchronised
        (as in the C API): finish the queued work that uses the object's memory first,
        e.g. ctx.synchronize(stream), or that work reads freed memory. A call running
        in another thread meanwhile finishes first: the destroy waits for it to return
        (later calls raise ClosedError)."""
        for child in list(self._children):
            child.close()
        self._addr = 0
        self._keeper = None  # destroys now, unless a view still holds the memory

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
