"""Inference under a training-free method on the fused attention kernel: one kernel call per
rotation and block of queries, merged through their log-sum-exps.

A method gives each (query, key) pair the logit of one of R rotations (``select``). The pairs of
one rotation are a softmax over a subset of the keys; softmaxes over disjoint subsets combine
exactly through their log-sum-exps (the merge of FlashAttention's online softmax, Dao et al.
2022, section 3.1): with o_r the rotation's normalized output and l_r = log sum exp of its
logits,

    out = sum_r exp(l_r - m) o_r / sum_r exp(l_r - m),   m = max_r l_r.

So for a block of queries, each rotation runs PyTorch's fused CPU attention kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, which also returns the log-sum-exp) on
the key range where some pair selects it, with an additive mask only where selection or
causality cuts inside that range. No logit tensor is written: the kernel's tiles stay in cache,
which is what the unfused path (:mod:`posenc.methods.blockwise`, R logit blocks, a merge, a
softmax) pays for in memory traffic, 4 to 6 times the plain forward at 4096 tokens.

Used by :func:`posenc.methods.method_attention` for inference on the CPU (no autograd, no
dropout); training, dropout and other devices take the blockwise path. Equal to it up to the
kernel's float32 accumulation order (tests/test_methods_fused.py).

Shapes as in :mod:`posenc.methods.blockwise`: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk,
Dv), positions (B|1, T) int64, the queries the last Tq of the Tk keys.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .base import AttentionMethod
from .blockwise import cos_sin, rotate_half_layout

__all__ = ["FUSED_BLOCK_BYTES", "fused_available", "method_attention_fused"]

_KERNEL = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
#: query rows per block keep one block's selection codes and mask (B, rows, Tk) near this many bytes
FUSED_BLOCK_BYTES = 1 << 26
#: query rows per block and keys per tile of the tiled plan: the mixed bands are about this wide
_TILED_ROWS = 256
_TILE = 128
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def fused_available(q: Tensor, k: Tensor, v: Tensor, dropout: float) -> bool:
    """Whether the fused path can run: the kernel exists, CPU tensors of one floating dtype, no
    dropout and no gradient wanted (the kernel's backward does not see the log-sum-exp)."""
    return (_KERNEL is not None and dropout == 0.0 and q.device.type == "cpu"
            and q.dtype == k.dtype == v.dtype and q.dtype in _DTYPES
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))))


def _heads(x: Tensor, groups: int) -> Tensor:
    """(B, Hkv, T, D) -> (B, Hkv * groups, T, D): key head h serves query heads h g .. h g + g - 1."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _contiguous(qp: Tensor, kp: Tensor, offset: int) -> bool:
    """Whether every row's key positions step by one along the stream and the queries are the
    last keys (no packing, no padding): then a tile's rotation is read off its corners."""
    steps = torch.arange(kp.shape[1], device=kp.device)
    return bool((kp == kp[:, :1] + steps).all()) and bool((qp == kp[:, offset:]).all())


def _runs(method: AttentionMethod, qp: Tensor, kp: Tensor, i0: int, i1: int, end: int, offset: int
          ) -> list[tuple[int, int, int]]:
    """(lo, hi, r) runs of key tiles covering 0..end-1 for queries i0..i1-1 of contiguous
    positions: r the rotation every pair of the run takes and sees, or -1 (mixed: a selection
    boundary or the causal diagonal crosses it). A tile's pairs range from its nearest (first
    query, last key) to its farthest (last query, first key), and ``select`` is monotone
    (:class:`~posenc.methods.base.AttentionMethod`), so equal corners make a uniform tile."""
    starts = torch.arange(0, end, _TILE, device=kp.device)
    stops = (starts + _TILE).clamp(max=end)
    near = method.select(qp[:, i0:i0 + 1, None], kp[:, None, stops - 1])[:, 0]  # (B, tiles)
    far = method.select(qp[:, i1 - 1:i1, None], kp[:, None, starts])[:, 0]  # (B, tiles)
    uniform = ((near == far) & (near == near[:1])).all(0) & (stops - 1 <= offset + i0)  # (tiles,)
    kind = torch.where(uniform, near[0].long(), -1).tolist()
    runs: list[tuple[int, int, int]] = []
    for t, r in enumerate(kind):
        lo, hi = int(starts[t]), int(stops[t])
        if runs and runs[-1][2] == r:
            runs[-1] = (runs[-1][0], hi, r)
        else:
            runs.append((lo, hi, r))
    return runs


