"""What the `qsakv` tool's tests share: the library with the prototypes generated from
include/qsakv.h, a runner for the tool, and an overlay pack bound to a throwaway
checkpoint index (its SHA-256 is the revision a verify must name)."""
import ctypes
import hashlib
import json
import os
import subprocess

import pytest

from qsakv import _cdefs  # struct layouts and prototypes generated from include/qsakv.h

QSA_LAYERS = [4 * i + 3 for i in range(12)]  # the qwen4_exp preset's QSA layers


def load_library_and_tool():
    """(library, tool path) from QSAKV_LIB and QSAKV_TOOL; the test skips without them."""
    lib_path, tool = os.environ.get("QSAKV_LIB"), os.environ.get("QSAKV_TOOL")
    if not lib_path or not tool:
        pytest.skip("QSAKV_LIB and QSAKV_TOOL must be set")
    lib = ctypes.CDLL(lib_path)
    for name, fn in _cdefs.FUNCTIONS.items():
        f = getattr(lib, name, None)
        if f is not None:
            f.restype, f.argtypes = fn[0], fn[1]
    lib.qsakv_last_error.restype = ctypes.c_char_p
    lib.qsakv_status_string.restype = ctypes.c_char_p
    return lib, tool


def run_tool(tool, *args, cwd=None):
    return subprocess.run([os.path.abspath(tool), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd)


def write_pack(lib, tmp_path, num_layers=len(QSA_LAYERS), tp=0):
    """An overlay pack for the first num_layers QSA layers (fewer than all: an incomplete
    one), bound to a throwaway checkpoint index in tmp_path. Returns (pack, revision)."""
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"lm_head.weight": "model-00001.safetensors"}}))
    opts = _cdefs.qsakv_overlay_write_options()
    assert lib.qsakv_overlay_write_options_init(ctypes.byref(opts)) == 0
    opts.base_index_path = str(index).encode()
    opts.contract_tp_size = tp
    layers = (ctypes.c_int32 * num_layers)(*QSA_LAYERS[:num_layers])
    k = (ctypes.c_float * num_layers)(*[0.01 * (i + 1) for i in range(num_layers)])
    v = (ctypes.c_float * num_layers)(*[0.5] * num_layers)
    out = tmp_path / "pack"
    assert lib.qsakv_overlay_write(str(out).encode(), layers, k, v, num_layers,
                                   ctypes.byref(opts)) == 0, lib.qsakv_last_error()
    return out, hashlib.sha256(index.read_bytes()).hexdigest()
