"""Overlay scale files against the reference `safetensors` package, both ways:
files written by libqsakv (qsakv_overlay_write) are read by safetensors.numpy.load_file
with the exact values, and files written by safetensors.numpy.save_file (FP32 scalars)
load and validate through libqsakv; wrong dtypes and shapes from it are refused.
Needs QSAKV_LIB pointing at libqsakv.so."""
import ctypes
import hashlib
import json
import os

import numpy as np
import pytest

# Struct layouts: the declarations generated from include/qsakv.h (drift-checked).
from qsakv import _cdefs  # noqa: E402

ModelConfig = _cdefs.qsakv_model_config
WriteOptions = _cdefs.qsakv_overlay_write_options


st_numpy = pytest.importorskip("safetensors.numpy")
safetensors = pytest.importorskip("safetensors")

QSA_LAYERS = [4 * i + 3 for i in range(12)]
SUCCESS = 0
ERROR_OVERLAY_BAD_TENSOR = -23
CONTRACT = "e4m3fn(x/scale), max_abs/448"


@pytest.fixture(scope="module")
def lib():
    path = os.environ.get("QSAKV_LIB")
    if not path:
        pytest.skip("QSAKV_LIB is not set")
    lib = ctypes.CDLL(path)
    lib.qsakv_last_error.restype = ctypes.c_char_p
    lib.qsakv_overlay_load.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                       ctypes.c_char_p]
    lib.qsakv_overlay_validate.argtypes = [ctypes.c_void_p, ctypes.POINTER(ModelConfig),
                                           ctypes.c_char_p]
    lib.qsakv_overlay_get_scales.argtypes = [ctypes.c_void_p, ctypes.c_int32,
                                             ctypes.POINTER(ctypes.c_float),
                                             ctypes.POINTER(ctypes.c_float)]
    lib.qsakv_overlay_destroy.argtypes = [ctypes.c_void_p]
    return lib


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def base_index(tmp_path):
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps({"metadata": {"total_size": 10},
                                "weight_map": {"lm_head.weight": "model-00001.safetensors"}}))
    return path


def reference_scales():
    k = np.array([0.01 * (i + 1) for i in range(12)], dtype=np.float32)
    # FLT_MIN, the smallest valid scale (a subnormal one is refused), and 1.0 at the edges.
    v = np.array([np.finfo(np.float32).tiny, 1.0] + [0.37 * (i + 1) for i in range(10)],
                 dtype=np.float32)
    return k, v


def load_and_validate(lib, path, revision):
    """Returns (load status, validate status, {layer: (k, v)}); the validation message
    is in lib.last_validate_error."""
    handle = ctypes.c_void_p()
    status = lib.qsakv_overlay_load(ctypes.byref(handle), str(path).encode(), None)
    if status != SUCCESS:
        return status, None, {}
    try:
        cfg = ModelConfig()
        assert lib.qsakv_model_config_preset(ctypes.byref(cfg), b"qwen4_exp") == SUCCESS
        vstatus = lib.qsakv_overlay_validate(handle, ctypes.byref(cfg), revision.encode())
        lib.last_validate_error = lib.qsakv_last_error()
        scales = {}
        for layer in QSA_LAYERS:
            k, v = ctypes.c_float(), ctypes.c_float()
            if lib.qsakv_overlay_get_scales(handle, layer, ctypes.byref(k),
                                            ctypes.byref(v)) == SUCCESS:
                scales[layer] = (k.value, v.value)
        return status, vstatus, scales
    finally:
        lib.qsakv_overlay_destroy(handle)


