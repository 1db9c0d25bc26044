"""The ctypes package on the CUDA backend with PyTorch tensors and streams, compared
with the CPU backend (stores bit for bit, selection exactly, attention within the
FP64-checked tolerance). Skipped, with the reason, without torch, a GPU or a CUDA
build of the library (without the last two, failed under QSAKV_REQUIRE_GPU=1)."""
import numpy as np
import pytest

import qsakv
from conftest import no_gpu
from reference import make_world, rel_l2

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    no_gpu("PyTorch sees no CUDA GPU")
if not qsakv.built_with_cuda():
    no_gpu("libqsakv was built without the CUDA backend")


def run(ctx, cfg, w, to_dev, stream=None, inputs_ready=lambda: None):
    layer = cfg.qsa_layers[0]
    geo = cfg.rank_geometry()
    # Every device input is made before the first call and kept until the synchronize:
    # the library reads them on `stream`, while torch's caching allocator would hand a
    # dropped temporary's memory to the next allocation on torch's current stream at
    # once (the package README: keep inputs alive until the stream ran them).
    k, v, slots, ck, cslots, bt, iq, q = (to_dev(a) for a in (
        w.k, w.v, w.slots, w.ck, w.cslots, w.bt, w.iq, w.q))
    topk = to_dev(np.full((w.num_rows, geo.topk_width), -7, np.int32))
    out = to_dev(np.full(w.q.shape, np.nan, np.float16))
    inputs_ready()
    with qsakv.Cache(ctx, cfg, num_blocks=w.num_blocks) as cache, \
            qsakv.Plan(cache, max_rows=w.num_rows) as plan:
        cache.store_kv(layer, k, v, slots, stream=stream)
        cache.store_compressed_keys(layer, ck, cslots, stream=stream)
        plan.update(qsakv.Batch(w.query_start, w.lens, bt), stream=stream)
        plan.select_topk(layer, iq, topk, stream=stream)
        plan.attention(layer, q, out, topk=topk, stream=stream)
        ctx.synchronize(stream)
        kv = cache.read_kv(layer)
        as_np = (lambda t: t.cpu().numpy()) if ctx.is_cuda else (lambda a: a)
        return as_np(out), as_np(topk), kv


def test_torch_cuda_matches_cpu(small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = make_world(cfg, cfg.rank_geometry(), seed=5)
    with qsakv.Context("cpu") as cpu:
        ref_out, ref_topk, ref_kv = run(cpu, cfg, w, lambda a: a)
    with qsakv.Context("cuda") as gpu:
        stream = torch.cuda.Stream()
        # The copies to the GPU run on torch's current stream; the library's calls on
        # `stream` must wait for them.
        out, topk, kv = run(gpu, cfg, w, lambda a: torch.from_numpy(a).cuda(), stream,
                            lambda: stream.wait_stream(torch.cuda.current_stream()))
    np.testing.assert_array_equal(kv, ref_kv)
    np.testing.assert_array_equal(topk, ref_topk)
    assert rel_l2(out, ref_out) < 2e-3


def test_device_checks_with_torch(small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    with qsakv.Context("cuda") as gpu, qsakv.Cache(gpu, cfg, num_blocks=2) as cache:
        k = torch.zeros((3, 1, 256), dtype=torch.float16)
        s = torch.arange(3, dtype=torch.int64, device="cuda")
        with pytest.raises(qsakv.InvalidArgumentError, match=r"k: expected CUDA device memory"):
            cache.store_kv(3, k, k.cuda(), s)
        with pytest.raises(qsakv.InvalidArgumentError, match=r"k: expected float16 .* got bfloat16"):
            cache.store_kv(3, k.cuda().bfloat16(), k.cuda(), s)
        with pytest.raises(qsakv.InvalidArgumentError, match="non-contiguous"):
            cache.store_kv(3, torch.zeros((3, 1, 512), dtype=torch.float16,
                                          device="cuda")[:, :, ::2], k.cuda(), s)
        cache.store_kv(3, k.cuda(), k.cuda(), s, stream=torch.cuda.current_stream())
        gpu.synchronize()


def test_layer_buffers_are_cuda_array_views(small_cfg):
    """Issue 15, item 1: on the CUDA backend layer_buffers gives __cuda_array_interface__
    views that torch takes without a copy, with the layout's shapes and dtypes."""
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = make_world(cfg, cfg.rank_geometry(), seed=6)
    layer = cfg.qsa_layers[0]
    with qsakv.Context("cuda") as gpu, qsakv.Cache(gpu, cfg, num_blocks=w.num_blocks) as cache:
        cache.store_kv(layer, torch.from_numpy(w.k).cuda(), torch.from_numpy(w.v).cuda(),
                       torch.from_numpy(w.slots).cuda())
        b = cache.layer_buffers(layer)
        assert isinstance(b.kv, qsakv.DeviceArray) and b.kv.device == gpu.info.device
        kv = torch.as_tensor(b.kv, device="cuda")
        L = cache.layout
        assert kv.dtype == torch.float16 and tuple(kv.shape) == (
            L.num_blocks, 2, L.block_size, L.kv_heads, L.head_dim)
        assert kv.data_ptr() == b.kv.ptr  # no copy
        torch.cuda.synchronize()
        np.testing.assert_array_equal(kv.cpu().numpy(), cache.read_kv(layer))
        topk = torch.as_tensor(b.topk, device="cuda")
        assert topk.dtype == torch.int32 and tuple(topk.shape) == (L.topk_rows, L.topk_cols)
        # scales: const float* in the C API, so a read-only interface, which torch.as_tensor
        # refuses (torch has no read-only tensors); torch_ops.as_tensor gives a copy.
        assert b.scales.readonly and b.scales.__cuda_array_interface__["data"][1] is True
        assert not b.kv.readonly and not b.topk.readonly
        with pytest.raises(TypeError, match="read only"):
            torch.as_tensor(b.scales, device="cuda")
        from qsakv import torch_ops

        scales = torch_ops.as_tensor(b.scales)
        assert scales.tolist() == [1.0, 1.0] and scales.data_ptr() != b.scales.ptr
        scales.fill_(7.0)
        assert torch_ops.as_tensor(b.scales).tolist() == [1.0, 1.0]
