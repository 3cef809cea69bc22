"""FlexAttention (``torch.nn.attention.flex_attention``): terms as a ``score_mod``, the mask as
a block-sparse ``BlockMask``. No (Tq, Tk) tensor is built: every term's ``score_mod`` reads
small tensors (bias parameters, (B, H, T, R) tables) by (b, h, q_idx, kv_idx).

Compiled with ``torch.compile`` (once per process, at module level; keyed on nothing the user
owns) unless :data:`COMPILE` is False, which runs flex's unfused reference implementation
(tests on CPU use it: compiling costs more than the tests). :func:`posenc.backends.plan`
refuses, with a ``ValueError`` naming ``impl``, value terms (flex returns no probabilities
for Shaw's a^V) and a backward on CPU (:data:`posenc.torch_facts.FLEX_HAS_CPU_BACKWARD`),
and sends a call without queries elsewhere.

Unnormalised weights (``terms.normalized`` False: stick-breaking, whose logits are its log
weights): flex's softmax output times exp(logsumexp) of each row, which is the row's sum of
exp(logits), so the output is sum_j exp(logit_ij) v_j; the logsumexp is differentiable, so the
backward follows (a row that sees no key has logsumexp -inf: output 0).

Shapes: q (B, H, Tq, D), k, v (B, H, Tk, D).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import Tensor

from ..masks import AttentionMask
from . import LayerTerms

__all__ = ["attention", "COMPILE", "score_mod"]

COMPILE = True  # False: flex's eager (unfused) implementation, for tests on CPU
_compiled: Callable | None = None


def _flex() -> Callable:
    global _compiled
    from torch.nn.attention.flex_attention import flex_attention

    if not COMPILE:
        return flex_attention
    if _compiled is None:
        _compiled = torch.compile(flex_attention)
    return _compiled


def score_mod(terms: LayerTerms) -> Callable | None:
    """One ``score_mod`` adding the bias and every logit term; None without terms."""
    mods = [t.score_mod(terms.q_pos, terms.k_pos) for t in terms.logits]
    if terms.bias is not None:
        mods.insert(0, terms.bias.term.score_mod(terms.q_pos, terms.k_pos))
    if len(mods) == 0:
        return None

    def mod(score, b, h, q_idx, kv_idx):
        for m in mods:
            score = m(score, b, h, q_idx, kv_idx)
        return score

    return mod


def attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """(B, H, Tq, D) with flex_attention (the calls it cannot run are refused by the plan)."""
    with warnings.catch_warnings():
        # The unfused-implementation warning is expected when COMPILE is False.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        args = dict(score_mod=score_mod(terms), block_mask=mask.block_mask(), scale=scale)
        if terms.normalized:
            return _flex()(q, k, v, **args)
        out, lse = _with_lse(_flex(), q, k, v, **args)  # lse (B, H, Tq), natural log
        return out * lse.exp().unsqueeze(-1).to(out.dtype)


def _with_lse(fn: Callable, q: Tensor, k: Tensor, v: Tensor, **args) -> tuple[Tensor, Tensor]:
    """flex's output and its rows' logsumexp: ``return_aux`` where torch has it, ``return_lse``
    in older torch (which deprecates it once ``return_aux`` exists)."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return fn(q, k, v, return_lse=True, **args)
    out, aux = fn(q, k, v, return_aux=AuxRequest(lse=True), **args)
    return out, aux.lse
