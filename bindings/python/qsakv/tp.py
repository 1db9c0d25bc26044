"""Tensor-parallel consensus: before an E4M3 cache is used, every rank checks that all
ranks of its TP group hold the same config and overlay, so that a group that would
compute garbage refuses on every rank instead."""
from __future__ import annotations

from ._buffers import resolve_stream, stream_arg
from ._lib import lib
from .calibration import _address_of
from .config import ModelConfig
from .context import Context
from .overlay import Overlay


def tp_consensus(context: Context, config: ModelConfig, overlay: Overlay | None, nccl_comm,
                 *, stream=None) -> None:
    """Collective: every rank of the NCCL communicator (one rank per process, numbered
    as tp_rank) calls it with its own config and overlay (None for 16-bit caches). All
    ranks must agree on every config field but tp_rank, on the overlay (scale file,
    layer prefix, validation) and on the numbering; otherwise every rank raises
    TpMismatchError with the same message, naming each difference and which ranks hold
    which value. nccl_comm: an ncclComm_t (an int address, a ctypes pointer, or an object
    with an int .comm / .ptr). Blocking (synchronises `stream`); CUDA backend only
    (UnsupportedError on the CPU backend); NCCL is loaded at call time (NcclError when
    it is missing)."""
    comm = _address_of(nccl_comm, "nccl_comm")
    s = resolve_stream(stream, context.is_cuda, context.info.device)
    lib.qsakv_tp_consensus(context._p, config._ref, overlay._p if overlay is not None else None,
                           comm, stream_arg(s))