def test_library_file_reads_in_safetensors(lib, tmp_path, base_index):
    k, v = reference_scales()
    layers = (ctypes.c_int32 * 12)(*QSA_LAYERS)
    opts = WriteOptions()
    assert lib.qsakv_overlay_write_options_init(ctypes.byref(opts)) == SUCCESS
    opts.base_index_path = str(base_index).encode()
    out = tmp_path / "pack"
    status = lib.qsakv_overlay_write(str(out).encode(), layers,
                                     k.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                     v.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 12,
                                     ctypes.byref(opts))
    assert status == SUCCESS, lib.qsakv_last_error()
    scale_file = out / "model-kvscales.safetensors"
    tensors = st_numpy.load_file(str(scale_file))
    assert len(tensors) == 24
    for i, layer in enumerate(QSA_LAYERS):
        tk = tensors[f"model.layers.{layer}.self_attn.k_scale"]
        tv = tensors[f"model.layers.{layer}.self_attn.v_scale"]
        assert tk.dtype == np.float32 and tk.shape == ()
        assert tk.tobytes() == k[i].tobytes() and tv.tobytes() == v[i].tobytes()
    with safetensors.safe_open(str(scale_file), framework="np") as f:
        meta = f.metadata()
    assert meta["qsakv.scale_contract"] == CONTRACT
    assert meta["qsakv.unit_scale_control"] == "0"
    manifest = json.loads((out / "qsakv-overlay.json").read_text())
    assert manifest["base_index_sha256"] == sha256(base_index)
    assert manifest["scale_file_sha256"] == sha256(scale_file)


def write_reference_pack(tmp_path, base_index, tensors, prefix="model.layers", metadata=None):
    pack = tmp_path / "pack"
    pack.mkdir()
    scale_file = pack / "model-kvscales.safetensors"
    st_numpy.save_file(tensors, str(scale_file), metadata=metadata)
    manifest = {
        "schema_version": 1, "kind": "qsakv-overlay",
        "base_index_sha256": sha256(base_index), "scale_file_sha256": sha256(scale_file),
        "layer_prefix": prefix, "tensor_names": sorted(tensors),
        "scale_contract": CONTRACT, "unit_scale_control": False,
        "contract": {"tp_size": None, "speculative_tokens": None,
                     "activation_dtype": None, "min_sm": None},
    }
    (pack / "qsakv-overlay.json").write_text(json.dumps(manifest))
    return scale_file


@pytest.mark.parametrize("prefix,k_name,v_name", [
    ("model.layers", "self_attn.k_scale", "self_attn.v_scale"),
    ("model.language_model.layers", "k_proj.output_scale", "v_proj.output_scale"),
    ("language_model.model.layers", "self_attn.attn.k_scale", "self_attn.attn.v_scale"),
])
def test_safetensors_file_loads_in_library(lib, tmp_path, base_index, prefix, k_name, v_name):
    k, v = reference_scales()
    tensors = {}
    for i, layer in enumerate(QSA_LAYERS):
        tensors[f"{prefix}.{layer}.{k_name}"] = np.array(k[i], dtype=np.float32)
        tensors[f"{prefix}.{layer}.{v_name}"] = np.array(v[i], dtype=np.float32)
    scale_file = write_reference_pack(tmp_path, base_index, tensors, prefix,
                                      metadata={"qsakv.scale_contract": CONTRACT})
    status, vstatus, scales = load_and_validate(lib, scale_file, sha256(base_index))
    assert status == SUCCESS, lib.qsakv_last_error()
    assert vstatus == SUCCESS, lib.last_validate_error
    for i, layer in enumerate(QSA_LAYERS):
        assert np.float32(scales[layer][0]).tobytes() == k[i].tobytes()
        assert np.float32(scales[layer][1]).tobytes() == v[i].tobytes()


@pytest.mark.parametrize("bad", [np.array(0.5, dtype=np.float16),
                                 np.array(0.5, dtype=np.float64),
                                 np.array([0.5], dtype=np.float32),
                                 np.array([0.5, 0.5], dtype=np.float32)],
                         ids=["f16", "f64", "shape1", "shape2"])
def test_safetensors_wrong_tensor_is_refused(lib, tmp_path, base_index, bad):
    k, v = reference_scales()
    tensors = {}
    for i, layer in enumerate(QSA_LAYERS):
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = np.array(k[i], dtype=np.float32)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = np.array(v[i], dtype=np.float32)
    tensors["model.layers.27.self_attn.v_scale"] = bad
    scale_file = write_reference_pack(tmp_path, base_index, tensors)
    status, vstatus, _ = load_and_validate(lib, scale_file, sha256(base_index))
    assert status == SUCCESS, lib.qsakv_last_error()
    assert vstatus == ERROR_OVERLAY_BAD_TENSOR
    assert b"layer 27 v_scale" in lib.last_validate_error
