"""Status codes -> exception classes: the mapping is total and distinct, and every
failure the library can be driven into from Python raises its class with the library's
message (copied, then cleared in the calling thread)."""
import hashlib
import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import qsakv
from qsakv import _cdefs, errors


def test_every_status_has_its_own_class():
    statuses = _cdefs.ENUMS["qsakv_status"]
    seen = set()
    for name, code in statuses.items():
        if code == 0 or name.endswith("_MAX_ENUM"):  # the sentinel is not a status
            continue
        cls = errors.error_class(code)
        assert cls is not qsakv.QsakvError and cls not in seen, name
        seen.add(cls)
        assert issubclass(cls, qsakv.QsakvError) and cls.status == code
        assert cls.__name__ == "".join(
            w.capitalize() for w in name.replace("QSAKV_ERROR_", "").split("_")) + "Error"
        assert getattr(qsakv, cls.__name__) is cls
        assert qsakv.status_string(code) == name  # the library agrees on the name
        e = cls("msg", code, "qsakv_f")
        assert str(e) == f"qsakv_f: {name}: msg" and e.status_name == name
        assert issubclass(cls, qsakv.OverlayError) == (-29 <= code <= -20 or code == -32)
    assert errors.error_class(-999) is qsakv.QsakvError
    assert issubclass(qsakv.InvalidArgumentError, ValueError)
    assert issubclass(qsakv.ClosedError, qsakv.StateError)


def _pack(tmp_path, checkpoint, layers, name="pack", **kw):
    out = tmp_path / name
    qsakv.Overlay.write(out, {l: (0.01, 0.02) for l in layers},
                        base_index_path=checkpoint / "model.safetensors.index.json", **kw)
    return out


def _rewrite_scales(pack, tensors):
    """Replaces the scale file with `tensors` (safetensors, written by the safetensors
    package) and updates the manifest's hash and names, so only the content is wrong."""
    scale = pack / "model-kvscales.safetensors"
    save_file(tensors, str(scale))
    manifest = json.loads((pack / "qsakv-overlay.json").read_text())
    manifest["scale_file_sha256"] = hashlib.sha256(scale.read_bytes()).hexdigest()
    manifest["tensor_names"] = sorted(tensors)
    (pack / "qsakv-overlay.json").write_text(json.dumps(manifest))


def _load_validate(pack, cfg, checkpoint):
    with qsakv.Overlay.load(pack / "model-kvscales.safetensors") as ov:
        ov.validate(cfg, qsakv.checkpoint_revision(checkpoint))


