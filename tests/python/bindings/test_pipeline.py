"""The demo's flow through the ctypes package on the CPU backend, against FP64 NumPy
oracles: overlay write -> load -> validate -> E4M3 cache -> store -> plan -> select ->
attention (sparse and dense), and the FP16 cache beside it."""
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

import qsakv
from qsakv import _buffers
from reference import (attention_reference, calibrate, make_world, quantise_e4m3, rel_l2,
                       select_reference)


@pytest.fixture
def world(small_cfg):
    return make_world(small_cfg, small_cfg.rank_geometry())


@pytest.fixture
def overlay(tmp_path, checkpoint, small_cfg, world):
    ks, vs = calibrate(world.k), calibrate(world.v)
    qsakv.Overlay.write(tmp_path / "pack", {l: (ks, vs) for l in small_cfg.qsa_layers},
                        base_index_path=checkpoint / "model.safetensors.index.json",
                        contract_tp_size=4, contract_speculative_tokens=0,
                        contract_activation_dtype="fp16")
    with qsakv.Overlay.load(tmp_path / "pack" / "model-kvscales.safetensors") as ov:
        yield ov, ks, vs


def run(ctx, cfg, ov, w, mode="sparse"):
    """Store, plan, select into our own top-k array, attend. Returns (out, topk, cache
    bytes of the layer)."""
    layer = cfg.qsa_layers[0]
    geo = cfg.rank_geometry()
    with qsakv.Cache(ctx, cfg, ov, num_blocks=w.num_blocks) as cache, \
            qsakv.Plan(cache, max_rows=w.num_rows) as plan:
        cache.store_kv(layer, w.k, w.v, w.slots)
        cache.store_compressed_keys(layer, w.ck, w.cslots)
        plan.update(qsakv.Batch(w.query_start, w.lens, w.bt))
        info = plan.info
        assert (info.num_rows, info.num_requests) == (w.num_rows, len(w.lens))
        topk = np.full((w.num_rows, geo.topk_width + 5), -7, np.int32)  # poisoned, wider
        plan.select_topk(layer, w.iq, topk)
        out = np.full(w.q.shape, np.nan, np.float16)
        plan.attention(layer, w.q, out, mode=mode, topk=topk)
        return out, topk, cache.read_kv(layer)


def test_overlay_roundtrip(overlay, checkpoint, small_cfg):
    ov, ks, vs = overlay
    info = ov.info
    assert info.num_scales == 2 * len(small_cfg.qsa_layers)
    assert info.validated == 0
    assert info.contract_tp_size == 4 and info.contract_activation_dtype == qsakv.DType.FP16
    assert info.base_index_sha256 == qsakv.checkpoint_revision(checkpoint)
    assert ov.scales(small_cfg.qsa_layers[-1]) == (np.float32(ks), np.float32(vs))
    with pytest.raises(qsakv.InvalidArgumentError, match="0"):
        ov.scales(0)  # not a QSA layer


def test_full_pipeline_e4m3_against_fp64_reference(cpu, small_cfg, world, overlay, checkpoint):
    ov, ks, vs = overlay
    cfg, w, geo = small_cfg, world, small_cfg.rank_geometry()
    revision = qsakv.checkpoint_revision(checkpoint)
    wrong = ("1" if revision[0] == "0" else "0") + revision[1:]
    with pytest.raises(qsakv.RevisionMismatchError) as e:
        ov.validate(cfg, wrong)
    assert wrong[:16] in e.value.message or revision[:16] in e.value.message
    assert ov.info.validated == 0
    ov.validate(cfg, revision)
    assert ov.info.validated == 1

    out, topk, kv = run(cpu, cfg, ov, w)

    # Store: bit for bit what ml_dtypes makes of e4m3(x / scale), at each token's slot.
    bs = cfg.block_size
    blocks, offs = w.slots // bs, w.slots % bs
    np.testing.assert_array_equal(kv[blocks, 0, offs], quantise_e4m3(w.k, ks).view(np.uint8))
    np.testing.assert_array_equal(kv[blocks, 1, offs], quantise_e4m3(w.v, vs).view(np.uint8))

    # Selection: exact, including the -1 padding; the extra columns are untouched.
    np.testing.assert_array_equal(topk[:, : geo.topk_width], select_reference(w, cfg, geo))
    assert (topk[:, geo.topk_width:] == -7).all()
    # The decode row at 3001 tokens: the whole budget plus the open group's one token.
    assert (topk[0, :geo.topk_width] >= 0).sum() == geo.topk_blocks * cfg.compress_ratio + 1

    # Attention against FP64 over the decoded cache values.
    dk = kv[blocks, 0, offs].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    dv = kv[blocks, 1, offs].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    ref = attention_reference(w, cfg, geo, dk, dv, ks, vs, topk[:, : geo.topk_width])
    assert np.isfinite(out).all()
    assert rel_l2(out, ref) < 2e-3

    # And against the unquantised FP16 inputs: the E4M3 error the demo reports.
    ref16 = attention_reference(w, cfg, geo, w.k.astype(np.float64), w.v.astype(np.float64),
                                1.0, 1.0, topk[:, : geo.topk_width])
    assert 1e-3 < rel_l2(out, ref16) < 0.1


