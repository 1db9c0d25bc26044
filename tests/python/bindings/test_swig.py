"""The SWIG module qsakv_swig: the same pipeline on the CPU backend against the FP64
oracle, status -> exception mapping, out-parameters as return values, ownership."""
import gc
import os

import ml_dtypes
import numpy as np
import pytest

from reference import (attention_reference, calibrate, make_world, quantise_e4m3, rel_l2,
                       select_reference)

try:
    import qsakv_swig as q
except ImportError as e:  # pragma: no cover - depends on the build
    if os.environ.get("QSAKV_SWIG_BUILT") == "1":
        raise  # CMake built it: failing to import it is a failure, not a skip
    pytest.skip(f"qsakv_swig not built (SWIG or the Python headers were not found at "
                f"configure time): {e}", allow_module_level=True)


def cpu_context():
    o = q.qsakv_context_options()
    q.qsakv_context_options_init(o)
    o.backend = q.QSAKV_BACKEND_CPU
    return q.qsakv_context_create(o)


def config(**fields):
    c = q.qsakv_model_config()
    q.qsakv_model_config_preset(c, "qwen4_exp")
    c.tp_size, c.max_batched_tokens, c.max_requests, c.max_model_len = 4, 64, 8, 8192
    for k, v in fields.items():
        setattr(c, k, v)
    return c


class Cfg:
    """The attributes reference.py reads, from a SWIG config and geometry."""

    def __init__(self, c):
        for f in ("block_size", "compress_ratio", "head_dim", "index_head_dim",
                  "index_num_heads"):
            setattr(self, f, getattr(c, f))


def test_pipeline_e4m3(tmp_path, checkpoint):
    cfg = config()
    geo = q.qsakv_model_config_rank_geometry(cfg)
    assert (geo.q_heads, geo.kv_heads, geo.topk_width) == (6, 1, 2051)
    w = make_world(Cfg(cfg), geo)
    ks, vs = calibrate(w.k), calibrate(w.v)
    layers = np.array(cfg.qsa_layers[: cfg.num_qsa_layers], np.int32)
    wo = q.qsakv_overlay_write_options()
    q.qsakv_overlay_write_options_init(wo)
    wo.base_index_path = str(checkpoint / "model.safetensors.index.json")
    wo.contract_tp_size = 4
    n = len(layers)
    q.qsakv_overlay_write(str(tmp_path / "pack"), layers, np.full(n, ks, np.float32),
                          np.full(n, vs, np.float32), n, wo)
    ov = q.qsakv_overlay_load(str(tmp_path / "pack" / "model-kvscales.safetensors"), None)
    assert q.qsakv_overlay_get_scales(ov, 3) == [np.float32(ks), np.float32(vs)]
    rev = q.qsakv_checkpoint_revision(str(checkpoint))
    with pytest.raises(q.RevisionMismatchError):
        q.qsakv_overlay_validate(ov, cfg, "0" * 64)
    q.qsakv_overlay_validate(ov, cfg, rev)
    assert q.qsakv_overlay_get_info(ov).validated == 1

    ctx = cpu_context()
    co = q.qsakv_cache_options()
    q.qsakv_cache_options_init(co)
    co.num_blocks = w.num_blocks
    cache = q.qsakv_cache_create(ctx, cfg, ov, co)
    q.qsakv_overlay_destroy(ov)  # the cache copied the scales
    layer = int(layers[0])
    q.qsakv_store_kv(cache, layer, w.k, w.v, w.slots, len(w.slots), None)
    q.qsakv_store_compressed_keys(cache, layer, w.ck, w.cslots, len(w.cslots), None)
    po = q.qsakv_plan_options()
    q.qsakv_plan_options_init(po)
    po.max_rows = w.num_rows
    plan = q.qsakv_plan_create(cache, po)
    b = q.qsakv_batch()
    qs, lens = w.query_start, np.array(w.lens, np.int32)
    b.num_requests, b.query_start, b.seq_lens = len(lens), qs, lens
    b.block_table, b.block_table_stride = w.bt, w.bt.shape[1]
    assert b.query_start == qs.ctypes.data  # pointer members read back as addresses
    q.qsakv_plan_update(plan, b, None)
    topk = np.full((w.num_rows, geo.topk_width), -7, np.int32)
    q.qsakv_select_topk(plan, layer, w.iq, topk, topk.shape[1], None)
    out = np.zeros_like(w.q)
    q.qsakv_attention_run(plan, layer, q.QSAKV_ATTENTION_SPARSE, w.q, topk, topk.shape[1],
                          out, None)
    info = q.qsakv_plan_get_info(plan)
    assert (info.num_rows, info.num_requests) == (w.num_rows, len(lens))

    layout = q.qsakv_cache_get_layout(cache)
    kv = np.empty((layout.num_blocks, 2, layout.block_size, 1, 256), np.uint8)
    bufs = q.qsakv_cache_get_layer_buffers(cache, layer)
    q.qsakv_memcpy(ctx, kv, bufs.kv, kv.nbytes, q.QSAKV_COPY_DEVICE_TO_HOST, None)
    blocks, offs = w.slots // layout.block_size, w.slots % layout.block_size
    np.testing.assert_array_equal(kv[blocks, 0, offs], quantise_e4m3(w.k, ks).view(np.uint8))
    np.testing.assert_array_equal(topk, select_reference(w, Cfg(cfg), geo))
    dk = kv[blocks, 0, offs].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    dv = kv[blocks, 1, offs].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    ref = attention_reference(w, Cfg(cfg), geo, dk, dv, ks, vs, topk)
    assert rel_l2(out, ref) < 2e-3
    q.qsakv_plan_destroy(plan)
    q.qsakv_cache_destroy(cache)
    q.qsakv_context_destroy(ctx)


