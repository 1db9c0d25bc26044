"""Caches over caller-owned memory through the ctypes package (CPU backend, NumPy
arrays): the same results as a library-allocated cache, the caller's arrays are the
cache's memory, and wrong arrays are refused naming memory[i].field."""
import numpy as np
import pytest

import qsakv
from conftest import run_isolated
from reference import make_world
from test_pipeline import overlay, world  # noqa: F401 (fixtures)


def own_memory(cfg, num_blocks):
    layout = qsakv.layout_for(cfg, num_blocks=num_blocks)
    shapes = qsakv.memory_shapes(cfg, layout)
    mem = []
    for _ in cfg.qsa_layers:
        entry = {}
        for field, (shape, dtypes) in shapes.items():
            a = np.empty(shape, np.dtype(dtypes[0]))
            a.view(np.uint8)[...] = 0x7F  # poison: only what a store wrote may be read
            entry[field] = a
        mem.append(entry)
    return layout, mem


def pipeline(ctx, cfg, ov, w, **cache_kw):
    layer = cfg.qsa_layers[0]
    geo = cfg.rank_geometry()
    with qsakv.Cache(ctx, cfg, ov, num_blocks=w.num_blocks, **cache_kw) as cache, \
            qsakv.Plan(cache, max_rows=w.num_rows) as plan:
        cache.store_kv(layer, w.k, w.v, w.slots)
        cache.store_compressed_keys(layer, w.ck, w.cslots)
        plan.update(qsakv.Batch(w.query_start, w.lens, w.bt))
        topk = np.full((w.num_rows, geo.topk_width), -7, np.int32)
        plan.select_topk(layer, w.iq, topk)
        out = np.full(w.q.shape, np.nan, np.float16)
        plan.attention(layer, w.q, out, topk=topk)
        return out, topk, cache.read_kv(layer)


def test_caller_memory_matches_library_memory(cpu, small_cfg, world, overlay, checkpoint):
    ov = overlay[0]
    ov.validate(small_cfg, qsakv.checkpoint_revision(checkpoint))
    layout, mem = own_memory(small_cfg, world.num_blocks)
    assert layout.kv_bytes_per_layer == mem[0]["kv"].nbytes
    want = pipeline(cpu, small_cfg, ov, world)
    got = pipeline(cpu, small_cfg, ov, world, memory=mem)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert np.isfinite(got[0].astype(np.float32)).all()
    # The caller's array is the cache: what the store wrote is in it.
    layer0 = 0  # index of config.qsa_layers[0]
    np.testing.assert_array_equal(mem[layer0]["kv"], got[2])


def test_caller_memory_refusals(cpu, small_cfg, world, overlay, checkpoint):
    ov = overlay[0]
    ov.validate(small_cfg, qsakv.checkpoint_revision(checkpoint))
    _, mem = own_memory(small_cfg, world.num_blocks)
    with pytest.raises(qsakv.InvalidArgumentError, match="one entry per QSA layer"):
        qsakv.Cache(cpu, small_cfg, ov, num_blocks=world.num_blocks, memory=mem[:1])
    bad = [dict(e) for e in mem]
    bad[1]["compressed_keys"] = bad[1]["compressed_keys"].astype(np.float32)
    with pytest.raises(qsakv.InvalidArgumentError,
                       match=r"memory\[1\]\.compressed_keys \(layer %d\)" % small_cfg.qsa_layers[1]):
        qsakv.Cache(cpu, small_cfg, ov, num_blocks=world.num_blocks, memory=bad)
    bad = [dict(e) for e in mem]
    bad[0]["kv"] = bad[0]["kv"][:-1]
    with pytest.raises(qsakv.InvalidArgumentError, match=r"memory\[0\]\.kv"):
        qsakv.Cache(cpu, small_cfg, ov, num_blocks=world.num_blocks, memory=bad)
    with pytest.raises(qsakv.InvalidArgumentError, match="num_blocks"):
        qsakv.layout_for(small_cfg, num_blocks=0)