def test_dense_and_fp16_cache(cpu, small_cfg, world):
    cfg = small_cfg.replace(kv_dtype="fp16")
    w, geo = world, cfg.rank_geometry()
    out, topk, kv = run(cpu, cfg, None, w, mode="dense")
    bs = cfg.block_size
    np.testing.assert_array_equal(kv[w.slots // bs, 0, w.slots % bs], w.k)  # a plain copy
    ref = attention_reference(w, cfg, geo, w.k.astype(np.float64), w.v.astype(np.float64),
                              1.0, 1.0, None)
    assert rel_l2(out, ref) < 2e-3


def test_layout_and_layer_buffers(cpu, small_cfg, world, overlay, checkpoint):
    ov, _, _ = overlay
    ov.validate(small_cfg, qsakv.checkpoint_revision(checkpoint))
    with qsakv.Cache(cpu, small_cfg, ov, num_blocks=32) as cache:
        L = cache.layout
        assert L.kv_dtype == qsakv.DType.E4M3 and L.num_blocks == 32
        assert (L.kv_heads, L.head_dim) == (1, 256)
        assert L.kv_stride_kv == L.block_size * L.kv_heads * L.head_dim
        assert L.kv_bytes_per_layer == 32 * 2 * L.block_size * 256
        assert L.topk_cols == small_cfg.rank_geometry().topk_width
        bufs = [cache.layer_buffers(l) for l in small_cfg.qsa_layers]
        with pytest.raises(qsakv.InvalidArgumentError, match="layer"):
            cache.layer_buffers(0)


def test_layer_buffers_are_typed_views_of_the_cache(cpu, small_cfg, world, overlay,
                                                     checkpoint):
    """Item 1 of issue 15: arrays with the layout's shapes and dtypes over the cache's
    own memory (no copy), never bare integers."""
    ov, ks, vs = overlay
    ov.validate(small_cfg, qsakv.checkpoint_revision(checkpoint))
    w = world
    with qsakv.Cache(cpu, small_cfg, ov, num_blocks=w.num_blocks) as cache:
        L, cfg = cache.layout, small_cfg
        bufs = [cache.layer_buffers(l) for l in cfg.qsa_layers]
        for b in bufs:
            assert all(isinstance(x, np.ndarray) for x in b), [type(x) for x in b]
        b = bufs[0]
        assert (b.kv.dtype, b.kv.shape) == (np.uint8, (L.num_blocks, 2, L.block_size, 1, 256))
        assert b.kv.nbytes == L.kv_bytes_per_layer
        assert b.kv.strides == (L.kv_stride_block, L.kv_stride_kv, L.kv_stride_token,
                                L.kv_stride_head, 1)  # bytes = elements for uint8
        assert (b.compressed_keys.dtype, b.compressed_keys.shape) == \
            (np.float16, (L.num_blocks, L.block_size // cfg.compress_ratio,
                          cfg.index_head_dim))
        assert (b.ring_keys.dtype, b.ring_keys.shape) == \
            (np.float16, (cfg.max_requests, L.ring_length, cfg.index_head_dim))
        assert (b.topk.dtype, b.topk.shape) == (np.int32, (L.topk_rows, L.topk_cols))
        assert b.scales.dtype == np.float32 and b.scales.tolist() == [np.float32(ks),
                                                                      np.float32(vs)]
        ptr = lambda a: a.__array_interface__["data"][0]  # noqa: E731
        assert len({ptr(x.kv) for x in bufs}) == len(bufs)  # one main cache per layer
        assert len({ptr(x.topk) for x in bufs}) == 1         # one shared top-k buffer
        assert not b.kv.any()  # the cache starts zeroed
        # The views are the cache's memory: a store shows in them, equal to read_kv.
        layer = cfg.qsa_layers[0]
        cache.store_kv(layer, w.k, w.v, w.slots)
        cache.store_compressed_keys(layer, w.ck, w.cslots)
        np.testing.assert_array_equal(b.kv, cache.read_kv(layer))
        blocks, offs = w.slots // L.block_size, w.slots % L.block_size
        np.testing.assert_array_equal(b.kv[blocks, 0, offs],
                                      quantise_e4m3(w.k, ks).view(np.uint8))
        c = w.cslots // cfg.compress_ratio
        np.testing.assert_array_equal(
            b.compressed_keys.reshape(-1, cfg.index_head_dim)[c], w.ck)
        # ... and writes through a view reach the library (a swap-in of codes).
        b.kv[0, 1, 0, 0, :4] = [1, 2, 3, 4]
        cache.note_external_codes(layer)
        assert cache.read_kv(layer)[0, 1, 0, 0, :4].tolist() == [1, 2, 3, 4]
        # A view holds the cache's memory (its keeper), which outlives close() until the
        # last view is gone (test_ownership.py).
        assert b.kv.base._owner is cache._pin()


def test_layer_buffer_scales_are_read_only(cpu, small_cfg, world, overlay, checkpoint):
    """qsakv_layer_buffers.scales is a const float*: the view is read-only, for good, so
    the validated scales of an E4M3 cache cannot be overwritten through it (before, the
    view was writable: b.scales[:] = 1.0 replaced them). The other buffers stay
    writable (the C API's void*)."""
    ov, ks, vs = overlay
    ov.validate(small_cfg, qsakv.checkpoint_revision(checkpoint))
    with qsakv.Cache(cpu, small_cfg, ov, num_blocks=world.num_blocks) as cache:
        b = cache.layer_buffers(small_cfg.qsa_layers[0])
        assert not b.scales.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            b.scales[:] = 1.0
        with pytest.raises(ValueError, match="read-only"):
            b.scales[0] = 2.0
        with pytest.raises(ValueError):
            b.scales.setflags(write=True)
        with pytest.raises(ValueError, match="read-only"):
            np.asarray(b.scales)[1] = 3.0
        want = [np.float32(ks), np.float32(vs)]
        assert b.scales.tolist() == want
        assert cache.layer_buffers(small_cfg.qsa_layers[0]).scales.tolist() == want
        assert all(x.flags.writeable for x in (b.kv, b.compressed_keys, b.ring_keys, b.topk))
        # As an output the package refuses it, as any read-only array.
        with pytest.raises(qsakv.InvalidArgumentError, match="read-only"):
            _buffers.check(b.scales, "out", "float32", (2,), backend_cuda=False,
                           writable=True)


def test_layer_buffers_16bit_and_device_array_interface(cpu, small_cfg):
    with qsakv.Cache(cpu, small_cfg.replace(kv_dtype="bf16", activation_dtype="bf16"),
                     num_blocks=2) as cache:
        kv = cache.layer_buffers(3).kv
        assert kv.dtype == ml_dtypes.bfloat16 and kv.shape == (2, 2, 64, 1, 256)
        assert cache.layer_buffers(3).scales.tolist() == [1.0, 1.0]
    # The CUDA backend's views: __cuda_array_interface__ v3 with the same shapes.
    from qsakv._views import DeviceArray

    d = DeviceArray(0x7F0000001000, (4, 2, 64, 1, 256), "uint8",
                    strides=(32768, 16384, 256, 256, 1), device=1)
    cai = d.__cuda_array_interface__
    assert cai == {"shape": (4, 2, 64, 1, 256), "typestr": "|u1",
                   "data": (0x7F0000001000, False), "strides": (32768, 16384, 256, 256, 1),
                   "version": 3, "stream": None}
    assert d.nbytes == 4 * 2 * 64 * 256 and "cuda:1" in repr(d)
    f = DeviceArray(0x1000, (3, 2), "float16", strides=(2, 1))
    assert f.__cuda_array_interface__["strides"] == (4, 2)
    assert _buffers.describe(f).shape == (3, 2)  # the package itself accepts its views
    assert d.readonly is False and _buffers.describe(d).writable
    # Memory the C API declares const (layer_buffers().scales on CUDA): the interface's
    # read-only flag, which the package honours too.
    r = DeviceArray(0x2000, (2,), "float32", device=0, readonly=True)
    assert r.__cuda_array_interface__["data"] == (0x2000, True)
    assert not _buffers.describe(r).writable and "read-only" in repr(r)


def test_capacity_plan(small_cfg):
    e = qsakv.capacity_plan(small_cfg, 40 << 30)
    f = qsakv.capacity_plan(small_cfg.replace(kv_dtype="fp16"), 40 << 30)
    assert e.num_tokens == e.num_blocks * small_cfg.block_size
    assert e.fp16_num_tokens == f.num_tokens
    assert 1.8 < e.capacity_ratio < 1.95
    assert e.topk_bytes * len(small_cfg.qsa_layers) == e.topk_bytes_unshared


def test_model_config_attribute_access():
    cfg = qsakv.ModelConfig.preset("qwen4_exp")
    assert cfg.num_layers == 48 and cfg.qsa_layers == tuple(range(3, 48, 4))
    assert cfg.kv_dtype is qsakv.DType.E4M3 and cfg.activation_dtype is qsakv.DType.FP16
    geo = cfg.rank_geometry()
    assert (geo.q_heads, geo.kv_heads, geo.topk_width, geo.topk_blocks) == (24, 2, 2051, 512)
    c2 = cfg.replace(qsa_layers=[3, 7], tp_size=2)
    assert c2.num_qsa_layers == 2 and c2.tp_size == 2 and cfg.tp_size == 1
    assert c2 != cfg and cfg.copy() == cfg
    with pytest.raises(AttributeError):
        cfg.no_such_field = 1
    bad = cfg.replace(head_dim=100)
    with pytest.raises(qsakv.InvalidConfigError, match="head_dim"):
        bad.validate()
    with pytest.raises(qsakv.InvalidConfigError, match="head_dim"):
        bad.rank_geometry()


def test_materialize(tmp_path, checkpoint, small_cfg, overlay):
    ov, ks, _ = overlay
    out = tmp_path / "calibrated"
    qsakv.Overlay.materialize(out, checkpoint, tmp_path / "pack")
    with qsakv.Overlay.load(out) as ov2:  # the directory form
        ov2.validate(small_cfg, qsakv.checkpoint_revision(checkpoint))
        assert ov2.scales(3)[0] == np.float32(ks)
    with pytest.raises(qsakv.InvalidArgumentError):
        qsakv.Overlay.materialize(out, checkpoint, tmp_path / "pack")  # exists


# E4M3 compressed index keys ---------------------------------------------------------------

def test_index_key_dtype_config():
    """index_key_dtype: FP16 by default (init and preset), E4M3 validates, anything else
    is refused naming the field."""
    assert qsakv.ModelConfig().index_key_dtype is qsakv.DType.FP16
    cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4)
    assert cfg.index_key_dtype is qsakv.DType.FP16 and "index_key_dtype" in cfg.to_dict()
    e4 = cfg.replace(index_key_dtype="e4m3")
    assert e4.index_key_dtype is qsakv.DType.E4M3 and e4 != cfg
    e4.validate()
    assert e4.rank_geometry() == cfg.rank_geometry()
    assert qsakv.ModelConfig.preset("qwen4_exp", index_key_dtype=qsakv.DType.E4M3) \
        .index_key_dtype is qsakv.DType.E4M3
    for bad in ("bf16", qsakv.DType.FP32, qsakv.DType.INVALID):
        with pytest.raises(qsakv.InvalidConfigError, match="index_key_dtype"):
            cfg.replace(index_key_dtype=bad).validate()
    raw = cfg.copy()
    raw._c.index_key_dtype = 99  # not a DType at all: read back as the int
    assert raw.index_key_dtype == 99
    with pytest.raises(qsakv.InvalidConfigError, match="index_key_dtype"):
        raw.validate()
    with pytest.raises(ValueError, match="dtype"):
        cfg.index_key_dtype = "fp8e5"


def test_layout_reports_the_e4m3_page():
    """The reference preset's page: 16 keys of 128 dims; E4M3 2048 code bytes, then 16
    FP32 scales at 2048, 2112 bytes a page (FP16: 4096, no scales)."""
    cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4, max_batched_tokens=64,
                                   max_requests=8, max_model_len=8192)
    f = qsakv.layout_for(cfg, num_blocks=8)
    assert f.index_key_dtype is qsakv.DType.FP16
    assert (f.index_head_dim, f.compressed_keys_per_block) == (128, 16)
    assert (f.compressed_stride_block, f.compressed_scales_offset) == (4096, -1)
    assert f.compressed_bytes_per_layer == 8 * 4096
    e = qsakv.layout_for(cfg.replace(index_key_dtype="e4m3"), num_blocks=8)
    assert e.index_key_dtype is qsakv.DType.E4M3
    assert (e.index_head_dim, e.compressed_keys_per_block) == (128, 16)
    assert (e.compressed_stride_block, e.compressed_scales_offset) == (2112, 2048)
    assert e.compressed_stride_block % 16 == 0
    assert e.compressed_bytes_per_layer == 8 * 2112
    assert e.kv_bytes_per_layer == f.kv_bytes_per_layer
    shapes = qsakv.memory_shapes(cfg, e)
    assert shapes["compressed_keys"] == ((8, 2112), ("uint8",))
    assert qsakv.memory_shapes(cfg, f)["compressed_keys"] == ((8, 16, 128), ("float16",))


