"""qsakv.Calibration (issue 15, item 2b) on the CPU backend against NumPy: observe
(stopped: nothing counted), snapshot, stats and histogram, save/load, merge of TP
ranks, summarize, write_overlay -> an overlay that validates and backs an E4M3 cache
whose stores match the ml_dtypes oracle with the calibrated scales."""
import numpy as np
import pytest

import qsakv
from reference import quantise_e4m3


def _kv(rng, n, scale):
    chan = np.where(np.arange(256) % 17 == 0, 3.5, 0.5) * scale
    k = (rng.standard_normal((n, 1, 256)) * chan).astype(np.float16)
    v = (rng.standard_normal((n, 1, 256)) * 0.8 * scale).astype(np.float16)
    return k, v


def _observe_all(calib, cfg, rng, scale=1.0, n=40):
    data = {}
    for layer in cfg.qsa_layers:
        k, v = _kv(rng, n, scale)
        calib.observe(layer, k, v)
        data[layer] = (k, v)
    return data


def test_observe_stats_histogram_save_load(cpu, small_cfg, tmp_path):
    rng = np.random.default_rng(7)
    with qsakv.Calibration(cpu, small_cfg) as live:
        assert live.info.live == 1 and live.info.started == 0
        k0, v0 = _kv(rng, 10, 100.0)
        live.observe(3, k0, v0)  # stopped: a no-op
        live.start()
        assert live.info.started == 1
        data = _observe_all(live, small_cfg, rng)
        live.stop()
        live.observe(3, k0, v0)  # stopped again
        with pytest.raises(qsakv.StateError):
            live.stats(3)  # live statistics are on the device: snapshot first
        host = live.snapshot()
    assert host.info.live == 0 and host.info.qsa_layers == small_cfg.qsa_layers
    assert host.config == small_cfg
    layer = small_cfg.qsa_layers[1]
    k, v = data[layer]
    for kind, x in (("k", k), ("V", v)):
        st = host.stats(layer, kind)
        assert st.count == x.size and st.finite_count == x.size
        assert st.nonzero_count == np.count_nonzero(x)
        assert st.max_abs == np.float32(np.abs(x.astype(np.float32)).max())
        h = host.histogram(layer, kind)
        assert h.dtype == np.uint64 and h.shape == (4096,) and h.sum() == st.nonzero_count
    with pytest.raises(qsakv.StateError, match="qsakv_calib_observe needs a live handle"):
        host.observe(3, k0, v0)
    with pytest.raises(ValueError, match=r"kind: 'q' is not one of 'k', 'v'"):
        host.stats(3, "q")
    host.save(tmp_path / "stats.safetensors")
    with qsakv.Calibration.load(tmp_path / "stats.safetensors") as back:
        assert back.stats(layer, "v") == host.stats(layer, "v")
        assert (back.histogram(layer) == host.histogram(layer)).all()
    with pytest.raises(qsakv.IoError):
        qsakv.Calibration.load(tmp_path / "missing.safetensors")


def test_host_handle_refusals_are_library_errors(cpu, small_cfg):
    """A host handle (snapshot, load, merge) refuses the live-only calls with the
    library's StateError (as the class docstring says), not an AttributeError, whatever
    the arrays: observe refused it with an InvalidArgumentError of its own."""
    with qsakv.Calibration(cpu, small_cfg) as live, live.snapshot() as host:
        with pytest.raises(qsakv.StateError, match="needs a live handle"):
            host.allreduce(1)
        for k in (None, np.zeros((4, 1, 256), np.float16)):
            with pytest.raises(qsakv.StateError, match="observe needs a live handle") as e:
                host.observe(3, k, k)
            assert e.value.function == "qsakv_calib_observe"
        with pytest.raises(qsakv.StateError, match="needs a live handle"):
            host.start()


