"""Calibration: K/V activation statistics observed on the device, merged over TP ranks
(NCCL all-reduce or saved files), summarised into scales, written as an overlay.

    calib = qsakv.Calibration(ctx, cfg)       # live: device statistics, starts stopped
    calib.start()
    for each forward pass, per QSA layer:
        calib.observe(layer, k, v)            # async on the stream, capturable
    calib.stop()
    calib.allreduce(nccl_comm)                # TP > 1, or: save per rank + merge
    host = calib.snapshot()                   # a host copy (blocking)
    host.save("rank0.calib.safetensors")
    print(host.summarize(3, "k"))             # max_abs, scale, p99.9, underflow, ...
    host.write_overlay("pack", base_index_path="ckpt/model.safetensors.index.json")

Formats and the statistics' definition: docs/calibration.md and qsakv.h.
"""
from __future__ import annotations

import ctypes
import os

from . import _cdefs, _structs
from ._buffers import ArgSpec, resolve_stream, stream_arg
from ._handle import Handle
from ._ints import INT32_MAX, INT32_MIN, c_int
from ._lib import argument_type_error, lib, raise_status, raw_function
from .config import ModelConfig
from .context import Context
from .enums import ARRAY_DTYPE_NAMES, by_c_name, choice
from .errors import argument_error
from .overlay import write_options

CalibKind = by_c_name["qsakv_calib_kind"]
CalibMergeMode = by_c_name["qsakv_calib_merge_mode"]
DType = by_c_name["qsakv_dtype"]
_u = ctypes.c_void_p
_observe = raw_function("qsakv_calib_observe", _u, ctypes.c_int32, _u, _u, ctypes.c_int64, _u)


def _path(p) -> bytes:
    return os.fsencode(p)


def _new_handle(cls, out, parent=None, context=None):
    self = cls.__new__(cls)
    Handle.__init__(self, out, lib.qsakv_calib_destroy, parent=parent)
    self.context = context
    self._k = self._v = None
    # A host handle: its calls that take a stream pass the legacy one, and the library
    # refuses the live-only ones (allreduce, observe) with its own status.
    self._cuda, self._device = False, -1
    return self