def test_status_mapping():
    codes = {v: k for k, v in vars(q).items() if k.startswith("QSAKV_ERROR_")}
    assert len(codes) >= 22
    for code, name in codes.items():
        cls = q._make_error(code, "m").__class__
        assert cls is not q.QsakvError and issubclass(cls, q.QsakvError) and cls.status == code
        assert q.qsakv_status_string(code) == name
    with pytest.raises(q.InvalidArgumentError) as e:
        q.qsakv_model_config_preset(q.qsakv_model_config(), "no_such_model")
    assert e.value.status == q.QSAKV_ERROR_INVALID_ARGUMENT
    assert "no_such_model" in e.value.message and str(e.value).startswith("QSAKV_ERROR_")
    assert q.qsakv_last_error() == ""  # copied, then cleared
    bad = config(head_dim=100)
    with pytest.raises(q.InvalidConfigError, match="head_dim"):
        q.qsakv_model_config_validate(bad)
    with pytest.raises(q.IoError):
        q.qsakv_checkpoint_revision("/nonexistent/checkpoint")
    with pytest.raises(q.OverlayMissingError):
        q.qsakv_cache_create(cpu_context(), config(), None, None)
    with pytest.raises(TypeError, match="stream"):
        q.qsakv_stream_synchronize(cpu_context(), "default")


