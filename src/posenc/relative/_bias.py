"""Helpers shared by the content-independent relative biases (T5, ALiBi, KERPLE, FIRE).

Each of them implements ``logit_bias()`` -> :class:`~posenc.terms.BiasTerm`, one pointwise
function of (head, q_pos, k_pos); the dense, Toeplitz and FlexAttention forms are derived
from it in :mod:`posenc.terms`.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..positions import shared_rows
from ..terms import BiasTerm

__all__ = ["shared_rows", "bias_dtype", "distance_table_bias"]


def bias_dtype(*params: Tensor) -> torch.dtype:
    """float32, or the parameters' dtype when it is wider (float64 in gradchecks and references)."""
    dtype = torch.float32
    for p in params:
        dtype = torch.promote_types(dtype, p.dtype)
    return dtype


def distance_table_bias(
    memo: dict, key: str, q_pos: Tensor, k_pos: Tensor, num_heads: int, values: Callable[[Tensor], Tensor]
) -> BiasTerm | None:
    """For a decoding step: a Toeplitz bias read from its values at every distance in [-n, n],
    ``values(d)`` (H, 2n + 1) for the int64 distances d = -n..n (as ``logit_bias`` computes them,
    so the same numbers), made once per KV cache and kept in ``memo[key]``; n doubles when a step
    reaches past it. None where a table does not pay: under torch.compile, for no positions, or
    for sparse positions (a table of every distance would outgrow the keys); the caller then
    returns its ``logit_bias()``."""
    if torch.compiler.is_compiling() or q_pos.numel() == 0 or k_pos.numel() == 0:
        return None
    reach = int(torch.maximum(q_pos.max() - k_pos.min(), k_pos.max() - q_pos.min()))
    if reach > 4 * k_pos.shape[-1] + 64:
        return None
    n, table = memo.get(key, (-1, None))
    if reach > n:
        n = max(reach, 2 * n, 64)
        table = values(torch.arange(-n, n + 1, device=q_pos.device)).contiguous()  # (H, 2n + 1)
        memo[key] = (n, table)

    def fn(h: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return table[h, q_pos - k_pos + n]

    return BiasTerm(fn, num_heads, toeplitz=True)