class Calibration(Handle):
    """A calibration handle.

    Calibration(context, config): a LIVE handle (statistics in the context's memory,
    zeroed; starts stopped). Calibration.load(path) and Calibration.merge([...]), and
    snapshot() of any handle, make HOST handles: query (info, stats, histogram,
    summarize), save, merge, write_overlay. Live handles: start, stop, observe,
    allreduce, snapshot. Calling a method on the wrong kind raises StateError (the
    library's refusal). A live handle keeps its Context alive; closing the Context
    closes it.
    """

    _kind = "calibration"

    def __init__(self, context: Context, config: ModelConfig):
        out = ctypes.POINTER(_cdefs.qsakv_calib)()
        lib.qsakv_calib_create(ctypes.byref(out), context._p, config._ref)
        super().__init__(out, lib.qsakv_calib_destroy, parent=context)
        self.context = context
        geo = config.rank_geometry()
        act = ARRAY_DTYPE_NAMES[DType(config.activation_dtype).name]
        tail = (geo.kv_heads, config.head_dim)
        self._cuda, self._device = context.is_cuda, context.info.device
        self._k = ArgSpec("k", act, tail, cuda=self._cuda, device_id=self._device)
        self._v = ArgSpec("v", act, tail, cuda=self._cuda, device_id=self._device)

    @classmethod
    def load(cls, path) -> "Calibration":
        """A host handle from a statistics file written by save() (or the CLI). Strict:
        FormatError naming the field for anything malformed; IoError when missing."""
        out = ctypes.POINTER(_cdefs.qsakv_calib)()
        lib.qsakv_calib_load(ctypes.byref(out), _path(path))
        return _new_handle(cls, out)

    @classmethod
    def merge(cls, inputs, mode="ranks") -> "Calibration":
        """A host handle merging host handles (max of maxima, sums of counts and
        histograms). mode "ranks": distinct TP ranks of one run; "envelope": complete
        statistics of several runs (run counts add up). Mismatched configs, TP sizes,
        overlapping ranks or incomplete envelope inputs: InvalidArgumentError."""
        mode = choice(CalibMergeMode, mode, "mode")
        inputs = list(inputs)
        for i, c in enumerate(inputs):
            if not isinstance(c, Calibration):
                raise argument_error(f"inputs[{i}]: expected a Calibration, got "
                                     f"{type(c).__name__}")
        ptrs = [c._p for c in inputs]  # each holds its handle's keeper during the call
        out = ctypes.POINTER(_cdefs.qsakv_calib)()
        try:
            arr = (ctypes.POINTER(_cdefs.qsakv_calib) * max(1, len(inputs)))(*ptrs)
            lib.qsakv_calib_merge(ctypes.byref(out), arr, len(inputs), mode)
        finally:
            ptrs = None  # noqa: F841 (not kept alive by an exception's traceback)
        return _new_handle(cls, out)

    # -- live handles --------------------------------------------------------------------
    def start(self) -> None:
        """Start counting (observe is a no-op while stopped). Immediate, host-side."""
        lib.qsakv_calib_start(self._p)

    def stop(self) -> None:
        """Stop counting: around warm-up, profiling and graph-capture passes."""
        lib.qsakv_calib_stop(self._p)

    def observe(self, layer: int, k, v, *, stream=None) -> None:
        """Adds K and V of one QSA layer (model-layer id) to the statistics.

        k, v: DEVICE arrays, the config's activation dtype, [n, kv_heads, head_dim]
        contiguous (n from k; v must match). Asynchronous on `stream` (default: torch's
        current stream when torch is imported); no allocation, capturable (a captured
        observe counts at every replay). A no-op while stopped (arguments still
        checked). A host handle raises StateError (the library's refusal)."""
        if self._keeper is None:
            self._closed_error()
        if type(layer) is not int or not INT32_MIN <= layer <= INT32_MAX:
            layer = c_int(layer, "layer")  # the exact int32, or InvalidArgumentError
        if self._k is None:  # a host handle: the library refuses it (StateError)
            pk = pv = n = 0
        else:
            pk, n = self._k.ptr(k)
            pv = self._v.ptr(v, n)[0]
        s = resolve_stream(stream, self._cuda, self._device)
        keeper = self._keeper  # held for the call: a close() meanwhile destroys after it
        if keeper is None:
            self._closed_error()
        try:
            status = _observe(keeper.addr, layer, pk, pv, n, s)
        except ctypes.ArgumentError as e:
            keeper = None
            raise argument_type_error("qsakv_calib_observe", e) from None
        if status:
            keeper = None  # not kept alive by the exception's traceback
            raise_status(status, "qsakv_calib_observe")

    def allreduce(self, nccl_comm, *, stream=None) -> None:
        """Reduces the statistics in place over the TP group's NCCL communicator (an
        ncclComm_t: an int address, a ctypes pointer, or an object with an int `comm` /
        `ptr` attribute such as cupy.cuda.nccl.NcclCommunicator). Collective: every rank
        calls it, on the stream its observes ran on. Once per handle; CUDA backend only
        (UnsupportedError on the CPU backend: merge saved files instead)."""
        comm = _address_of(nccl_comm, "nccl_comm")
        lib.qsakv_calib_allreduce(self._p, comm,
                                  stream_arg(resolve_stream(stream, self._cuda, self._device)))

    def snapshot(self, *, stream=None) -> "Calibration":
        """A host copy, after the work enqueued on `stream` (blocking)."""
        self._p  # noqa: B018 (ClosedError first)
        s = resolve_stream(stream, self._cuda, self._device)
        out = ctypes.POINTER(_cdefs.qsakv_calib)()
        lib.qsakv_calib_snapshot(ctypes.byref(out), self._p, stream_arg(s))
        return _new_handle(type(self), out)

    # -- any handle ----------------------------------------------------------------------
    @property
    def info(self):
        """CalibInfo: live, started, reduced, tp_size, rank, ranks_covered, complete,
        num_runs, activation_dtype, qsa_layers (the num_qsa_layers in use),
        config_fingerprint."""
        out = _structs.new(_cdefs.qsakv_calib_info)
        lib.qsakv_calib_get_info(self._p, ctypes.byref(out))
        rec = _structs.record(out, "CalibInfo")
        return rec._replace(qsa_layers=rec.qsa_layers[: rec.num_qsa_layers])

    @property
    def config(self) -> ModelConfig:
        """The ModelConfig the statistics were gathered for."""
        cfg = ModelConfig()
        lib.qsakv_calib_get_config(self._p, cfg._ref)
        return cfg

    def stats(self, layer: int, kind="k"):
        """CalibStats of a host handle: count, finite_count, nonzero_count, max_abs.
        kind: "k" or "v"."""
        out = _structs.new(_cdefs.qsakv_calib_stats)
        lib.qsakv_calib_get_stats(self._p, c_int(layer, "layer"), choice(CalibKind, kind, "kind"),
                                  ctypes.byref(out), None)
        return _structs.record(out, "CalibStats")

    def histogram(self, layer: int, kind="k"):
        """The log2 histogram of a host handle: NumPy uint64 [QSAKV_CALIB_BINS] over
        [2^QSAKV_CALIB_LOG2_MIN, 2^QSAKV_CALIB_LOG2_MAX] (docs/calibration.md)."""
        import numpy as np

        h = np.zeros(_cdefs.QSAKV_CALIB_BINS, np.uint64)
        out = _structs.new(_cdefs.qsakv_calib_stats)
        lib.qsakv_calib_get_stats(self._p, c_int(layer, "layer"), choice(CalibKind, kind, "kind"),
                                  ctypes.byref(out),
                                  h.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)))
        return h

    def save(self, path) -> None:
        """Saves a host handle's statistics (safetensors; refuses an existing path)."""
        lib.qsakv_calib_save(self._p, _path(path))

    def summarize(self, layer: int, kind="k"):
        """CalibSummary of one layer and kind of a host handle: count, finite_count,
        nonzero_count, max_abs, scale (max_abs / 448 rounded up), p99_9, p99_99,
        saturate_fraction, underflow_fraction. Checks the whole handle first: every TP
        rank covered (OverlayIncompleteError), every layer's K and V observed, finite
        (CalibNonFiniteError) and nonzero (OverlayBadScaleError)."""
        out = _structs.new(_cdefs.qsakv_calib_summary)
        lib.qsakv_calib_summarize(self._p, c_int(layer, "layer"), choice(CalibKind, kind, "kind"),
                                  ctypes.byref(out))
        return _structs.record(out, "CalibSummary")

    def scales(self) -> dict:
        """{layer: (k_scale, v_scale)} for every QSA layer, from summarize()."""
        return {layer: (self.summarize(layer, "k").scale, self.summarize(layer, "v").scale)
                for layer in self.info.qsa_layers}

    def write_overlay(self, out_dir, *, base_index_path, layer_prefix: str | None = None,
                      contract_tp_size: int = 0, contract_speculative_tokens: int = -1,
                      contract_activation_dtype=None, contract_min_sm: int = 0,
                      unit_scale_control: bool = False) -> None:
        """Summarises every QSA layer (all of summarize()'s refusals) and writes the scale
        pack out_dir/model-kvscales.safetensors + qsakv-overlay.json bound to the base
        checkpoint's index (as Overlay.write, same contract fields, but bound to the
        statistics by default: contract_tp_size 0 is their TP size, -1 no TP constraint;
        contract_activation_dtype None is their activation dtype)."""
        self._p  # noqa: B018 (ClosedError first)
        opts = write_options(base_index_path, layer_prefix, contract_tp_size,
                             contract_speculative_tokens, contract_activation_dtype,
                             contract_min_sm, unit_scale_control)
        lib.qsakv_calib_write_overlay(self._p, _path(out_dir), ctypes.byref(opts))


def scale_from_max(max_abs: float) -> float:
    """The library's scale of a maximum: the smallest FP32 s with s >= max_abs / 448."""
    out = ctypes.c_float()
    try:
        lib.qsakv_calib_scale_from_max(max_abs, ctypes.byref(out))
    except ctypes.ArgumentError:
        raise argument_error(f"max_abs: expected a number, got {type(max_abs).__name__} "
                             f"{max_abs!r}") from None
    return out.value


def _address_of(obj, name: str):
    if obj is None:
        raise argument_error(f"{name}: expected a communicator, got None")
    if isinstance(obj, int):
        return c_int(obj, name, ctypes.c_uint64)  # an address: a negative one would wrap
    if isinstance(obj, ctypes.c_void_p):
        return obj.value
    for attr in ("comm", "ptr", "value"):
        v = getattr(obj, attr, None)
        if isinstance(v, int):
            return c_int(v, name, ctypes.c_uint64)
    raise argument_error(f"{name}: expected an ncclComm_t address (int), a ctypes pointer "
                         f"or an object with an int .comm / .ptr; got {type(obj).__name__}")
