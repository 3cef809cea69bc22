"""The cos/sin tables of RoPE's angles m * theta_i, computed in float64 and stored float32.

Shapes: positions (...,) integers (B, T for a batch); inv_freq (r/2,) the theta_i of the
rotated pairs; cos, sin (..., r/2) float32, the tables every rotation kernel reads.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["angles_cos_sin"]


def angles_cos_sin(positions: Tensor, inv_freq: Tensor, attention_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """cos and sin of m * theta_i, times ``attention_factor``: (...,) x (r/2,) -> (..., r/2) float32.

    Angles are float64: in float32, m * theta_0 at m = 2^20 is off by up to 2^-4 rad (half an
    ulp of 2^20), which no later rounding can repair.
    """
    ang = positions.to(torch.float64)[..., None] * inv_freq.to(device=positions.device, dtype=torch.float64)
    cos, sin = ang.cos(), ang.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.float(), sin.float()
