#!/usr/bin/env python3
"""The pipeline of `make demo`, in Python, through the `qsakv` package:

  1. a context (AUTO: the GPU when there is one, else the CPU reference backend) and the
     capacity of the reference model at TP4 in 40 GiB;
  2. a synthetic checkpoint, K/V scales calibrated on synthetic activations through
     qsakv.Calibration (statistics observed on the device, summarised: max |x| / 448,
     rounded up), the overlay it writes for that checkpoint, loaded and validated
     against its revision (a wrong revision is refused: fail closed);
  3. E4M3 and FP16 caches (TP4 rank 0), store K/V and compressed index keys, plan a
     mixed batch (decode, verify and prefill rows), select top-k, sparse attention, and
     the E4M3-vs-FP16 output error.
On the CUDA backend the buffers are PyTorch tensors on the GPU and the work runs on a
torch stream (the PyTorch variant); on the CPU backend they are NumPy arrays.

  QSAKV_LIBRARY=build/libqsakv.so PYTHONPATH=bindings/python python examples/python/quickstart.py
"""
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import qsakv


def synthetic_batch(cfg, geo, rng):
    """A mixed batch: 1 decode row at 6000 tokens, 4 verify rows at 3000, a 24-row
    prefill chunk at 24 tokens, a 3-token request. Pages on blocks handed out in reverse
    order, so that they are not contiguous."""
    rows, lens = [1, 4, 24, 1], [6000, 3000, 24, 3]
    bs, ratio = cfg.block_size, cfg.compress_ratio
    pages = [(L + bs - 1) // bs for L in lens]
    num_blocks = sum(pages)
    bt = np.full((len(lens), max(pages)), -1, np.int32)
    nxt = num_blocks - 1
    for r, p in enumerate(pages):
        bt[r, :p] = np.arange(nxt, nxt - p, -1)
        nxt -= p
    slots = np.concatenate([bt[r, np.arange(L) // bs].astype(np.int64) * bs + np.arange(L) % bs
                            for r, L in enumerate(lens)])
    cslots = np.concatenate([s[ratio - 1::ratio] for s in np.split(slots, np.cumsum(lens)[:-1])])
    n, g = len(slots), len(cslots)
    chan = np.where(np.arange(cfg.head_dim) % 17 == 0, 3.5, 0.5)  # outlier channels
    return dict(
        rows=rows, lens=lens, num_blocks=num_blocks, block_table=bt, slots=slots,
        cslots=cslots,
        k=(rng.standard_normal((n, geo.kv_heads, cfg.head_dim)) * chan).astype(np.float16),
        v=(rng.standard_normal((n, geo.kv_heads, cfg.head_dim)) * 0.8).astype(np.float16),
        ck=rng.standard_normal((g, cfg.index_head_dim)).astype(np.float16),
        q=rng.standard_normal((sum(rows), geo.q_heads, cfg.head_dim)).astype(np.float16),
        iq=rng.standard_normal((sum(rows), cfg.index_num_heads,
                                cfg.index_head_dim)).astype(np.float16),
        query_start=np.concatenate([[0], np.cumsum(rows)]).astype(np.int32))


def calibrate(ctx, cfg, b, to_device, stream, out_dir, base_index_path):
    """Observes K/V of every QSA layer on the device, then writes the overlay from the
    summarised statistics. A per-layer scale is the max over every TP rank: in a TP run
    each rank observes its own heads in its own process and `allreduce(nccl_comm)` (or
    saving and merging the files) combines them; here one process plays the 4 ranks on
    the same synthetic activations and merges their snapshots. Returns the first layer's
    (k_scale, v_scale)."""
    k, v = to_device(b["k"]), to_device(b["v"])
    ranks = []
    for rank in range(cfg.tp_size):
        with qsakv.Calibration(ctx, cfg.replace(tp_rank=rank)) as calib:
            calib.start()  # stop() around warm-up or graph capture
            for layer in cfg.qsa_layers:
                calib.observe(layer, k, v, stream=stream)  # async, capturable
            calib.stop()
            ranks.append(calib.snapshot(stream=stream))
    with qsakv.Calibration.merge(ranks, mode="ranks") as stats:
        s = stats.summarize(cfg.qsa_layers[0], "k")
        print(f"\nCalibration ({len(ranks)} ranks merged): {s.count} K values per layer, "
              f"max |k| {s.max_abs:.4g} -> k_scale {s.scale:.6g} (max / 448 rounded up; "
              f"p99.9 {s.p99_9:.4g}, {s.underflow_fraction:.3%} flush to zero in E4M3)")
        stats.write_overlay(out_dir, base_index_path=base_index_path,
                            contract_tp_size=cfg.tp_size, contract_speculative_tokens=0,
                            contract_activation_dtype="fp16")
        scales = stats.scales()[cfg.qsa_layers[0]]
    for r in ranks:
        r.close()
    return scales


def run_pipeline(ctx, cfg, overlay, b, to_device, stream):
    """Store, plan, select, attend on one cache; returns the output (NumPy) and ms."""
    layer = cfg.qsa_layers[0]
    with qsakv.Cache(ctx, cfg, overlay, num_blocks=b["num_blocks"]) as cache, \
            qsakv.Plan(cache, max_rows=len(b["q"])) as plan:
        dev = {k: to_device(b[k]) for k in ("k", "v", "slots", "ck", "cslots", "q", "iq",
                                             "block_table")}
        out = to_device(np.zeros_like(b["q"]))
        ctx.synchronize(stream)
        t0 = time.perf_counter()
        cache.store_kv(layer, dev["k"], dev["v"], dev["slots"], stream=stream)
        cache.store_compressed_keys(layer, dev["ck"], dev["cslots"], stream=stream)
        plan.update(qsakv.Batch(b["query_start"], b["lens"], dev["block_table"]), stream=stream)
        plan.select_topk(layer, dev["iq"], stream=stream)
        plan.attention(layer, dev["q"], out, stream=stream)
        ctx.synchronize(stream)
        ms = (time.perf_counter() - t0) * 1e3
        return (out.cpu().numpy() if hasattr(out, "cpu") else out), ms


def device_arrays(ctx):
    """How to put NumPy data where the backend reads it, and the stream to use."""
    if not ctx.is_cuda:
        return (lambda a: a), None, "NumPy on the CPU backend"
    try:
        import torch
    except ImportError:
        raise SystemExit("the CUDA backend needs device arrays: install PyTorch (or adapt "
                         "this example to CuPy), or run with qsakv.Context('cpu')")
    torch.cuda.set_device(ctx.info.device)
    return (lambda a: torch.from_numpy(a).cuda()), torch.cuda.Stream(), \
        "PyTorch tensors on a torch stream"


def main():
    print(f"libqsakv {qsakv.version()} (ABI {qsakv.ABI_VERSION}) from {qsakv.library_path}, "
          f"built {'with' if qsakv.built_with_cuda() else 'without'} CUDA")
    with qsakv.Context("auto") as ctx:
        i = ctx.info
        if ctx.is_cuda:
            print(f"backend: CUDA on {i.device_name} (SM {i.sm_version}, "
                  f"{i.multiprocessor_count} SMs), {i.decoder.name.lower()} E4M3 decoder")
        else:
            print(f"backend: CPU reference ({i.fallback_reason or 'asked for'})")

        cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4)  # rank 0 of TP4
        e = qsakv.capacity_plan(cfg, 40 << 30)
        f = qsakv.capacity_plan(cfg.replace(kv_dtype="fp16"), 40 << 30)
        print(f"\nCapacity, reference model at TP4, 40 GiB per rank: fp16 {f.num_tokens} "
              f"tokens, e4m3 {e.num_tokens} tokens: {e.capacity_ratio:.3f}x "
              f"(ideal {e.ideal_ratio:.3f}x)")
        cfg.max_batched_tokens, cfg.max_requests, cfg.max_model_len = 64, 8, 8192
        geo = cfg.rank_geometry()
        b = synthetic_batch(cfg, geo, np.random.default_rng(1234567))
        to_device, stream, how = device_arrays(ctx)

        with tempfile.TemporaryDirectory(prefix="qsakv-quickstart-") as tmp:
            ckpt = Path(tmp) / "checkpoint"
            ckpt.mkdir()
            (ckpt / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": 1024}, "weight_map": {
                    "model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}))
            ks, vs = calibrate(ctx, cfg, b, to_device, stream, Path(tmp) / "kvscales",
                               ckpt / "model.safetensors.index.json")
            revision = qsakv.checkpoint_revision(ckpt)
            with qsakv.Overlay.load(Path(tmp) / "kvscales" / "model-kvscales.safetensors") as ov:
                print(f"\nOverlay: {ov.info.num_scales} scales, k_scale {ks:.6g}, v_scale "
                      f"{vs:.6g}, bound to revision {revision[:16]}...")
                wrong = ("1" if revision[0] == "0" else "0") + revision[1:]
                try:
                    ov.validate(cfg, wrong)
                except qsakv.RevisionMismatchError as err:
                    print(f"  validate against another revision: {err.status_name}\n"
                          f"    {err.message}")
                ov.validate(cfg, revision)
                print("  validate against the checkpoint's revision: OK")

                out8, ms8 = run_pipeline(ctx, cfg, ov, b, to_device, stream)
            out16, ms16 = run_pipeline(ctx, cfg.replace(kv_dtype="fp16"), None, b, to_device,
                                       stream)

        a, r = out8.astype(np.float64), out16.astype(np.float64)
        err = np.linalg.norm(a - r) / np.linalg.norm(r)
        print(f"\nPipeline (store K/V + compressed keys, plan, select top-k, sparse attention), "
              f"{len(b['q'])} rows in {len(b['lens'])} requests, {how}:")
        print(f"  e4m3 cache: {ms8:.1f} ms   fp16 cache: {ms16:.1f} ms   (wall clock incl. "
              f"launch)")
        print(f"  E4M3 vs FP16 attention output: relative L2 error {err:.3e}")
        return err


if __name__ == "__main__":
    main()
