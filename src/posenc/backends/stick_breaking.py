"""Stick-breaking's term for one block of query rows: what :mod:`.fused` adds to the block's
logits, and the gradient it sends back (:class:`~posenc.terms.StickBreakingTerm` describes the
term, :mod:`posenc.relative.stick_breaking` the attention).

A block is query rows i in [i0, i1) (stream indices s_i) against keys [0, z). Its scaled logits
x (B, H, rows, z) are also the breaks' logits, beta = sigmoid(x), so the breaks cost no matmul
of their own. The term is the sum of ``log_keep = log(1 - beta) = logsigmoid(-x)`` from key j
to the last key e_i that breaks the row's stick (s_i, or s_i - 1 without ``attend_current``): a
reversed cumulative sum over the keys, as CoPE's counts (:mod:`.counting`) but neither clamped
nor interpolated; keys after the query (bidirectional use) sum from the query forwards. The
logits then are the log weights, and the fused function takes their exp (the layer's
``normalized`` is False), so the block needs no softmax and its backward no row sums.

Backward, for dL/dlogits ``ds`` of the block (``ds = p dp``, p = exp(logits)):

* ``dlog_keep_it = sum_{j <= t} ds_ij`` for keys t up to e_i (every key j from t back shares
  t's break), and ``sum_{j >= t, j > s_i} ds_ij`` for keys from the forward stick's first;
* ``dx = dlog_keep · (-sigmoid(x)) = dlog_keep · expm1(log_keep)``, which the fused function
  adds to ``ds`` before its dq/dk products (x is also the logit itself, which ``ds`` covers).

Every key of the block is summed: no key is skipped where the stick is spent, so the result
is the dense formula's to rounding (a spent stick gives weights that underflow to zero, which
a later version may use to skip the keys, as CoPE's counts skip the clamped ones).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..terms import EXCLUDED

__all__ = ["StickBlock"]


class StickBlock:
    """The stick-breaking term of one block: ``add_to(x)`` adds the sums to the logits,
    ``grads(ds)`` gives dx (B, H, rows, z) through the breaks.

    ``x`` (B, H, rows, z): the block's scaled logits before any term; ``s`` (rows,) int64: the
    rows' stream indices; ``causal``: keys after a query are hidden in every row (no forward
    stick); ``attend_current``: the query's own key breaks the stick first.
    """

    def __init__(self, x: Tensor, s: Tensor, causal: bool, attend_current: bool) -> None:
        t = torch.arange(x.shape[-1], device=x.device)  # (z,)
        self.causal = causal
        self.log_keep = F.logsigmoid(-x)  # (B, H, rows, z): log(1 - beta)
        self.before = t[None, :] <= (s if attend_current else s - 1)[:, None]  # (rows, z): keys up to e_i
        back = torch.where(self.before, self.log_keep, 0.0).flip(-1).cumsum(-1).flip(-1)  # sum over [j, z)
        if causal:  # keys after e_i: the excluded diagonal, then keys the causal mask hides
            self.term = back.masked_fill_(~self.before, EXCLUDED)
        else:
            self.after = t[None, :] >= (s if attend_current else s + 1)[:, None]  # keys from b_i on
            self.later = t[None, :] > s[:, None]  # keys after the query: the forward stick
            fwd = torch.where(self.after, self.log_keep, 0.0).cumsum(-1)  # sum over [0, j]
            self.term = torch.where(self.before, back, torch.where(self.later, fwd, EXCLUDED))

    def add_to(self, x: Tensor) -> None:
        """Add the sums to the block's logits x (B, H, rows, z), in place."""
        x.add_(self.term)
        self.term = None  # the backward recomputes the block; nothing but log_keep is read again

    def grads(self, ds: Tensor) -> Tensor:
        """dx (B, H, rows, z) for the block's logits through the breaks, from dL/dlogits ds."""
        if self.causal:  # keys after e_i have p = 0, so ds = 0 there
            dkeep = ds.cumsum(-1).masked_fill_(~self.before, 0.0)
        else:
            dkeep = torch.where(self.before, ds, 0.0).cumsum(-1).masked_fill_(~self.before, 0.0)
            # the forward stick: the sum over keys j >= t after the query
            later = torch.where(self.later, ds, 0.0).flip(-1).cumsum(-1).flip(-1)
            dkeep = dkeep + later.masked_fill_(~self.after, 0.0)
        return dkeep.mul_(torch.expm1(self.log_keep))
