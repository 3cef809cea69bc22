"""The leaf of a :class:`~posenc.terms.LogitsTerm` alone: the encoding's own logits, scaled and
masked, then softmax, then v, with no q·kᵀ (PaTH's decoding step, whose logits come from the
keys its KV cache keeps carried through the Householders: the term's dense form would add
them to q·kᵀ and subtract q·kᵀ again, two passes over the keys that this leaf skips).
Logits and softmax in float32 or wider, as the eager reference. Shapes: logits (B, H, Tq, Tk),
v (B, H, Tk, Dv)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..masks import AttentionMask
from . import LayerTerms, logit_dtype

__all__ = ["attention"]


def attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """(B, H, Tq, Dv): softmax(scale · logits, masked) · v of the layer's one LogitsTerm (its q,
    k and scale are this call's)."""
    (t,) = terms.logits
    if t.scale != scale:
        raise ValueError(f"a LogitsTerm's scale ({t.scale}) must be the attention's ({scale}): its logits replace "
                         "scale·q·kᵀ")
    logits = t.logits.to(logit_dtype(q.dtype)) * scale
    m = mask.dense()
    if m is not None:
        logits = logits.masked_fill(~m, float("-inf"))
    return torch.matmul(torch.softmax(logits, dim=-1).to(v.dtype), v)
