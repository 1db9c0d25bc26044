"""Threads: ctypes releases the GIL during library calls, so these really run in
parallel. Each thread's failures carry its own message (the library's last error is
thread-local and the binding copies it in the failing thread), and distinct handles
used from distinct threads give the same results as one thread."""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import qsakv
from reference import make_world

THREADS = 8


def test_errors_stay_per_thread():
    barrier = threading.Barrier(THREADS)

    def worker(i):
        barrier.wait()
        bad = []
        for j in range(200):
            name = f"no_such_model_t{i}_{j}"
            try:
                qsakv.ModelConfig.preset(name)
            except qsakv.InvalidArgumentError as e:
                if name not in e.message or any(f"_t{o}_" in e.message
                                                for o in range(THREADS) if o != i):
                    bad.append(e.message)
            else:
                bad.append("no error")
            qsakv.ModelConfig.preset("qwen4_exp")  # successes in between change nothing
            if qsakv.lib.qsakv_last_error() != b"":
                bad.append("message left behind")
        return bad

    with ThreadPoolExecutor(THREADS) as ex:
        results = list(ex.map(worker, range(THREADS)))
    assert results == [[]] * THREADS


def test_parallel_pipelines_agree(small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    w = make_world(cfg, cfg.rank_geometry(), rows=(1, 4, 8), lens=(900, 300, 40), seed=3)
    layer = cfg.qsa_layers[1]

    def pipeline(_):
        with qsakv.Context("cpu") as ctx, \
                qsakv.Cache(ctx, cfg, num_blocks=w.num_blocks) as cache, \
                qsakv.Plan(cache, max_rows=w.num_rows) as plan:
            cache.store_kv(layer, w.k, w.v, w.slots)
            cache.store_compressed_keys(layer, w.ck, w.cslots)
            plan.update(qsakv.Batch(w.query_start, w.lens, w.bt))
            plan.select_topk(layer, w.iq)
            out = np.zeros_like(w.q)
            plan.attention(layer, w.q, out)
            return out

    expected = pipeline(None)
    with ThreadPoolExecutor(THREADS) as ex:
        outs = list(ex.map(pipeline, range(THREADS)))
    assert np.isfinite(expected).all() and np.abs(expected).max() > 0
    for out in outs:
        np.testing.assert_array_equal(out, expected)
