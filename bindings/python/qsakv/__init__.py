"""qsakv: Python bindings (ctypes, no compiler needed) for libqsakv, calibrated FP8 E4M3
KV caches and sparse / dense attention.

The flow (see examples/python/quickstart.py):

    import qsakv
    ctx = qsakv.Context("auto")                     # CUDA when there is a GPU, else CPU
    cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4)
    ov = qsakv.Overlay.load(scale_dir).validate(cfg, qsakv.checkpoint_revision(ckpt))
    cache = qsakv.Cache(ctx, cfg, ov, num_blocks=1024)
    cache.store_kv(layer, k, v, slot_mapping)        # device arrays; async on `stream`
    plan = qsakv.Plan(cache, max_rows=64)
    plan.update(qsakv.Batch(query_start, seq_lens, block_table))
    plan.select_topk(layer, index_q)
    plan.attention(layer, q, out)

Calibration (qsakv.Calibration): observe K/V on the device, all-reduce over NCCL or
merge saved files, summarise, write the overlay.

Failures raise QsakvError subclasses (qsakv.errors), one per status code, carrying the
library's message. The library is found through $QSAKV_LIBRARY / $QSAKV_LIB, next to
this package, or on the system paths; its version must match the header the
declarations were generated from (checked at import).
"""
from . import _cdefs, errors
from ._handle import live_handles
from ._lib import library_path, missing_functions
from ._views import DeviceArray
from .cache import Cache, CompressedKeyViews, LayerBuffers, layout_for, memory_shapes
from .calibration import Calibration, scale_from_max
from .config import ModelConfig, capacity_plan
from .context import Context, built_with_cuda
from .enums import *  # noqa: F401,F403 (DType, Backend, Decoder, AttentionMode, Status, ...)
from .enums import dtype_of
from .errors import *  # noqa: F401,F403 (QsakvError and one class per status)
from .overlay import Overlay, checkpoint_revision
from .plan import Batch, Plan
from .tp import tp_consensus
from ._lib import lib  # the raw CDLL, prototypes applied (failures raise by status)

__version__ = (f"{_cdefs.QSAKV_VERSION_MAJOR}.{_cdefs.QSAKV_VERSION_MINOR}."
               f"{_cdefs.QSAKV_VERSION_PATCH}")
HEADER_VERSION = _cdefs.QSAKV_VERSION_NUMBER
ABI_VERSION = _cdefs.QSAKV_ABI_VERSION


def version() -> str:
    """The loaded library's "major.minor.patch"."""
    return lib.qsakv_version_string().decode()


def status_string(status: int) -> str:
    """The library's name of a status code ("QSAKV_ERROR_OVERLAY_INCOMPLETE")."""
    from ._ints import c_int

    return lib.qsakv_status_string(c_int(status, "status")).decode()


def dtype_size(dtype) -> int:
    """Bytes per element of a library dtype (DType or name)."""
    return lib.qsakv_dtype_size(dtype_of(dtype))
