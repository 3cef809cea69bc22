"""The slow references of the attention methods' tests: per query i and key j, the position pair
the paper's formula gives, the logit of q and k rotated there (float64), then one softmax per
query. Written from the papers, apart from posenc.methods' two-rotation form."""

from __future__ import annotations

from typing import Callable

import torch

Pair = Callable[[int, int], tuple[float, float]]


def self_extend_pair(G: int, W: int) -> Pair:
    """Jin et al. 2024 (LongLM Llama.py): neighbours at (m, n); beyond W, (m // G + W - W / G, n // G)."""
    return lambda m, n: (m, n) if m - n < W else (m // G + W - W / G, n // G)


def rerope_pair(w: int, slope: float = 0.0) -> Pair:
    """Su 2023: the distance d kept below w, then w + slope (d - w); as a pair (distance, 0)."""
    return lambda m, n: (m - n, 0) if m - n < w else (w + slope * (m - n - w), 0)


def rotate(x: torch.Tensor, p: float, inv_freq: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
    """x (D,) float64 rotated to position p in the half layout: pair j = (x_j, x_{j + r/2})."""
    half = inv_freq.numel()
    ang = p * inv_freq.double()
    c, s = ang.cos() * factor, ang.sin() * factor
    x1, x2 = x[:half], x[half: 2 * half]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, x[2 * half:]))


def slow_attention(q, k, v, q_pos, k_pos, inv_freq, pair: Pair, *, scale=None, factor=1.0,
                   visible: Callable[[int, int, int], bool] | None = None) -> torch.Tensor:
    """(B, H, Tq, Dv) float64. Queries are the last Tq keys; a query sees keys up to its stream
    index, and only those where ``visible(b, i, j)`` (default all)."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    g = H // Hkv
    scale = D ** -0.5 if scale is None else scale
    rows: dict[tuple[int, int, int], torch.Tensor] = {}  # kept as tensors: the loop is differentiable
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                m = int(q_pos[min(b, q_pos.shape[0] - 1), i])
                logits, vals = [], []
                for j in range(Tk - Tq + i + 1):
                    if visible is not None and not visible(b, i, j):
                        continue
                    n = int(k_pos[min(b, k_pos.shape[0] - 1), j])
                    pm, pn = pair(m, n)
                    qi = rotate(q[b, h, i].double(), pm, inv_freq, factor)
                    kj = rotate(k[b, h // g, j].double(), pn, inv_freq, factor)
                    logits.append((qi @ kj) * scale)
                    vals.append(v[b, h // g, j].double())
                if logits:  # a row that sees no key stays zero (the tests skip it)
                    rows[b, h, i] = torch.softmax(torch.stack(logits), 0) @ torch.stack(vals)
    return _stack(rows, B, H, Tq, v.shape[-1])


def _stack(rows, B, H, Tq, Dv):
    zero = torch.zeros(Dv, dtype=torch.float64)
    return torch.stack([torch.stack([torch.stack([rows.get((b, h, i), zero) for i in range(Tq)])
                                     for h in range(H)]) for b in range(B)])


def qkv(B=2, H=4, Hkv=2, Tq=12, Tk=None, D=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    Tk = Tq if Tk is None else Tk
    return (torch.randn(B, H, Tq, D, generator=g, dtype=dtype), torch.randn(B, Hkv, Tk, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv, Tk, D, generator=g, dtype=dtype))


def dual_chunk_pair(s: int, l: int) -> Pair:
    """An et al. 2024 (ChunkLlama): chunks of c = s - l; keys at n mod c; the query at m mod c in
    its own chunk, min(m mod c + c, s) in the next one, min(2c - 1, s) farther."""
    c = s - l

    def pair(m: int, n: int) -> tuple[float, float]:
        apart = m // c - n // c
        q = m % c if apart == 0 else min(m % c + c, s) if apart == 1 else min(2 * c - 1, s)
        return q, n % c

    return pair
