"""The fused function's blocks (:mod:`.fused`): what one call is (:class:`Spec`) and the
softmax probabilities of one block of query rows (:class:`Blocks`), computed the same way by
the forward and by the backward, which recomputes them block by block instead of keeping them.

A block is query rows [i0, i1) against keys [0, z) (with ``causal``, z stops at the block's
last query). Its logits: ``q·kᵀ·scale`` + the dense bias + prefix-sum differences + table
terms gathered by bucket + count terms (:mod:`.counting`) + stick terms' sums
(:mod:`.stick_breaking`: stick-breaking's, from the block's own logits; per_row_alibi's, from
its gate vectors), masked, then softmax, or exp when the logits are log weights
(``Spec.normalized`` False).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from ..terms import BucketFn, StickRule
from .counting import CountBlock
from .stick_breaking import StickBlock

__all__ = ["Blocks", "Spec", "bucket_range", "memo_buckets"]


@dataclass(frozen=True, eq=False)
class Spec:
    """Everything about one call that is not a differentiable tensor."""

    scale: float
    causal: bool
    block: int
    q_pos: Tensor | None  # (B|1, Tq) int64
    k_pos: Tensor | None  # (B|1, Tk) int64
    mask: Tensor | None  # (B|1, 1|H, Tq, Tk) bool, True = attend
    sides: tuple[str, ...]  # per table term: "query" or "key"
    factored: tuple[bool, ...]  # per table term: given as factors x (B, H, Tq, D), rows (H|, D, R)
    table_buckets: tuple[BucketFn, ...]
    value_buckets: tuple[BucketFn, ...]
    has_bias: bool
    sums_after: tuple[bool, ...] = ()  # per prefix-sum term: a second pair of sums for keys after the query
    n_counts: int = 0  # count terms (their embeddings come last among the inputs)
    count_causal: bool = False  # keys after a query are hidden in every row: counts and sticks stop at the query
    # per stick term: its rule and its gates' scale, None when its gates are the call's own scaled
    # logits; the gate vectors of the others (gate_q, gate_k per term) come last among the inputs
    sticks: tuple[tuple[StickRule, float | None], ...] = ()
    normalized: bool = True  # False: the weights are exp(logits) (stick-breaking), not their softmax


class Blocks:
    """The per-call geometry and the probabilities of one block of query rows, shared by
    forward and backward (the backward recomputes exactly what the forward computed)."""

    def __init__(
        self, spec: Spec, q: Tensor, k: Tensor, bias: Tensor | None, tables: Sequence[Tensor], sums: Sequence[tuple] = (),
        counts: Sequence[Tensor] = (), gates: Sequence[tuple[Tensor, Tensor]] = (),
    ) -> None:
        self.spec, self.bias, self.tables = spec, bias, tables
        self.q, self.counts = q, [e.to(q.dtype) for e in counts]
        # stick terms with gate vectors of their own: gate_q·scale (B, H, Tq, d), gate_kᵀ (B, H, d, Tk)
        scales = [g for _, g in spec.sticks if g is not None]
        self.gates = [(gq.to(q.dtype) * g, gk.to(q.dtype).transpose(-1, -2).contiguous()) for (gq, gk), g in zip(gates, scales)]
        # prefix-sum terms: (query sums, key sums, after pair or None) in the compute dtype
        self.sums = [(t[0].to(q.dtype), t[1].to(q.dtype), None if t[2] is None else (t[2][0].to(q.dtype), t[2][1].to(q.dtype)))
                     for t in sums]
        self.B, self.H, self.Tq, _ = q.shape
        self.Tk = k.shape[2]
        self.qs = q * spec.scale  # (B, H, Tq, D): the scale on q, not on every logit block
        # kᵀ contiguous: on CPU x @ kᵀ-as-a-view runs at half the speed of x @ (D, Tk) rows.
        self.kt = k.transpose(-1, -2).contiguous()  # (B, H, D, Tk)
        self.offset = self.Tk - self.Tq  # query i is stream index offset + i
        # Key-side tables are read as (B, H, R, Tk) so one gather along R serves a block.
        self.key_tables = [t.transpose(-1, -2) if side == "key" else None for t, side in zip(tables, spec.sides)]
        # Factored query-side terms: x (B, H, Tq, D) and rows (H|1, D, R) in the compute dtype.
        self.factors = [
            (t[0].to(q.dtype), (t[1] if t[1].dim() == 3 else t[1][None]).to(q.dtype)) if f else None
            for t, f in zip(tables, spec.factored)
        ]

    def at_or_before(self, i0: int, i1: int, z: int) -> Tensor:
        """(rows, z) bool: key j at or before query i's stream index."""
        qi = torch.arange(self.offset + i0, self.offset + i1, device=self.qs.device)
        return torch.arange(z, device=self.qs.device)[None, :] <= qi[:, None]

    def ranges(self):
        """(i0, i1, z): query rows [i0, i1) and the keys [0, z) any of them may see."""
        for i0 in range(0, self.Tq, self.spec.block):
            i1 = min(i0 + self.spec.block, self.Tq)
            z = min(self.Tk, self.offset + i1) if self.spec.causal else self.Tk
            yield i0, i1, max(z, 0)

    def buckets(self, fn: BucketFn, i0: int, i1: int, z: int) -> Tensor:
        """(B, H, rows, z) int64 buckets of the block (an expanded view of (B|1, rows, z))."""
        s = self.spec
        idx = fn(s.q_pos[:, i0:i1, None], s.k_pos[:, None, :z])  # (B|1, rows, z)
        return idx[:, None].expand(self.B, self.H, i1 - i0, z)

    def block_table(self, n: int, idx: Tensor, i0: int, i1: int) -> tuple[int, Tensor]:
        """(lo, table): a factored term's columns [lo, hi) that the block's buckets reach,
        x[rows] @ rows[:, lo:hi] (B, H, rows, hi - lo)."""
        lo, hi = bucket_range(idx)
        x, rows = self.factors[n]
        return lo, torch.matmul(x[:, :, i0:i1], rows[..., lo:hi])

    def probs(self, i0: int, i1: int, z: int, idx_of) -> tuple[Tensor, list[CountBlock], list[StickBlock]]:
        """(B, H, rows, z) weights of the block in the compute dtype: softmax probabilities
        (rows that see no key are zero), or exp(logits) when not ``spec.normalized``; and the
        block's count and stick terms (for their gradients)."""
        s = self.spec
        x = torch.matmul(self.qs[:, :, i0:i1], self.kt[..., :z])  # (B, H, rows, z)
        rows = torch.arange(self.offset + i0, self.offset + i1, device=x.device)  # stream indices
        # the count terms' gates and stick-breaking's breaks are the scaled logits before any term is added
        counted = [CountBlock(x, self.q[:, :, i0:i1], e, rows, s.count_causal) for e in self.counts]
        broken, gated = [], iter(self.gates)
        for rule, gate_scale in s.sticks:
            if gate_scale is None:
                y = x
            else:
                gq, gkt = next(gated)
                y = torch.matmul(gq[:, :, i0:i1], gkt[..., :z])  # (B, H, rows, z): the block's gate logits
            broken.append(StickBlock(y, rows, s.count_causal, rule))
        # The logits' own dtype, not q's: under autocast a float32 q gives bf16 logits, where
        # float32's min overflows. Finite: exp(-inf) takes a slow path on CPU.
        neg = torch.finfo(x.dtype).min
        if self.bias is not None:
            x.add_(self.bias[..., i0:i1, :z])
        for cq, ck, after in self.sums:
            d = cq[..., i0:i1, None] - ck[..., None, :z]  # (B, H, rows, z): c_i - c_j
            if not s.causal:  # keys after the query read the other sums (causal: they are hidden)
                later = -d if after is None else after[1][..., None, :z] - after[0][..., i0:i1, None]
                d = torch.where(self.at_or_before(i0, i1, z), d, later)
            x.add_(d)
        for n, side in enumerate(s.sides):
            idx = idx_of(s.table_buckets[n])
            if s.factored[n]:
                lo, t = self.block_table(n, idx, i0, i1)  # (B, H, rows, hi - lo)
                x.add_(t.gather(-1, idx - lo))
            elif side == "query":
                t = self.tables[n][..., i0:i1, :].expand(self.B, self.H, -1, -1)  # (B, H, rows, R)
                x.add_(t.gather(-1, idx))
            else:
                t = self.key_tables[n][..., :z].expand(self.B, self.H, -1, -1)  # (B, H, R, z)
                x.add_(t.gather(-2, idx))
        for c in counted:
            c.add_to(x)
        for b in broken:
            b.add_to(x)
        if s.mask is not None:
            x.masked_fill_(~s.mask[..., i0:i1, :z], neg)
        if s.causal and self.offset + i0 < z - 1:  # the block crosses the diagonal
            c0 = max(self.offset + i0, 0)  # keys left of c0 are seen by every row of the block
            qi = torch.arange(self.offset + i0, self.offset + i1, device=x.device)
            above = torch.arange(c0, z, device=x.device)[None, :] > qi[:, None]  # (rows, z - c0)
            x[..., c0:].masked_fill_(above, neg)
        if not s.normalized:  # log weights: exp(neg) is 0, so rows that see no key are zero too
            return x.exp_(), counted, broken
        # Rows that see no key (padding queries, queries before the first key): all hidden.
        may_be_empty = s.mask is not None or (s.causal and self.offset + i0 < 0)
        empty = (x.amax(-1, keepdim=True) == neg) if may_be_empty else None  # (B, H, rows, 1)
        p = torch.softmax(x, dim=-1)
        if empty is not None:
            p.masked_fill_(empty, 0.0)
        return p, counted, broken


def bucket_range(idx: Tensor) -> tuple[int, int]:
    """[lo, hi): the buckets a block's (expanded) index reaches; read from the unexpanded rows."""
    base = idx[:1] if idx.stride(0) == 0 else idx  # batch and heads expanded: read one copy
    base = base[:, :1] if base.stride(1) == 0 else base
    return int(base.min()), int(base.max()) + 1


def memo_buckets(geo: Blocks, i0: int, i1: int, z: int):
    """A bucket lookup for one block that computes each distinct bucket function once."""
    seen: list[tuple[BucketFn, Tensor]] = []

    def idx_of(fn: BucketFn) -> Tensor:
        for f, t in seen:  # terms of one encoding share one bucket function
            if f is fn or f == fn:  # bound methods are new objects on each access, equal
                return t
        t = geo.buckets(fn, i0, i1, z)
        seen.append((fn, t))
        return t

    return idx_of
