"""CoPE's count term for one block of query rows: what :mod:`.fused` adds to the block's
logits, and the gradients it sends back (:class:`~posenc.terms.CountTerm` describes the term).

A block is query rows i in [i0, i1) (stream indices s_i) against keys [0, z). Its scaled
logits x (B, H, rows, z) are also the gates' logits, ``g = sigmoid(x)``, so the gates cost no
matmul of their own. The counts ``p_ij = sum_{t=j}^{s_i} g_it`` are a reversed cumulative sum
over the keys, clamped to M - 1 (M = ``emb.shape[0]``), and the gain is ``q_i·e[p_ij]``
interpolated between the integer positions around ``p_ij``.

**Only the keys a count can tell apart are counted.** With causal attention a count only
grows from the query backwards, so once every row of the block has counted past M - 1 at
some key a, every key before a is clamped to M - 1 and gains the row constant ``q_i·e[M-1]``
exactly as the dense formula gives it (``w = 0``), with no gradient to its count. The block
therefore counts over [a, z) only: a is found by counting back from the diagonal over twice
as many keys each time until the block's smallest count at a reaches M - 1 (or a = 0). With
the gates around one half (a model at initialisation), a is about 2M keys before the block,
so the elementwise work per block is rows x (rows + 2M) instead of rows x z. A model whose
gates stay near zero (a count of rare tokens) counts over all keys, as the dense formula.
Bidirectional attention counts every key, both ways (keys after the query count from the
query forwards, :func:`~posenc.terms.contextual_positions`).

Backward, for dL/dlogits ``ds`` of the block:

* ``d(q_i·e[m])``: ``ds (1 - w)`` scattered to m = floor p and ``ds w`` to ceil p, and the row
  sums of the clamped keys to M - 1; from it dq_i (= d @ e, unscaled) and de (= dᵀ @ q);
* ``dp_ij = ds_ij (q_i·e[ceil p] - q_i·e[floor p])`` where the count is not clamped;
* ``dg_it = sum_{j <= t} dp_ij`` (keys up to the query; for keys after it the mirror sum), and
  ``dx = dg g (1 - g)``, which the fused function adds to ``ds`` before its dq/dk products.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..terms import interpolated_gain

__all__ = ["CountBlock"]

# Keys counted beyond the block's rows at first: 2M covers gates of about one half; the
# width doubles until every count of the block has reached M - 1.
_MIN_EXTRA = 32


class CountBlock:
    """The count term of one block: ``add_to(x)`` adds the gains to the logits, ``grads(ds)``
    gives (dx on keys [a, z), dq of the rows, de).

    ``x`` (B, H, rows, z): the block's scaled logits before any term (the gates' logits);
    ``q_rows`` (B, H, rows, D): the block's queries, unscaled; ``emb`` (M, D); ``s``
    (rows,) int64: the rows' stream indices; ``causal``: keys after a query are hidden.
    """

    def __init__(self, x: Tensor, q_rows: Tensor, emb: Tensor, s: Tensor, causal: bool) -> None:
        self.M = M = emb.shape[0]
        self.q_rows, self.emb, self.causal = q_rows, emb, causal
        z = x.shape[-1]
        self.per_position = torch.matmul(q_rows, emb.t())  # (B, H, rows, M): q_i·e[m]
        if causal:
            width = max(z - int(s[0]), 0) + max(2 * M, _MIN_EXTRA)  # the rows' diagonal and 2M keys before it
            while True:
                a = max(z - width, 0)
                self.t = torch.arange(a, z, device=x.device)  # (W,) the counted keys
                self.g = torch.sigmoid(x[..., a:])  # (B, H, rows, W)
                self.before = self.t[None, :] <= s[:, None]  # (rows, W): key at or before the query
                self.raw = torch.where(self.before, self.g, 0.0).flip(-1).cumsum(-1).flip(-1)
                if a == 0 or bool(self.raw[..., 0].amin() >= M - 1):  # NaN: count everything
                    break
                width *= 2
        else:
            a = 0
            self.t = torch.arange(z, device=x.device)
            self.g = torch.sigmoid(x)
            self.before = self.t[None, :] <= s[:, None]
            self.after = self.t[None, :] >= s[:, None]
            back = torch.where(self.before, self.g, 0.0).flip(-1).cumsum(-1).flip(-1)
            fwd = torch.where(self.after, self.g, 0.0).cumsum(-1)
            self.raw = torch.where(self.before, back, fwd)
        self.a = a
        self.s = s

    def add_to(self, x: Tensor) -> None:
        """Add the gains to the block's logits x (B, H, rows, z), in place."""
        a = self.a
        if a > 0:
            x[..., :a].add_(self.per_position[..., self.M - 1 :])  # clamped: q_i·e[M - 1]
        x[..., a:].add_(interpolated_gain(self.per_position, self.raw.clamp(max=self.M - 1)))

    def grads(self, ds: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(dx (B, H, rows, z - a) for the logits of keys [a, z) through the gates, dq of the
        rows (B, H, rows, D) through q_i·e, de (M, D)) from dL/dlogits ds (B, H, rows, z)."""
        M, a = self.M, self.a
        dper = torch.zeros_like(self.per_position)  # (B, H, rows, M)
        if a > 0:
            dper[..., M - 1].add_(ds[..., :a].sum(-1))
        d = ds[..., a:]
        pos = self.raw.clamp(max=M - 1)
        lo, hi = pos.floor(), pos.ceil()
        w = pos - lo
        lo_i, hi_i = lo.nan_to_num(0.0).long(), hi.nan_to_num(0.0).long()
        dper.scatter_add_(-1, lo_i, d * (1 - w))
        dper.scatter_add_(-1, hi_i, d * w)
        step = self.per_position.gather(-1, hi_i) - self.per_position.gather(-1, lo_i)
        dpos = (d * step).masked_fill_(self.raw > M - 1, 0.0)  # clamped counts pass no gradient
        if self.causal:  # keys after the query have ds = 0, so dpos = 0 there
            dg = dpos.cumsum(-1).masked_fill_(~self.before, 0.0)
        else:
            dg = torch.where(self.before, dpos, 0.0).cumsum(-1).masked_fill_(~self.before, 0.0)
            later = torch.where(self.before, 0.0, dpos).flip(-1).cumsum(-1).flip(-1)  # sum over keys j > s_i, j >= t
            dg = dg + later.masked_fill_(~self.after, 0.0)
        dx = dg.mul_(self.g).mul_(1 - self.g)
        dq = torch.matmul(dper, self.emb)  # (B, H, rows, D)
        de = torch.matmul(dper.transpose(-1, -2), self.q_rows).sum((0, 1))  # (M, D)
        return dx, dq, de