def test_index_key_dtype_and_the_compressed_page():
    """index_key_dtype is reachable (default FP16, also for a config constructed here,
    as qsakv_model_config_init leaves it), E4M3 validates and changes the layout's page
    and the capacity; another dtype is refused naming the field."""
    assert q.qsakv_model_config().index_key_dtype == q.QSAKV_DTYPE_FP16
    assert config().index_key_dtype == q.QSAKV_DTYPE_FP16
    cfg = config(kv_dtype=q.QSAKV_DTYPE_FP16, index_key_dtype=q.QSAKV_DTYPE_E4M3)
    q.qsakv_model_config_validate(cfg)
    with pytest.raises(q.InvalidConfigError, match="index_key_dtype"):
        q.qsakv_model_config_validate(config(index_key_dtype=q.QSAKV_DTYPE_BF16))
    co = q.qsakv_cache_options()
    q.qsakv_cache_options_init(co)
    co.num_blocks = 4
    cache = q.qsakv_cache_create(cpu_context(), cfg, None, co)
    L = q.qsakv_cache_get_layout(cache)
    assert L.index_key_dtype == q.QSAKV_DTYPE_E4M3 and L.index_head_dim == 128
    assert (L.compressed_keys_per_block, L.compressed_stride_block,
            L.compressed_scales_offset) == (16, 2112, 2048)
    assert L.compressed_bytes_per_layer == 4 * 2112
    keys = np.zeros((1, 128), np.float16)
    keys[0, :4] = [1, -2, 0.5, 4]
    q.qsakv_store_compressed_keys(cache, 3, keys, np.array([64 + 7], np.int64), 1, None)
    pages = np.empty(4 * 2112, np.uint8)
    buf = q.qsakv_cache_get_layer_buffers(cache, 3)
    q.qsakv_memcpy(cache._context, pages, buf.compressed_keys, pages.nbytes,
                   q.QSAKV_COPY_DEVICE_TO_HOST, None)
    page = pages.reshape(4, 2112)[1]  # slot 71: block 1, key 71 % 64 // 4 = 1
    assert page[2048 + 4:2048 + 8].view(np.float32)[0] == np.float32(4) / np.float32(448)
    assert page[128:132].view(ml_dtypes.float8_e4m3fn).astype(np.float32).tolist() == \
        [112, -224, 56, 448]
    cap = q.qsakv_capacity_plan(config(index_key_dtype=q.QSAKV_DTYPE_E4M3), 40 << 30)
    assert (cap.bytes_per_token, cap.fp16_bytes_per_token) == (6540, 13056)
    assert cap.ideal_ratio >= 1.99


def test_store_step_equals_the_compressed_key_store():
    """qsakv_store_step with a compressed-key part stores the bytes of
    qsakv_store_compressed_keys; its arrays are checked against its counts, naming the
    field."""
    co = q.qsakv_cache_options()
    q.qsakv_cache_options_init(co)
    co.num_blocks = 4
    cfg = config(kv_dtype=q.QSAKV_DTYPE_FP16, index_key_dtype=q.QSAKV_DTYPE_E4M3)
    ctx = cpu_context()
    keys = np.arange(2 * 128, dtype=np.float16).reshape(2, 128) / np.float16(64)
    slots = np.array([64 + 7, 5], np.int64)
    pages = []
    for step in (False, True):
        cache = q.qsakv_cache_create(ctx, cfg, None, co)
        if step:
            st = q.qsakv_step_stores()
            assert st.struct_size > 0 and st.version == q.QSAKV_STEP_STORES_VERSION
            st.compressed_keys = keys
            st.compressed_slot_mapping = slots
            st.num_compressed_keys = 2
            q.qsakv_store_step(cache, 3, st, None)
            st.num_compressed_keys = 3
            with pytest.raises(q.InvalidArgumentError, match="stores.compressed_keys"):
                q.qsakv_store_step(cache, 3, st, None)
        else:
            q.qsakv_store_compressed_keys(cache, 3, keys, slots, 2, None)
        out = np.empty(4 * 2112, np.uint8)
        buf = q.qsakv_cache_get_layer_buffers(cache, 3)
        q.qsakv_memcpy(ctx, out, buf.compressed_keys, out.nbytes, q.QSAKV_COPY_DEVICE_TO_HOST,
                       None)
        pages.append(out)
        q.qsakv_cache_destroy(cache)
    assert pages[0].tobytes() == pages[1].tobytes() and pages[0].any()
    # The other parts' arrays are checked against their counts too, naming the field.
    cache = q.qsakv_cache_create(ctx, cfg, None, co)
    st = q.qsakv_step_stores()
    st.k = np.zeros((2, 256), np.float16)
    st.v = np.zeros((1, 256), np.float16)
    st.kv_slot_mapping = np.zeros(2, np.int64)
    st.num_tokens = 2
    with pytest.raises(q.InvalidArgumentError, match="stores.v"):
        q.qsakv_store_step(cache, 3, st, None)
    st = q.qsakv_step_stores()
    st.index_keys = np.zeros((2, 128), np.float16)
    st.index_request_slots = np.zeros(2, np.int64)  # int32 wanted
    st.index_positions = np.zeros(2, np.int64)
    st.num_index_keys = 2
    with pytest.raises(q.InvalidArgumentError, match="stores.index_request_slots"):
        q.qsakv_store_step(cache, 3, st, None)
    q.qsakv_cache_destroy(cache)


