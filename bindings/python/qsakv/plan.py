"""Plan: a batch's metadata (made on the host, copied to the device) and the calls that
consume it: top-k selection and attention."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from . import _cdefs, _structs
from ._buffers import ANY, as_stream, check, typed
from ._handle import Handle
from ._lib import lib
from .cache import Cache, act_dtype
from .enums import by_c_name
from .errors import argument_error

AttentionMode = by_c_name["qsakv_attention_mode"]


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

    Plan(cache, *, max_rows=0, max_requests=0, num_splits=0)  (0: from the config /
    occupancy). Keeps its Cache alive; closing the Cache closes the Plan first.
    """

    _kind = "plan"

    def __init__(self, cache: Cache, *, max_rows: int = 0, max_requests: int = 0,
                 num_splits: int = 0):
        opts = _structs.new(_cdefs.qsakv_plan_options)
        lib.qsakv_plan_options_init(ctypes.byref(opts))
        opts.max_rows, opts.max_requests, opts.num_splits = max_rows, max_requests, num_splits
        out = ctypes.POINTER(_cdefs.qsakv_plan)()
        lib.qsakv_plan_create(ctypes.byref(out), cache._p, ctypes.byref(opts))
        super().__init__(out, lib.qsakv_plan_destroy, parent=cache)
        self.cache = cache
        self._batch = None
        self._rows = 0

    def update(self, batch: Batch, *, stream=None) -> None:
        """Describes the next batch: host work and an ASYNC copy of the metadata to the
        plan's device buffers on `stream`. Not capturable. Blocking only while the
        previous update's copy still reads the staging buffer."""
        import numpy as np

        def host(name, values, n):
            a = np.ascontiguousarray(np.asarray(values), dtype=np.int32)
            if a.shape != (n,):
                raise argument_error(f"batch.{name}: expected int32 [{n}], got "
                                     f"{a.dtype} {list(a.shape)}")
            return a

        n = len(batch.seq_lens)
        qs = host("query_start", batch.query_start, n + 1)
        lens = host("seq_lens", batch.seq_lens, n)
        slots = None if batch.request_slots is None else \
            host("request_slots", batch.request_slots, n)
        c = self.cache
        bt = check(batch.block_table, "batch.block_table", "int32", (ANY, ANY),
                   backend_cuda=c.context.is_cuda, device_id=c.context.info.device,
                   min_rows=n)
        b = _structs.new(_cdefs.qsakv_batch)
        b.num_requests = n
        b.query_start = typed(qs.ctypes.data, ctypes.c_int32)
        b.seq_lens = typed(lens.ctypes.data, ctypes.c_int32)
        b.request_slots = None if slots is None else typed(slots.ctypes.data, ctypes.c_int32)
        b.block_table = typed(bt.ptr, ctypes.c_int32)
        b.block_table_stride = bt.shape[1]
        lib.qsakv_plan_update(self._p, ctypes.byref(b), as_stream(stream))
        self._batch = batch  # the block table is read at run time
        self._rows = int(qs[-1])

    def info(self):
        """PlanInfo: max_rows, max_requests, num_splits, num_rows and num_requests of the
        last update, workspace_bytes."""
        out = _structs.new(_cdefs.qsakv_plan_info)
        lib.qsakv_plan_get_info(self._p, ctypes.byref(out))
        return _structs.record(out, "PlanInfo")

    def _topk(self, topk):
        if topk is None:
            return None, 0
        c = self.cache
        b = check(topk, "topk", "int32", (ANY, ANY), backend_cuda=c.context.is_cuda,
                  device_id=c.context.info.device, min_rows=self._rows)
        width = c.geometry.topk_width
        if b.shape[1] < width:
            raise argument_error(f"topk: expected int32 [n, >= {width}] (topk_width) "
                                 f"contiguous, got int32 {list(b.shape)}")
        return typed(b.ptr, ctypes.c_int32), b.shape[1]

    def select_topk(self, layer: int, index_q, topk=None, *, stream=None) -> None:
        """Indexer scoring, exact top-k and expansion for every row of the last update.

        index_q: DEVICE float16 [rows, index_num_heads, index_head_dim];
        topk: DEVICE int32 [rows, >= topk_width] to write, or None for the layer's
        (shared) top-k buffer. Asynchronous on `stream`; capturable."""
        c = self.cache
        cfg = c.config
        pq = check(index_q, "index_q", "float16", (ANY, cfg.index_num_heads, cfg.index_head_dim),
                   backend_cuda=c.context.is_cuda, device_id=c.context.info.device,
                   min_rows=self._rows)
        ptk, stride = self._topk(topk)
        lib.qsakv_select_topk(self._p, layer, pq.ptr, ptk, stride, as_stream(stream))

    def attention(self, layer: int, q, out, *, mode="sparse", topk=None, stream=None) -> None:
        """softmax(q K^T * softmax_scale) V for every row of the last update.

        q, out: DEVICE arrays, activation dtype, [rows, q_heads, head_dim] contiguous.
        mode: "sparse" (over top-k indices: `topk` DEVICE int32 [rows, >= topk_width],
        or None for the layer's top-k buffer) or "dense" (over the block table, causal).
        Asynchronous on `stream`; no allocation, capturable in a CUDA graph."""
        c = self.cache
        mode = AttentionMode[mode.upper()] if isinstance(mode, str) else AttentionMode(mode)
        shape = (ANY, c.geometry.q_heads, c.config.head_dim)
        dt = act_dtype(c.config)
        kw = dict(backend_cuda=c.context.is_cuda, device_id=c.context.info.device,
                  min_rows=self._rows)
        pq = check(q, "q", dt, shape, **kw)
        po = check(out, "out", dt, shape, **kw)
        ptk, stride = self._topk(topk) if mode == AttentionMode.SPARSE else (None, 0)
        lib.qsakv_attention_run(self._p, layer, mode, pq.ptr, ptk, stride, po.ptr,
                                as_stream(stream))
