"""Independent NumPy oracles for the pipeline tests (FP64), and the synthetic world they
run on. Nothing here calls the library: E4M3 comes from ml_dtypes, selection and
attention are written from the header's contract."""
from dataclasses import dataclass

import ml_dtypes
import numpy as np

E4M3_MAX = 448.0


@dataclass
class World:
    """A mixed batch (decode, verify, prefill chunk, a short request) and its data."""

    rows: list
    lens: list
    block_size: int
    bt: np.ndarray            # int32 [requests, pages]
    num_blocks: int
    k: np.ndarray             # float16 [tokens, kv_heads, head_dim], requests concatenated
    v: np.ndarray
    slots: np.ndarray         # int64 [tokens]
    ck: np.ndarray            # float16 [groups, index_head_dim]
    cslots: np.ndarray        # int64 [groups]
    q: np.ndarray             # float16 [rows, q_heads, head_dim]
    iq: np.ndarray            # float16 [rows, index_heads, index_head_dim]
    query_start: np.ndarray   # int32 [requests + 1]

    @property
    def num_rows(self):
        return int(self.query_start[-1])

    def row_request_pos(self):
        out = []
        for r, (n, L) in enumerate(zip(self.rows, self.lens)):
            out += [(r, L - n + i) for i in range(n)]
        return out


def make_world(cfg, geo, rows=(1, 4, 24, 1), lens=(3001, 700, 24, 3), seed=0) -> World:
    rng = np.random.default_rng(seed)
    bs, ratio = cfg.block_size, cfg.compress_ratio
    pages = [(L + bs - 1) // bs for L in lens]
    stride = max(pages) + 1
    num_blocks = sum(pages) + 4
    # Pages on a random permutation of the blocks: not contiguous, some never mapped.
    perm = rng.permutation(num_blocks).astype(np.int32)
    bt = np.full((len(lens), stride), -1, np.int32)
    nxt = 0
    for r, p in enumerate(pages):
        bt[r, :p] = perm[nxt:nxt + p]
        nxt += p
    slots, cslots = [], []
    for r, L in enumerate(lens):
        t = np.arange(L)
        s = bt[r, t // bs].astype(np.int64) * bs + t % bs
        slots.append(s)
        cslots.append(s[ratio - 1::ratio][: L // ratio])
    slots, cslots = np.concatenate(slots), np.concatenate(cslots)
    tokens, groups = len(slots), len(cslots)
    # Channel-dependent magnitudes, as real K/V have.
    chan = np.where(np.arange(cfg.head_dim) % 17 == 0, 3.5, 0.5)
    k = (rng.standard_normal((tokens, geo.kv_heads, cfg.head_dim)) * chan).astype(np.float16)
    v = (rng.standard_normal((tokens, geo.kv_heads, cfg.head_dim)) * 0.8).astype(np.float16)
    # Small integer index keys and queries: scores are exact in FP32 and FP64, so the
    # top-k is unambiguous (ties broken by block id, as the contract says).
    ck = rng.integers(-3, 4, (groups, cfg.index_head_dim)).astype(np.float16)
    n_rows = sum(rows)
    iq = rng.integers(-2, 3, (n_rows, cfg.index_num_heads, cfg.index_head_dim)).astype(np.float16)
    q = rng.standard_normal((n_rows, geo.q_heads, cfg.head_dim)).astype(np.float16)
    qs = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
    return World(list(rows), list(lens), bs, bt, num_blocks, k, v, slots, ck, cslots, q, iq, qs)


def calibrate(x: np.ndarray) -> float:
    """max|x| / 448 rounded up to the next FP32, so that nothing saturates."""
    m = np.float32(np.abs(x.astype(np.float32)).max())
    s = np.float32(m / np.float32(E4M3_MAX))
    return float(np.nextafter(s, np.float32(np.inf)) if s * np.float32(E4M3_MAX) < m else s)


def quantise_e4m3(x: np.ndarray, scale: float) -> np.ndarray:
    """e4m3(fp32(x) / scale), round to nearest even (the values stay below 448)."""
    return (x.astype(np.float32) / np.float32(scale)).astype(ml_dtypes.float8_e4m3fn)


def select_reference(w: World, cfg, geo) -> np.ndarray:
    ratio, width = cfg.compress_ratio, geo.topk_width
    out = np.full((w.num_rows, width), -1, np.int32)
    group_base = np.concatenate([[0], np.cumsum([L // ratio for L in w.lens])])
    for row, (r, pos) in enumerate(w.row_request_pos()):
        visible = (pos + 1) // ratio
        keys = w.ck[group_base[r]:group_base[r] + visible].astype(np.float64)
        dots = np.einsum("hd,bd->hb", w.iq[row].astype(np.float64), keys)
        scores = np.maximum(dots, 0).sum(0)
        order = np.lexsort((np.arange(visible), -scores))[: geo.topk_blocks]
        toks = (order[:, None] * ratio + np.arange(ratio)).ravel().tolist()
        toks += list(range(visible * ratio, pos + 1))
        out[row, : len(toks)] = toks
    return out


def attention_reference(w: World, cfg, geo, kv_k, kv_v, k_scale, v_scale, topk=None):
    """FP64 attention. kv_k / kv_v: the values each token's K / V decode to (float64,
    [tokens, kv_heads, head_dim], requests concatenated, before the scale). topk None:
    dense causal."""
    starts = np.concatenate([[0], np.cumsum(w.lens)])
    out = np.zeros((w.num_rows, geo.q_heads, cfg.head_dim))
    for row, (r, pos) in enumerate(w.row_request_pos()):
        if topk is None:
            toks = np.arange(pos + 1)
        else:
            t = topk[row]
            toks = t[(t >= 0) & (t <= pos)]
        if len(toks) == 0:
            continue
        K = kv_k[starts[r] + toks] * k_scale
        V = kv_v[starts[r] + toks] * v_scale
        for h in range(geo.q_heads):
            kvh = h // geo.group_size
            logits = K[:, kvh] @ w.q[row, h].astype(np.float64) * geo.softmax_scale
            p = np.exp(logits - logits.max())
            out[row, h] = p @ V[:, kvh] / p.sum()
    return out


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))
