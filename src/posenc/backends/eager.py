"""The reference backend: attention spelled out, in float32 or wider.

logits = q·kᵀ·scale + bias + logit terms (dense), masked to -inf where a key is hidden,
softmax in float32 (float64 for float64 inputs), out = probs·v + value terms (which read the
probabilities). When the logits are log weights themselves (``terms.normalized`` is False:
stick-breaking) the weights are exp(logits), not their softmax. Every other backend is
tested against this one. Shapes: q (B, H, Tq, D), k, v (B, H, Tk, D); logits (B, H, Tq, Tk).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..masks import AttentionMask
from . import LayerTerms, logit_dtype

__all__ = ["attention", "attention_probs"]


def attention_probs(q: Tensor, k: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """Attention weights (B, H, Tq, Tk) in float32 or wider: softmax probabilities, or
    exp(logits) when ``terms.normalized`` is False."""
    logits = torch.matmul(q, k.transpose(-2, -1)).to(logit_dtype(q.dtype)) * scale  # (B, H, Tq, Tk)
    add = terms.dense_logits()
    if add is not None:
        logits = logits + add
    m = mask.dense()
    if m is not None:
        logits = logits.masked_fill(~m, float("-inf"))
    return torch.softmax(logits, dim=-1) if terms.normalized else torch.exp(logits)


def attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """(B, H, Tq, Dv): the reference computation, value terms included."""
    probs = attention_probs(q, k, scale=scale, mask=mask, terms=terms).to(v.dtype)
    out = torch.matmul(probs, v)
    for t in terms.values:
        out = out + t.dense_output(probs, terms.q_pos, terms.k_pos).to(v.dtype)
    return out
