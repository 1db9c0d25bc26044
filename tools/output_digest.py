#!/usr/bin/env python3
"""Digests of the library's outputs on fixed-seed data, one line per case, for checking
that a change which should move no result moved none: run it against two builds and
diff the lines.

  QSAKV_LIBRARY=old/libqsakv.so PYTHONPATH=bindings/python python3 tools/output_digest.py > a
  QSAKV_LIBRARY=new/libqsakv.so PYTHONPATH=bindings/python python3 tools/output_digest.py > b
  diff a b

A case is one output of one batch: the top-k lists of select_topk, the sparse attention
over them and the dense attention, for each cache type (E4M3 with E4M3 index keys, FP16
with FP16 index keys, and E4M3 with BF16 activations on the GPU), each route (every row on the decode route, the automatic rule,
requests of 2+ rows grouped), and each kernel choice the environment can force
(QSAKV_GROUPED_MMA=sync / wgmma, QSAKV_CUDA_TIER=sm70, QSAKV_DEPENDENT_LAUNCH=off and with
every kernel family, QSAKV_SELECT_SORT=runs / buckets, each in a fresh context; a build that does not know a variable runs
its default there). The
batch mixes decode rows, verify rows and prefill chunks whose rows select partly the
same tokens. Needs a CUDA GPU and PyTorch; `--cpu` runs the same cases (one environment)
on the CPU reference backend with NumPy arrays; `--small` a quick batch of the same kinds.
The digest is SHA-256 of the output's bytes
(the top-k lists' unused tail included), so equal lines mean bit-identical outputs.
"""
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

import qsakv

CPU = "--cpu" in sys.argv[1:]
if not CPU:
    import torch

# (rows, seq_len) per request: decode rows at several lengths, verify rows, a prefill
# chunk deep in a long context and one at a request's start.
REQUESTS = [(1, 300), (1, 5000), (1, 16000), (4, 9000), (8, 7000), (384, 16000), (48, 48)]
MIXES = (0, 0, 0, 0.5, 0.8, 0.6, 0.3)  # each request's own share of its rows' index queries
MAX_MODEL_LEN = 16384
if "--small" in sys.argv[1:]:  # a quick batch of the same kinds (the tool's own test)
    REQUESTS = [(1, 300), (4, 900), (24, 1200), (8, 8)]
    MIXES = (0, 0.5, 0.6, 0.3)
    MAX_MODEL_LEN = 2048
ENVIRONMENTS = [("auto", {}), ("mma-sync", {"QSAKV_GROUPED_MMA": "sync"}),
                ("mma-wgmma", {"QSAKV_GROUPED_MMA": "wgmma"}),
                ("tier-sm70", {"QSAKV_CUDA_TIER": "sm70"}),
                ("dependent-launch-off", {"QSAKV_DEPENDENT_LAUNCH": "off"}),
                ("dependent-launch-all", {"QSAKV_DEPENDENT_LAUNCH": "store,select,attention"}),
                ("sort-runs", {"QSAKV_SELECT_SORT": "runs"}),
                ("sort-buckets", {"QSAKV_SELECT_SORT": "buckets"})]
ROUTES = [("decode", -1), ("auto", 0), ("grouped2", 2)]


