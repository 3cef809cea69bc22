"""``torch.nn.functional.scaled_dot_product_attention``, and the fused paths for terms.

* no terms: ``is_causal`` when the mask is plain causal, else the bool mask;
* a content-independent bias alone, on CPU, plain causal or no mask:
  :func:`posenc.backends.cpu_flash.flash_bias_attention` — the CPU flash kernel with the bias
  and ``is_causal`` together, and a backward that gives the bias its gradient (T5, KERPLE,
  FIRE) without keeping (B, H, T, T) probabilities. The bias is built once per forward and
  shared by every layer (:class:`SharedBias`);
* a bias alone otherwise (padding, documents, a GPU, or under torch.compile): the bias with the
  mask folded in as SDPA's float ``attn_mask``; plain causal runs in row blocks that skip the
  keys right of each block (:func:`causal_sdpa_with_bias`). A learned bias in training outside
  those cases takes the fused function below;
* content-dependent logit terms or value terms: :func:`posenc.backends.fused.fused_attention`,
  which reads the (B, H, T, R) tables by bucket and never keeps (B, H, Tq, Tk) probabilities
  for backward. Under ``torch.compile`` the dense composition (the eager backend) is traced
  instead.

Shapes: q (B, H, Tq, D), k, v (B, H, Tk, D).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..masks import AttentionMask
from ..terms import DenseTerm, TableTerm
from . import LayerTerms, eager
from .cpu_flash import flash_bias_attention
from .fused import fused_attention

__all__ = ["attention", "causal_sdpa_with_bias"]


def causal_sdpa_with_bias(q: Tensor, k: Tensor, v: Tensor, masked_bias: Tensor, scale: float, rows: int = 256) -> Tensor:
    """Causal SDPA (Tq == Tk) whose float ``attn_mask`` (B|1, H, T, T) already holds -inf above the diagonal.

    SDPA cannot combine a float mask with ``is_causal`` (the math backend rejects it), so with
    the mask alone it computes every query-key block, twice the work of causal attention. Each
    block of ``rows`` queries attends only to the keys up to its last query instead: the keys
    left out are all -inf for those queries, so the result is the same, and about half the
    blocks are skipped.
    """
    T = q.shape[2]
    if T <= rows:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=masked_bias, scale=scale)
    outs = []
    for a in range(0, T, rows):
        z = min(a + rows, T)
        m = masked_bias[:, :, a:z, :z]  # (B|1, H, z - a, z): a view, no copy
        outs.append(F.scaled_dot_product_attention(q[:, :, a:z], k[:, :, :z], v[:, :, :z], attn_mask=m, scale=scale))
    return torch.cat(outs, dim=2)  # (B, H, T, D)


def attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """(B, H, Tq, Dv) with SDPA, or the fused function when there are per-layer terms."""
    if terms.empty:
        if mask.plain_causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense(), scale=scale)
    # len(): dynamo cannot `not` a tuple. A learned bias in training takes the fused function:
    # SDPA's CPU backward then keeps a (B|1, H, T, T) bias gradient and probabilities per layer
    # (measured: T5's peak memory falls from about 1.85x NoPE's to 1.15x, for about 15% more
    # time). A fixed bias (ALiBi) keeps SDPA, which is faster and has no bias gradient.
    compiling = torch.compiler.is_compiling()
    bias_only = len(terms.logits) == 0 and len(terms.values) == 0
    if bias_only and not compiling and q.device.type == "cpu" and (mask.plain_causal or mask.is_full):
        # The CPU flash kernel with the bias and is_causal together; its backward (with the
        # bias's gradient when the bias is learned) keeps no (B, H, T, T) probabilities.
        return flash_bias_attention(q, k, v, terms.bias.summed(), scale=scale, causal=mask.plain_causal)
    if bias_only and (compiling or not _learned_bias(terms)):
        masked = terms.bias.masked(q.dtype)  # (B|1, H, Tq, Tk), shared by the layers
        if mask.plain_causal:
            return causal_sdpa_with_bias(q, k, v, masked, scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=masked, scale=scale)
    if compiling or (mask.tq <= _DECODE_ROWS < mask.tk and not _needs_grad(q, k, v)):
        # Under torch.compile the dense composition is traced and fused by the compiler (the
        # fused autograd.Function's non-tensor spec does not trace with fullgraph=True). A
        # decoding step without autograd has (B, H, Tq <= 16, Tk) logits: the dense composition
        # is small, and the fused call's per-call copies of the whole cache (kᵀ, v made
        # contiguous) cost more than it saves.
        return eager.attention(q, k, v, scale=scale, mask=mask, terms=terms)
    return _fused(q, k, v, scale, mask, terms)


_DECODE_ROWS = 16


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _learned_bias(terms: LayerTerms) -> bool:
    return torch.is_grad_enabled() and terms.bias is not None and terms.bias.dense().requires_grad


def _fused(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    bias = None if terms.bias is None else terms.bias.dense()
    for t in terms.logits:
        if isinstance(t, DenseTerm):
            bias = t.logits if bias is None else bias + t.logits
    tables = [t for t in terms.logits if isinstance(t, TableTerm)]
    # Causality as a flag lets the fused function skip key blocks; padding and documents (and
    # the rows-that-see-nothing rule) come as the dense bool mask.
    only_causal = mask.causal_only
    m = None if only_causal else mask.dense()
    if m is not None:
        m = m.expand(m.shape[0], 1, mask.tq, mask.tk)  # a padding mask broadcasts over queries
    return fused_attention(
        q, k, v, scale=scale, mask=m, causal=only_causal,
        bias=bias, tables=tables, values=terms.values, q_pos=terms.q_pos, k_pos=terms.k_pos,
    )
