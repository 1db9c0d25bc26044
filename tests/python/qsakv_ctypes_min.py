"""A small driver for the Python oracle tests of the C library: stores a flat FP16 array
into an E4M3 cache on the CPU backend and returns the cache bytes. Struct layouts are the
declarations generated from include/qsakv.h (bindings/python, drift-checked); calls go
straight to the C functions so the oracle tests exercise the library, not the binding."""
import ctypes
import os
import tempfile

import numpy as np

from qsakv import _cdefs

HEAD_DIM = 64
BLOCK = 64


def _new(struct, version):
    s = struct()
    s.struct_size = ctypes.sizeof(struct)
    s.version = version
    return s


class Lib:
    def __init__(self):
        path = os.environ.get("QSAKV_LIB")
        if not path:
            raise RuntimeError("QSAKV_LIB must point at libqsakv.so")
        self.lib = ctypes.CDLL(path)
        self.lib.qsakv_last_error.restype = ctypes.c_char_p

    def check(self, status):
        if status != 0:
            raise RuntimeError(f"qsakv status {status}: {self.lib.qsakv_last_error().decode()}")

    def store_e4m3(self, x_fp16: np.ndarray, scale: float) -> np.ndarray:
        """Stores x as K (and V) tokens of one 64-dim KV head through qsakv_store_kv at
        `scale`; returns the E4M3 bytes of K in input order."""
        lib, ref = self.lib, ctypes.byref
        n = x_fp16.size
        tokens = (n + HEAD_DIM - 1) // HEAD_DIM
        flat = np.zeros(tokens * HEAD_DIM, dtype=np.float16)
        flat[:n] = x_fp16
        cfg = _new(_cdefs.qsakv_model_config, _cdefs.QSAKV_MODEL_CONFIG_VERSION)
        self.check(lib.qsakv_model_config_preset(ref(cfg), b"qwen4_exp"))
        cfg.num_layers, cfg.num_qsa_layers = 8, 2
        cfg.qsa_layers[0], cfg.qsa_layers[1] = 3, 7
        cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 1, 1, HEAD_DIM
        cfg.max_batched_tokens = 1
        opts = _new(_cdefs.qsakv_context_options, _cdefs.QSAKV_CONTEXT_OPTIONS_VERSION)
        self.check(lib.qsakv_context_options_init(ref(opts)))
        opts.backend = _cdefs.QSAKV_BACKEND_CPU
        ctx = ctypes.c_void_p()
        self.check(lib.qsakv_context_create(ref(ctx), ref(opts)))
        try:
            with tempfile.TemporaryDirectory() as tmp:
                index = os.path.join(tmp, "model.safetensors.index.json")
                with open(index, "w") as f:
                    f.write('{"metadata": {"total_size": 0}, "weight_map": {}}')
                wo = _new(_cdefs.qsakv_overlay_write_options, _cdefs.QSAKV_OVERLAY_WRITE_OPTIONS_VERSION)
                self.check(lib.qsakv_overlay_write_options_init(ref(wo)))
                wo.base_index_path = index.encode()
                layers = (ctypes.c_int32 * 2)(3, 7)
                sc = (ctypes.c_float * 2)(scale, scale)
                out_dir = os.path.join(tmp, "ov").encode()
                self.check(lib.qsakv_overlay_write(out_dir, layers, sc, sc, 2, ref(wo)))
                ov = ctypes.c_void_p()
                self.check(lib.qsakv_overlay_load(ref(ov), out_dir, None))
                rev = ctypes.create_string_buffer(65)
                self.check(lib.qsakv_checkpoint_revision(index.encode(), rev))
                self.check(lib.qsakv_overlay_validate(ov, ref(cfg), rev.value))
                co = _new(_cdefs.qsakv_cache_options, _cdefs.QSAKV_CACHE_OPTIONS_VERSION)
                self.check(lib.qsakv_cache_options_init(ref(co)))
                co.num_blocks = (tokens + BLOCK - 1) // BLOCK
                co.allow_unit_scales = int(scale == 1.0)  # the codec test's unit scale, asked for
                cache = ctypes.c_void_p()
                self.check(lib.qsakv_cache_create(ref(cache), ctx, ref(cfg), ov, ref(co)))
                slots = np.arange(tokens, dtype=np.int64)
                vp = ctypes.c_void_p
                self.check(lib.qsakv_store_kv(cache, 3, vp(flat.ctypes.data), vp(flat.ctypes.data),
                                              vp(slots.ctypes.data), ctypes.c_int64(tokens), None))
                lb = _cdefs.qsakv_layer_buffers()
                lb.struct_size = ctypes.sizeof(lb)
                lb.version = _cdefs.QSAKV_LAYER_BUFFERS_VERSION
                self.check(lib.qsakv_cache_get_layer_buffers(cache, 3, ref(lb)))
                raw = np.ctypeslib.as_array(ctypes.cast(lb.kv, ctypes.POINTER(ctypes.c_uint8)),
                                            shape=(co.num_blocks, 2, BLOCK, HEAD_DIM)).copy()
                lib.qsakv_cache_destroy(cache)
                lib.qsakv_overlay_destroy(ov)
        finally:
            lib.qsakv_context_destroy(ctx)
        return raw[:, 0].reshape(-1)[:n]