def test_ownership_no_leak_no_double_free():
    from test_ownership import heap_in_use

    cfg = config(kv_dtype=q.QSAKV_DTYPE_FP16)
    co = q.qsakv_cache_options()
    q.qsakv_cache_options_init(co)
    co.num_blocks = 2

    def cycle(explicit):
        ctx = cpu_context()
        cache = q.qsakv_cache_create(ctx, cfg, None, co)
        assert cache.thisown and cache._context is ctx
        if explicit:
            q.qsakv_cache_destroy(cache)  # %delobject: the proxy no longer owns it
            assert not cache.thisown
            q.qsakv_cache_destroy(cache)  # a second destroy is a no-op, not a double free
            q.qsakv_context_destroy(ctx)
        # otherwise the proxies destroy both when collected (cache first: it holds ctx)

    for _ in range(20):
        cycle(True)
        cycle(False)
    gc.collect()
    before = heap_in_use()
    for i in range(1000):
        cycle(i % 2 == 0)
    gc.collect()
    ctx = cpu_context()
    per_cycle = q.qsakv_cache_get_layout(q.qsakv_cache_create(ctx, cfg, None, co)).total_bytes
    assert heap_in_use() - before < 20 * per_cycle


def test_cache_keeps_context_alive():
    cfg = config(kv_dtype=q.QSAKV_DTYPE_FP16)
    co = q.qsakv_cache_options()
    q.qsakv_cache_options_init(co)
    co.num_blocks = 2
    cache = q.qsakv_cache_create(cpu_context(), cfg, None, co)  # no other ref to ctx
    gc.collect()
    assert q.qsakv_cache_get_layout(cache).num_blocks > 0
    po = q.qsakv_plan_options()
    q.qsakv_plan_options_init(po)
    po.max_rows = 2
    plan = q.qsakv_plan_create(cache, po)
    del cache
    gc.collect()
    assert q.qsakv_plan_get_info(plan).max_rows == 2


def test_version_constants_match_the_library():
    # They come from the generated qsakv_version.h, which the interface %includes.
    assert q.QSAKV_VERSION_NUMBER == q.qsakv_version()
    assert q.QSAKV_ABI_VERSION == q.qsakv_abi_version()
    assert (f"{q.QSAKV_VERSION_MAJOR}.{q.QSAKV_VERSION_MINOR}.{q.QSAKV_VERSION_PATCH}"
            == q.qsakv_version_string())


def _fp16_cache(ctx, **fields):
    co = q.qsakv_cache_options()
    q.qsakv_cache_options_init(co)
    co.num_blocks = 4
    return q.qsakv_cache_create(ctx, config(kv_dtype=q.QSAKV_DTYPE_FP16, **fields), None, co)


