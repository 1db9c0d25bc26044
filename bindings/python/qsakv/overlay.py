"""Overlay: calibrated per-layer K/V scales bound to a checkpoint revision (fail closed)."""
from __future__ import annotations

import ctypes
import os
from typing import Mapping

from . import _cdefs, _structs
from ._handle import Handle
from ._ints import c_int, set_field
from ._lib import lib
from .config import ModelConfig
from .enums import dtype_of


def _path(p) -> bytes | None:
    return None if p is None else os.fsencode(p)


def checkpoint_revision(path) -> str:
    """The revision an overlay is bound to: the lower-case hex SHA-256 of a checkpoint's
    model.safetensors.index.json (`path`: the checkpoint directory or the index file). A
    materialised checkpoint answers with its base's revision, hashed now (qsakv.h).
    Blocking."""
    out = ctypes.create_string_buffer(65)
    lib.qsakv_checkpoint_revision(_path(path), out)
    return out.value.decode()


def write_options(base_index_path, layer_prefix=None, contract_tp_size=0,
                  contract_speculative_tokens=-1, contract_activation_dtype=None,
                  contract_min_sm=0, unit_scale_control=False):
    """A qsakv_overlay_write_options (see Overlay.write for the fields). The strings are
    kept referenced by the returned struct's `_keep`."""
    opts = _structs.filled(_cdefs.qsakv_overlay_write_options,
                           lib.qsakv_overlay_write_options_init)
    keep = (None if layer_prefix is None else layer_prefix.encode(), _path(base_index_path))
    opts.layer_prefix, opts.base_index_path = keep
    set_field(opts, "contract_tp_size", contract_tp_size)
    set_field(opts, "contract_speculative_tokens", contract_speculative_tokens)
    opts.contract_activation_dtype = 0 if contract_activation_dtype is None else \
        dtype_of(contract_activation_dtype)
    set_field(opts, "contract_min_sm", contract_min_sm)
    opts.unit_scale_control = int(bool(unit_scale_control))
    opts._keep = keep
    return opts


class Overlay(Handle):
    """Loaded K/V scales. Overlay.load(...) -> validate(config, revision) -> back an E4M3
    Cache. A failed validate() raises the refusal's class (RevisionMismatchError,
    OverlayIncompleteError, ContractError, ...) and leaves the overlay unvalidated.
    Every method is blocking; none takes device buffers."""

    _kind = "overlay"

    @classmethod
    def load(cls, path, manifest_path=None) -> "Overlay":
        """Loads from a materialised checkpoint directory or a bare scale file (with
        `manifest_path`; None: "<dir>/qsakv-overlay.json"). Strict parsing; checks the
        scale file's SHA-256 against the manifest."""
        out = ctypes.POINTER(_cdefs.qsakv_overlay)()
        lib.qsakv_overlay_load(ctypes.byref(out), _path(path), _path(manifest_path))
        self = cls.__new__(cls)
        Handle.__init__(self, out, lib.qsakv_overlay_destroy)
        return self

    def __init__(self, *args, **kwargs):
        raise TypeError("use Overlay.load(path, manifest_path=None)")

    def validate(self, config: ModelConfig, expected_base_revision: str) -> "Overlay":
        """Validates against `config` and the base checkpoint's revision (see
        checkpoint_revision). Every fail-closed rule has its own exception class."""
        self._p  # noqa: B018 (ClosedError first)
        if not isinstance(expected_base_revision, str):
            raise TypeError("expected_base_revision: a hex SHA-256 string")
        lib.qsakv_overlay_validate(self._p, config._ref, expected_base_revision.encode())
        return self

    @property
    def info(self):
        """OverlayInfo: num_scales, validated, unit_scale_control, the contract fields,
        base_index_sha256, scale_file_sha256, layer_prefix. (A method up to 0.1.0:
        `overlay.info()` still works, with a DeprecationWarning.)"""
        info = _structs.new(_cdefs.qsakv_overlay_info)
        lib.qsakv_overlay_get_info(self._p, ctypes.byref(info))
        return _structs.callable_record(_structs.record(info, "OverlayInfo"), "Overlay.info")

    def scales(self, layer: int) -> tuple[float, float]:
        """(k_scale, v_scale) of a model layer id; InvalidArgumentError if absent."""
        k, v = ctypes.c_float(), ctypes.c_float()
        lib.qsakv_overlay_get_scales(self._p, c_int(layer, "layer"), ctypes.byref(k),
                                     ctypes.byref(v))
        return k.value, v.value

    @staticmethod
    def read_scale_file(path) -> tuple[dict[int, tuple[float, float]], str]:
        """The scales of a bare scale file, for inspection (no manifest, no validation):
        ({model-layer id: (k_scale, v_scale)}, the file's SHA-256 hex). A half the file
        does not give reads NaN. Refuses unknown tensors, non-scalars and a scale given
        twice, like the C call."""
        # One read for any file of a model's layers; a larger one is read again, sized.
        n, cap = ctypes.c_int32(), _cdefs.QSAKV_MAX_LAYERS
        while True:
            layers, k, v = (ctypes.c_int32 * cap)(), (ctypes.c_float * cap)(), \
                (ctypes.c_float * cap)()
            sha = ctypes.create_string_buffer(65)
            lib.qsakv_overlay_read_scale_file(_path(path), cap, layers, k, v, ctypes.byref(n),
                                              sha)
            if n.value <= cap:
                return ({layers[i]: (k[i], v[i]) for i in range(n.value)}, sha.value.decode())
            cap = n.value

    @staticmethod
    def write(out_dir, scales: Mapping[int, tuple[float, float]], *, base_index_path,
              layer_prefix: str | None = None, contract_tp_size: int = 0,
              contract_speculative_tokens: int = -1, contract_activation_dtype=None,
              contract_min_sm: int = 0, unit_scale_control: bool = False) -> None:
        """Writes a scale pack: out_dir/model-kvscales.safetensors and its manifest
        out_dir/qsakv-overlay.json, bound to the base checkpoint whose index file is
        `base_index_path`. scales: {model layer id: (k_scale, v_scale)}. The contract
        fields constrain the runtime (0 / -1 / None: not constrained). Refuses an
        existing out_dir; atomic."""
        items = sorted((c_int(layer, "scales: a layer id"), ks_vs)
                       for layer, ks_vs in scales.items())
        n = len(items)
        opts = write_options(base_index_path, layer_prefix, contract_tp_size,
                             contract_speculative_tokens, contract_activation_dtype,
                             contract_min_sm, unit_scale_control)
        arr_l = (ctypes.c_int32 * n)(*(layer for layer, _ in items))
        arr_k = (ctypes.c_float * n)(*(ks_vs[0] for _, ks_vs in items))
        arr_v = (ctypes.c_float * n)(*(ks_vs[1] for _, ks_vs in items))
        lib.qsakv_overlay_write(_path(out_dir), arr_l, arr_k, arr_v, n, ctypes.byref(opts))

    @staticmethod
    def materialize(out_dir, base_checkpoint_dir, scale_pack_dir) -> None:
        """Builds a calibrated checkpoint directory: merged index, links to the base
        files, the scale file, manifest and provenance. Refuses an existing out_dir
        (InvalidArgumentError), a base of another revision (RevisionMismatchError) and a
        scale name the base already has (OverlayDuplicateError). Atomic."""
        lib.qsakv_overlay_materialize(_path(out_dir), _path(base_checkpoint_dir),
                                      _path(scale_pack_dir))
