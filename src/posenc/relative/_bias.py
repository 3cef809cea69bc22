"""Helpers shared by the content-independent relative biases (T5, ALiBi, KERPLE, FIRE).

Each of them implements ``logit_bias()`` -> :class:`~posenc.terms.BiasTerm`, one pointwise
function of (head, q_pos, k_pos); the dense, Toeplitz and FlexAttention forms are derived
from it in :mod:`posenc.terms`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..positions import shared_rows

__all__ = ["shared_rows", "bias_dtype"]


def bias_dtype(*params: Tensor) -> torch.dtype:
    """float32, or the parameters' dtype when it is wider (float64 in gradchecks and references)."""
    dtype = torch.float32
    for p in params:
        dtype = torch.promote_types(dtype, p.dtype)
    return dtype
