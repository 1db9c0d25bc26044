"""Cache: every KV cache of one rank (main K/V per QSA layer, index-key rings,
compressed index keys, the top-k workspace) and the store calls that fill it."""
from __future__ import annotations

import ctypes
from collections import namedtuple

from . import _cdefs, _structs
from . import _views
from ._buffers import ANY, ArgSpec, check, resolve_stream, stream_arg
from ._handle import Handle
from ._ints import INT32_MAX, INT32_MIN, c_int, set_field
from ._lib import argument_type_error, lib, raise_status, raw_function
from .config import ModelConfig
from .context import Context
from .enums import ARRAY_DTYPE_NAMES, by_c_name
from .errors import InternalError, InvalidArgumentError, argument_error  # noqa: F401
from .overlay import Overlay

DType = by_c_name["qsakv_dtype"]
CopyKind = by_c_name["qsakv_copy_kind"]

LayerBuffers = namedtuple("LayerBuffers", "kv compressed_keys ring_keys topk scales")
LayerBuffers.__doc__ = """Views of one QSA layer's buffers: NumPy arrays (CPU backend,
host memory) or DeviceArray objects with __cuda_array_interface__ (CUDA backend; e.g.
torch.as_tensor(view, device="cuda")). No copy: they are the cache's memory, which each
view keeps allocated (caller-owned memory included), even after the Cache is closed.

kv: the main cache [num_blocks, 2 (K, V), block_size, kv_heads, head_dim]: uint8 E4M3
    codes (torch: .view(torch.float8_e4m3fn)), float16, or bfloat16 (uint16 on the
    device: .view(torch.bfloat16)). Writing E4M3 codes yourself: call
    Cache.note_external_codes(layer) afterwards.
compressed_keys: the compressed index keys, num_blocks pages of the layout's
    compressed_stride_block bytes (CacheLayout.index_key_dtype): FP16 keys: float16
    [num_blocks, compressed_keys_per_block, index_head_dim]; E4M3 keys: the raw pages,
    uint8 [num_blocks, compressed_stride_block] (Cache.compressed_key_views(layer) gives
    the codes and the scales in them).
ring_keys: float16 [max_requests, ring_length, index_head_dim].
topk: int32 [topk_rows, topk_cols] (the shared buffer when shared).
scales: float32 [2]: k_scale, v_scale (1, 1 for 16-bit caches). Read-only (the C API's
    const float*: the cache's validated scales): a NumPy array with writeable False, a
    DeviceArray with readonly True (torch.as_tensor refuses it; qsakv.torch_ops.as_tensor
    gives a copy)."""

_KV_DTYPE_NAMES = {"E4M3": "uint8", "FP16": "float16", "BF16": "bfloat16"}

CompressedKeyViews = namedtuple("CompressedKeyViews", "dtype pages keys scales")
CompressedKeyViews.__doc__ = """Views of one QSA layer's compressed index keys, made from the
layout (CacheLayout: index_key_dtype, compressed_keys_per_block, index_head_dim,
compressed_stride_block, compressed_scales_offset); NumPy arrays (CPU backend) or
DeviceArray objects (CUDA backend) over the cache's memory, no copy.

dtype: the index-key dtype (DType.FP16 or DType.E4M3).
pages: uint8 [num_blocks, compressed_stride_block]: page b (cache block b) whole.
keys: FP16: float16 [num_blocks, compressed_keys_per_block, index_head_dim];
    E4M3: the uint8 codes [num_blocks, compressed_keys_per_block, index_head_dim] at the
    start of each page (torch: .view(torch.float8_e4m3fn); strided by the page).
scales: E4M3: float32 [num_blocks, compressed_keys_per_block], one per key, at
    compressed_scales_offset of each page (strided by the page); FP16: None.
Key j of block b is scales[b, j] * e4m3(keys[b, j]) (E4M3) or keys[b, j] (FP16)."""
_u = ctypes.c_void_p
_store_kv = raw_function("qsakv_store_kv", _u, ctypes.c_int32, _u, _u, _u, ctypes.c_int64, _u)
_store_index_keys = raw_function("qsakv_store_index_keys", _u, ctypes.c_int32, _u, _u, _u,
                                 ctypes.c_int64, _u)
