"""The slow reference of the multi-axis rotary tests (VideoRoPE, XD-RoPE): q·k after rotating
each pair by its own axis's position, one pair and one token at a time, in float64."""

from __future__ import annotations

import math

import torch


def slow_axes_logits(q: torch.Tensor, k: torch.Tensor, ids: list[list[int]], pair_axis: list[int],
                     base: float) -> torch.Tensor:
    """q·k (B, H, T, T) after rotating pair j (half layout: channels j and j + P, the engines'
    is_neox_style) by ``ids[pair_axis[j]][t] * base^(-2j/D)`` at token t."""
    T, D = q.shape[-2], q.shape[-1]
    P = D // 2

    def rot(x):
        out = x.clone()
        for j in range(P):
            theta = base ** (-2 * j / D)
            for t in range(T):
                ang = ids[pair_axis[j]][t] * theta
                c, s = math.cos(ang), math.sin(ang)
                x1, x2 = x[:, :, t, j], x[:, :, t, j + P]
                out[:, :, t, j], out[:, :, t, j + P] = x1 * c - x2 * s, x2 * c + x1 * s
        return out

    return torch.einsum("bhid,bhjd->bhij", rot(q), rot(k))
