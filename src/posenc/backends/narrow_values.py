"""Attention whose values are narrower than its queries and keys, on CPU, in blocks of query rows.

torch's CPU flash kernel takes one head size for q, k and v. PoPE's q and k carry two real
channels per frequency (2D) against its values' D, so on the kernel v is zero-padded to 2D:
p·v in the forward, and dP = dO·vᵀ and dv = Pᵀ·dO in the backward, then do twice their work
(the kernel's padded output channels are all zero). :func:`narrow_value_attention` computes
softmax(q·kᵀ·scale [+ causal mask])·v with batched matmuls at each tensor's own width
(Dao et al. 2022, Alg. 1 and 2, one block of query rows against all the keys it sees):

    forward:  per block, S = q·kᵀ·scale, m = rowmax S, P = exp(S − m), l = ΣP,
              O = P·v / l, lse = m + log l                            keeps q, k, v, O, lse
    backward: :func:`posenc.backends.cpu_flash.backward_with_bias` with no bias: P = exp(S − lse)
              (no softmax reductions), dv += Pᵀ·dO, dS = P ⊙ (dO·vᵀ − δ), dq = dS·k, dk += dSᵀ·q

A block's scores live in one scratch buffer; nothing of size (Tq, Tk) is kept for the backward.
With ``causal`` (Tq == Tk, aligned top-left as SDPA's ``is_causal``) a block never reads the
keys right of its last row. Arithmetic in float32 (float64 stays float64), results in the
inputs' dtype.

Shapes: q, k (B, H, T, D), v (B, H, Tk, Dv) with Dv <= D; grouped heads already repeated.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .cpu_flash import backward_with_bias, check_qkv

__all__ = ["narrow_value_attention", "forward_blocks", "BLOCK_ROWS"]

#: Query rows per block of the forward (its scratch is (B·H, rows, Tk) in float32).
BLOCK_ROWS = 64


def narrow_value_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool,
                           block: int = BLOCK_ROWS) -> Tensor:
    """softmax(q·kᵀ·scale [+ causal mask])·v: (B, H, Tq, Dv), differentiable in q, k and v.

    Args:
        q: (B, H, Tq, D), k: (B, H, Tk, D), v: (B, H, Tk, Dv): CPU tensors of one floating dtype.
        scale: multiplier of q·kᵀ.
        causal: query i sees keys j <= i; requires Tq == Tk.
        block: query rows per block (a positive int).
    """
    check_qkv("narrow_value_attention", q, k, v, causal)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    B, H, Tq, _ = q.shape
    if Tq == 0 or k.shape[2] == 0:  # no query, or no key to attend to: zeros, as SDPA's math path
        return q.new_zeros(B, H, Tq, v.shape[-1]) + 0 * (q.sum() + k.sum() + v.sum())
    return _NarrowValues.apply(q, k, v, float(scale), causal, block)


def forward_blocks(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool,
                   block: int = BLOCK_ROWS) -> tuple[Tensor, Tensor]:
    """The forward: (out (B, H, Tq, Dv) in the compute dtype, lse (B, H, Tq) float32 or float64).
    Inputs as :func:`narrow_value_attention`'s, not checked again."""
    cdt = torch.promote_types(q.dtype, torch.float32)
    B, H, Tq, _ = q.shape
    Tk, Dv = k.shape[2], v.shape[-1]
    qf = q.to(cdt).flatten(0, 1)  # (B·H, Tq, D): scaled by the matmul (alpha), not by a pass over q
    kt = k.to(cdt).flatten(0, 1).transpose(-1, -2).contiguous()  # (B·H, D, Tk): a view of kᵀ runs at half speed
    vf = v.to(cdt).flatten(0, 1)  # (B·H, Tk, Dv)
    out = torch.empty(B * H, Tq, Dv, dtype=cdt)
    lse = torch.empty(B * H, Tq, 1, dtype=cdt)
    above = torch.ones(block, block, dtype=torch.bool).triu_(1) if causal else None
    scratch = torch.empty(B * H * min(block, Tq) * Tk, dtype=cdt)  # a block's scores, then probabilities
    for i0 in range(0, Tq, block):
        i1 = min(i0 + block, Tq)
        rows, z = i1 - i0, (i1 if causal else Tk)  # z: keys any row of the block may see
        s = scratch[:B * H * rows * z].view(B * H, rows, z)
        s.baddbmm_(qf[:, i0:i1], kt[..., :z], beta=0.0, alpha=scale)  # beta=0: the scratch is not read
        if causal:  # the block's last `rows` keys: row r sees i0 + r and those left of it
            s[..., i0:].masked_fill_(above[:rows, :rows], float("-inf"))
        m = s.amax(-1, keepdim=True)  # finite: every row sees at least its own key
        s.sub_(m).exp_()
        total = s.sum(-1, keepdim=True)
        out[:, i0:i1] = torch.bmm(s, vf[:, :z]).div_(total)
        lse[:, i0:i1] = total.log_().add_(m)
    return out.view(B, H, Tq, Dv), lse.view(B, H, Tq)


class _NarrowValues(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, block: int) -> Tensor:
        out, lse = forward_blocks(q, k, v, scale=scale, causal=causal, block=block)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv, _ = backward_with_bias(q, k, v, None, out, lse, dout, scale=ctx.scale, causal=ctx.causal)
        return dq, dk, dv, None, None, None