_store_compressed_keys = raw_function("qsakv_store_compressed_keys", _u, ctypes.c_int32,
                                      _u, _u, ctypes.c_int64, _u)


def act_dtype(config: ModelConfig) -> str:
    """The array dtype name of the config's activations ("float16" or "bfloat16")."""
    return ARRAY_DTYPE_NAMES[DType(config.activation_dtype).name]


def _cache_options(num_blocks, *, memory_budget_bytes=0, share_topk=True, external_topk=None,
                   allow_unit_scales=False):
    """The qsakv_cache_options of a cache, filled in one place for layout_for and Cache.
    external_topk: (address, rows, cols) of an external top-k buffer, or None."""
    opts = _structs.filled(_cdefs.qsakv_cache_options, lib.qsakv_cache_options_init)
    set_field(opts, "num_blocks", num_blocks)
    set_field(opts, "memory_budget_bytes", memory_budget_bytes)
    opts.share_topk = int(bool(share_topk))
    opts.allow_unit_scales = int(bool(allow_unit_scales))
    if external_topk is not None:
        opts.external_topk, opts.external_topk_rows, opts.external_topk_cols = external_topk
        opts.external_topk_dtype = DType.INT32
    return opts


def _layout_of(config: ModelConfig, opts):
    out = _structs.new(_cdefs.qsakv_cache_layout)
    lib.qsakv_cache_layout_for(config._ref, ctypes.byref(opts), ctypes.byref(out))
    return _structs.record(out, "CacheLayout")


def layout_for(config: ModelConfig, *, num_blocks: int, share_topk: bool = True,
               external_topk=None):
    """The CacheLayout (shapes, strides, bytes per layer) of a cache of `num_blocks` blocks
    per layer, without creating one: what to allocate for Cache(..., memory=...). Host
    only. external_topk is only read for its shape."""
    topk = None
    if external_topk is not None:
        rows, cols = tuple(getattr(external_topk, "shape", (0, 0)))[:2]
        topk = (16, rows, cols)  # any non-NULL address: only the shape is read here
    return _layout_of(config, _cache_options(num_blocks, share_topk=share_topk,
                                             external_topk=topk))


def _compressed_shape(layout):
    """(shape, dtype) of a layer's compressed index keys, from the layout's page fields:
    FP16 keys [num_blocks, compressed_keys_per_block, index_head_dim] float16, E4M3 the
    raw pages [num_blocks, compressed_stride_block] uint8."""
    if DType(layout.index_key_dtype) == DType.FP16:
        return ((layout.num_blocks, layout.compressed_keys_per_block, layout.index_head_dim),
                "float16")
    return (layout.num_blocks, layout.compressed_stride_block), "uint8"


def memory_shapes(config: ModelConfig, layout) -> dict:
    """Shape and dtype of each per-layer buffer of a caller-owned cache of this layout
    (the same views Cache.layer_buffers returns): {"kv": (shape, dtypes), ...}; the
    first dtype is the canonical one (E4M3 codes also as torch float8_e4m3fn, BF16 also
    as uint16). compressed_keys: float16 [num_blocks, compressed_keys_per_block,
    index_head_dim] for FP16 index keys, the uint8 pages [num_blocks,
    compressed_stride_block] for E4M3 ones."""
    kv_dtypes = {"E4M3": ("uint8", "float8_e4m3fn"), "FP16": ("float16",),
                 "BF16": ("bfloat16", "uint16")}[DType(layout.kv_dtype).name]
    ck_shape, ck_dtype = _compressed_shape(layout)
    return {
        "kv": ((layout.num_blocks, 2, layout.block_size, layout.kv_heads, layout.head_dim),
               kv_dtypes),
        "compressed_keys": (ck_shape, (ck_dtype,)),
        "ring_keys": ((config.max_requests, layout.ring_length, config.index_head_dim),
                      ("float16",)),
    }


