"""The leaves on ``torch.nn.functional.scaled_dot_product_attention`` (which one runs:
:func:`posenc.backends.plan`).

* :func:`causal` — no terms, plain causal: ``is_causal``;
* :func:`masked` — no terms, any other mask: the bool mask (None when every key is visible);
* :func:`cpu_flash_bias` — a bias alone on CPU, plain causal or no mask:
  :func:`posenc.backends.cpu_flash.flash_bias_attention`, the CPU flash kernel with the bias
  and ``is_causal`` together, and a backward that gives a learned bias its gradient (T5,
  KERPLE, FIRE) without keeping (B, H, T, T) probabilities. The bias is built once per forward
  and shared by every layer (:class:`~posenc.backends.SharedBias`);
* :func:`bias` — a fixed bias otherwise: the bias with the mask folded in as SDPA's float
  ``attn_mask``; :func:`bias_rows` the same for plain causal attention in row blocks that
  skip the keys right of each block (:func:`causal_sdpa_with_bias`);
* :func:`local_rows` — no terms, a causal sliding window or chunks alone
  (``mask.local_rows``): row blocks that read only the keys their window or chunk reaches.

Shapes: q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv); Dv may differ from D (PoPE's q and k
are twice as wide as its values): see :func:`sdpa`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..masks import AttentionMask
from . import LayerTerms
from .cpu_flash import flash_bias_attention
from .narrow_values import narrow_value_attention

__all__ = ["ROWS", "LOCAL_ROWS", "FEW_ROWS", "sdpa", "bias", "bias_rows", "causal", "causal_sdpa_with_bias", "cpu_flash_bias", "local_rows",
           "masked"]

#: Query rows per block of :func:`causal_sdpa_with_bias`.
ROWS = 256
#: Query rows per block of :func:`local_rows`.
LOCAL_ROWS = 128
#: With q and k wider than v on CPU, calls of at most this many query rows (decoding steps)
#: compute their scores directly; longer ones run in row blocks or pad v (see :func:`sdpa`).
FEW_ROWS = 16


def sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
         scale: float | None = None) -> Tensor:
    """``F.scaled_dot_product_attention``, also fast on CPU when v is narrower than q and k.

    torch's CPU flash kernel needs one head dim for q, k and v; otherwise SDPA falls to its math
    kernel, which keeps the (Tq, Tk) probabilities for the backward and, with Tq = 1, copies
    every key to scale it. So on CPU, with Dv < D: a call of a few query rows computes
    ``softmax(q·scale @ kᵀ + mask) @ v`` (the scale on q alone: no copy of the keys); a longer
    call without a mask (causal or not) runs
    :func:`~posenc.backends.narrow_values.narrow_value_attention` (blocks of query rows, p·v and
    its backward at v's own width); a call with a mask, or under torch.compile (whose graph
    would unroll the blocks), pads v with zeros to width D, runs the flash kernel and keeps the
    first Dv channels of its output (the zero channels' outputs are zero; their gradient is
    dropped with them).
    """
    dq, dv = q.shape[-1], v.shape[-1]
    if dv == dq or dv > dq or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    if q.shape[-2] <= FEW_ROWS and not is_causal:
        q = q * (dq ** -0.5 if scale is None else scale)
        if q.shape[-2] == 1:
            # One row (a decoding step): k @ qᵀ, a matrix-vector product, seen as the (1, Tk) row
            # it is. q @ kᵀ gives the same numbers slower at length (2 threads, 8 heads of 128:
            # 330 against 560 us at 4096 keys, 880 against 1980 at 8192; equal up to 2048).
            s = (k @ q.transpose(-1, -2)).transpose(-1, -2)  # (B, H, 1, Tk)
        else:
            s = q @ k.transpose(-1, -2)  # (B, H, Tq, Tk)
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        return s.softmax(-1, dtype=torch.promote_types(s.dtype, torch.float32)).to(v.dtype) @ v  # (B, H, Tq, Dv)
    scale = dq ** -0.5 if scale is None else scale
    if attn_mask is None and (not is_causal or q.shape[-2] == k.shape[-2]) and not torch.compiler.is_compiling():
        return narrow_value_attention(q, k, v, scale=scale, causal=is_causal)
    out = F.scaled_dot_product_attention(q, k, F.pad(v, (0, dq - dv)), attn_mask=attn_mask, is_causal=is_causal,
                                         scale=scale)
    return out[..., :dv]


def causal_sdpa_with_bias(q: Tensor, k: Tensor, v: Tensor, masked_bias: Tensor, scale: float, rows: int = ROWS) -> Tensor:
    """Causal SDPA (Tq == Tk) whose float ``attn_mask`` (B|1, H, T, T) already holds -inf above the diagonal.

    SDPA cannot combine a float mask with ``is_causal`` (the math backend rejects it), so with
    the mask alone it computes every query-key block, twice the work of causal attention. Each
    block of ``rows`` queries attends only to the keys up to its last query instead: the keys
    left out are all -inf for those queries, so the result is the same, and about half the
    blocks are skipped.
    """
    T = q.shape[2]
    outs = []
    for a in range(0, T, rows):
        z = min(a + rows, T)
        m = masked_bias[:, :, a:z, :z]  # (B|1, H, z - a, z): a view, no copy
        outs.append(sdpa(q[:, :, a:z], k[:, :, :z], v[:, :, :z], attn_mask=m, scale=scale))
    return torch.cat(outs, dim=2)  # (B, H, T, D)


def causal(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    return sdpa(q, k, v, is_causal=True, scale=scale)


def masked(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    return sdpa(q, k, v, attn_mask=mask.dense(), scale=scale)


def local_rows(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """Causal local attention (``mask.local_rows``: a sliding window w or chunks c alone) in blocks
    of ``LOCAL_ROWS`` queries, each reading only the keys its window or chunk reaches
    (``mask.row_block``): T·(w + rows) work instead of T·Tk, and no (Tq, Tk) mask."""
    off = mask.tk - mask.tq  # queries are the last Tq keys
    outs = []
    for a in range(0, mask.tq, LOCAL_ROWS):
        z = min(a + LOCAL_ROWS, mask.tq)
        lo, m = mask.row_block(a, z)  # m (z - a, z + off - lo)
        outs.append(sdpa(q[:, :, a:z], k[:, :, lo:z + off], v[:, :, lo:z + off],
                                                   attn_mask=m, scale=scale))
    return torch.cat(outs, dim=2)  # (B, H, Tq, D)


def cpu_flash_bias(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    return flash_bias_attention(q, k, v, terms.bias.summed(), scale=scale, causal=mask.plain_causal)


def bias(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    masked_bias = terms.bias.masked(q.dtype)  # (B|1, H, Tq, Tk), shared by the layers
    return sdpa(q, k, v, attn_mask=masked_bias, scale=scale)


def bias_rows(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    return causal_sdpa_with_bias(q, k, v, terms.bias.masked(q.dtype), scale)