def batch_data(cfg, geo, rng):
    bs, ratio = cfg.block_size, cfg.compress_ratio
    rows = [r for r, _ in REQUESTS]
    lens = [n for _, n in REQUESTS]
    pages = [(n + bs - 1) // bs for n in lens]
    num_blocks = sum(pages) + 1
    order = rng.permutation(np.arange(1, num_blocks))  # block 0 unused by any request
    bt = np.full((len(lens), max(pages)), -1, np.int32)
    at = 0
    for r, p in enumerate(pages):
        bt[r, :p] = order[at:at + p]
        at += p
    per_req = [bt[r, np.arange(n) // bs].astype(np.int64) * bs + np.arange(n) % bs
               for r, n in enumerate(lens)]
    slots = np.concatenate(per_req)
    cslots = np.concatenate([s[ratio - 1::ratio] for s in per_req])
    n, g = len(slots), len(cslots)
    chan = np.where(np.arange(cfg.head_dim) % 17 == 0, 3.5, 0.5)
    # A request's index queries: a shared direction plus each row's own, so that its
    # rows select partly the same groups.
    iq = []
    for (r, _), mix in zip(REQUESTS, MIXES):
        base = rng.standard_normal((1, cfg.index_num_heads, cfg.index_head_dim))
        own = rng.standard_normal((r, cfg.index_num_heads, cfg.index_head_dim))
        iq.append(base + mix * own)
    return dict(
        query_start=np.concatenate([[0], np.cumsum(rows)]).astype(np.int32),
        lens=np.asarray(lens, np.int32), num_blocks=num_blocks, block_table=bt,
        slots=slots, cslots=cslots,
        k=(rng.standard_normal((n, geo.kv_heads, cfg.head_dim)) * chan).astype(np.float16),
        v=(rng.standard_normal((n, geo.kv_heads, cfg.head_dim)) * 0.8).astype(np.float16),
        ck=rng.standard_normal((g, cfg.index_head_dim)).astype(np.float16),
        q=rng.standard_normal((sum(rows), geo.q_heads, cfg.head_dim)).astype(np.float16),
        iq=np.concatenate(iq).astype(np.float16))


def digest(t):
    if not CPU and t.dtype == torch.bfloat16:
        t = t.view(torch.int16)  # NumPy has no BF16: the same bytes
    a = t if CPU else t.contiguous().cpu().numpy()
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:24]


def filled(like_or_shape, value, dtype=None):
    """An output buffer poisoned with `value` (NaN or -7): a case that leaves part of it
    unwritten changes its digest."""
    if CPU:
        if dtype is None:
            return np.full_like(like_or_shape, value)
        return np.full(like_or_shape, value, dtype)
    if dtype is None:
        return torch.full_like(like_or_shape, value)
    return torch.full(like_or_shape, value, dtype=torch.int32, device="cuda")


def run_cases(tag, ctx, cfg, overlay, b):
    put = (lambda a: np.ascontiguousarray(a)) if CPU else \
        (lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda())
    dev = {k: put(b[k]) for k in ("k", "v", "slots", "ck", "cslots", "q", "iq", "block_table")}
    if getattr(cfg.activation_dtype, "name", "") == "BF16":
        for k in ("k", "v", "q"):
            dev[k] = dev[k].to(torch.bfloat16)
    layer = cfg.qsa_layers[0]
    rows = len(b["q"])
    with qsakv.Cache(ctx, cfg, overlay, num_blocks=b["num_blocks"]) as cache:
        cache.store_kv(layer, dev["k"], dev["v"], dev["slots"])
        cache.store_compressed_keys(layer, dev["ck"], dev["cslots"])
        for route, min_rows in ROUTES:
            with qsakv.Plan(cache, max_rows=rows, multi_row_min_rows=min_rows) as plan:
                plan.update(qsakv.Batch(b["query_start"], b["lens"], dev["block_table"]))
                topk = filled((rows, cache.geometry.topk_width), -7, np.int32)
                plan.select_topk(layer, dev["iq"], topk)
                out = filled(dev["q"], float("nan"))
                plan.attention(layer, dev["q"], out, topk=topk)
                dense = filled(dev["q"], float("nan"))
                plan.attention(layer, dev["q"], dense, mode="dense")
                ctx.synchronize(None)
                groups = plan.info.num_groups
                for what, t in (("topk", topk), ("sparse", out), ("dense", dense)):
                    print(f"{tag} route={route} {what}: {digest(t)}  (groups {groups})")
                sys.stdout.flush()


def run_environment(env_name, tmp, index, ckpt):
    """Every case in a fresh context of the environment already set."""
    try:
        ctx = qsakv.Context("cpu" if CPU else "cuda")
    except qsakv.UnsupportedError as err:  # e.g. wgmma forced on a GPU other than SM 9.0
        print(f"{env_name}: skipped ({err})")
        return
    with ctx:
        cfg = qsakv.ModelConfig.preset("qwen4_exp", tp_size=4)
        cfg.max_model_len, cfg.max_requests = MAX_MODEL_LEN, len(REQUESTS)
        cfg.max_batched_tokens = sum(r for r, _ in REQUESTS)
        geo = cfg.rank_geometry()
        b = batch_data(cfg, geo, np.random.default_rng(20261204))
        pack = Path(tmp) / f"scales-{env_name}"
        qsakv.Overlay.write(pack, {l: (0.02, 0.007) for l in cfg.qsa_layers},
                            base_index_path=index)
        cfg8 = cfg.replace(index_key_dtype="e4m3")
        # BF16 activations on an E4M3 cache: the FP16 MMAs with rescaled queries.
        variants = [("e4m3", cfg8)] if CPU else \
            [("e4m3", cfg8), ("bf16-e4m3", cfg8.replace(activation_dtype="bf16"))]
        for name, c in variants:
            with qsakv.Overlay.load(pack / "model-kvscales.safetensors") as ov:
                ov.validate(c, qsakv.checkpoint_revision(ckpt))
                run_cases(f"{env_name} {name}", ctx, c, ov, b)
        run_cases(f"{env_name} fp16", ctx, cfg.replace(kv_dtype="fp16"), None, b)


def main():
    # Each environment alone: the hook variables it does not set are unset for it (a value
    # from the caller's shell would otherwise run under another case's name).
    hooks = sorted({k for _, env in ENVIRONMENTS for k in env})
    saved = {k: os.environ.get(k) for k in hooks}
    try:
        with tempfile.TemporaryDirectory(prefix="qsakv-digest-") as tmp:
            ckpt = Path(tmp) / "checkpoint"
            ckpt.mkdir()
            index = ckpt / "model.safetensors.index.json"
            index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": {
                "model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}))
            for env_name, env in ENVIRONMENTS[:1] if CPU else ENVIRONMENTS:
                for k in hooks:
                    os.environ.pop(k, None)
                os.environ.update(env)
                run_environment(env_name, tmp, index, ckpt)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    main()
