#!/usr/bin/env python3
"""Per-call overhead of the Python package's hot calls (store_kv, select_topk,
attention), against the raw ctypes call with the same arguments prepared in advance.

The work per call is kept tiny (1 token stored, 1 decode row over 4 tokens), so the
wrapper's cost shows; overhead = wrapper time - raw call time. Backend: CPU unless
--backend cuda (then the arrays are torch CUDA tensors and the calls are asynchronous:
the figure is launch-side cost only).

  QSAKV_LIB=build/libqsakv.so PYTHONPATH=bindings/python \
      python bindings/python/tools/bench_overhead.py [--calls 20000] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import time

import numpy as np

import qsakv
from qsakv._buffers import stream_arg
from qsakv._lib import lib


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """The median over `repeats` of the mean time of `calls` calls, in microseconds."""
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    ctx = qsakv.Context(args.backend)
    cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4, max_batched_tokens=8,
                                   max_requests=2, max_model_len=256, kv_dtype="fp16")
    geo = cfg.rank_geometry()
    layer = cfg.qsa_layers[0]
    if ctx.is_cuda:
        import torch

        dev = (lambda a: torch.from_numpy(a).cuda())
        stream = torch.cuda.current_stream()
    else:
        dev, stream = (lambda a: a), None
    cache = qsakv.Cache(ctx, cfg, num_blocks=4)
    plan = qsakv.Plan(cache, max_rows=1)
    k = dev(np.ones((1, geo.kv_heads, cfg.head_dim), np.float16))
    v = dev(np.ones((1, geo.kv_heads, cfg.head_dim), np.float16))
    slots = dev(np.array([3], np.int64))
    bt = dev(np.array([[0]], np.int32))
    plan.update(qsakv.Batch([0, 1], [4], bt))
    iq = dev(np.ones((1, cfg.index_num_heads, cfg.index_head_dim), np.float16))
    q = dev(np.ones((1, geo.q_heads, cfg.head_dim), np.float16))
    out = dev(np.zeros((1, geo.q_heads, cfg.head_dim), np.float16))
    topk = dev(np.full((1, geo.topk_width), -1, np.int32))

    # The raw calls: everything converted once, outside the loop.
    def ptr(a):
        return a.data_ptr() if hasattr(a, "data_ptr") else a.ctypes.data

    P = ctypes.POINTER
    sk = (cache._ptr, layer, ptr(k), ptr(v), ctypes.cast(ptr(slots), P(ctypes.c_int64)), 1,
          None if stream is None else stream_arg(stream.cuda_stream))
    tk = ctypes.cast(ptr(topk), P(ctypes.c_int32))
    st = sk[-1]
    raw = {
        "store_kv": lambda: lib.qsakv_store_kv(*sk),
        "select_topk": lambda: lib.qsakv_select_topk(plan._ptr, layer, ptr(iq), tk,
                                                     geo.topk_width, st),
        "attention": lambda: lib.qsakv_attention_run(plan._ptr, layer, 0, ptr(q), tk,
                                                     geo.topk_width, ptr(out), st),
    }
    kw = {} if stream is None else {"stream": stream}
    wrapped = {
        "store_kv": lambda: cache.store_kv(layer, k, v, slots, **kw),
        "select_topk": lambda: plan.select_topk(layer, iq, topk, **kw),
        "attention": lambda: plan.attention(layer, q, out, topk=topk, **kw),
    }
    # Raw (argument conversion done once above) vs the package.
    res = {"backend": ctx.info.backend.name, "machine": platform.node(),
           "cpu": platform.processor() or platform.machine(),
           "python": platform.python_version(), "calls": args.calls, "per_call_us": {}}
    print(f"backend {res['backend']}, Python {res['python']}, {args.calls} calls x 5, "
          f"median of the means (us per call):")
    print(f"  {'call':<12} {'package':>9} {'raw ctypes':>11} {'overhead':>9}")
    for name in raw:
        r = per_call_us(raw[name], args.calls)
        w = per_call_us(wrapped[name], args.calls)
        res["per_call_us"][name] = {"package": round(w, 2), "raw": round(r, 2),
                                    "overhead": round(w - r, 2)}
        print(f"  {name:<12} {w:9.2f} {r:11.2f} {w - r:9.2f}")
    if ctx.is_cuda:
        ctx.synchronize()
    plan.close()
    cache.close()
    ctx.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
