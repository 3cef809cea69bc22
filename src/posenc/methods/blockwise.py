"""Attention under a training-free method (:class:`~posenc.methods.base.AttentionMethod`), one block
of query rows at a time, so that no (Tq, Tk) tensor is ever held.

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), H a multiple of Hkv (grouped
queries: head h reads key head h // (H / Hkv)); positions q_pos (B|1, Tq), k_pos (B|1, Tk)
int64; inv_freq (r/2,) the RoPE frequencies (after any scaling), r <= D rotated channels in
the half layout (pair j is channels (j, j + r/2), transformers' ``rotate_half``), channels r..
passing through. The queries are the last Tq of the Tk keys in the stream (a KV cache holds
the first Tk - Tq).

q and k arrive unrotated. For each of the method's R rotations the keys are rotated once per
call (R copies of k, O(Tk D)); then for each block of ``block_rows`` queries: the queries are
rotated R ways, R logit blocks (B, H, rows, Tk') are computed against the keys a causal query of
the block can see (Tk' = up to the block's last query), merged by the method's ``select``,
masked, and one softmax times v gives the block's output. Angles are float64, rotations in
float32 (float64 for float64 inputs) rounded once to the input dtype, the q·k products in the
input dtype (as transformers' eager attention), the merge and softmax in float32 (float64).
The RoPE attention factor (YaRN's temperature) multiplies cos and sin, so the logits get its
square, as when transformers rotates.

Memory: O(R Tk D) for the rotated keys plus O(B H rows Tk) for one block, never O(Tq Tk);
under autograd each block is recomputed in the backward (``torch.utils.checkpoint``), so the
saved tensors stay O(T) too. Masks: causal by stream index, and any of a dense boolean mask
(True = may attend; transformers' SDPA mask, sliced per block), a padding vector ``key_valid``
(B, Tk) and document ids ``segment_ids`` (B, Tk) of the stream (packing). A query row that sees
no key (a padding query) sees all of them equally (its output is meaningless and ignored, as in
posenc's own attention), never NaN.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .base import AttentionMethod

__all__ = ["BLOCK_BYTES", "block_rows_for", "cos_sin", "method_attention", "rotate_half_layout"]

#: the automatic block size keeps one float32 logit block (B, H, rows, Tk) near this many bytes
#: (64 MiB): at 16384 keys and 9 heads (SmolLM2-135M) that is 113 rows, while the full
#: (9, 16384, 16384) float32 scores would be 9 GiB.
BLOCK_BYTES = 1 << 26
_MIN_ROWS = 16


def block_rows_for(batch: int, heads: int, keys: int) -> int:
    """The automatic number of query rows per block: one float32 logit block of about
    :data:`BLOCK_BYTES`, at least 16 rows."""
    return max(_MIN_ROWS, BLOCK_BYTES // (4 * max(1, batch * heads * keys)))


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs: the precision of the rotations, merge and softmax."""
    return torch.promote_types(dtype, torch.float32)


