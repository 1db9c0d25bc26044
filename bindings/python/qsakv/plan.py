"""Plan: a batch's metadata (made on the host, copied to the device) and the calls that
consume it: top-k selection and attention."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from . import _cdefs, _structs
from ._buffers import ANY, ArgSpec, check, resolve_stream, stream_arg, typed
from . import _buffers
from ._handle import Handle
from ._ints import INT32_MAX, INT32_MIN, c_int, set_field
from ._lib import argument_type_error, lib, raise_status, raw_function
from .cache import Cache, act_dtype
from .enums import by_c_name, choice
from .errors import argument_error

AttentionMode = by_c_name["qsakv_attention_mode"]
# mode -> value, for the names and values a call usually passes (IntEnum members hash
# as their ints); anything else goes through enums.choice.
_MODES = {"sparse": 0, "dense": 1, 0: 0, 1: 1}
_u = ctypes.c_void_p
_select_topk = raw_function("qsakv_select_topk", _u, ctypes.c_int32, _u, _u, ctypes.c_int64,
                            _u)
_attention_run = raw_function("qsakv_attention_run", _u, ctypes.c_int32, ctypes.c_int32, _u,
                              _u, ctypes.c_int64, _u, _u)


@dataclass
class Batch:
    """One step's batch.

    query_start: HOST int32 [num_requests + 1]; rows of request r are
        [query_start[r], query_start[r+1]) (decode 1, verify 1 + spec, prefill a chunk).
    seq_lens: HOST int32 [num_requests]; tokens of request r after this step.
    block_table: DEVICE int32 [num_requests, pages]; physical block of each page. It is
        read when select/attention run (not copied): the Plan keeps a reference until
        the next update, keep its contents unchanged until the work ran.
    request_slots: HOST int32 [num_requests] raw-ring slot of each request, or None (r).
    Host arrays may be any int sequences; they are copied at update().
    """

    query_start: object
    seq_lens: object
    block_table: object
    request_slots: object = None

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens)

    @property
    def num_rows(self) -> int:
        return int(self.query_start[-1])


class Plan(Handle):
    """A plan for batches up to a maximum shape (allocates its device metadata and
    workspace; blocking). A CUDA graph captured with it stays valid across update()s.

    Plan(cache, *, max_rows=0, max_requests=0, num_splits=0, multi_row_min_rows=0)
    (0: from the config / occupancy / the measured crossover; multi_row_min_rows -1: every
    row on the decode route, n >= 1: requests of n rows or more on the grouped route).
    Keeps its Cache alive; closing the Cache closes the Plan first.
    """

    _kind = "plan"

    def __init__(self, cache: Cache, *, max_rows: int = 0, max_requests: int = 0,
                 num_splits: int = 0, multi_row_min_rows: int = 0):
        opts = _structs.filled(_cdefs.qsakv_plan_options, lib.qsakv_plan_options_init)
        for field, value in (("max_rows", max_rows), ("max_requests", max_requests),
                             ("num_splits", num_splits),
                             ("multi_row_min_rows", multi_row_min_rows)):
            set_field(opts, field, value)
        out = ctypes.POINTER(_cdefs.qsakv_plan)()
        lib.qsakv_plan_create(ctypes.byref(out), cache._p, ctypes.byref(opts))
        super().__init__(out, lib.qsakv_plan_destroy, parent=cache)
        self.cache = cache
        self._block_table = None  # the last update's: read when select/attention run
        self._block_table_address = None  # its address (holding a DLPack export)
        self._rows = 0
        cfg, geo = cache._config, cache._geometry
        self._cuda, self._device = cache._cuda, cache._device
        self._width = geo.topk_width
        act = act_dtype(cfg)

        def spec(name, dtype, tail, **kw):
            return ArgSpec(name, dtype, tail, cuda=self._cuda, device_id=self._device, **kw)

        self._iq = spec("index_q", "float16", (cfg.index_num_heads, cfg.index_head_dim))
        self._q = spec("q", act, (geo.q_heads, cfg.head_dim))
        self._out = spec("out", act, (geo.q_heads, cfg.head_dim), writable=True)

    def update(self, batch: Batch, *, stream=None) -> None:
        """Describes the next batch: host work and an ASYNC copy of the metadata to the
        plan's device buffers on `stream`. Not capturable. Blocking only while the
        previous update's copy still reads the staging buffer."""
        import numpy as np

        self._p  # noqa: B018 (ClosedError first)

        def host(name, values, n):
            # Host integers, taken as int32 only where every value is one (an unchecked
            # cast would wrap 2**32 + 1 to 1 and truncate 1.9 to 1).
            try:
                a = np.asarray(values)
            except (TypeError, ValueError, RuntimeError) as e:  # e.g. a CUDA tensor
                raise argument_error(f"batch.{name}: expected host integers [{n}] "
                                     f"(a list or NumPy array): {e}") from None
            if a.shape != (n,) or (a.size and a.dtype.kind not in "iu"):
                raise argument_error(f"batch.{name}: expected int32 [{n}], got "
                                     f"{a.dtype} {list(a.shape)}")
            if a.size and (int(a.min()) < -2**31 or int(a.max()) >= 2**31):
                raise argument_error(f"batch.{name}: values {int(a.min())}..{int(a.max())} "
                                     f"do not fit int32")
            return np.ascontiguousarray(a, dtype=np.int32)

        n = len(batch.seq_lens)
        qs = host("query_start", batch.query_start, n + 1)
        lens = host("seq_lens", batch.seq_lens, n)
        slots = None if batch.request_slots is None else \
            host("request_slots", batch.request_slots, n)
        bt = check(batch.block_table, "batch.block_table", "int32", (ANY, ANY),
                   backend_cuda=self._cuda, device_id=self._device, min_rows=n)
        b = _structs.new(_cdefs.qsakv_batch)
        b.num_requests = n
        b.query_start = typed(qs.ctypes.data, ctypes.c_int32)
        b.seq_lens = typed(lens.ctypes.data, ctypes.c_int32)
        b.request_slots = None if slots is None else typed(slots.ctypes.data, ctypes.c_int32)
        b.block_table = typed(bt.ptr, ctypes.c_int32)
        b.block_table_stride = bt.shape[1]
        lib.qsakv_plan_update(self._p, ctypes.byref(b),
                              stream_arg(resolve_stream(stream, self._cuda, self._device)))
        # The block table itself, not the Batch: the kernels read it at run time, and a
        # Batch reused with another table must not let this one be freed.
        self._block_table = batch.block_table
        self._block_table_address = bt.ptr
        self._rows = int(qs[-1])

    @property
    def info(self):
        """PlanInfo: max_rows, max_requests, num_splits, num_rows and num_requests of the
        last update, workspace_bytes; the grouped route: rows_per_group (0: none),
        multi_row_min_rows, num_groups and grouped_rows of the last update. (A method up
        to 0.1.0: `plan.info()` still works, with a DeprecationWarning.)"""
        out = _structs.new(_cdefs.qsakv_plan_info)
        lib.qsakv_plan_get_info(self._p, ctypes.byref(out))
        return _structs.callable_record(_structs.record(out, "PlanInfo"), "Plan.info")

    def _topk(self, topk):
        """(address, stride) of a caller's top-k array int32 [>= rows, >= topk_width]."""
        if topk is None:
            return 0, 0
        if type(topk) is _buffers._NDARRAY and not self._cuda and \
                topk.dtype is _INT32 and topk.flags.c_contiguous and topk.ndim == 2 and \
                topk.flags.writeable:
            rows, cols = topk.shape
            if rows >= self._rows and cols >= self._width:
                return topk.__array_interface__["data"][0], cols
        b = check(topk, "topk", "int32", (ANY, ANY), backend_cuda=self._cuda,
                  device_id=self._device, min_rows=self._rows, writable=True)
        if b.shape[1] < self._width:
            raise argument_error(f"topk: expected int32 [n, >= {self._width}] (topk_width) "
                                 f"contiguous, got int32 {list(b.shape)}")
        return b.ptr, b.shape[1]

    def select_topk(self, layer: int, index_q, topk=None, *, stream=None) -> None:
        """Indexer scoring, exact top-k and expansion for every row of the last update.

        index_q: DEVICE float16 [rows, index_num_heads, index_head_dim];
        topk: DEVICE int32 [rows, >= topk_width] to write, or None for the layer's
        (shared) top-k buffer. Asynchronous on `stream` (default: torch's current
        stream); capturable."""
        if self._keeper is None:
            self._closed_error()
        if type(layer) is not int or not INT32_MIN <= layer <= INT32_MAX:
            layer = c_int(layer, "layer")  # the exact int32, or InvalidArgumentError
        pq = self._iq.ptr(index_q, None, self._rows)[0]
        ptk, stride = self._topk(topk)
        s = resolve_stream(stream, self._cuda, self._device)
        keeper = self._keeper  # held for the call: a close() meanwhile destroys after it
        if keeper is None:
            self._closed_error()
        try:
            status = _select_topk(keeper.addr, layer, pq, ptk, stride, s)
        except ctypes.ArgumentError as e:
            keeper = None
            raise argument_type_error("qsakv_select_topk", e) from None
        if status:
            keeper = None  # not kept alive by the exception's traceback
            raise_status(status, "qsakv_select_topk")

    def attention(self, layer: int, q, out, *, mode="sparse", topk=None, stream=None) -> None:
        """softmax(q K^T * softmax_scale) V for every row of the last update.

        q, out: DEVICE arrays, activation dtype, [rows, q_heads, head_dim] contiguous.
        mode: "sparse" (over top-k indices: `topk` DEVICE int32 [rows, >= topk_width],
        or None for the layer's top-k buffer) or "dense" (over the block table, causal).
        Asynchronous on `stream` (default: torch's current stream); no allocation,
        capturable in a CUDA graph."""
        if self._keeper is None:
            self._closed_error()
        if type(layer) is not int or not INT32_MIN <= layer <= INT32_MAX:
            layer = c_int(layer, "layer")  # the exact int32, or InvalidArgumentError
        # Exact str / int only: bool is an int that hashes as 0 / 1 (mode=True is no mode).
        m = _MODES.get(mode) if type(mode) is str or type(mode) is int else None
        if m is None:
            m = int(choice(AttentionMode, mode, "mode"))
        rows = self._rows
        pq = self._q.ptr(q, None, rows)[0]
        po = self._out.ptr(out, None, rows)[0]
        ptk, stride = self._topk(topk) if m == 0 else (0, 0)
        s = resolve_stream(stream, self._cuda, self._device)
        keeper = self._keeper  # held for the call: a close() meanwhile destroys after it
        if keeper is None:
            self._closed_error()
        try:
            status = _attention_run(keeper.addr, layer, m, pq, ptk, stride, po, s)
        except ctypes.ArgumentError as e:
            keeper = None
            raise argument_type_error("qsakv_attention_run", e) from None
        if status:
            keeper = None  # not kept alive by the exception's traceback
            raise_status(status, "qsakv_attention_run")


def _int32():
    import numpy as np

    return np.dtype("int32")


_INT32 = _int32()