def test_library_failures_raise_their_class(tmp_path, checkpoint, cpu):
    cfg = qsakv.ModelConfig.preset()
    rev = qsakv.checkpoint_revision(checkpoint)
    full = _pack(tmp_path, checkpoint, cfg.qsa_layers, contract_tp_size=1)
    cases = []

    def expect(cls, fn, text):
        with pytest.raises(cls) as e:
            fn()
        assert type(e.value) is cls, f"{type(e.value).__name__} is not {cls.__name__}"
        assert text in e.value.message, (text, e.value.message)
        assert e.value.function.startswith("qsakv_")
        cases.append(cls)

    expect(qsakv.InvalidArgumentError, lambda: qsakv.ModelConfig.preset("nope"), "nope")
    expect(qsakv.InvalidConfigError, lambda: cfg.replace(tp_size=5).validate(), "tp_size")
    expect(qsakv.IoError, lambda: qsakv.checkpoint_revision(tmp_path / "nowhere"), "nowhere")
    expect(qsakv.OverlayMissingError,
           lambda: qsakv.Overlay.load(tmp_path / "missing.safetensors"), "missing")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "model-kvscales.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{")
    (tmp_path / "junk" / "qsakv-overlay.json").write_text("{not json")
    expect(qsakv.FormatError, lambda: qsakv.Overlay.load(tmp_path / "junk" /
                                                         "model-kvscales.safetensors"), "")
    with qsakv.Overlay.load(full / "model-kvscales.safetensors") as ov:
        expect(qsakv.RevisionMismatchError, lambda: ov.validate(cfg, "0" * 64), "0" * 16)
        expect(qsakv.ContractError, lambda: ov.validate(cfg.replace(tp_size=2), rev), "")
        expect(qsakv.OverlayNotValidatedError, lambda: qsakv.Cache(cpu, cfg, ov, num_blocks=4),
               "")
        ov.validate(cfg, rev)
        expect(qsakv.OverlayNotValidatedError,  # validated, but for another config
               lambda: qsakv.Cache(cpu, cfg.replace(max_requests=3), ov, num_blocks=4), "")
    expect(qsakv.OverlayMissingError, lambda: qsakv.Cache(cpu, cfg, None, num_blocks=4), "")
    part = _pack(tmp_path, checkpoint, cfg.qsa_layers[:-1], "part")
    expect(qsakv.OverlayIncompleteError, lambda: _load_validate(part, cfg, checkpoint),
           str(cfg.qsa_layers[-1]))

    names = load_file(str(full / "model-kvscales.safetensors"))
    bad = dict(names, **{"model.layers.3.self_attn.k_scale": np.array(0.0, np.float32)})
    _rewrite_scales(p := _pack(tmp_path, checkpoint, cfg.qsa_layers, "zero"), bad)
    expect(qsakv.OverlayBadScaleError, lambda: _load_validate(p, cfg, checkpoint), "layers.3")
    bad = dict(names, **{"model.layers.3.self_attn.k_scale": np.ones(2, np.float32)})
    _rewrite_scales(p := _pack(tmp_path, checkpoint, cfg.qsa_layers, "shape"), bad)
    expect(qsakv.OverlayBadTensorError, lambda: _load_validate(p, cfg, checkpoint), "layers.3")
    bad = dict(names, **{"model.layers.3.mlp.weight": np.array(1.0, np.float32)})
    _rewrite_scales(p := _pack(tmp_path, checkpoint, cfg.qsa_layers, "unknown"), bad)
    expect(qsakv.OverlayUnknownTensorError, lambda: _load_validate(p, cfg, checkpoint),
           "mlp.weight")
    p = _pack(tmp_path, checkpoint, cfg.qsa_layers, "tampered")
    (p / "model-kvscales.safetensors").write_bytes(
        (full / "model-kvscales.safetensors").read_bytes().replace(b"pt", b"PT"))
    expect(qsakv.HashMismatchError, lambda: qsakv.Overlay.load(p / "model-kvscales.safetensors"),
           "")
    dup = tmp_path / "dupbase"
    dup.mkdir()
    (dup / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 1}, "weight_map": {
            "model.layers.3.self_attn.k_scale": "model-00001-of-00001.safetensors"}}))
    expect(qsakv.OverlayDuplicateError, lambda: qsakv.Overlay.write(
        tmp_path / "dpack", {l: (0.01, 0.02) for l in cfg.qsa_layers},
        base_index_path=dup / "model.safetensors.index.json"), "layers.3.self_attn.k_scale")

    with qsakv.Cache(cpu, cfg.replace(kv_dtype="fp16"), num_blocks=4) as cache, \
            qsakv.Plan(cache, max_rows=4) as plan:
        q = np.zeros((4, 24, 256), np.float16)
        expect(qsakv.StateError, lambda: plan.attention(3, q, q.copy()), "")  # no update yet
    if not qsakv.built_with_cuda():
        expect(qsakv.NoDeviceError, lambda: qsakv.Context("cuda"), "CUDA")
    else:
        expect(qsakv.NoDeviceError, lambda: qsakv.Context("cuda", device=4096), "")
    # The library's message is consumed: the thread's last error is clear again.
    assert qsakv.lib.qsakv_last_error() == b""
    assert len(cases) >= 18


def test_python_side_checks_name_the_argument(cpu, small_cfg):
    with qsakv.Cache(cpu, small_cfg.replace(kv_dtype="fp16"), num_blocks=4) as cache:
        good = np.zeros((3, 1, 256), np.float16)
        slots = np.arange(3, dtype=np.int64)
        with pytest.raises(qsakv.InvalidArgumentError) as e:
            cache.store_kv(3, np.zeros((3, 256), np.float32), good, slots)
        assert str(e.value.message) == \
            "k: expected float16 [n, 1, 256] contiguous, got float32 [3, 256]"
        assert str(e.value) == e.value.message  # a binding-side check: just the message
        with pytest.raises(qsakv.InvalidArgumentError, match=r"^v: .*non-contiguous"):
            cache.store_kv(3, good, np.zeros((3, 1, 512), np.float16)[:, :, ::2], slots)
        with pytest.raises(qsakv.InvalidArgumentError, match=r"slot_mapping: expected int64 \[3\]"):
            cache.store_kv(3, good, good, slots.astype(np.int32))
        with pytest.raises(qsakv.InvalidArgumentError, match=r"slot_mapping: expected int64 \[3\]"):
            cache.store_kv(3, good, good, slots[:2])
        with pytest.raises(qsakv.InvalidArgumentError, match="k: .*not an array"):
            cache.store_kv(3, [[0.0]], good, slots)
        with pytest.raises(qsakv.InvalidArgumentError, match="stream"):
            cache.store_kv(3, good, good, slots, stream="default")
        # The library's own checks still apply after ours: layer 0 is not a QSA layer.
        with pytest.raises(qsakv.InvalidArgumentError, match="layer") as e:
            cache.store_kv(0, good, good, slots)
        assert e.value.function == "qsakv_store_kv"