def _layer_memory(memory, config, layout, cuda, device):
    """ctypes qsakv_layer_memory[num_qsa_layers] from the caller's arrays, each checked for
    dtype, shape, contiguity and device (messages name memory[i].field), and the tuple of
    what must stay alive for the addresses to stay valid: each array object checked
    (taken from the caller's container once) with its checked address."""
    shapes = memory_shapes(config, layout)
    n = config.num_qsa_layers
    if len(memory) != n:
        raise argument_error(f"memory: expected one entry per QSA layer ({n}), got "
                             f"{len(memory)}")
    arr = (_cdefs.qsakv_layer_memory * n)()
    held = []
    for i, entry in enumerate(memory):
        get = entry.get if isinstance(entry, dict) else \
            (lambda f, e=entry: e[("kv", "compressed_keys", "ring_keys").index(f)])
        for field, size_field in (("kv", "kv_bytes"), ("compressed_keys", "compressed_bytes"),
                                  ("ring_keys", "ring_bytes")):
            shape, dtypes = shapes[field]
            name = f"memory[{i}].{field} (layer {config.qsa_layers[i]})"
            obj = get(field)  # once: the object checked is the object held
            b, error, matched = None, None, None
            for dt in dtypes:
                try:
                    b = check(obj, name, dt, shape, backend_cuda=cuda, device_id=device,
                              writable=True)
                    matched = dt
                    break
                except InvalidArgumentError as e:
                    error = error or e
            if b is None:
                raise error
            setattr(arr[i], field, b.ptr)
            setattr(arr[i], size_field, _nbytes(shape, matched))
            held.append((obj, b.ptr))
    return arr, tuple(held)


def _page_strides(layout, dtype, ndim):
    """Element strides of a view over the compressed pages: one page per block, keys of
    index_head_dim elements (ndim 3) or one element per key (ndim 2, the scales)."""
    size = {"uint8": 1, "float16": 2, "float32": 4}[dtype]
    block = layout.compressed_stride_block // size
    return (block, layout.index_head_dim, 1) if ndim == 3 else (block, 1)


def _nbytes(shape, dtype):
    size = {"uint8": 1, "float8_e4m3fn": 1, "float16": 2, "bfloat16": 2, "uint16": 2}[dtype]
    n = 1
    for d in shape:
        n *= d
    return n * size


