"""Issue 15, item 2f: store / select / attention as torch.library operators
(qsakv.torch_ops), against the package's methods: eagerly, under torch.compile
(aot_eager: functionalization clones what the operators declare they mutate), and on a
GPU inside a torch.cuda.graph capture, replayed. Also the stream rules with real torch
on the GPU: the default is torch's current stream, a call aimed away from a capture is
refused. Skipped, with the reason, without torch (and the GPU part without a GPU)."""
import os

import numpy as np
import pytest

import qsakv
from reference import make_world, rel_l2

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the torch.library operators are registered "
                    "only when torch imports (they run on the GPU machine)")
import qsakv.torch_ops as qops  # noqa: E402 (after the skip)

_HAVE_GPU = torch.cuda.is_available() and qsakv.built_with_cuda()
_NO_GPU = "needs PyTorch with a CUDA GPU and libqsakv built with the CUDA backend"
# Under QSAKV_REQUIRE_GPU=1 (the GPU runs) the GPU tests run, and fail, where there is none.
gpu = pytest.mark.skipif(not _HAVE_GPU and os.environ.get("QSAKV_REQUIRE_GPU") != "1",
                         reason=_NO_GPU)


def _world(cfg):
    return make_world(cfg, cfg.rank_geometry(), rows=(1, 3), lens=(300, 40), seed=3)


def _by_methods(ctx, cfg, w, dev):
    layer = cfg.qsa_layers[0]
    with qsakv.Cache(ctx, cfg, num_blocks=w.num_blocks) as cache, \
            qsakv.Plan(cache, max_rows=w.num_rows) as plan:
        cache.store_kv(layer, dev(w.k), dev(w.v), dev(w.slots))
        cache.store_compressed_keys(layer, dev(w.ck), dev(w.cslots))
        plan.update(qsakv.Batch(w.query_start, w.lens, dev(w.bt)))
        topk = dev(np.full((w.num_rows, cfg.rank_geometry().topk_width), -7, np.int32))
        plan.select_topk(layer, dev(w.iq), topk)
        out = dev(np.zeros_like(w.q))
        plan.attention(layer, dev(w.q), out, topk=topk)
        ctx.synchronize()
        return out.cpu().numpy(), topk.cpu().numpy(), cache.read_kv(layer)


def test_operators_are_registered_with_their_schemas():
    for name, schema in qops.SCHEMAS.items():
        op = getattr(torch.ops.qsakv, name).default
        assert str(op._schema).replace("qsakv::", "") == schema
        assert op._schema.is_mutable  # never dropped as dead code by torch.compile