def test_every_refusal_is_a_qsakv_error(cpu, small_cfg, tmp_path):
    """What escaped the QsakvError hierarchy: ctypes.ArgumentError for a layer that is
    not an int (store_step, layer_buffers, note_external_codes, stats, summarize),
    TypeError for a str option, AttributeError for a merge input that is not a
    Calibration, ctypes.ArgumentError for a scale_from_max that is not a number; and
    mode=True, which hashes as 1, ran dense attention."""
    cfg = small_cfg.replace(kv_dtype="fp16")
    k = np.ones((1, 1, 256), np.float16)
    slots = np.array([0], np.int64)

    def refused(fn, match):
        with pytest.raises(qsakv.InvalidArgumentError, match=match):
            fn()

    with qsakv.Cache(cpu, cfg, num_blocks=2) as cache, \
            qsakv.Plan(cache, max_rows=1) as plan:
        refused(lambda: cache.store_kv("3", k, k, slots), "layer")
        refused(lambda: cache.store_step("3", k=k, v=k, slot_mapping=slots), "layer")
        refused(lambda: cache.layer_buffers(3.0), "layer")
        refused(lambda: cache.compressed_key_views("3"), "layer")
        refused(lambda: cache.note_external_codes("3"), "layer")
        refused(lambda: qsakv.Plan(cache, max_rows="8"), "max_rows")
        plan.update(qsakv.Batch([0, 1], [1], np.zeros((1, 1), np.int32)))
        q = np.ones((1, 6, 256), np.float16)
        out = np.zeros_like(q)
        refused(lambda: plan.attention(3, q, out, mode=True), r"mode: True is not one of")
        refused(lambda: plan.attention(3, q, out, mode=False), r"mode: False is not one of")
        assert not out.any()
        plan.attention(3, q, out, mode=qsakv.AttentionMode.DENSE)  # the enum still works
    refused(lambda: qsakv.Context("cpu", device=0.0), "device")
    with qsakv.Calibration(cpu, cfg) as cal:
        cal.start()
        cal.observe(3, k, k)
        with cal.snapshot() as snap:
            refused(lambda: snap.stats("3"), "layer")
            refused(lambda: snap.histogram(3.0), "layer")
            refused(lambda: snap.summarize("3"), "layer")
            refused(lambda: qsakv.Calibration.merge([snap, 3]),
                    r"inputs\[1\]: expected a Calibration, got int")
    refused(lambda: qsakv.scale_from_max("1.0"), "max_abs: expected a number, got str")
    assert qsakv.scale_from_max(np.float32(448.0)) == 1.0
    refused(lambda: qsakv.Calibration(cpu, cfg).allreduce(-1), r"nccl_comm: -1 does not fit")


def test_file_and_memory_errors_are_builtin_ones_too(tmp_path, cpu, small_cfg):
    """IoError is an OSError and OutOfMemoryError a MemoryError (as InvalidArgumentError
    is a ValueError), so `except OSError` catches a missing file."""
    assert issubclass(qsakv.IoError, OSError) and issubclass(qsakv.IoError, qsakv.QsakvError)
    assert issubclass(qsakv.OutOfMemoryError, MemoryError)
    with pytest.raises(OSError, match="nowhere"):
        qsakv.Calibration.load(tmp_path / "nowhere")
    with pytest.raises(OSError) as e:
        qsakv.ModelConfig.from_checkpoint(tmp_path / "nowhere")
    assert type(e.value) is qsakv.IoError and e.value.function.startswith("qsakv_")
    assert str(e.value).startswith("qsakv_model_config_from_checkpoint: QSAKV_ERROR_IO: ")
    with pytest.raises(MemoryError) as e:  # the whole address space
        qsakv.Cache(cpu, small_cfg.replace(kv_dtype="fp16"), memory_budget_bytes=2**64 - 1)
    assert type(e.value) is qsakv.OutOfMemoryError
