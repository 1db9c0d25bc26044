"""The hot calls as PyTorch operators: torch.ops.qsakv.store_kv, store_index_keys,
store_compressed_keys, store_step, select_topk and attention, so that a whole decode step
can sit inside torch.compile'd and CUDA-graphed model code, as vLLM's attention backends
do.

`import qsakv.torch_ops` imports torch and registers the operators (the rest of the
package never imports torch):

  store_kv(Tensor(a!) token, Tensor k, Tensor v, Tensor slot_mapping, int cache,
           int layer) -> ()
  store_index_keys(Tensor(a!) token, Tensor keys, Tensor request_slots,
                   Tensor positions, int cache, int layer) -> ()
  store_compressed_keys(Tensor(a!) token, Tensor keys, Tensor slot_mapping, int cache,
                        int layer) -> ()
  store_step(Tensor(a!) token, Tensor? k, Tensor? v, Tensor? slot_mapping,
             Tensor? index_keys, Tensor? request_slots, Tensor? positions,
             Tensor? compressed_keys, Tensor? compressed_slot_mapping, int cache,
             int layer) -> ()             (Cache.store_step: a part left out is None)
  select_topk(Tensor(a!) topk, Tensor index_q, Tensor token, int plan, int layer) -> ()
  attention(Tensor(a!) out, Tensor q, Tensor? topk, Tensor token, int plan, int layer,
            int attn_mode) -> ()                (attn_mode: 0 sparse, 1 dense; the
                                                 eager attention() below takes names)

`cache` / `plan` are ids from handle_id(obj) (plain ints, so graphs can hold them).
`token` is the cache's ordering token (token(cache), a 1-element tensor the kernels
never touch): the stores declare that they write it and select / attention read it, so
torch.compile keeps a layer's store before the select and attention that read the
cache, and never drops a store as dead code. The library's cache memory itself is not
an operator argument: a compiler that clones mutated arguments (functionalization)
would otherwise copy a stale clone back over what the store wrote. What the kernels
write through a tensor argument (topk, out) is written at that tensor's address, so a
clone is filled and copied back correctly.

The kernels run on torch's current stream (the package's default), so a
torch.cuda.graph capture records them; Plan.update stays outside the graph (host work),
as the C API says. Each call costs the torch dispatcher's overhead on top of the
package's: eager code that wants the lowest overhead calls the methods.

    import qsakv.torch_ops as qops
    qops.store_kv(cache, layer, k, v, slots)       # = torch.ops.qsakv.store_kv(
                                                   #   qops.token(cache), k, v, slots,
                                                   #   qops.handle_id(cache), layer)
    kv = qops.kv_cache(cache, layer)               # torch view of the main cache
"""
from __future__ import annotations

import itertools
import weakref

import torch

from ._views import DeviceArray
from .cache import Cache
from .enums import choice
from .errors import ClosedError
from .plan import AttentionMode, Plan

__all__ = ["handle_id", "token", "kv_cache", "compressed_keys", "index_key_ring",
           "topk_buffer", "as_tensor", "store_kv", "store_index_keys",
           "store_compressed_keys", "store_step", "select_topk", "attention", "SCHEMAS"]

SCHEMAS = {
    "store_kv": "store_kv(Tensor(a!) token, Tensor k, Tensor v, Tensor slot_mapping, "
                "int cache, int layer) -> ()",
    "store_index_keys": "store_index_keys(Tensor(a!) token, Tensor keys, "
                        "Tensor request_slots, Tensor positions, int cache, int layer) -> ()",
    "store_compressed_keys": "store_compressed_keys(Tensor(a!) token, Tensor keys, "
                             "Tensor slot_mapping, int cache, int layer) -> ()",
    "store_step": "store_step(Tensor(a!) token, Tensor? k, Tensor? v, Tensor? slot_mapping, "
                  "Tensor? index_keys, Tensor? request_slots, Tensor? positions, "
                  "Tensor? compressed_keys, Tensor? compressed_slot_mapping, int cache, "
                  "int layer) -> ()",
    "select_topk": "select_topk(Tensor(a!) topk, Tensor index_q, Tensor token, int plan, "
                   "int layer) -> ()",
    # `attn_mode`, not `mode`: torch.compile's functionalization (auto_functionalized_v2)
    # passes a `mode` keyword of its own and fails with "multiple values for argument".
    "attention": "attention(Tensor(a!) out, Tensor q, Tensor? topk, Tensor token, int plan, "
                 "int layer, int attn_mode) -> ()",
}

