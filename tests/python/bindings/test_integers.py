"""Integers at the ctypes boundary: ctypes truncates a Python int to the C type of the
argument or field (layer 2**32 + 3 is layer 3, a budget of -1 bytes is 2**64 - 1). Every
integer the package passes on is checked against its C type instead and refused with an
InvalidArgumentError naming the argument; NumPy integers are taken, bool is not."""
import numpy as np
import pytest

import qsakv

WRAP = 2**32


def refused(match, fn):
    with pytest.raises(qsakv.InvalidArgumentError, match=match):
        fn()


def test_layer_ids_are_not_wrapped(cpu, small_cfg, tmp_path, checkpoint):
    cfg = small_cfg.replace(kv_dtype="fp16")
    layer = cfg.qsa_layers[0]
    big = WRAP + layer
    k = np.full((1, 1, 256), 3.0, np.float16)
    slots = np.array([5], np.int64)
    keys = np.ones((1, cfg.index_head_dim), np.float16)
    fits = rf"layer: {big} does not fit int32"
    with qsakv.Cache(cpu, cfg, num_blocks=2) as cache, \
            qsakv.Plan(cache, max_rows=1) as plan:
        refused(fits, lambda: cache.store_kv(big, k, k, slots))
        refused(fits, lambda: cache.store_step(big, k=k, v=k, slot_mapping=slots))
        refused(fits, lambda: cache.store_index_keys(big, keys, np.zeros(1, np.int32), slots))
        refused(fits, lambda: cache.store_compressed_keys(big, keys, slots))
        refused(fits, lambda: cache.layer_buffers(big))
        refused(fits, lambda: cache.compressed_key_views(big))
        refused(fits, lambda: cache.note_external_codes(big))
        refused(fits, lambda: cache.read_kv(big))
        assert not cache.read_kv(layer).any(), "a wrapped layer id was stored as layer 3"
        plan.update(qsakv.Batch([0, 1], [1], np.zeros((1, 1), np.int32)))
        q = np.ones((1, 6, 256), np.float16)
        refused(fits, lambda: plan.select_topk(big, np.ones((1, 4, 128), np.float16)))
        refused(fits, lambda: plan.attention(big, q, np.zeros_like(q), mode="dense"))
        refused(rf"layer: {layer - WRAP} does not fit int32",
                lambda: plan.attention(layer - WRAP, q, np.zeros_like(q)))
        # NumPy integers are integers; bool is not a layer id.
        cache.store_kv(np.int64(layer), k, k, slots)
        cache.store_kv(np.int32(layer), k, k, slots)
        assert cache.layer_buffers(np.int64(layer)).kv[0, 0, 5, 0, 0] == 3.0
        refused(r"layer: expected an integer, got bool", lambda: cache.store_kv(True, k, k, slots))
        refused(r"layer: expected an integer, got bool", lambda: cache.layer_buffers(True))
    with qsakv.Calibration(cpu, cfg) as cal:
        refused(fits, lambda: cal.observe(big, k, k))
        with cal.snapshot() as host:
            refused(fits, lambda: host.stats(big))
            refused(fits, lambda: host.histogram(big))
            refused(fits, lambda: host.summarize(big))
    index = checkpoint / "model.safetensors.index.json"
    refused(rf"scales: a layer id: {big} does not fit int32", lambda: qsakv.Overlay.write(
        tmp_path / "p1", {l + WRAP: (0.01, 0.02) for l in cfg.qsa_layers},
        base_index_path=index))
    qsakv.Overlay.write(tmp_path / "p2", {np.int64(l): (np.float32(0.01), 0.02)
                                          for l in cfg.qsa_layers}, base_index_path=index)
    scales, _ = qsakv.Overlay.read_scale_file(tmp_path / "p2" / "model-kvscales.safetensors")
    assert sorted(scales) == sorted(cfg.qsa_layers)
    with qsakv.Overlay.load(tmp_path / "p2" / "model-kvscales.safetensors") as ov:
        refused(fits, lambda: ov.scales(big))
        assert ov.scales(np.int32(layer)) == pytest.approx((0.01, 0.02))


def test_config_and_option_fields_are_not_wrapped(cpu, small_cfg, tmp_path, checkpoint):
    cfg = small_cfg.replace(kv_dtype="fp16")
    refused(rf"max_batched_tokens: {WRAP + 64} does not fit int32",
            lambda: cfg.replace(max_batched_tokens=WRAP + 64))
    refused(r"tp_size: -4294967292 does not fit int32", lambda: cfg.replace(tp_size=4 - WRAP))
    refused(r"tp_size: expected an integer, got float", lambda: cfg.replace(tp_size=4.0))
    refused(r"softmax_scale: ", lambda: cfg.replace(softmax_scale="big"))
    refused(rf"qsa_layers\[1\]: {WRAP + 7} does not fit int32",
            lambda: cfg.replace(qsa_layers=[3, WRAP + 7]))
    refused(r"qsa_layers\[0\]: expected an integer, got float 3.7",
            lambda: cfg.replace(qsa_layers=[3.7]))
    assert cfg.replace(tp_size=np.int64(2)).tp_size == 2
    refused(rf"max_rows: {WRAP + 8} does not fit int32",
            lambda: qsakv.Plan(qsakv.Cache(cpu, cfg, num_blocks=2), max_rows=WRAP + 8))
    refused(r"max_rows: expected an integer, got str", lambda: qsakv.Plan(
        qsakv.Cache(cpu, cfg, num_blocks=2), max_rows="8"))
    refused(rf"device: {WRAP} does not fit int32", lambda: qsakv.Context("cpu", device=WRAP))
    refused(r"device: expected an integer, got float", lambda: qsakv.Context("cpu", device=0.0))
    refused(r"memory_budget_bytes: -1 does not fit uint64",
            lambda: qsakv.capacity_plan(cfg, -1))
    refused(r"memory_budget_bytes: -1048576 does not fit uint64",
            lambda: qsakv.Cache(cpu, cfg, memory_budget_bytes=-(1 << 20)))
    refused(rf"num_blocks: {2**63} does not fit int64",
            lambda: qsakv.layout_for(cfg, num_blocks=2**63))
    refused(rf"contract_tp_size: {WRAP + 4} does not fit int32", lambda: qsakv.Overlay.write(
        tmp_path / "p", {l: (0.01, 0.02) for l in cfg.qsa_layers},
        base_index_path=checkpoint / "model.safetensors.index.json",
        contract_tp_size=WRAP + 4))
    refused(rf"status: {WRAP} does not fit int32", lambda: qsakv.status_string(WRAP))
    with qsakv.Cache(cpu, cfg, num_blocks=2) as cache:
        k = np.ones((1, 1, 256), np.float16)
        refused(r"stream: -1 does not fit uint64",
                lambda: cache.store_kv(3, k, k, np.array([0], np.int64), stream=-1))
