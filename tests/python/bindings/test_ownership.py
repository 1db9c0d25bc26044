"""Ownership: every C object is destroyed exactly once, parents outlive children, closed
objects refuse use, and nothing leaks over many create/close cycles."""
import ctypes
import gc
import weakref

import numpy as np
import pytest

import qsakv
from conftest import run_isolated


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


def heap_in_use() -> int:
    """Bytes the C heap hands out now (glibc mallinfo2: small chunks + mmapped blocks).
    Unlike RSS it counts allocations whose pages were never touched."""
    libc = ctypes.CDLL(None)
    try:
        f = libc.mallinfo2
    except AttributeError:
        pytest.skip("glibc without mallinfo2 (needs glibc >= 2.33)")
    f.restype = _Mallinfo2
    m = f()
    return m.uordblks + m.hblkhd


def cycle(cfg):
    with qsakv.Context("cpu") as ctx:
        cache = qsakv.Cache(ctx, cfg, num_blocks=2)
        plan = qsakv.Plan(cache, max_rows=8)
        plan.close()
        cache.close()


def test_create_close_1000_times_leaks_nothing(small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    base_handles = qsakv.live_handles()
    for _ in range(20):  # warm up allocator caches
        cycle(cfg)
    gc.collect()
    before = heap_in_use()
    with qsakv.Context("cpu") as ctx, qsakv.Cache(ctx, cfg, num_blocks=2) as c:
        per_cycle = c.layout.total_bytes  # what one leaked cache would cost
    for _ in range(1000):
        cycle(cfg)
    gc.collect()
    grown = heap_in_use() - before
    assert qsakv.live_handles() == base_handles
    # One leaked cache per cycle would be 1000 * per_cycle (>= 500 MB here).
    assert per_cycle > 500_000
    assert grown < 20 * per_cycle, f"heap grew by {grown} bytes over 1000 cycles"


def test_close_is_idempotent_and_closed_objects_refuse_use(small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    ctx = qsakv.Context("cpu")
    cache = qsakv.Cache(ctx, cfg, num_blocks=2)
    plan = qsakv.Plan(cache, max_rows=4)
    n = qsakv.live_handles()
    plan.close()
    plan.close()
    assert plan.closed and qsakv.live_handles() == n - 1
    with pytest.raises(qsakv.ClosedError, match="plan is closed"):
        plan.info  # noqa: B018 (a property)
    # Closing the context closes its open cache first (no C object outlives its parent).
    ctx.close()
    assert cache.closed and ctx.closed and qsakv.live_handles() == n - 3
    with pytest.raises(qsakv.ClosedError):
        cache.layer_buffers(3)
    with pytest.raises(qsakv.ClosedError):
        qsakv.Cache(ctx, cfg, num_blocks=2)
    with pytest.raises(qsakv.ClosedError):
        with ctx:
            pass
    cache.close()
    ctx.close()
    assert qsakv.live_handles() == n - 3
    assert "closed" in repr(cache)


def test_children_keep_parents_alive_and_gc_is_a_backstop(small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    n = qsakv.live_handles()
    plan = qsakv.Plan(qsakv.Cache(qsakv.Context("cpu"), cfg, num_blocks=2), max_rows=4)
    gc.collect()
    # Only the plan is referenced here, yet its cache and context are still open.
    assert qsakv.live_handles() == n + 3
    assert not plan.cache.closed and not plan.cache.context.closed
    assert plan.info.max_rows == 4
    del plan
    gc.collect()
    assert qsakv.live_handles() == n  # finalizers destroyed all three


def test_views_keep_the_memory_they_show(small_cfg):
    """A view of a cache's memory outlives close(): closing the Context closes the Cache
    (the handles refuse use at once) but the C objects go only with the last view; the
    view stays readable and writable meanwhile (it used to crash the process)."""
    cfg = small_cfg.replace(kv_dtype="fp16")
    n = qsakv.live_handles()
    ctx = qsakv.Context("cpu")
    cache = qsakv.Cache(ctx, cfg, num_blocks=2)
    kv = cache.layer_buffers(3).kv
    ctx.close()
    assert ctx.closed and cache.closed
    with pytest.raises(qsakv.ClosedError):
        cache.layer_buffers(3)
    assert qsakv.live_handles() == n + 2  # the cache and, through it, the context
    kv[...] = 1
    assert (kv == 1).all()
    del kv
    gc.collect()
    assert qsakv.live_handles() == n
    # Without views, close() destroys at once, children first.
    ctx = qsakv.Context("cpu")
    qsakv.Cache(ctx, cfg, num_blocks=2).layer_buffers(3)  # a view that is gone already
    ctx.close()
    assert qsakv.live_handles() == n


def test_plan_keeps_the_block_table_alive(cpu, small_cfg):
    cfg = small_cfg.replace(kv_dtype="fp16")
    with qsakv.Cache(cpu, cfg, num_blocks=2) as cache, qsakv.Plan(cache, max_rows=1) as plan:
        bt = np.array([[0, 1]], np.int32)
        batch = qsakv.Batch([0, 1], [3], bt)
        plan.update(batch)
        ref = weakref.ref(bt)
        batch.block_table = np.array([[1, 0]], np.int32)  # the Batch reused, not updated
        del bt
        gc.collect()
        # Read at run time: the table of the last update stays alive until the next one.
        assert ref() is not None and ref() is plan._block_table


def test_failed_create_leaves_nothing(cpu, small_cfg):
    n = qsakv.live_handles()
    with pytest.raises(qsakv.OverlayMissingError):
        qsakv.Cache(cpu, small_cfg, None, num_blocks=2)
    assert qsakv.live_handles() == n


def test_garbage_collector_destroys_children_before_parents():
    """An engine object in a reference cycle that holds a Context, a Cache and a Plan:
    the garbage collector finds their keepers unreachable together and runs the
    finalizers in its own order. The Cache was destroyed first and the Plan's destroy
    then read it (a segfault); the child's finalizer holds the parent's keeper now. In
    a subprocess, so that a regression fails this test rather than killing pytest."""
    r = run_isolated("""
        import gc
        import qsakv
        cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4, max_batched_tokens=64,
                                       max_requests=8, max_model_len=8192, kv_dtype="fp16")
        class Engine:
            pass
        for _ in range(5):
            e = Engine()
            e.ctx = qsakv.Context("cpu")
            e.cache = qsakv.Cache(e.ctx, cfg, num_blocks=16)
            e.plan = qsakv.Plan(e.cache, max_rows=8)
            e.self = e
            del e
            gc.collect()
            assert qsakv.live_handles() == 0, qsakv.live_handles()
        print("ok")
        """)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip() == "ok"
