"""ModelConfig (geometry and runtime of a model on one TP rank) and capacity planning."""
from __future__ import annotations

import ctypes
import os

from . import _cdefs, _structs
from ._ints import c_int, set_field
from ._lib import lib
from .enums import dtype_of

_FIELDS = [f for f, _ in _cdefs.qsakv_model_config._fields_ if f not in ("struct_size", "version")]
_DTYPE_FIELDS = {f for f, e in _cdefs.ENUM_FIELDS.get("qsakv_model_config", {}).items()
                 if e == "qsakv_dtype"}


class ModelConfig:
    """A qsakv_model_config with attribute access.

        cfg = ModelConfig.preset("qwen4_exp")
        cfg.tp_size = 4
        cfg.kv_dtype = "e4m3"          # or DType.E4M3
        cfg.index_key_dtype = "e4m3"   # compressed index keys: "fp16" (default) or "e4m3"
        cfg.qsa_layers = [3, 7, 11]    # also sets num_qsa_layers
        cfg.validate()                 # InvalidConfigError naming the field
        geo = cfg.rank_geometry()      # q_heads, kv_heads, topk_width, ...

    Dtype fields (activation_dtype, kv_dtype, index_key_dtype) take a DType, an int or a
    name and read as DType. index_key_dtype: the compressed index keys, FP16 (the
    default) or E4M3 with one FP32 scale per key (max |x| / 448, computed when the key is
    stored; 132 instead of 256 bytes per key of 128 dims); the raw index-key ring and the
    index queries stay FP16.
    Plain data (no C object to free): copy with copy() or replace(**fields).
    `qsa_layers` reads as the tuple of the num_qsa_layers layer ids in use.
    """

    __slots__ = ("_c",)

    def __init__(self, **fields):
        """A zeroed config (not valid until filled; index_key_dtype FP16, the one
        default), with `fields` set."""
        object.__setattr__(self, "_c", _structs.filled(_cdefs.qsakv_model_config,
                                                      lib.qsakv_model_config_init))
        for k, v in fields.items():
            setattr(self, k, v)

    @classmethod
    def preset(cls, name: str = "qwen4_exp", **fields) -> "ModelConfig":
        """A named preset ("qwen4_exp": the reference model), with `fields` replaced."""
        cfg = cls()
        object.__setattr__(cfg, "_c", _structs.filled(
            _cdefs.qsakv_model_config, lambda c: lib.qsakv_model_config_preset(c, name.encode())))
        for k, v in fields.items():
            setattr(cfg, k, v)
        return cfg

    @classmethod
    def from_checkpoint(cls, path, **fields) -> "ModelConfig":
        """The config of a Hugging Face checkpoint: `path` is its directory (config.json
        is read) or the JSON file. The geometry comes from the file; the runtime fields
        (tp_size, tp_rank, kv_dtype, block_size, max_requests, ...) are the qwen4_exp
        preset's until `fields` set them. FormatError names the key, IoError (an
        OSError) the file."""
        cfg = cls()
        object.__setattr__(cfg, "_c", _structs.filled(
            _cdefs.qsakv_model_config,
            lambda c: lib.qsakv_model_config_from_checkpoint(c, os.fsencode(path))))
        for k, v in fields.items():
            setattr(cfg, k, v)
        return cfg

    def __getattr__(self, name):
        if name == "qsa_layers":
            return tuple(self._c.qsa_layers[: self._c.num_qsa_layers])
        if name in _FIELDS:
            return _structs.value(self._c, name)
        raise AttributeError(f"ModelConfig has no field {name!r}")

    def __setattr__(self, name, value):
        if name == "qsa_layers":
            layers = [c_int(x, f"qsa_layers[{i}]") for i, x in enumerate(value)]
            if len(layers) > _cdefs.QSAKV_MAX_LAYERS:
                raise ValueError(f"qsa_layers: at most {_cdefs.QSAKV_MAX_LAYERS} layers")
            arr = self._c.qsa_layers
            for i in range(len(arr)):
                arr[i] = layers[i] if i < len(layers) else 0
            self._c.num_qsa_layers = len(layers)
        elif name in _DTYPE_FIELDS:
            setattr(self._c, name, dtype_of(value))
        elif name in _FIELDS:
            set_field(self._c, name, value)  # integers checked against the C type
        else:
            raise AttributeError(f"ModelConfig has no field {name!r}")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_FIELDS))

    def to_dict(self) -> dict:
        return {f: getattr(self, f) for f in _FIELDS}

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"ModelConfig({body})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ModelConfig) and bytes(self._c) == bytes(other._c)

    def copy(self) -> "ModelConfig":
        new = ModelConfig()
        ctypes.memmove(ctypes.byref(new._c), ctypes.byref(self._c), ctypes.sizeof(self._c))
        return new

    def replace(self, **fields) -> "ModelConfig":
        new = self.copy()
        for k, v in fields.items():
            setattr(new, k, v)
        return new

    def validate(self) -> "ModelConfig":
        """Checks every field and combination; InvalidConfigError names the field."""
        lib.qsakv_model_config_validate(ctypes.byref(self._c))
        return self

    def rank_geometry(self):
        """Validates, then returns this rank's RankGeometry (q_heads, kv_heads,
        group_size, first_q_head, first_kv_head, topk_width, topk_blocks, ring_length,
        softmax_scale)."""
        g = _structs.new(_cdefs.qsakv_rank_geometry)
        lib.qsakv_model_config_rank_geometry(ctypes.byref(self._c), ctypes.byref(g))
        return _structs.record(g, "RankGeometry")

    @property
    def _ref(self):
        return ctypes.byref(self._c)


def capacity_plan(config: ModelConfig, memory_budget_bytes: int):
    """How many cache blocks/tokens fit in a memory budget per rank (pure arithmetic,
    no allocation). Returns a Capacity record: bytes per token (main, compressed index
    keys in index_key_dtype, and fp16_bytes_per_token: a 16-bit main cache with FP16
    index keys, for comparison), ring and top-k bytes, num_blocks, num_tokens,
    fp16_num_tokens, capacity_ratio, ideal_ratio, bytes_per_block."""
    out = _structs.new(_cdefs.qsakv_capacity)
    budget = c_int(memory_budget_bytes, "memory_budget_bytes", ctypes.c_uint64)
    lib.qsakv_capacity_plan(config._ref, budget, ctypes.byref(out))
    return _structs.record(out, "Capacity")