class Cache(Handle):
    """All caches of this rank, allocated once (blocking; contents start zeroed).

    Cache(context, config, overlay=None, *, num_blocks=0, memory_budget_bytes=0,
          share_topk=True, external_topk=None, memory=None, allow_unit_scales=False)

    An E4M3 cache needs an Overlay that validate() accepted for an equal config (else
    OverlayMissingError / OverlayNotValidatedError) holding calibrated scales: a
    unit-scale overlay (a negative control: marked unit_scale_control, or every scale
    1.0) raises OverlayUnitScalesError unless allow_unit_scales=True.
    16-bit caches take overlay=None.
    The scales are copied: the overlay may be closed afterwards. num_blocks=0 sizes the
    cache from memory_budget_bytes. external_topk: a device int32 [rows, topk_width]
    array to use as the top-k workspace (kept alive by the cache and its views).

    memory: caller-owned cache memory (engines that allocate and profile their own KV
    pool): one entry per QSA layer (config.qsa_layers order), each a dict or tuple of
    arrays (kv, compressed_keys, ring_keys) with the shapes and dtypes that
    memory_shapes(config, layout_for(config, num_blocks=...)) gives (torch/CuPy device
    arrays on the CUDA backend, NumPy arrays on the CPU backend); needs num_blocks > 0.
    The library checks each (messages name memory[i].field), never frees them and uses
    their contents as they are. The Cache holds the arrays themselves (not the
    container: emptying or refilling it changes nothing), as long as it is open and as
    long as any view of its memory is alive.

    The Cache keeps its Context alive; closing the Context closes the Cache first.
    """

    _kind = "cache"

    def __init__(self, context: Context, config: ModelConfig, overlay: Overlay | None = None,
                 *, num_blocks: int = 0, memory_budget_bytes: int = 0,
                 share_topk: bool = True, external_topk=None, memory=None,
                 allow_unit_scales: bool = False):
        geometry = config.rank_geometry()
        cuda, device = context.is_cuda, context.info.device
        topk, held = None, ()
        if external_topk is not None:
            b = check(external_topk, "external_topk", "int32", (ANY, geometry.topk_width),
                      backend_cuda=cuda, device_id=device, writable=True)
            topk = (b.ptr,) + tuple(b.shape)
            held = ((external_topk, b.ptr),)
        opts = _cache_options(num_blocks, memory_budget_bytes=memory_budget_bytes,
                              share_topk=share_topk, external_topk=topk,
                              allow_unit_scales=allow_unit_scales)
        out = ctypes.POINTER(_cdefs.qsakv_cache)()
        if memory is None:
            lib.qsakv_cache_create(ctypes.byref(out), context._p, config._ref,
                                   overlay._p if overlay is not None else None,
                                   ctypes.byref(opts))
        else:
            layers, arrays = _layer_memory(memory, config, _layout_of(config, opts), cuda,
                                           device)
            held += arrays
            m = _structs.new(_cdefs.qsakv_cache_memory)
            m.version = _cdefs.QSAKV_CACHE_MEMORY_VERSION
            m.num_layers = len(layers)
            m.layers = layers
            lib.qsakv_cache_create_with_memory(
                ctypes.byref(out), context._p, config._ref,
                overlay._p if overlay is not None else None, ctypes.byref(opts),
                ctypes.byref(m))
        super().__init__(out, lib.qsakv_cache_destroy, parent=context)
        # The caller's arrays (external top-k, memory) on the keeper that the C object's
        # destroy and every view of its memory share: they outlive both.
        self._keeper.held = held
        self.context = context
        self._config = config.copy()
        self._geometry = geometry
        self._cuda, self._device = cuda, device
        self._layout = self._get_layout()
        # Argument checks of the hot calls, made once (see _buffers.ArgSpec).
        act, ihd = act_dtype(config), config.index_head_dim
        kv = (geometry.kv_heads, config.head_dim)
        spec = lambda name, dtype, tail: ArgSpec(name, dtype, tail, cuda=cuda,  # noqa: E731
                                                 device_id=device)
        self._k, self._v = spec("k", act, kv), spec("v", act, kv)
        self._slots = spec("slot_mapping", "int64", ())
        self._keys = spec("keys", "float16", (ihd,))
        self._request_slots = spec("request_slots", "int32", ())
        self._positions = spec("positions", "int64", ())

    @property
    def config(self) -> ModelConfig:
        """A copy of the ModelConfig the cache was made for."""
        self._p  # noqa: B018 (ClosedError once closed)
        return self._config

    @property
    def geometry(self):
        """This rank's RankGeometry (q_heads, kv_heads, topk_width, ...)."""
        self._p  # noqa: B018
        return self._geometry

    @property
    def layout(self):
        """CacheLayout: kv_dtype, num_blocks, block_size, kv_heads, head_dim, strides of
        the main cache [num_blocks, 2, block_size, kv_heads, head_dim] in elements,
        bytes per layer of each cache, ring_length, topk_rows/cols, total_bytes, and the
        compressed index-key pages: index_key_dtype, index_head_dim,
        compressed_keys_per_block, compressed_stride_block (bytes per page, one page per
        block) and compressed_scales_offset (bytes from the page's start to the FP32
        scales of E4M3 keys; -1 for FP16 keys)."""
        self._p  # noqa: B018
        return self._layout

    def _get_layout(self):
        out = _structs.new(_cdefs.qsakv_cache_layout)
        lib.qsakv_cache_get_layout(self._p, ctypes.byref(out))
        return _structs.record(out, "CacheLayout")

    def _addresses(self, layer: int):
        out = _structs.new(_cdefs.qsakv_layer_buffers)
        lib.qsakv_cache_get_layer_buffers(self._p, c_int(layer, "layer"), ctypes.byref(out))
        return {f: _structs.value(out, f) for f in LayerBuffers._fields}

    def close(self) -> None:
        """Closes the cache (its plans first). Its memory is freed at once, unless a view
        of it is still alive (layer_buffers, compressed_key_views, a tensor made from
        one): then when the last such view is gone. Nothing is synchronised: finish the
        queued work that uses the cache first (ctx.synchronize(stream))."""
        self.__dict__.pop("_torch_views", None)  # torch_ops' cached tensors: views too
        super().close()

    def layer_buffers(self, layer: int) -> LayerBuffers:
        """Views (no copy) of a QSA layer's buffers (model-layer id): NumPy arrays on the
        CPU backend, DeviceArray objects (__cuda_array_interface__) on CUDA; see
        LayerBuffers for shapes and dtypes. A view keeps the memory it shows allocated,
        even after the Cache is closed."""
        a = self._addresses(layer)
        L, c = self._layout, self._config
        kw = dict(cuda=self._cuda, device=self._device, owner=self._pin())
        kv_dtype = _KV_DTYPE_NAMES[DType(L.kv_dtype).name]
        kv = _views.view(a["kv"], (L.num_blocks, 2, L.block_size, L.kv_heads, L.head_dim),
                         kv_dtype, strides=(L.kv_stride_block, L.kv_stride_kv,
                                            L.kv_stride_token, L.kv_stride_head, 1), **kw)
        ck_shape, ck_dtype = _compressed_shape(L)
        ck = _views.view(a["compressed_keys"], ck_shape, ck_dtype,
                         strides=_page_strides(L, ck_dtype, len(ck_shape)), **kw)
        ring = _views.view(a["ring_keys"], (c.max_requests, L.ring_length, c.index_head_dim),
                           "float16", **kw)
        topk = _views.view(a["topk"], (L.topk_rows, L.topk_cols), "int32", **kw)
        # const float* in qsakv_layer_buffers: the validated scales, read-only here too.
        scales = _views.view(a["scales"], (2,), "float32", readonly=True, **kw)
        for name, v, want in (("kv", kv, L.kv_bytes_per_layer),
                              ("compressed_keys", ck, L.compressed_bytes_per_layer),
                              ("ring_keys", ring, L.ring_bytes_per_layer)):
            if v.nbytes != want:  # the layout and these shapes disagree: a binding bug
                raise InternalError(f"layer_buffers: {name} view of {v.nbytes} bytes, "
                                    f"layout says {want}")
        return LayerBuffers(kv, ck, ring, topk, scales)

    def compressed_key_views(self, layer: int) -> CompressedKeyViews:
        """Views (no copy) of a QSA layer's compressed index keys, made from the layout's
        page fields: the raw pages, the keys (FP16) or codes (E4M3), and the E4M3
        scales; see CompressedKeyViews. Views keep the memory allocated (see layer_buffers)."""
        L = self._layout
        ptr = self._addresses(layer)["compressed_keys"]
        kw = dict(cuda=self._cuda, device=self._device, owner=self._pin())
        dims = (L.num_blocks, L.compressed_keys_per_block, L.index_head_dim)
        pages = _views.view(ptr, (L.num_blocks, L.compressed_stride_block), "uint8", **kw)
        if pages.nbytes != L.compressed_bytes_per_layer:  # a binding bug
            raise InternalError(f"compressed_key_views: pages of {pages.nbytes} bytes, "
                                f"layout says {L.compressed_bytes_per_layer}")
        dtype = DType(L.index_key_dtype)
        if dtype == DType.FP16:
            keys = _views.view(ptr, dims, "float16", strides=_page_strides(L, "float16", 3),
                               **kw)
            return CompressedKeyViews(dtype, pages, keys, None)
        codes = _views.view(ptr, dims, "uint8", strides=_page_strides(L, "uint8", 3), **kw)
        scales = _views.view(ptr + L.compressed_scales_offset,
                             (L.num_blocks, L.compressed_keys_per_block), "float32",
                             strides=_page_strides(L, "float32", 2), **kw)
        return CompressedKeyViews(dtype, pages, codes, scales)

    def note_external_codes(self, layer: int, *, stream=None) -> None:
        """Tells the library that `layer`'s E4M3 codes were written outside store_kv
        (a swap-in, a prefix-cache copy through layer_buffers(layer).kv), so the software
        decoder checks them for NaN codes from now on. Async on `stream`."""
        lib.qsakv_cache_note_external_codes(
            self._p, c_int(layer, "layer"),
            stream_arg(resolve_stream(stream, self._cuda, self._device)))

    # -- store -------------------------------------------------------------------------
    def store_kv(self, layer: int, k, v, slot_mapping, *, stream=None) -> None:
        """Quantises (E4M3: e4m3(fp32(x) / scale), RNE, saturating) or copies (16-bit)
        K and V into the main cache of `layer`.

        k, v: DEVICE arrays, activation dtype, [n, kv_heads, head_dim] contiguous;
        slot_mapping: DEVICE int64 [n] (block * block_size + offset; -1 skips).
        Asynchronous on `stream` (default: torch's current stream, see Buffers, streams
        in the README); keep the inputs alive until it ran; no allocation, capturable in
        a CUDA graph. CPU backend: synchronous.
        """
        if self._keeper is None:
            self._closed_error()
        if type(layer) is not int or not INT32_MIN <= layer <= INT32_MAX:
            layer = c_int(layer, "layer")  # the exact int32, or InvalidArgumentError
        pk, n = self._k.ptr(k)
        pv = self._v.ptr(v, n)[0]
        ps = self._slots.ptr(slot_mapping, n)[0]
        s = resolve_stream(stream, self._cuda, self._device)
        keeper = self._keeper  # held for the call: a close() meanwhile destroys after it
        if keeper is None:
            self._closed_error()
        try:
            status = _store_kv(keeper.addr, layer, pk, pv, ps, n, s)
        except ctypes.ArgumentError as e:
            keeper = None
            raise argument_type_error("qsakv_store_kv", e) from None
        if status:
            keeper = None  # not kept alive by the exception's traceback
            raise_status(status, "qsakv_store_kv")

    def store_index_keys(self, layer: int, keys, request_slots, positions, *,
                         stream=None) -> None:
        """Raw index keys into the per-request ring, entry (request_slots[i],
        positions[i] % ring_length). keys: DEVICE float16 [n, index_head_dim];
        request_slots: DEVICE int32 [n]; positions: DEVICE int64 [n] (negative skips).
        Asynchronous on `stream`; capturable."""
        if self._keeper is None:
            self._closed_error()
        if type(layer) is not int or not INT32_MIN <= layer <= INT32_MAX:
            layer = c_int(layer, "layer")  # the exact int32, or InvalidArgumentError
        pk, n = self._keys.ptr(keys)
        pr = self._request_slots.ptr(request_slots, n)[0]
        pp = self._positions.ptr(positions, n)[0]
        s = resolve_stream(stream, self._cuda, self._device)
        keeper = self._keeper  # held for the call: a close() meanwhile destroys after it
        if keeper is None:
            self._closed_error()
        try:
            status = _store_index_keys(keeper.addr, layer, pk, pr, pp, n, s)
        except ctypes.ArgumentError as e:
            keeper = None
            raise argument_type_error("qsakv_store_index_keys", e) from None
        if status:
            keeper = None  # not kept alive by the exception's traceback
            raise_status(status, "qsakv_store_index_keys")

    def store_compressed_keys(self, layer: int, keys, slot_mapping, *, stream=None) -> None:
        """Finished compressed index keys into the compressed cache, entry
        slot_mapping[i] // compress_ratio. keys: DEVICE float16 [n, index_head_dim]
        (also for E4M3 index keys: each key is quantised on its own, scale = max |x| /
        448 in FP32 and codes e4m3(fp32(x) / scale), RNE, saturating; a key that is all
        zero or has a NaN / infinite element is stored as scale 0 and codes 0);
        slot_mapping: DEVICE int64 [n], the slot of any token of the group (-1 skips).
        Asynchronous on `stream`; capturable."""
        if self._keeper is None:
            self._closed_error()
        if type(layer) is not int or not INT32_MIN <= layer <= INT32_MAX:
            layer = c_int(layer, "layer")  # the exact int32, or InvalidArgumentError
        pk, n = self._keys.ptr(keys)
        ps = self._slots.ptr(slot_mapping, n)[0]
        s = resolve_stream(stream, self._cuda, self._device)
        keeper = self._keeper  # held for the call: a close() meanwhile destroys after it
        if keeper is None:
            self._closed_error()
        try:
            status = _store_compressed_keys(keeper.addr, layer, pk, ps, n, s)
        except ctypes.ArgumentError as e:
            keeper = None
            raise argument_type_error("qsakv_store_compressed_keys", e) from None
        if status:
            keeper = None  # not kept alive by the exception's traceback
            raise_status(status, "qsakv_store_compressed_keys")

    def store_step(self, layer: int, *, k=None, v=None, slot_mapping=None, index_keys=None,
                   request_slots=None, positions=None, compressed_keys=None,
                   compressed_slot_mapping=None, stream=None) -> None:
        """A step's stores together (qsakv_store_step): store_kv's k, v and slot_mapping,
        store_index_keys' index_keys, request_slots and positions, and
        store_compressed_keys' compressed_keys and compressed_slot_mapping, each part
        with that method's arrays and meaning, any part left out (None). Every part is
        checked before anything is stored; on a GPU the parts take one kernel launch
        instead of three. Asynchronous on `stream`; capturable."""
        if self._keeper is None:
            self._closed_error()
        if type(layer) is not int or not INT32_MIN <= layer <= INT32_MAX:
            layer = c_int(layer, "layer")  # the exact int32, or InvalidArgumentError
        st = _structs.new(_cdefs.qsakv_step_stores)
        types = dict(st._fields_)

        exports = []  # the addresses, which hold DLPack exports, until the call returns

        def part(count, *fields):  # (name, spec, array) in order; the first sets the count
            n = None
            for name, spec, array in fields:
                address, rows = spec.ptr(array) if n is None else spec.ptr(array, n)
                n = rows if n is None else n
                setattr(st, name, ctypes.cast(address, types[name]))
                exports.append(address)
            setattr(st, count, n)

        if k is not None or v is not None or slot_mapping is not None:
            part("num_tokens", ("k", self._k, k), ("v", self._v, v),
                 ("kv_slot_mapping", self._slots, slot_mapping))
        if index_keys is not None or request_slots is not None or positions is not None:
            part("num_index_keys", ("index_keys", self._keys, index_keys),
                 ("index_request_slots", self._request_slots, request_slots),
                 ("index_positions", self._positions, positions))
        if compressed_keys is not None or compressed_slot_mapping is not None:
            part("num_compressed_keys", ("compressed_keys", self._keys, compressed_keys),
                 ("compressed_slot_mapping", self._slots, compressed_slot_mapping))
        lib.qsakv_store_step(self._p, layer, ctypes.byref(st),
                             stream_arg(resolve_stream(stream, self._cuda, self._device)))

    # -- reading back ------------------------------------------------------------------
    def read_kv(self, layer: int, *, stream=None):
        """A host (NumPy) copy of a layer's main cache, shaped [num_blocks, 2,
        block_size, kv_heads, head_dim]: uint8 E4M3 bytes, or float16 / bfloat16 (as
        uint16 for bfloat16 unless ml_dtypes is installed). Waits for `stream` first:
        blocking."""
        import numpy as np

        keeper = self._pin()  # the memory copied from stays allocated until the copy ran
        try:
            return self._read_kv(layer, stream)
        finally:
            keeper = None  # noqa: F841 (not kept alive by an exception's traceback)

    def _read_kv(self, layer, stream):
        import numpy as np

        L = self._layout
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
        lib.qsakv_memcpy(self.context._p, host.ctypes.data, self._addresses(layer)["kv"],
                         host.nbytes, CopyKind.DEVICE_TO_HOST,
                         stream_arg(resolve_stream(stream, self._cuda, self._device)))
        self.context.synchronize(stream)
        return host