_objects: dict[int, weakref.ref] = {}
_ids = itertools.count(1)


def handle_id(obj) -> int:
    """A process-wide int naming a Cache or Plan for the operators (stable for the
    object's life; the operators do not keep the object alive)."""
    hid = obj.__dict__.get("_torch_op_id")
    if hid is None:
        hid = next(_ids)
        obj._torch_op_id = hid
        _objects[hid] = weakref.ref(obj)
    return hid


def _get(hid: int, cls):
    ref = _objects.get(hid)
    obj = ref() if ref is not None else None
    if not isinstance(obj, cls):
        raise ClosedError(f"qsakv operator: no {cls.__name__.lower()} with id {hid} (made "
                          f"by qsakv.torch_ops.handle_id, and still referenced?)")
    return obj


def as_tensor(view) -> torch.Tensor:
    """A torch tensor sharing the memory of a layer_buffers view (no copy). E4M3 codes
    stay uint8 (.view(torch.float8_e4m3fn)); a bfloat16 cache is uint16 on the device
    (.view(torch.bfloat16)), bfloat16 on the host. A read-only view (layer_buffers(l).scales,
    const in the C API) comes as a copy: torch has no read-only tensors (torch.as_tensor
    refuses a read-only __cuda_array_interface__), and a shared one would let a write reach
    the cache's validated scales."""
    if isinstance(view, DeviceArray):
        device = f"cuda:{view.device}"
        if view.readonly:  # a writable alias only for the copy, which never escapes
            alias = DeviceArray(view.ptr, view.shape, view.dtype, device=view.device,
                                owner=view)
            alias.strides = view.strides
            return torch.as_tensor(alias, device=device).clone()
        return torch.as_tensor(view, device=device)
    copy = not view.flags.writeable
    if view.dtype.name == "bfloat16":  # ml_dtypes: torch.from_numpy does not know it
        view = view.view("uint16")
        t = torch.from_numpy(view.copy() if copy else view)
        return t.view(torch.bfloat16)
    return torch.from_numpy(view.copy() if copy else view)


def _views(cache: Cache, layer: int) -> dict:
    per_cache = cache.__dict__.setdefault("_torch_views", {})
    views = per_cache.get(layer)
    if views is None:
        b = cache.layer_buffers(layer)
        views = per_cache[layer] = {"kv": as_tensor(b.kv),
                                    "compressed_keys": as_tensor(b.compressed_keys),
                                    "ring_keys": as_tensor(b.ring_keys),
                                    "topk": as_tensor(b.topk)}
    return views


def kv_cache(cache: Cache, layer: int) -> torch.Tensor:
    """The main cache of `layer` as a tensor [num_blocks, 2, block_size, kv_heads,
    head_dim] (uint8 E4M3 codes: .view(torch.float8_e4m3fn); or 16-bit)."""
    return _views(cache, layer)["kv"]


def compressed_keys(cache: Cache, layer: int) -> torch.Tensor:
    """The compressed index-key cache of `layer` as a tensor: float16 [num_blocks,
    compressed_keys_per_block, index_head_dim] for FP16 index keys, the raw uint8 pages
    [num_blocks, compressed_stride_block] for E4M3 ones (Cache.compressed_key_views
    gives the codes and scales in them)."""
    return _views(cache, layer)["compressed_keys"]


def index_key_ring(cache: Cache, layer: int) -> torch.Tensor:
    """The raw index-key ring of `layer` as a float16 tensor [max_requests, ring_length,
    index_head_dim] (what store_index_keys writes)."""
    return _views(cache, layer)["ring_keys"]


def topk_buffer(cache: Cache, layer: int) -> torch.Tensor:
    """The layer's (shared) top-k buffer as an int32 tensor [topk_rows, topk_cols]."""
    return _views(cache, layer)["topk"]


def token(cache: Cache) -> torch.Tensor:
    """The cache's ordering token for the operators (see the module docstring)."""
    t = cache.__dict__.get("_torch_token")
    if t is None:
        device = f"cuda:{cache._device}" if cache._cuda else "cpu"
        t = cache._torch_token = torch.zeros(1, dtype=torch.int32, device=device)
    return t