def test_typed_buffers_refuse_wrong_element_types_and_short_arrays():
    """Issue 15, item 5: the checks run before the library is called; a count beyond
    the arrays (the issue's 70000 tokens with 7-row arrays, exit 139 before) raises."""
    ctx = cpu_context()
    cache = _fp16_cache(ctx)
    k = np.zeros((7, 1, 256), np.float16)
    slots = np.arange(7, dtype=np.int64)
    q.qsakv_store_kv(cache, 3, k, k, slots, 7, None)  # the good call
    cases = [
        (r"k: expected float16 elements, got float32",
         lambda: q.qsakv_store_kv(cache, 3, k.astype(np.float32), k, slots, 7, None)),
        (r"slot_mapping: expected int64 elements, got int32",
         lambda: q.qsakv_store_kv(cache, 3, k, k, slots.astype(np.int32), 7, None)),
        (r"k: the call uses 17920000 elements, the array holds 1792 \(shape \[7, 1, 256\]\)",
         lambda: q.qsakv_store_kv(cache, 3, k, k, slots, 70000, None)),
        (r"slot_mapping: the call uses 8 elements, the array holds 7",
         lambda: q.qsakv_store_kv(cache, 3, np.zeros((8, 1, 256), np.float16),
                                  np.zeros((8, 1, 256), np.float16), slots, 8, None)),
        (r"k: the count is negative \(-256\)",
         lambda: q.qsakv_store_kv(cache, 3, k, k, slots, -1 // 256, None)),
        (r"k: expected a C-contiguous array",
         lambda: q.qsakv_store_kv(cache, 3, np.zeros((7, 1, 512), np.float16)[:, :, ::2],
                                  k, slots, 7, None)),
        (r"request_slots: expected int32 elements, got int64",
         lambda: q.qsakv_store_index_keys(cache, 3, np.zeros((7, 128), np.float16), slots,
                                          slots, 7, None)),
        (r"keys: the call uses 1280 elements, the array holds 896",
         lambda: q.qsakv_store_compressed_keys(cache, 3, np.zeros((7, 128), np.float16),
                                               np.arange(10, dtype=np.int64), 10, None)),
        (r"k_scales: expected float32 elements, got float64",
         lambda: q.qsakv_overlay_write("/nonexistent/x", np.array([3], np.int32),
                                       np.ones(1), np.ones(1, np.float32), 1, None)),
        (r"layers: the call uses 2 elements, the array holds 1",
         lambda: q.qsakv_overlay_write("/nonexistent/x", np.array([3], np.int32),
                                       np.ones(2, np.float32), np.ones(2, np.float32), 2,
                                       None)),
        (r"dst: the call uses 100 bytes, the array holds 64",
         lambda: q.qsakv_memcpy(ctx, np.zeros(16, np.float32), slots, 100,
                                q.QSAKV_COPY_DEVICE_TO_HOST, None)),
    ]
    for message, call in cases:
        with pytest.raises(q.InvalidArgumentError, match=message):
            call()
    live = q.qsakv_calib_create(ctx, config())
    with pytest.raises(q.InvalidArgumentError, match=r"v: the call uses 2560 elements"):
        q.qsakv_calib_observe(live, 3, np.zeros((10, 1, 256), np.float16), k, 10, None)
    host = q.qsakv_calib_snapshot(live, None)
    with pytest.raises(q.InvalidArgumentError, match="histogram: expected uint64 elements"):
        q.qsakv_calib_get_stats(host, 3, q.QSAKV_CALIB_K, np.zeros(4096, np.int64))
    with pytest.raises(q.InvalidArgumentError, match="histogram: the call uses 4096"):
        q.qsakv_calib_get_stats(host, 3, q.QSAKV_CALIB_K, np.zeros(100, np.uint64))


def test_select_attention_and_batch_arrays_are_checked_against_the_plan():
    ctx = cpu_context()
    cache = _fp16_cache(ctx)
    po = q.qsakv_plan_options()
    q.qsakv_plan_options_init(po)
    po.max_rows = 4
    plan = q.qsakv_plan_create(cache, po)
    b = q.qsakv_batch()
    bt = np.zeros((2, 1), np.int32)
    b.num_requests, b.block_table, b.block_table_stride = 2, bt, 1
    b.query_start, b.seq_lens = np.array([0, 1], np.int32), np.array([1, 2], np.int32)
    with pytest.raises(q.InvalidArgumentError, match=r"batch.query_start: the call uses 3"):
        q.qsakv_plan_update(plan, b, None)
    b.query_start = np.array([0, 1, 3], np.int64)
    with pytest.raises(q.InvalidArgumentError, match=r"batch.query_start: expected int32"):
        q.qsakv_plan_update(plan, b, None)
    b.query_start = np.array([0, 1, 3], np.int32)
    b.block_table_stride = 5
    with pytest.raises(q.InvalidArgumentError, match=r"batch.block_table: the call uses 10"):
        q.qsakv_plan_update(plan, b, None)
    b.block_table_stride = 1
    q.qsakv_plan_update(plan, b, None)  # 3 rows
    iq = np.zeros((3, 4, 128), np.float16)
    topk = np.full((3, 2051), -1, np.int32)
    q.qsakv_select_topk(plan, 3, iq, topk, 2051, None)
    with pytest.raises(q.InvalidArgumentError, match=r"index_q: the call uses 1536 elements"):
        q.qsakv_select_topk(plan, 3, iq[:2], topk, 2051, None)
    with pytest.raises(q.InvalidArgumentError, match=r"topk: the call uses 6153"):
        q.qsakv_select_topk(plan, 3, iq, topk[:2], 2051, None)
    qq = np.zeros((3, 6, 256), np.float16)
    q.qsakv_attention_run(plan, 3, q.QSAKV_ATTENTION_SPARSE, qq, topk, 2051, qq.copy(), None)
    with pytest.raises(q.InvalidArgumentError, match=r"out: expected float16 elements"):
        q.qsakv_attention_run(plan, 3, q.QSAKV_ATTENTION_DENSE, qq, None, 0,
                              qq.astype(np.float32), None)


def test_destroyed_handles_raise_closed_error():
    """Not "layer 3 is not a QSA layer" from freed memory: ClosedError naming it."""
    assert issubclass(q.ClosedError, q.StateError)
    ctx = cpu_context()
    cache = _fp16_cache(ctx)
    po = q.qsakv_plan_options()
    q.qsakv_plan_options_init(po)
    plan = q.qsakv_plan_create(cache, po)
    k = np.zeros((1, 1, 256), np.float16)
    s = np.zeros(1, np.int64)
    q.qsakv_store_kv(cache, 3, k, k, s, 1, None)
    q.qsakv_cache_destroy(cache)
    with pytest.raises(q.ClosedError, match=r"this cache was destroyed \(qsakv_cache_destroy"):
        q.qsakv_store_kv(cache, 3, k, k, s, 1, None)
    with pytest.raises(q.ClosedError, match="this cache was destroyed"):
        q.qsakv_cache_get_layout(cache)
    with pytest.raises(q.ClosedError, match="this plan was destroyed"):
        q.qsakv_plan_get_info(plan)  # destroyed with its cache, before it (C's order)
    assert not plan.thisown
    q.qsakv_cache_destroy(cache)  # a second destroy stays a no-op
    cache2 = _fp16_cache(ctx)
    q.qsakv_context_destroy(ctx)
    with pytest.raises(q.ClosedError, match="this cache was destroyed"):
        q.qsakv_cache_get_layout(cache2)  # the context destroyed its cache first
    with pytest.raises(q.ClosedError, match="this context was destroyed"):
        q.qsakv_context_get_info(ctx)
    live = q.qsakv_calib_create(cpu_context(), config())
    q.qsakv_calib_destroy(live)
    with pytest.raises(q.ClosedError, match="this calib was destroyed"):
        q.qsakv_calib_start(live)


def test_external_topk_and_merge_counts_are_checked():
    ctx = cpu_context()
    co = q.qsakv_cache_options()
    q.qsakv_cache_options_init(co)
    co.num_blocks = 2
    small = np.zeros((8, 2051), np.int32)
    co.external_topk, co.external_topk_dtype = small, q.QSAKV_DTYPE_INT32
    co.external_topk_rows, co.external_topk_cols = 64, 2051  # more rows than it has
    cfg = config(kv_dtype=q.QSAKV_DTYPE_FP16)
    with pytest.raises(q.InvalidArgumentError, match=r"options.external_topk: the call "
                                                     r"uses 131264 elements, the array holds 16408"):
        q.qsakv_cache_create(ctx, cfg, None, co)
    co.external_topk = np.zeros((64, 2051), np.int32)
    cache = q.qsakv_cache_create(ctx, cfg, None, co)
    assert q.qsakv_cache_get_layout(cache).topk_external == 1
    live = q.qsakv_calib_create(ctx, config())
    host = q.qsakv_calib_snapshot(live, None)
    with pytest.raises(q.InvalidArgumentError, match="num_inputs: 3, but inputs holds 1"):
        q.qsakv_calib_merge([host], 3, q.QSAKV_CALIB_MERGE_RANKS)


def test_overlay_read_scale_file_returns_the_count_and_digest(tmp_path, checkpoint):
    """qsakv_overlay_read_scale_file: the scales land in the caller's arrays, the count
    and the file's SHA-256 come back ([num_layers, sha256]); capacity 0 with None asks
    for the count alone; the arrays are checked against capacity."""
    import hashlib

    wo = q.qsakv_overlay_write_options()
    q.qsakv_overlay_write_options_init(wo)
    wo.base_index_path = str(checkpoint / "model.safetensors.index.json")
    q.qsakv_overlay_write(str(tmp_path / "pack"), np.array([7, 3], np.int32),
                          np.array([2.5, 1.5], np.float32), np.array([0.25, 0.5], np.float32),
                          2, wo)
    f = str(tmp_path / "pack" / "model-kvscales.safetensors")
    sha = hashlib.sha256(open(f, "rb").read()).hexdigest()
    assert q.qsakv_overlay_read_scale_file(f, 0, None, None, None) == [2, sha]
    layers, k, v = np.full(4, -1, np.int32), np.zeros(4, np.float32), np.zeros(4, np.float32)
    assert q.qsakv_overlay_read_scale_file(f, 4, layers, k, v) == [2, sha]
    assert layers[:2].tolist() == [3, 7]  # ascending layer order
    assert k[:2].tolist() == [1.5, 2.5] and v[:2].tolist() == [0.5, 0.25]
    assert layers[2:].tolist() == [-1, -1]
    layers[:] = -1
    assert q.qsakv_overlay_read_scale_file(f, 1, layers, k, v)[0] == 2  # more than capacity
    assert layers.tolist() == [3, -1, -1, -1]
    with pytest.raises(q.InvalidArgumentError, match="k_scales: expected float32 elements"):
        q.qsakv_overlay_read_scale_file(f, 4, layers, np.zeros(4), v)
    with pytest.raises(q.InvalidArgumentError, match="v_scales: the call uses 4 elements, "
                                                     "the array holds 2"):
        q.qsakv_overlay_read_scale_file(f, 4, layers, k, v[:2])
    with pytest.raises(q.IoError):
        q.qsakv_overlay_read_scale_file(str(tmp_path / "missing.safetensors"), 0, None, None,
                                        None)


def test_cache_over_caller_memory_for_every_qsa_layer():
    """qsakv_cache_create_with_memory over NumPy arrays for all of a multi-layer config's
    QSA layers (CPU backend): qsakv_cache_memory is constructed versioned, .layers takes
    a sequence of qsakv_layer_memory; the cache runs on the caller's arrays (stores land
    in them, the same bytes as in a library-allocated cache), keeps them and its context
    alive, and is destroyed with its context; counts beyond the arrays are refused."""
    ctx = cpu_context()
    cfg = config(kv_dtype=q.QSAKV_DTYPE_FP16)
    n = cfg.num_qsa_layers
    layers = cfg.qsa_layers[:n]
    assert n > 1
    co = q.qsakv_cache_options()
    q.qsakv_cache_options_init(co)
    co.num_blocks = 4
    L = q.qsakv_cache_layout_for(cfg, co)
    sizes = {"kv": L.kv_bytes_per_layer, "compressed_keys": L.compressed_bytes_per_layer,
             "ring_keys": L.ring_bytes_per_layer}

    def memory(short=None):
        mem = q.qsakv_cache_memory()
        assert (mem.struct_size, mem.version) == (24, q.QSAKV_CACHE_MEMORY_VERSION)
        entries, arrays = [], []
        for i in range(n):
            e, a = q.qsakv_layer_memory(), {}
            for field, nbytes in sizes.items():
                a[field] = np.full(nbytes - (8 if (i, field) == short else 0), 0x7F, np.uint8)
                setattr(e, field, a[field])
                setattr(e, field.replace("_keys", "") + "_bytes", nbytes)
            entries.append(e)
            arrays.append(a)
        mem.num_layers, mem.layers = n, entries
        assert len(mem.layers) == n and mem.layers[1].kv == arrays[1]["kv"].ctypes.data
        return mem, arrays

    mem, arrays = memory()
    cache = q.qsakv_cache_create_with_memory(ctx, cfg, None, co, mem)
    for i, layer in enumerate(layers):
        b = q.qsakv_cache_get_layer_buffers(cache, layer)
        assert (b.kv, b.compressed_keys, b.ring_keys) == tuple(
            arrays[i][f].ctypes.data for f in ("kv", "compressed_keys", "ring_keys"))
    own = q.qsakv_cache_create(ctx, cfg, None, co)
    rng = np.random.default_rng(5)
    k = rng.standard_normal((3, 1, 256)).astype(np.float16)
    v = rng.standard_normal((3, 1, 256)).astype(np.float16)
    slots = np.array([0, 17, 200], np.int64)
    ck = rng.standard_normal((2, 128)).astype(np.float16)
    cslots = np.array([3, 130], np.int64)
    for c in (cache, own):
        for layer in (layers[0], layers[-1]):
            q.qsakv_store_kv(c, layer, k, v, slots, 3, None)
            q.qsakv_store_compressed_keys(c, layer, ck, cslots, 2, None)
    for i in (0, n - 1):
        b = q.qsakv_cache_get_layer_buffers(own, layers[i])
        for field, nbytes in (("kv", sizes["kv"]), ("compressed_keys", sizes["compressed_keys"])):
            want = np.empty(nbytes, np.uint8)
            q.qsakv_memcpy(ctx, want, getattr(b, field), nbytes, q.QSAKV_COPY_DEVICE_TO_HOST,
                           None)
            got = arrays[i][field]
            written = got != 0x7F  # the rest is the caller's poison, used as it is
            assert written.any()
            np.testing.assert_array_equal(got[written], want[written])
    assert (arrays[1]["kv"] == 0x7F).all()  # a layer nothing was stored into
    # The cache holds the struct and the arrays it was set from; and its context.
    kv_last = arrays[-1]["kv"].ctypes.data
    del mem, arrays, ctx
    gc.collect()
    q.qsakv_store_kv(cache, layers[-1], k, v, slots, 3, None)
    assert q.qsakv_cache_get_layer_buffers(cache, layers[-1]).kv == kv_last
    q.qsakv_context_destroy(cache._context)
    with pytest.raises(q.ClosedError, match="this cache was destroyed"):
        q.qsakv_cache_get_layout(cache)

    ctx = cpu_context()
    mem, _ = memory()
    mem.num_layers = n + 1
    with pytest.raises(q.InvalidArgumentError,
                       match=f"memory.num_layers: {n + 1}, but memory.layers holds {n}"):
        q.qsakv_cache_create_with_memory(ctx, cfg, None, co, mem)
    mem.num_layers = 1
    with pytest.raises(q.InvalidArgumentError, match="memory.num_layers is 1"):
        q.qsakv_cache_create_with_memory(ctx, cfg, None, co, mem)
    mem, _ = memory(short=(1, "ring_keys"))
    with pytest.raises(q.InvalidArgumentError,
                       match=r"memory.layers\[1\].ring_keys: the call uses %d bytes"
                       % sizes["ring_keys"]):
        q.qsakv_cache_create_with_memory(ctx, cfg, None, co, mem)
    with pytest.raises(TypeError, match=r"layers\[0\]: expected a qsakv_layer_memory"):
        mem.layers = [cfg]