def method_attention_fused(q: Tensor, k: Tensor, v: Tensor, method: AttentionMethod, qp: Tensor, kp: Tensor,
                           inv_freq: Tensor, *, attention_factor: float, scale: float, causal: bool,
                           visible_of: Callable[[int, int, int], Tensor], masked: bool, block_rows: int | None
                           ) -> Tensor:
    """(B, H, Tq, Dv) in v's dtype. ``qp``/``kp``: positions expanded to (B, Tq) and (B, Tk);
    ``visible_of(i0, i1, end)``: the bool mask (broadcasting to (B, H, rows, end)) of which keys
    0..end-1 the queries i0..i1-1 may see; ``masked``: whether it holds more than causality
    (padding, documents, a dense mask). Causal, unmasked, with
    contiguous positions (a window read on its own, a prefill, decoding), the keys of a block go
    in runs of tiles (:func:`_runs`): a uniform run is one unmasked kernel call, and selection is
    evaluated pair by pair only on the mixed runs (bands of about ``rows`` keys); otherwise every
    pair of a block is evaluated."""
    B, H, Tq, D = q.shape
    Tk, groups = k.shape[2], H // k.shape[1]
    offset = Tk - Tq
    R = method.num_rotations
    tiled = causal and not masked and _contiguous(qp, kp, offset)
    rows = block_rows or (_TILED_ROWS if tiled else max(16, FUSED_BLOCK_BYTES // (8 * B * max(1, Tk))))
    rotations = method.rotations(qp, kp)
    tables_q = [cos_sin(rq, inv_freq, attention_factor, q.dtype) for rq, _ in rotations]  # R x 2 x (B, Tq, r/2)
    keys = [_heads(rotate_half_layout(k, *cos_sin(rk, inv_freq, attention_factor, k.dtype)), groups)
            for _, rk in rotations]  # R x (B, H, Tk, D)
    values = _heads(v, groups)  # (B, H, Tk, Dv)
    out = q.new_empty(B, H, Tq, v.shape[-1], dtype=v.dtype)
    work = torch.promote_types(v.dtype, torch.float32)  # the merge's precision
    for i0 in range(0, Tq, rows):
        i1 = min(i0 + rows, Tq)
        end = offset + i1 if causal else Tk
        q_rot: dict[int, Tensor] = {}

        def rotated(r: int) -> Tensor:
            if r not in q_rot:
                q_rot[r] = rotate_half_layout(q[:, :, i0:i1], tables_q[r][0][:, i0:i1], tables_q[r][1][:, i0:i1])
            return q_rot[r]

        pieces: list[tuple[Tensor, Tensor]] = []  # (output (B, H, rows, Dv), log-sum-exp (B, H, rows))
        if tiled:
            for lo, hi, r in _runs(method, qp, kp, i0, i1, end, offset):
                if r >= 0:
                    pieces.append(_KERNEL(rotated(r), keys[r][:, :, lo:hi], values[:, :, lo:hi], 0.0, False,
                                          scale=scale))
                    continue
                stream = torch.arange(offset + i0, offset + i1, device=q.device)[:, None]  # (rows, 1)
                visible = (torch.arange(lo, hi, device=q.device)[None] <= stream)[None, None]  # (1, 1, rows, n)
                pieces += _masked(method, qp, kp, i0, i1, lo, hi, visible, rotated, keys, values, scale)
        else:
            visible = visible_of(i0, i1, end)
            pieces += _masked(method, qp, kp, i0, i1, 0, end, visible, rotated, keys, values, scale)
        out[:, :, i0:i1] = _merge(pieces, values[:, :, :end], work, i1 - i0).to(v.dtype)
    return out


def _masked(method: AttentionMethod, qp: Tensor, kp: Tensor, i0: int, i1: int, lo: int, hi: int, visible: Tensor,
            rotated: Callable[[int], Tensor], keys: list[Tensor], values: Tensor, scale: float
            ) -> list[tuple[Tensor, Tensor]]:
    """The kernel calls of keys lo..hi-1 for queries i0..i1-1, every pair's rotation evaluated:
    per rotation, its key range with an additive mask where the rotation or ``visible`` cuts."""
    R = method.num_rotations
    sel = method.select(qp[:, i0:i1, None], kp[:, None, lo:hi])[:, None].to(torch.int8)  # (B, 1, rows, n)
    code = torch.where(visible, sel, torch.tensor(R, dtype=torch.int8))  # R: the pair is not attended
    B, H, rows = values.shape[0], values.shape[1], i1 - i0
    pieces = []
    for r in range(R):
        chosen = code == r
        cols = chosen.flatten(0, -2).any(0).nonzero()  # keys some pair gives to r
        if cols.numel() == 0:
            continue
        a, b = int(cols[0]), int(cols[-1]) + 1
        part = chosen[..., a:b]
        bias = None
        if not bool(part.all()):
            bias = torch.zeros(part.shape, dtype=values.dtype).masked_fill_(~part, float("-inf"))
        o, lse = _KERNEL(rotated(r), keys[r][:, :, lo + a:lo + b], values[:, :, lo + a:lo + b], 0.0, False,
                         attn_mask=bias, scale=scale)
        seen = part.any(-1).expand(B, H, rows)  # rows with no key here: the kernel says 0, weight them 0
        pieces.append((o, lse.masked_fill(~seen, float("-inf"))))
    return pieces


def _merge(pieces: list[tuple[Tensor, Tensor]], values: Tensor, work: torch.dtype, rows: int) -> Tensor:
    """The softmax over the union of the pieces' disjoint key sets, from their normalized outputs
    and log-sum-exps; a row that sees no key at all is uniform over ``values``' keys (B, H, n, Dv),
    as the blockwise path makes it."""
    if not pieces:
        return values.to(work).mean(2, keepdim=True).expand(-1, -1, rows, -1)
    lse = torch.stack([p[1] for p in pieces]).to(work)  # (P, B, H, rows)
    top = lse.amax(0)
    w = torch.exp(lse - torch.where(torch.isfinite(top), top, 0.0))  # (P, B, H, rows)
    total = w.sum(0)
    merged = sum(w[j, ..., None] * o.to(work) for j, (o, _) in enumerate(pieces))
    merged = merged / total.clamp_min(torch.finfo(work).tiny)[..., None]
    blind = total == 0
    if bool(blind.any()):
        merged = torch.where(blind[..., None], values.to(work).mean(2, keepdim=True), merged)
    return merged