def test_capacity_with_e4m3_index_keys():
    """132 / 4 = 33 bytes per token per layer for the index keys: the reference model at
    TP4 takes 6,540 bytes per token against the all-FP16 13,056 (about 2x)."""
    cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4)
    f = qsakv.capacity_plan(cfg, 40 << 30)
    e = qsakv.capacity_plan(cfg.replace(index_key_dtype="e4m3"), 40 << 30)
    assert f.bytes_per_token == 6912 and f.compressed_bytes_per_token == 12 * 64
    assert e.compressed_bytes_per_token == 12 * 33
    assert e.bytes_per_token == 6540 and e.fp16_bytes_per_token == 13056
    assert e.fp16_num_tokens == f.fp16_num_tokens and e.num_tokens > f.num_tokens
    assert e.ideal_ratio >= 1.99 and e.capacity_ratio >= 1.99
    assert e.ideal_ratio == pytest.approx(13056 / 6540)


def quantise_keys_e4m3(keys):
    """The store's per-key quantisation: scale = max |x| / 448 (FP32), codes
    e4m3(fp32(x) / scale)."""
    x = keys.astype(np.float32)
    scale = (np.abs(x).max(axis=1) / np.float32(448.0)).astype(np.float32)
    codes = (x / scale[:, None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return codes, scale


def test_pipeline_with_e4m3_index_keys(cpu, small_cfg, world):
    """Store compressed keys as E4M3 pages and select: codes and scales bit for bit what
    ml_dtypes makes of them at each key's page, and the selection the FP64 reference
    makes over the decoded keys."""
    cfg = small_cfg.replace(kv_dtype="fp16", index_key_dtype="e4m3")
    w, geo = world, cfg.rank_geometry()
    # Every key's max |x| is 3: one scale for all, so the ordering of the scores is that
    # of the exact (integer) code sums and the selection is unambiguous.
    ck = w.ck.copy()
    ck[:, 0] = 3
    w = replace(w, ck=ck)
    codes, scale = quantise_keys_e4m3(ck)
    layer = cfg.qsa_layers[0]
    with qsakv.Cache(cpu, cfg, num_blocks=w.num_blocks) as cache, \
            qsakv.Plan(cache, max_rows=w.num_rows) as plan:
        L = cache.layout
        assert (L.index_key_dtype, L.compressed_stride_block) == (qsakv.DType.E4M3, 2112)
        b = cache.layer_buffers(layer)
        assert (b.compressed_keys.dtype, b.compressed_keys.shape) == \
            (np.uint8, (L.num_blocks, 2112))
        views = cache.compressed_key_views(layer)
        assert views.dtype is qsakv.DType.E4M3
        assert views.keys.shape == (L.num_blocks, 16, 128) and views.keys.dtype == np.uint8
        assert views.scales.shape == (L.num_blocks, 16) and views.scales.dtype == np.float32
        ptr = lambda a: a.__array_interface__["data"][0]  # noqa: E731
        assert ptr(views.pages) == ptr(b.compressed_keys) == ptr(views.keys)
        assert ptr(views.scales) == ptr(views.pages) + 2048
        assert views.keys.strides == (2112, 128, 1) and views.scales.strides == (2112, 4)

        cache.store_compressed_keys(layer, ck, w.cslots)
        entry = w.cslots // cfg.compress_ratio
        blk, j = entry // L.compressed_keys_per_block, entry % L.compressed_keys_per_block
        np.testing.assert_array_equal(views.keys[blk, j], codes)
        np.testing.assert_array_equal(views.scales[blk, j], scale)
        page = views.pages[blk[0]]
        np.testing.assert_array_equal(page[j[0] * 128:(j[0] + 1) * 128], codes[0])
        assert page[2048 + 4 * j[0]:2048 + 4 * j[0] + 4].view(np.float32)[0] == scale[0]

        plan.update(qsakv.Batch(w.query_start, w.lens, w.bt))
        topk = np.full((w.num_rows, geo.topk_width), -7, np.int32)
        plan.select_topk(layer, w.iq, topk)
    decoded = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale[:, None]
    np.testing.assert_array_equal(topk, select_reference(replace(w, ck=decoded), cfg, geo))
    # The decode row (3001 tokens, 750 visible blocks) chose: the budget plus the open
    # group's one token.
    assert (topk[0] >= 0).sum() == geo.topk_blocks * cfg.compress_ratio + 1


def test_compressed_key_views_fp16(cpu, small_cfg, world):
    cfg = small_cfg.replace(kv_dtype="fp16")
    layer = cfg.qsa_layers[0]
    with qsakv.Cache(cpu, cfg, num_blocks=world.num_blocks) as cache:
        views = cache.compressed_key_views(layer)
        L = cache.layout
        assert views.dtype is qsakv.DType.FP16 and views.scales is None
        assert views.pages.shape == (L.num_blocks, 4096) and views.pages.dtype == np.uint8
        assert views.keys.shape == (L.num_blocks, 16, 128) and views.keys.dtype == np.float16
        cache.store_compressed_keys(layer, world.ck, world.cslots)
        c = world.cslots // cfg.compress_ratio
        np.testing.assert_array_equal(views.keys.reshape(-1, 128)[c], world.ck)
        np.testing.assert_array_equal(cache.layer_buffers(layer).compressed_keys, views.keys)


def test_e4m3_index_key_store_matches_ml_dtypes(cpu, small_cfg):
    """Keys of every magnitude (E4M3 subnormal codes included), bit for bit the header's
    quantisation; an all-zero key and keys with a NaN or an infinite element are stored as
    scale 0 and codes 0."""
    cfg = small_cfg.replace(kv_dtype="fp16", index_key_dtype="e4m3")
    rng = np.random.default_rng(7)
    n = 64
    x = rng.standard_normal((n, 128)) * 10.0 ** rng.integers(-6, 5, (n, 1))
    x[:, 5] *= 200  # wide dynamic range: the small elements become subnormal codes
    keys = np.clip(x, -60000, 60000).astype(np.float16)
    keys[0] = 0
    keys[1, 3] = np.nan
    keys[2, 7] = np.inf
    keys[3, 9] = -np.inf
    slots = np.arange(n, dtype=np.int64) * cfg.compress_ratio
    with qsakv.Cache(cpu, cfg, num_blocks=n // 16) as cache:
        cache.store_compressed_keys(cfg.qsa_layers[0], keys, slots)
        v = cache.compressed_key_views(cfg.qsa_layers[0])
        got_codes = v.keys.reshape(n, 128).copy()
        got_scales = v.scales.reshape(n).copy()
    codes, scale = quantise_keys_e4m3(keys[4:])
    np.testing.assert_array_equal(got_scales[4:], scale)
    np.testing.assert_array_equal(got_codes[4:], codes)
    assert (got_scales[:4] == 0).all() and (got_codes[:4] == 0).all()
    assert (np.abs(got_codes[4:].view(ml_dtypes.float8_e4m3fn).astype(np.float32))
            .max(axis=1) == 448).all()
    assert (got_codes[4:] & 0x7F != 0x7F).all()  # never a NaN code
    assert ((got_codes[4:] & 0x78 == 0) & (got_codes[4:] & 0x07 != 0)).any()  # subnormals


def test_store_step_equals_the_three_stores(overlay, small_cfg, world, checkpoint):
    """Cache.store_step (qsakv_store_step) stores the bytes of store_kv, store_index_keys
    and store_compressed_keys, with every part and with parts left out."""
    ov, _, _ = overlay
    ov.validate(small_cfg, qsakv.checkpoint_revision(checkpoint))
    w, layer = world, small_cfg.qsa_layers[0]
    n = len(w.cslots)
    keys = w.ck
    req = (np.arange(n) % small_cfg.max_requests).astype(np.int32)
    pos = np.arange(n, dtype=np.int64)
    with qsakv.Context("cpu") as ctx:
        def stored(fn):
            with qsakv.Cache(ctx, small_cfg, ov, num_blocks=w.num_blocks) as cache:
                fn(cache)
                lb = cache.layer_buffers(layer)  # host views on the CPU backend
                return tuple(np.asarray(b).tobytes()
                             for b in (lb.kv, lb.ring_keys, lb.compressed_keys))

        for kv, ring, comp in [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)]:
            def calls(cache):
                if kv:
                    cache.store_kv(layer, w.k, w.v, w.slots)
                if ring:
                    cache.store_index_keys(layer, keys, req, pos)
                if comp:
                    cache.store_compressed_keys(layer, keys, w.cslots)

            def step(cache):
                cache.store_step(layer, **(dict(k=w.k, v=w.v, slot_mapping=w.slots) if kv else {}),
                                 **(dict(index_keys=keys, request_slots=req, positions=pos)
                                    if ring else {}),
                                 **(dict(compressed_keys=keys, compressed_slot_mapping=w.cslots)
                                    if comp else {}))

            assert stored(calls) == stored(step), (kv, ring, comp)


def test_unit_scale_overlay_backs_a_cache_only_when_asked(tmp_path, checkpoint, small_cfg):
    """A pack of nothing but 1.0 validates, and Cache refuses it (OverlayUnitScalesError,
    an OverlayError naming the option) unless allow_unit_scales=True."""
    qsakv.Overlay.write(tmp_path / "unit", {l: (1.0, 1.0) for l in small_cfg.qsa_layers},
                        base_index_path=checkpoint / "model.safetensors.index.json")
    with qsakv.Context(backend="cpu") as ctx, \
            qsakv.Overlay.load(tmp_path / "unit" / "model-kvscales.safetensors") as ov:
        ov.validate(small_cfg, qsakv.checkpoint_revision(checkpoint))
        with pytest.raises(qsakv.OverlayUnitScalesError, match="allow_unit_scales") as e:
            qsakv.Cache(ctx, small_cfg, ov, num_blocks=2)
        assert isinstance(e.value, qsakv.OverlayError)
        with qsakv.Cache(ctx, small_cfg, ov, num_blocks=2, allow_unit_scales=True) as cache:
            assert list(cache.layer_buffers(small_cfg.qsa_layers[0]).scales) == [1.0, 1.0]
