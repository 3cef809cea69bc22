"""A stick term for one block of query rows: what :mod:`.fused` adds to the block's logits, and
the gradient it sends back to the gates (:class:`~posenc.terms.StickSums` describes the terms:
stick-breaking's log weights, :mod:`posenc.relative.stick_breaking`, and per_row_alibi's forget
gates, :mod:`posenc.relative.per_row_alibi`).

A block is query rows i in [i0, i1) (stream indices s_i) against keys [0, z). Its gate logits y
(B, H, rows, z) are the block's own scaled logits x when the gates are the call's q, k and
scale (stick-breaking's breaks cost no matmul of their own), else gate_q[rows] @ gate_k[:z]ᵀ
times the gate scale (a width-d product, d = 8 for per_row_alibi). The term is the sum of
``log_keep = power · logsigmoid(∓y)`` (:class:`~posenc.terms.StickRule`) from key j to the last
key e_i that breaks the row's stick (s_i, or s_i - 1 without ``attend_current``): a reversed
cumulative sum over the keys, as CoPE's counts (:mod:`.counting`) but neither clamped nor
interpolated; keys after the query (bidirectional use) sum from the query forwards; the
query's own key, when it breaks nothing, is hidden (stick-breaking) or gets 0 (per_row_alibi).

Backward, for dL/dlogits ``ds`` of the block:

* ``dlog_keep_it = sum_{j <= t} ds_ij`` for keys t up to e_i (every key j from t back shares
  t's break), and ``sum_{j >= t, j > s_i} ds_ij`` for keys from the forward stick's first;
* ``dy = dlog_keep · power · ±sigmoid(∓y)``, from the log keep itself: d logsigmoid(-y)/dy =
  expm1(logsigmoid(-y)) and d logsigmoid(y)/dy = -expm1(logsigmoid(y)). The fused function adds
  dy to ``ds`` before its dq/dk products when y is the block's own logits (which are also the
  logits themselves, which ``ds`` covers), else turns it into the gate vectors' gradients.

Every key of the block is summed: no key is skipped where the stick is spent, so the result
is the dense formula's to rounding (a spent stick gives weights that underflow to zero, which
a later version may use to skip the keys, as CoPE's counts skip the clamped ones).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..terms import EXCLUDED, StickRule

__all__ = ["StickBlock"]


class StickBlock:
    """The stick term of one block: ``add_to(x)`` adds the sums to the logits, ``grads(ds)``
    gives dy (B, H, rows, z), the gradient of the block's gate logits.

    ``y`` (B, H, rows, z): the block's gate logits (its scaled logits before any term, for
    stick-breaking); ``s`` (rows,) int64: the rows' stream indices; ``causal``: keys after a
    query are hidden in every row (no forward stick); ``rule``: the sign, power and diagonal.
    """

    def __init__(self, y: Tensor, s: Tensor, causal: bool, rule: StickRule) -> None:
        t = torch.arange(y.shape[-1], device=y.device)  # (z,)
        self.causal, self.rule = causal, rule
        self.log_sig = rule.log_sigmoid(y)  # (B, H, rows, z): logsigmoid(∓y), the log keep at unit power
        keep = rule.weighted(self.log_sig)
        own = rule.attend_current
        self.before = t[None, :] <= (s if own else s - 1)[:, None]  # (rows, z): keys up to e_i
        back = torch.where(self.before, keep, 0.0).flip(-1).cumsum(-1).flip(-1)  # sum over [j, z)
        if causal:  # keys after e_i: the query's own key, then keys the causal mask hides
            self.term = back.masked_fill_(~self.before, EXCLUDED) if rule.hide_current else back  # back is 0 there
        else:
            self.after = t[None, :] >= (s if own else s + 1)[:, None]  # keys from b_i on
            self.later = t[None, :] > s[:, None]  # keys after the query: the forward stick
            fwd = torch.where(self.after, keep, 0.0).cumsum(-1)  # sum over [0, j]
            self.term = torch.where(self.before, back, torch.where(self.later, fwd, EXCLUDED if rule.hide_current else 0.0))

    def add_to(self, x: Tensor) -> None:
        """Add the sums to the block's logits x (B, H, rows, z), in place."""
        x.add_(self.term)
        self.term = None  # the backward recomputes the block; nothing but log_sig is read again

    def grads(self, ds: Tensor) -> Tensor:
        """dy (B, H, rows, z) for the block's gate logits, from dL/dlogits ds."""
        if self.causal:  # a key t's break is shared by the keys j <= t: later keys do not enter
            dkeep = ds.cumsum(-1).masked_fill_(~self.before, 0.0)
        else:
            dkeep = torch.where(self.before, ds, 0.0).cumsum(-1).masked_fill_(~self.before, 0.0)
            # the forward stick: the sum over keys j >= t after the query
            later = torch.where(self.later, ds, 0.0).flip(-1).cumsum(-1).flip(-1)
            dkeep = dkeep + later.masked_fill_(~self.after, 0.0)
        dkeep.mul_(torch.expm1(self.log_sig))  # d logsigmoid(-y)/dy; the opposite sign for logsigmoid(y)
        factor = self.rule.power if self.rule.negate else -self.rule.power
        return dkeep if factor == 1.0 else dkeep.mul_(factor)