# -- the operators ------------------------------------------------------------------------
def _store_kv(token, k, v, slot_mapping, cache: int, layer: int) -> None:
    _get(cache, Cache).store_kv(layer, k, v, slot_mapping)


def _store_index_keys(token, keys, request_slots, positions, cache: int, layer: int) -> None:
    _get(cache, Cache).store_index_keys(layer, keys, request_slots, positions)


def _store_compressed_keys(token, keys, slot_mapping, cache: int, layer: int) -> None:
    _get(cache, Cache).store_compressed_keys(layer, keys, slot_mapping)


def _store_step(token, k, v, slot_mapping, index_keys, request_slots, positions,
                compressed_keys, compressed_slot_mapping, cache: int, layer: int) -> None:
    _get(cache, Cache).store_step(layer, k=k, v=v, slot_mapping=slot_mapping,
                                  index_keys=index_keys, request_slots=request_slots,
                                  positions=positions, compressed_keys=compressed_keys,
                                  compressed_slot_mapping=compressed_slot_mapping)


def _select_topk(topk, index_q, token, plan: int, layer: int) -> None:
    _get(plan, Plan).select_topk(layer, index_q, topk)


def _attention(out, q, topk, token, plan: int, layer: int, attn_mode: int) -> None:
    _get(plan, Plan).attention(layer, q, out, mode=attn_mode, topk=topk)


def _nothing(*args) -> None:  # fake / Meta kernel: the operators return nothing
    return None


_lib = torch.library.Library("qsakv", "DEF")
_register_fake = getattr(torch.library, "register_fake", None)  # torch >= 2.4
for _name, _fn in (("store_kv", _store_kv), ("store_index_keys", _store_index_keys),
                   ("store_compressed_keys", _store_compressed_keys),
                   ("store_step", _store_step), ("select_topk", _select_topk),
                   ("attention", _attention)):
    _lib.define(SCHEMAS[_name])
    _lib.impl(_name, _fn, "CPU")
    _lib.impl(_name, _fn, "CUDA")
    if _register_fake is not None:  # what torch.compile's fake tensors run
        _register_fake(f"qsakv::{_name}", _nothing, lib=_lib)
    else:
        _lib.impl(_name, _nothing, "Meta")


# -- conveniences for eager code ------------------------------------------------------
def store_kv(cache: Cache, layer: int, k, v, slot_mapping) -> None:
    torch.ops.qsakv.store_kv(token(cache), k, v, slot_mapping, handle_id(cache), layer)


def store_index_keys(cache: Cache, layer: int, keys, request_slots, positions) -> None:
    torch.ops.qsakv.store_index_keys(token(cache), keys, request_slots, positions,
                                     handle_id(cache), layer)


def store_compressed_keys(cache: Cache, layer: int, keys, slot_mapping) -> None:
    torch.ops.qsakv.store_compressed_keys(token(cache), keys, slot_mapping,
                                          handle_id(cache), layer)


def store_step(cache: Cache, layer: int, *, k=None, v=None, slot_mapping=None,
               index_keys=None, request_slots=None, positions=None, compressed_keys=None,
               compressed_slot_mapping=None) -> None:
    """Cache.store_step's parts as one operator (one kernel launch on a GPU); a part left
    out is None."""
    torch.ops.qsakv.store_step(token(cache), k, v, slot_mapping, index_keys, request_slots,
                               positions, compressed_keys, compressed_slot_mapping,
                               handle_id(cache), layer)


def select_topk(plan: Plan, layer: int, index_q, topk=None) -> None:
    """topk None: the layer's top-k buffer (topk_buffer(cache, layer))."""
    t = topk_buffer(plan.cache, layer) if topk is None else topk
    torch.ops.qsakv.select_topk(t, index_q, token(plan.cache), handle_id(plan), layer)


def attention(plan: Plan, layer: int, q, out, *, mode="sparse", topk=None) -> None:
    """mode: as Plan.attention's ("sparse", "dense", an AttentionMode or its int value);
    sparse with topk None reads the layer's top-k buffer."""
    m = int(choice(AttentionMode, mode, "mode"))
    if topk is None and m == AttentionMode.SPARSE:
        topk = topk_buffer(plan.cache, layer)
    torch.ops.qsakv.attention(out, q, topk, token(plan.cache), handle_id(plan), layer, m)