def test_operators_match_the_methods_on_the_cpu_backend(cpu, small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = _world(cfg)
    dev = torch.from_numpy
    ref_out, ref_topk, ref_kv = _by_methods(cpu, cfg, w, dev)
    layer = cfg.qsa_layers[0]
    with qsakv.Cache(cpu, cfg, num_blocks=w.num_blocks) as cache, \
            qsakv.Plan(cache, max_rows=w.num_rows) as plan:
        qops.store_kv(cache, layer, dev(w.k), dev(w.v), dev(w.slots))
        qops.store_compressed_keys(cache, layer, dev(w.ck), dev(w.cslots))
        plan.update(qsakv.Batch(w.query_start, w.lens, dev(w.bt)))
        qops.select_topk(plan, layer, dev(w.iq))  # the shared top-k buffer
        out = torch.zeros(w.q.shape, dtype=torch.float16)
        qops.attention(plan, layer, dev(w.q), out)
        np.testing.assert_array_equal(cache.read_kv(layer), ref_kv)
        np.testing.assert_array_equal(qops.topk_buffer(cache, layer)[: w.num_rows].numpy(),
                                      ref_topk)
        np.testing.assert_array_equal(out.numpy(), ref_out)
        assert qops.kv_cache(cache, layer).shape == ref_kv.shape


def test_operators_under_torch_compile(cpu, small_cfg):
    """aot_eager functionalizes: the ordering token and the outputs are cloned and
    copied back; the results must still equal the methods'."""
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = _world(cfg)
    dev = torch.from_numpy
    ref_out, ref_topk, ref_kv = _by_methods(cpu, cfg, w, dev)
    layer = cfg.qsa_layers[0]
    with qsakv.Cache(cpu, cfg, num_blocks=w.num_blocks) as cache, \
            qsakv.Plan(cache, max_rows=w.num_rows) as plan:
        tok, cid, pid = qops.token(cache), qops.handle_id(cache), qops.handle_id(plan)
        plan.update(qsakv.Batch(w.query_start, w.lens, dev(w.bt)))

        def step(k, v, slots, ck, cslots, iq, q, topk, out):
            torch.ops.qsakv.store_kv(tok, k, v, slots, cid, layer)
            torch.ops.qsakv.store_compressed_keys(tok, ck, cslots, cid, layer)
            torch.ops.qsakv.select_topk(topk, iq, tok, pid, layer)
            torch.ops.qsakv.attention(out, q, topk, tok, pid, layer, 0)
            return out * 1  # something that reads the result

        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        topk = torch.full((w.num_rows, ref_topk.shape[1]), -7, dtype=torch.int32)
        out = torch.zeros(w.q.shape, dtype=torch.float16)
        res = compiled(dev(w.k), dev(w.v), dev(w.slots), dev(w.ck), dev(w.cslots),
                       dev(w.iq), dev(w.q), topk, out)
        np.testing.assert_array_equal(cache.read_kv(layer), ref_kv)
        np.testing.assert_array_equal(topk.numpy(), ref_topk)
        np.testing.assert_array_equal(out.numpy(), ref_out)
        np.testing.assert_array_equal(res.numpy(), ref_out)


def test_store_operators_under_torch_compile(cpu, small_cfg):
    """store_step (a part passed as None) and store_index_keys through aot_eager store
    the bytes of the three Cache methods."""
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = _world(cfg)
    dev = torch.from_numpy
    layer = cfg.qsa_layers[0]
    n = len(w.cslots)
    req = (np.arange(n) % cfg.max_requests).astype(np.int32)
    pos = np.arange(n, dtype=np.int64)

    def stored(cache):
        lb = cache.layer_buffers(layer)
        return tuple(np.asarray(b).tobytes() for b in (lb.kv, lb.ring_keys, lb.compressed_keys))

    with qsakv.Cache(cpu, cfg, num_blocks=w.num_blocks) as cache:
        cache.store_kv(layer, w.k, w.v, w.slots)
        cache.store_index_keys(layer, w.ck, req, pos)
        cache.store_compressed_keys(layer, w.ck, w.cslots)
        want = stored(cache)
    for split in (False, True):
        with qsakv.Cache(cpu, cfg, num_blocks=w.num_blocks) as cache:
            tok, cid = qops.token(cache), qops.handle_id(cache)

            def step(k, v, slots, keys, req, pos, cslots):
                if split:
                    torch.ops.qsakv.store_step(tok, k, v, slots, None, None, None, keys,
                                               cslots, cid, layer)
                    torch.ops.qsakv.store_index_keys(tok, keys, req, pos, cid, layer)
                else:
                    torch.ops.qsakv.store_step(tok, k, v, slots, keys, req, pos, keys,
                                               cslots, cid, layer)
                return k * 1

            compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
            compiled(dev(w.k), dev(w.v), dev(w.slots), dev(w.ck), dev(req), dev(pos),
                     dev(w.cslots))
            assert stored(cache) == want, split


@gpu
def test_cuda_graph_capture_and_replay(small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = _world(cfg)
    layer = cfg.qsa_layers[0]
    dev = (lambda a: torch.from_numpy(a).cuda())  # noqa: E731
    with qsakv.Context("cpu") as cpu:
        ref_out, ref_topk, ref_kv = _by_methods(cpu, cfg, w, lambda a: torch.from_numpy(a))
    with qsakv.Context("cuda") as ctx, \
            qsakv.Cache(ctx, cfg, num_blocks=w.num_blocks) as cache, \
            qsakv.Plan(cache, max_rows=w.num_rows) as plan:
        k, v, slots = dev(w.k), dev(w.v), dev(w.slots)
        ck, cslots, iq, q = dev(w.ck), dev(w.cslots), dev(w.iq), dev(w.q)
        topk = torch.full((w.num_rows, ref_topk.shape[1]), -7, dtype=torch.int32,
                          device="cuda")
        out = torch.zeros(q.shape, dtype=torch.float16, device="cuda")
        slots_real = slots.clone()
        slots.fill_(-1)  # captured with padding slots: nothing stored at capture time
        plan.update(qsakv.Batch(w.query_start, w.lens, dev(w.bt)))
        side = torch.cuda.Stream()
        qops.token(cache), qops.kv_cache(cache, layer)  # made before capture (allocate)
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):  # on a side stream torch made current: the default
            qops.store_kv(cache, layer, k, v, slots)
            qops.store_compressed_keys(cache, layer, ck, cslots)
            qops.select_topk(plan, layer, iq, topk)
            qops.attention(plan, layer, q, out, topk=topk)
            with pytest.raises(qsakv.CaptureError, match="not capturing"):
                cache.store_kv(layer, k, v, slots, stream=side)  # would run outside
        torch.cuda.synchronize()
        assert not cache.read_kv(layer).any()  # captured, not run
        slots.copy_(slots_real)
        g.replay()
        torch.cuda.synchronize()
        np.testing.assert_array_equal(cache.read_kv(layer), ref_kv)
        np.testing.assert_array_equal(topk.cpu().numpy(), ref_topk)
        assert rel_l2(out.cpu().numpy(), ref_out) < 2e-3
