"""A minimal ctypes driver for the Python tests of the C library (the full binding lives
in bindings/python). It stores a flat FP16 array into an E4M3 cache on the CPU backend
and returns the cache bytes."""
import ctypes
import os
import tempfile

import numpy as np


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
        """Stores x as K (and V) tokens of head_dim 64 through qsakv_store_kv; returns the
        E4M3 bytes of K in token order."""
        lib = self.lib
        n = x_fp16.size
        hd = 64
        tokens = (n + hd - 1) // hd
        flat = np.zeros(tokens * hd, dtype=np.float16)
        flat[:n] = x_fp16
        # config: the preset shrunk to 1 KV head of 64 dims, 2 QSA layers
        cfg = ctypes.create_string_buffer(8192)
        self.check(lib.qsakv_model_config_preset(cfg, b"qwen4_exp"))
        # Field offsets from the header layout (size_t, uint32, then int32s).
        ints = np.frombuffer(cfg, dtype=np.int32)
        # struct qsakv_model_config: size_t struct_size; uint32 version; int32 num_layers;
        # int32 num_qsa_layers; int32 qsa_layers[512]; int32 num_q_heads; ...
        off_num_layers = 3
        ints[off_num_layers] = 8
        ints[off_num_layers + 1] = 2
        ints[off_num_layers + 2] = 3
        ints[off_num_layers + 3] = 7
        q_heads = off_num_layers + 2 + 512
        ints[q_heads] = 1
        ints[q_heads + 1] = 1
        ints[q_heads + 2] = hd
        ctx = ctypes.c_void_p()
        opts = ctypes.create_string_buffer(64)
        self.check(lib.qsakv_context_options_init(opts))
        np.frombuffer(opts, dtype=np.int32)[3] = 1  # backend = CPU
        self.check(lib.qsakv_context_create(ctypes.byref(ctx), opts))
        with tempfile.TemporaryDirectory() as tmp:
            index = os.path.join(tmp, "model.safetensors.index.json")
            with open(index, "w") as f:
                f.write('{"metadata": {"total_size": 0}, "weight_map": {}}')
            wo = ctypes.create_string_buffer(128)
            self.check(lib.qsakv_overlay_write_options_init(wo))
            # base_index_path is the second pointer field: after layer_prefix
            ptrs = (ctypes.c_void_p * 16).from_buffer(wo)
            idx_buf = ctypes.create_string_buffer(index.encode())
            ptrs[3] = ctypes.cast(idx_buf, ctypes.c_void_p).value
            layers = (ctypes.c_int32 * 2)(3, 7)
            sc = (ctypes.c_float * 2)(scale, scale)
            out_dir = os.path.join(tmp, "ov")
            self.check(lib.qsakv_overlay_write(out_dir.encode(), layers, sc, sc, 2, wo))
            ov = ctypes.c_void_p()
            self.check(lib.qsakv_overlay_load(ctypes.byref(ov), os.path.join(out_dir, "model-kvscales.safetensors").encode(), None))
            rev = ctypes.create_string_buffer(65)
            self.check(lib.qsakv_checkpoint_revision(index.encode(), rev))
            self.check(lib.qsakv_overlay_validate(ov, cfg, rev.value))
            copts = ctypes.create_string_buffer(128)
            self.check(lib.qsakv_cache_options_init(copts))
            np.frombuffer(copts, dtype=np.int64)[2] = (tokens + 15) // 16  # num_blocks
            cache = ctypes.c_void_p()
            self.check(lib.qsakv_cache_create(ctypes.byref(cache), ctx, cfg, ov, copts))
            slots = np.arange(tokens, dtype=np.int64)
            vp = ctypes.c_void_p
            self.check(lib.qsakv_store_kv(cache, 3, vp(flat.ctypes.data), vp(flat.ctypes.data),
                                          vp(slots.ctypes.data), ctypes.c_int64(tokens), None))
            bufs = (ctypes.c_void_p * 5)()
            self.check(lib.qsakv_cache_get_layer_buffers(cache, 3, bufs))
            bs = 64
            blocks = (tokens + 15) // 16
            raw = np.ctypeslib.as_array(ctypes.cast(bufs[0], ctypes.POINTER(ctypes.c_uint8)),
                                        shape=(blocks, 2, bs, hd)).copy()
            lib.qsakv_cache_destroy(cache)
            lib.qsakv_overlay_destroy(ov)
        lib.qsakv_context_destroy(ctx)
        k = raw[:, 0].reshape(-1)[: tokens * hd]
        return k[:n]