def cos_sin(positions: Tensor, inv_freq: Tensor, attention_factor: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin (..., r/2) of positions (...) (integer or fractional) times inv_freq: angles in
    float64 (as :func:`posenc.rotary.angles.angles_cos_sin`, which takes integer positions to
    float32 tables), times the attention factor, stored in ``_work_dtype(dtype)``."""
    ang = positions.to(torch.float64)[..., None] * inv_freq.to(device=positions.device, dtype=torch.float64)
    cos, sin = ang.cos() * attention_factor, ang.sin() * attention_factor
    work = _work_dtype(dtype)
    return cos.to(work), sin.to(work)


def rotate_half_layout(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, h, T, D) by cos/sin (B|1, T, r/2), half layout, in cos's dtype (float32 or
    wider) rounded once to x's dtype; channels r.. pass through."""
    half = cos.shape[-1]
    xf = x.to(cos.dtype)
    x1, x2, rest = xf[..., :half], xf[..., half: 2 * half], xf[..., 2 * half:]
    c, s = cos[:, None], sin[:, None]  # (B|1, 1, T, r/2)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), dim=-1).to(x.dtype)


def _grouped_matmul(a: Tensor, b: Tensor, heads: int) -> Tensor:
    """a (B, H, rows, X) @ b (B, Hkv, X, Y) -> (B, H, rows, Y), query head h on key head h // g."""
    B, H, rows, X = a.shape
    Hkv = b.shape[1]
    out = a.reshape(B, Hkv, (H // Hkv) * rows, X) @ b  # (B, Hkv, g * rows, Y)
    return out.reshape(B, H, rows, -1)


def _check(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, inv_freq: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, T, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, Tq, D = q.shape
    if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[-1] != D:
        raise ValueError(f"k must be (B, Hkv, Tk, D) and v (B, Hkv, Tk, Dv) for q {tuple(q.shape)}; "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")
    if H % k.shape[1]:
        raise ValueError(f"the query heads ({H}) must be a multiple of the key heads ({k.shape[1]})")
    if k.shape[2] < Tq:
        raise ValueError(f"the keys ({k.shape[2]}) must include the {Tq} queries (they are the last Tq keys)")
    for name, pos, T in (("q_pos", q_pos, Tq), ("k_pos", k_pos, k.shape[2])):
        if pos.dim() != 2 or pos.shape[0] not in (1, B) or pos.shape[1] != T or pos.is_floating_point():
            raise ValueError(f"{name} must be integer positions (B or 1, {T}); got {pos.dtype} {tuple(pos.shape)}")
    if inv_freq.dim() != 1 or not 0 < 2 * inv_freq.numel() <= D:
        raise ValueError(f"inv_freq must be (r/2,) with 0 < r <= head size {D}; got {tuple(inv_freq.shape)}")


def _block(q_rot: list[Tensor], keys: list[Tensor], v: Tensor, sel: Tensor, visible: Tensor, scale: float,
           dropout: float) -> Tensor:
    """One block: R logit blocks merged by ``sel`` (B, 1, rows, Tk'), masked by ``visible``
    (broadcasting to (B, H, rows, Tk')), softmax, times v. A straight-line function, so that
    checkpoint can recompute it in the backward."""
    heads = q_rot[0].shape[1]
    work = _work_dtype(v.dtype)
    merged = _grouped_matmul(q_rot[0], keys[0].transpose(-1, -2), heads).to(work) * scale  # (B, H, rows, Tk')
    for r in range(1, len(q_rot)):
        logits = _grouped_matmul(q_rot[r], keys[r].transpose(-1, -2), heads).to(work) * scale
        merged = torch.where(sel == r, logits, merged)
    # finfo.min, not -inf: a row that sees no key then sees all keys equally instead of NaN
    merged = merged.masked_fill(~visible, torch.finfo(work).min)
    probs = torch.softmax(merged, dim=-1)
    if dropout > 0.0:
        probs = F.dropout(probs, p=dropout)
    return _grouped_matmul(probs.to(v.dtype), v, heads)  # (B, H, rows, Dv)


def method_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    method: AttentionMethod,
    q_pos: Tensor,
    k_pos: Tensor,
    inv_freq: Tensor,
    *,
    attention_factor: float = 1.0,
    scale: float | None = None,
    causal: bool = True,
    mask: Tensor | None = None,
    key_valid: Tensor | None = None,
    segment_ids: Tensor | None = None,
    dropout: float = 0.0,
    block_rows: int | None = None,
    fused: bool | None = None,
) -> Tensor:
    """Attention of unrotated q, k, v under ``method`` (see the module docstring for shapes):
    (B, H, Tq, Dv) in v's dtype.

    Args:
        method: the method and its parameters (``posenc.methods.build_method``).
        q_pos, k_pos: the tokens' RoPE positions (int64), which the method remaps.
        inv_freq: RoPE's frequencies after scaling, (r/2,) (float64 preferred: angles are float64).
        attention_factor: multiplies cos and sin (the scaling's temperature; logits get its square).
        scale: the logit scale, default D ** -0.5.
        causal: a query sees the keys up to its own stream index (not its position).
        mask: bool, broadcasting to (B, H, Tq, Tk), True where a query may attend.
        key_valid: bool (B, Tk), False on padding keys.
        segment_ids: (B, Tk) document ids of the stream; a query sees its own document only.
        dropout: attention dropout probability (training).
        block_rows: query rows per block; None: :func:`block_rows_for` (about 64 MiB of logits).
        fused: None (automatic): the fused kernel (:mod:`posenc.methods.fused`) wherever it can run
            (inference on the CPU), else this module's blocks; False: this module's blocks.
    """
    from .fused import fused_available, method_attention_fused  # fused.py uses this module's rotations

    _check(q, k, v, q_pos, k_pos, inv_freq)
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    if block_rows is not None and (isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1):
        raise ValueError(f"block_rows must be an int >= 1 (or None for automatic), got {block_rows!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    offset = Tk - Tq  # stream index of the first query
    qp, kp = q_pos.expand(B, Tq), k_pos.expand(B, Tk)  # (B, Tq), (B, Tk) int64

    def visible_of(i0: int, i1: int, end: int) -> Tensor:
        """Which keys 0..end-1 the queries i0..i1-1 may see: (B|1, 1|H, rows, end) bool."""
        rows = torch.arange(offset + i0, offset + i1, device=q.device)  # stream indices of the block's queries
        cols = torch.arange(end, device=q.device)
        visible = (cols[None] <= rows[:, None]) if causal else torch.ones(i1 - i0, end, dtype=torch.bool,
                                                                             device=q.device)
        visible = visible[None, None]  # (1, 1, rows, Tk')
        if mask is not None:
            visible = visible & mask[..., i0:i1, :end].to(device=q.device, dtype=torch.bool)
        if key_valid is not None:
            visible = visible & key_valid[:, None, None, :end]
        if segment_ids is not None:
            seg = segment_ids[:, :end]
            visible = visible & (segment_ids[:, None, offset + i0: offset + i1, None] == seg[:, None, None, :])
        return visible

    if fused not in (None, False):
        raise ValueError(f"fused must be None (automatic) or False (the blockwise path), got {fused!r}")
    if Tq and fused is None and fused_available(q, k, v, dropout):  # inference on the CPU: the fused kernel (posenc.methods.fused)
        return method_attention_fused(q, k, v, method, qp, kp, inv_freq, attention_factor=attention_factor,
                                      scale=scale, causal=causal, visible_of=visible_of, block_rows=block_rows,
                                      masked=mask is not None or key_valid is not None or segment_ids is not None)
    if block_rows is None:
        block_rows = block_rows_for(B, H, Tk)
    rotations = method.rotations(qp, kp)
    tables_q = [cos_sin(rq, inv_freq, attention_factor, q.dtype) for rq, _ in rotations]  # R x 2 x (B, Tq, r/2)
    keys = [rotate_half_layout(k, *cos_sin(rk, inv_freq, attention_factor, k.dtype)) for _, rk in rotations]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    out = []
    for i0 in range(0, Tq, block_rows):
        i1 = min(i0 + block_rows, Tq)
        end = offset + i1 if causal else Tk  # the keys a query of this block can see
        visible = visible_of(i0, i1, end)
        sel = method.select(qp[:, i0:i1, None], kp[:, None, :end])[:, None]  # (B, 1, rows, Tk')
        q_rot = [rotate_half_layout(q[:, :, i0:i1], cos[:, i0:i1], sin[:, i0:i1]) for cos, sin in tables_q]
        args = (q_rot, [key[:, :, :end] for key in keys], v[:, :, :end], sel, visible, scale, dropout)
        out.append(checkpoint(_block, *args, use_reentrant=False) if grad else _block(*args))
    if not out:
        return q.new_zeros(B, H, 0, v.shape[-1]).to(v.dtype)
    return torch.cat(out, dim=2)