def test_observe_checks_its_arrays(cpu, small_cfg):
    with qsakv.Calibration(cpu, small_cfg) as live:
        k = np.zeros((4, 1, 256), np.float16)
        with pytest.raises(qsakv.InvalidArgumentError, match=r"k: expected float16"):
            live.observe(3, k.astype(np.float32), k)
        with pytest.raises(qsakv.InvalidArgumentError, match=r"v: expected float16 \[4, 1"):
            live.observe(3, k, k[:3])
        with pytest.raises(qsakv.UnsupportedError):
            live.allreduce(0x1234)  # the CPU backend has no NCCL: merge files instead
        with pytest.raises(qsakv.InvalidArgumentError, match="nccl_comm"):
            live.allreduce("comm")


def test_merge_ranks_summarize_write_overlay_store(cpu, small_cfg, tmp_path, checkpoint):
    """Two TP ranks observed separately, merged; the overlay written from the merge
    validates, and an E4M3 cache built on it quantises with max|x| / 448 rounded up."""
    rng = np.random.default_rng(11)
    cfg2 = [small_cfg.replace(tp_size=2, tp_rank=r) for r in (0, 1)]
    snaps, seen = [], {}
    for cfg in cfg2:
        with qsakv.Calibration(cpu, cfg) as live:
            live.start()
            for layer, (k, v) in _observe_all(live, cfg, rng, scale=1 + cfg.tp_rank).items():
                pk, pv = seen.get(layer, (0.0, 0.0))
                seen[layer] = (max(pk, np.abs(k.astype(np.float32)).max()),
                               max(pv, np.abs(v.astype(np.float32)).max()))
            snaps.append(live.snapshot())
    with pytest.raises(qsakv.OverlayIncompleteError):
        snaps[0].summarize(3, "k")  # one rank of two
    with pytest.raises(qsakv.InvalidArgumentError):
        qsakv.Calibration.merge([snaps[0], snaps[0]])  # overlapping ranks
    merged = qsakv.Calibration.merge(snaps, mode="ranks")
    info = merged.info
    assert (info.complete, info.ranks_covered, info.rank) == (1, 2, -1)
    scales = merged.scales()
    for layer, (mk, mv) in seen.items():
        s = merged.summarize(layer, "k")
        assert s.max_abs == np.float32(mk)
        assert s.scale == qsakv.scale_from_max(float(mk)) and 448 * s.scale >= mk
        assert s.saturate_fraction == 0
        assert scales[layer] == (s.scale, merged.summarize(layer, "v").scale)
    env = qsakv.Calibration.merge([merged, merged], mode="envelope")
    assert env.info.num_runs == 2 * merged.info.num_runs
    with pytest.raises(ValueError, match="mode: 'max' is not one of 'ranks', 'envelope'"):
        qsakv.Calibration.merge(snaps, mode="max")

    merged.write_overlay(tmp_path / "pack",
                         base_index_path=checkpoint / "model.safetensors.index.json",
                         contract_tp_size=2)
    cfg = cfg2[0]
    with qsakv.Overlay.load(tmp_path / "pack" / "model-kvscales.safetensors") as ov:
        ov.validate(cfg, qsakv.checkpoint_revision(checkpoint))
        layer = cfg.qsa_layers[0]
        assert ov.scales(layer) == scales[layer]
        with qsakv.Cache(cpu, cfg, ov, num_blocks=2) as cache:
            k, v = _kv(rng, 8, 1.0)
            slots = np.arange(8, dtype=np.int64)
            cache.store_kv(layer, k, v, slots)
            kv = cache.layer_buffers(layer).kv
            np.testing.assert_array_equal(kv[0, 0, :8],
                                          quantise_e4m3(k, scales[layer][0]).view(np.uint8))
    for s in snaps + [merged, env]:
        s.close()


def test_closing_the_context_closes_live_handles(small_cfg):
    ctx = qsakv.Context("cpu")
    live = qsakv.Calibration(ctx, small_cfg)
    live.start()
    host = live.snapshot()
    ctx.close()
    assert live.closed and not host.closed  # a host copy needs no context
    assert host.info.qsa_layers == small_cfg.qsa_layers
    host.close()
