"""Cache: every KV cache of one rank (main K/V per QSA layer, index-key rings,
compressed index keys, the top-k workspace) and the store calls that fill it."""
from __future__ import annotations

import ctypes
from collections import namedtuple

from . import _cdefs, _structs
from ._buffers import ANY, as_stream, check, typed
from ._handle import Handle
from ._lib import lib
from .config import ModelConfig
from .context import Context
from .enums import ARRAY_DTYPE_NAMES, by_c_name
from .overlay import Overlay

DType = by_c_name["qsakv_dtype"]
CopyKind = by_c_name["qsakv_copy_kind"]

LayerBuffers = namedtuple("LayerBuffers", "kv compressed_keys ring_keys topk scales")
LayerBuffers.__doc__ = """Device addresses (ints) of one QSA layer's buffers: kv (main
cache, layout in Cache.layout), compressed_keys and ring_keys (FP16), topk (int32, the
shared buffer when shared), scales (float[2]: k_scale, v_scale). Valid while the Cache
is open."""


def act_dtype(config: ModelConfig) -> str:
    """The array dtype name of the config's activations ("float16" or "bfloat16")."""
    return ARRAY_DTYPE_NAMES[DType(config.activation_dtype).name]


class Cache(Handle):
    """All caches of this rank, allocated once (blocking; contents start zeroed).

    Cache(context, config, overlay=None, *, num_blocks=0, memory_budget_bytes=0,
          share_topk=True, external_topk=None)

    An E4M3 cache needs an Overlay that validate() accepted for an equal config (else
    OverlayMissingError / OverlayNotValidatedError); 16-bit caches take overlay=None.
    The scales are copied: the overlay may be closed afterwards. num_blocks=0 sizes the
    cache from memory_budget_bytes. external_topk: a device int32 [rows, topk_width]
    array to use as the top-k workspace (kept alive by the cache).

    The Cache keeps its Context alive; closing the Context closes the Cache first.
    """

    _kind = "cache"

    def __init__(self, context: Context, config: ModelConfig, overlay: Overlay | None = None,
                 *, num_blocks: int = 0, memory_budget_bytes: int = 0,
                 share_topk: bool = True, external_topk=None):
        opts = _structs.new(_cdefs.qsakv_cache_options)
        lib.qsakv_cache_options_init(ctypes.byref(opts))
        opts.num_blocks = num_blocks
        opts.memory_budget_bytes = memory_budget_bytes
        opts.share_topk = int(bool(share_topk))
        geometry = config.rank_geometry()
        if external_topk is not None:
            b = check(external_topk, "external_topk", "int32", (ANY, geometry.topk_width),
                      backend_cuda=context.is_cuda, device_id=context.info.device)
            opts.external_topk = b.ptr
            opts.external_topk_dtype = DType.INT32
            opts.external_topk_rows, opts.external_topk_cols = b.shape
        out = ctypes.POINTER(_cdefs.qsakv_cache)()
        lib.qsakv_cache_create(ctypes.byref(out), context._p, config._ref,
                               overlay._p if overlay is not None else None,
                               ctypes.byref(opts))
        super().__init__(out, lib.qsakv_cache_destroy, parent=context)
        self.context = context
        self.config = config.copy()
        self.geometry = geometry
        self._external_topk = external_topk
        self.layout = self._get_layout()
        """CacheLayout: kv_dtype, num_blocks, block_size, kv_heads, head_dim, strides of
        the main cache [num_blocks, 2, block_size, kv_heads, head_dim] in elements,
        bytes per layer of each cache, ring_length, topk_rows/cols, total_bytes."""

    def _get_layout(self):
        out = _structs.new(_cdefs.qsakv_cache_layout)
        lib.qsakv_cache_get_layout(self._p, ctypes.byref(out))
        return _structs.record(out, "CacheLayout")

    def layer_buffers(self, layer: int) -> LayerBuffers:
        """Device addresses of a QSA layer's buffers (model-layer id), for interop."""
        out = _cdefs.qsakv_layer_buffers()
        lib.qsakv_cache_get_layer_buffers(self._p, layer, ctypes.byref(out))
        return LayerBuffers(*(_structs.value(out, f) for f in LayerBuffers._fields))

    # -- checks ------------------------------------------------------------------------
    def _arg(self, obj, name, dtype, shape, min_rows=None):
        return check(obj, name, dtype, shape, backend_cuda=self.context.is_cuda,
                     device_id=self.context.info.device, min_rows=min_rows)

    # -- store -------------------------------------------------------------------------
    def store_kv(self, layer: int, k, v, slot_mapping, *, stream=None) -> None:
        """Quantises (E4M3: e4m3(fp32(x) / scale), RNE, saturating) or copies (16-bit)
        K and V into the main cache of `layer`.

        k, v: DEVICE arrays, activation dtype, [n, kv_heads, head_dim] contiguous;
        slot_mapping: DEVICE int64 [n] (block * block_size + offset; -1 skips).
        Asynchronous on `stream` (CUDA): keep the inputs alive until it ran; no
        allocation, capturable in a CUDA graph. CPU backend: synchronous.
        """
        g, dt = self.geometry, act_dtype(self.config)
        shape = (ANY, g.kv_heads, self.config.head_dim)
        pk = self._arg(k, "k", dt, shape)
        n = pk.shape[0]
        pv = self._arg(v, "v", dt, (n,) + shape[1:])
        ps = self._arg(slot_mapping, "slot_mapping", "int64", (n,))
        lib.qsakv_store_kv(self._p, layer, pk.ptr, pv.ptr, typed(ps.ptr, ctypes.c_int64), n,
                           as_stream(stream))

    def store_index_keys(self, layer: int, keys, request_slots, positions, *,
                         stream=None) -> None:
        """Raw index keys into the per-request ring, entry (request_slots[i],
        positions[i] % ring_length). keys: DEVICE float16 [n, index_head_dim];
        request_slots: DEVICE int32 [n]; positions: DEVICE int64 [n] (negative skips).
        Asynchronous on `stream`; capturable."""
        pk = self._arg(keys, "keys", "float16", (ANY, self.config.index_head_dim))
        n = pk.shape[0]
        pr = self._arg(request_slots, "request_slots", "int32", (n,))
        pp = self._arg(positions, "positions", "int64", (n,))
        lib.qsakv_store_index_keys(self._p, layer, pk.ptr, typed(pr.ptr, ctypes.c_int32),
                                   typed(pp.ptr, ctypes.c_int64), n, as_stream(stream))

    def store_compressed_keys(self, layer: int, keys, slot_mapping, *, stream=None) -> None:
        """Finished compressed index keys into the compressed cache, entry
        slot_mapping[i] // compress_ratio. keys: DEVICE float16 [n, index_head_dim];
        slot_mapping: DEVICE int64 [n], the slot of any token of the group (-1 skips).
        Asynchronous on `stream`; capturable."""
        pk = self._arg(keys, "keys", "float16", (ANY, self.config.index_head_dim))
        n = pk.shape[0]
        ps = self._arg(slot_mapping, "slot_mapping", "int64", (n,))
        lib.qsakv_store_compressed_keys(self._p, layer, pk.ptr, typed(ps.ptr, ctypes.c_int64),
                                        n, as_stream(stream))

    # -- reading back ------------------------------------------------------------------
    def read_kv(self, layer: int, *, stream=None):
        """A host (NumPy) copy of a layer's main cache, shaped [num_blocks, 2,
        block_size, kv_heads, head_dim]: uint8 E4M3 bytes, or float16 / bfloat16 (as
        uint16 for bfloat16 unless ml_dtypes is installed). Waits for `stream` first:
        blocking."""
        import numpy as np

        L = self.layout
        kind = {DType.E4M3: np.uint8, DType.FP16: np.float16}.get(L.kv_dtype)
        if kind is None:
            try:
                import ml_dtypes

                kind = ml_dtypes.bfloat16
            except ImportError:
                kind = np.uint16
        shape = (L.num_blocks, 2, L.block_size, L.kv_heads, L.head_dim)
        host = np.empty(shape, dtype=kind)
        assert host.nbytes == L.kv_bytes_per_layer
        self.context.synchronize(stream)
        lib.qsakv_memcpy(self.context._p, host.ctypes.data, self.layer_buffers(layer).kv,
                         host.nbytes, CopyKind.DEVICE_TO_HOST, as_stream(stream))
        self.context.synchronize(stream)
        return host