def test_caller_memory_with_e4m3_index_keys(cpu, small_cfg, world):
    """E4M3 index keys: the caller allocates the raw pages (uint8 [num_blocks,
    compressed_stride_block]) and gets the library-allocated cache's results."""
    cfg = small_cfg.replace(kv_dtype="fp16", index_key_dtype="e4m3")
    layout, mem = own_memory(cfg, world.num_blocks)
    assert mem[0]["compressed_keys"].shape == (world.num_blocks, layout.compressed_stride_block)
    assert mem[0]["compressed_keys"].nbytes == layout.compressed_bytes_per_layer
    want = pipeline(cpu, cfg, None, world)
    got = pipeline(cpu, cfg, None, world, memory=mem)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    # The FP16-shaped array of the same layer is refused: E4M3 pages are bytes.
    bad = [dict(e) for e in mem]
    bad[0]["compressed_keys"] = np.zeros((world.num_blocks, 16, 128), np.float16)
    with pytest.raises(qsakv.InvalidArgumentError, match=r"memory\[0\]\.compressed_keys"):
        qsakv.Cache(cpu, cfg, num_blocks=world.num_blocks, memory=bad)


def test_caller_memory_lives_as_long_as_the_cache_and_its_views(small_cfg):
    """The Cache holds the arrays it checked, not the caller's container: emptying the
    list frees nothing, and a view of the memory keeps the arrays after the Cache is
    gone (README: a view keeps the memory it shows allocated). Likewise external_topk."""
    import gc
    import weakref

    cfg = small_cfg.replace(kv_dtype="fp16")
    geo = cfg.rank_geometry()
    with qsakv.Context("cpu") as ctx:
        _, mem = own_memory(cfg, 4)
        topk = np.zeros((cfg.max_batched_tokens, geo.topk_width), np.int32)
        refs = [weakref.ref(a) for e in mem for a in e.values()] + [weakref.ref(topk)]
        cache = qsakv.Cache(ctx, cfg, num_blocks=4, memory=mem, external_topk=topk)
        mem[0]["kv"] = None
        mem.clear()
        del topk
        gc.collect()
        assert all(r() is not None for r in refs), "the cache let the caller's arrays go"
        view = cache.layer_buffers(cfg.qsa_layers[0])
        del cache
        gc.collect()
        assert all(r() is not None for r in refs), "a view let the caller's arrays go"
        assert (view.kv[0].view(np.uint16) == 0x7F7F).all()  # own_memory's poison
        del view
        gc.collect()
        assert all(r() is None for r in refs), "the arrays outlived the cache and views"


def test_caller_memory_use_after_the_caller_drops_it_does_not_crash():
    """The audit's reproductions, each in its own interpreter (they crashed it: the
    library wrote into, and views read, arrays already freed)."""
    r = run_isolated("""
        import gc
        import numpy as np
        import qsakv
        ctx = qsakv.Context("cpu")
        cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4, max_batched_tokens=64,
                                       max_requests=8, max_model_len=8192, kv_dtype="fp16")
        layer = cfg.qsa_layers[0]
        shapes = qsakv.memory_shapes(cfg, qsakv.layout_for(cfg, num_blocks=16))
        def alloc():
            return [{f: np.zeros(s, np.dtype(d[0])) for f, (s, d) in shapes.items()}
                    for _ in cfg.qsa_layers]
        # 1. the caller empties its list, then the cache is written
        mem = alloc()
        cache = qsakv.Cache(ctx, cfg, num_blocks=16, memory=mem)
        mem[0]["kv"] = None
        mem.clear(); gc.collect()
        filler = [np.zeros(shapes["kv"][0], np.float16) for _ in range(12)]
        k = np.full((1, 1, 256), 7.0, np.float16)
        cache.store_kv(layer, k, k, np.array([0], np.int64))
        assert not any(f.any() for f in filler), "store_kv wrote into unrelated arrays"
        assert cache.layer_buffers(layer).kv[0, 0, 0, 0, 0] == 7.0
        # 2. a view read after the cache is gone
        bufs = qsakv.Cache(ctx, cfg, num_blocks=16, memory=alloc()).layer_buffers(layer)
        gc.collect()
        print("kv", float(bufs.kv.sum()))
        # 3. the top-k view of an external top-k array
        geo = cfg.rank_geometry()
        tk = qsakv.Cache(ctx, cfg, num_blocks=16, external_topk=np.ones(
            (4096, geo.topk_width), np.int32)).layer_buffers(layer).topk
        gc.collect()
        print("topk", int(tk.sum()))
        """)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.split() == ["kv", "0.0", "topk", str(4096 * 2051)], r.stdout
