"""Threads: ctypes releases the GIL during library calls, so these really run in
parallel. Each thread's failures carry its own message (the library's last error is
thread-local and the binding copies it in the failing thread), and distinct handles
used from distinct threads give the same results as one thread."""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import qsakv
from conftest import run_isolated
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


def test_close_during_a_call_waits_for_the_call():
    """close() from another thread while a call runs (ctypes released the GIL) destroyed
    the C object under the call: a use after free (a segfault). The call holds the
    handle's keeper, so the destroy happens when it returns. Each call is wrapped so
    that the close happens inside it, deterministically: the wrapper checks that
    nothing was destroyed before the library runs (exit 3 otherwise, instead of the
    crash), then the threaded reproduction of the audit runs. In a subprocess, so that
    a regression fails this test rather than killing pytest."""
    r = run_isolated("""
        import os, threading, time
        import numpy as np
        import qsakv
        from qsakv import cache as cache_mod, calibration as calib_mod, plan as plan_mod

        cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4, max_batched_tokens=64,
                                       max_requests=8, max_model_len=8192, kv_dtype="fp16")
        layer = cfg.qsa_layers[0]
        k = np.ones((1, 1, 256), np.float16)
        q = np.ones((1, 6, 256), np.float16)

        def closing(real, victim, name):
            def call(*args):
                before = qsakv.live_handles()
                victim().close()
                if qsakv.live_handles() != before:
                    print(name, "destroyed under the call", flush=True)
                    os._exit(3)
                return real(*args)
            return call

        def check(name, module, attr, victim, run):
            real = getattr(module, attr)
            n = qsakv.live_handles()
            setattr(module, attr, closing(real, victim, name))
            try:
                run()
            finally:
                setattr(module, attr, real)
            assert qsakv.live_handles() < n, name + ": not destroyed after the call"
            try:
                run()
            except qsakv.ClosedError:
                print(name, "ok")

        class Lib:  # the generated prototypes, one of them wrapped
            def __init__(self, real, name, fn):
                self._real, self._name, self._fn = real, name, fn
            def __getattr__(self, name):
                return self._fn if name == self._name else getattr(self._real, name)

        ctx = qsakv.Context("cpu")
        cache = qsakv.Cache(ctx, cfg, num_blocks=4)
        check("store_kv", cache_mod, "_store_kv", lambda: cache,
              lambda: cache.store_kv(layer, k, k, np.array([0], np.int64)))
        cache = qsakv.Cache(ctx, cfg, num_blocks=4)
        plan = qsakv.Plan(cache, max_rows=1)
        plan.update(qsakv.Batch([0, 1], [1], np.zeros((1, 1), np.int32)))
        out = np.zeros_like(q)
        check("attention (closing the cache)", plan_mod, "_attention_run", lambda: cache,
              lambda: plan.attention(layer, q, out, mode="dense"))
        cal = qsakv.Calibration(ctx, cfg)
        check("observe", calib_mod, "_observe", lambda: cal,
              lambda: cal.observe(layer, k, k))
        cache = qsakv.Cache(ctx, cfg, num_blocks=4)
        real_lib = cache_mod.lib
        wrapped = closing(real_lib.qsakv_cache_get_layer_buffers, lambda: cache,
                          "layer_buffers")
        n = qsakv.live_handles()
        cache_mod.lib = Lib(real_lib, "qsakv_cache_get_layer_buffers", wrapped)
        try:
            cache._addresses(layer)
        finally:
            cache_mod.lib = real_lib
        assert qsakv.live_handles() < n
        print("layer_buffers ok")

        # The audit's reproduction: close() from another thread while attention runs.
        for trial in range(20):
            cache = qsakv.Cache(ctx, cfg, num_blocks=16)
            plan = qsakv.Plan(cache, max_rows=64)
            plan.update(qsakv.Batch([0, 64], [1024], np.arange(16, dtype=np.int32).reshape(1, 16)))
            qq = np.ones((64, 6, 256), np.float16)
            oo = np.zeros_like(qq)
            errors = []
            def worker():
                try:
                    while True:
                        plan.attention(layer, qq, oo, mode="dense")
                except qsakv.ClosedError:
                    pass
                except Exception as e:
                    errors.append(e)
            t = threading.Thread(target=worker)
            t.start()
            time.sleep(0.01)
            cache.close()
            t.join()
            assert not errors, errors
        print("threads ok")
        """)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.splitlines() == ["store_kv ok", "attention (closing the cache) ok",
                                     "observe ok", "layer_buffers ok", "threads ok"], r.stdout

