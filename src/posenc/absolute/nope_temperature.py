"""NoPE with attention temperature tuning: Llama 4's global layers (the iRoPE design).

Llama 4 interleaves RoPE layers with layers that have no positional encoding (NoPE) and, on
those, scales each query by a factor that grows with the log of its position, so that
attention over very long contexts does not flatten (Meta 2025, "The Llama 4 herd"; after
Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv:2501.19399, which scales
logits by log n)::

    q_p <- q_p * (1 + attn_scale * log1p(floor((p + 1) / floor_scale)))

The factor is 1 for the first ``floor_scale - 1`` positions (transformers' defaults:
``floor_scale=8192``, ``attn_scale=0.1``). Only queries are scaled, so cached keys stay valid
and a KV-cache step equals the full forward; the scale is the query's own *position* (posenc's
``SequenceInfo``), so left padding and packed documents see the factors of their unpadded,
separate selves (transformers' Llama 4 counts stream indices, pads included).

Shapes: q (B, H, Tq, D); positions (B, Tq); the per-forward factor (B, 1, Tq, 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..config import EncodingConfig, check_int, check_range
from ..encoding import PositionalEncoding
from ..limits import MAX_DISTANCE
from ..registry import register

__all__ = ["NoPETemperatureConfig", "NoPETemperature", "temperature_scale"]

# Bounds that keep every factor finite and modest in float32: at the last int64 position
# log1p(2^63) ~ 43.7, so attn_scale <= 100 keeps the factor below 4.4e3.
MAX_ATTN_SCALE = 100.0


def temperature_scale(positions: Tensor, floor_scale: int, attn_scale: float) -> Tensor:
    """``1 + attn_scale * log1p(floor((p + 1) / floor_scale))`` of int64 positions, in float64.

    The floor is an integer division: exact at every int64 position (transformers' float32
    ``(p + 1.0) / floor_scale`` rounds p past 2^24 and can cross a floor boundary there).
    """
    steps = torch.div(positions + 1, floor_scale, rounding_mode="floor")  # int64, exact
    return torch.log1p(steps.to(torch.float64)) * attn_scale + 1.0


@dataclass
class NoPETemperatureConfig(EncodingConfig):
    """``nope_temperature``'s config: the query at position p is scaled by
    ``1 + attn_scale * log1p(floor((p + 1) / floor_scale))`` (:func:`temperature_scale`)."""

    floor_scale: int = 8192  # positions per step of the log (transformers' Llama4TextConfig default)
    attn_scale: float = 0.1  # strength of the tuning (default 0.1)

    def validate(self) -> None:
        check_int("floor_scale", self.floor_scale, minimum=1, maximum=MAX_DISTANCE)
        check_range("attn_scale", self.attn_scale, 0.0, MAX_ATTN_SCALE)


@register(
    "nope_temperature",
    family="none",
    summary="NoPE with Llama 4's attention temperature tuning: queries scaled by 1 + a·log1p(floor((p+1)/s))",
    paper="Meta 2025, The Llama 4 herd (iRoPE); Nakanishi 2025, Scalable-Softmax Is Superior for Attention",
    claims={
        "absolute": (False, "Meta 2025 (Llama 4): NoPE; the query factor is 1 below floor_scale (8192 positions)"),
        "extrapolation": (True, "no position table; the factor grows as log(p / floor_scale) for long contexts"),
        "linear_attention": (True, "a per-query factor: it factors through the query's features"),
    },
)
class NoPETemperature(PositionalEncoding):
    """No positional term in q·k; the ``rotate`` hook scales queries by their position's factor.

    ``prepare`` computes the factors once per forward (every layer using the module shares
    them); keys pass through untouched.
    """

    Config = NoPETemperatureConfig
    config: NoPETemperatureConfig

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        c = self.config
        return temperature_scale(q_pos, c.floor_scale, c.attn_scale)[:, None, :, None]  # (B, 1, Tq, 1)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: Any = None) -> tuple[Tensor, Tensor]:
        scale = self.prepare(q_pos, k_pos) if state is None else state  # (B, 1, Tq, 1) float64
        # Multiply in float32 (float64 for a float64 model), cast back last: transformers
        # multiplies bf16 queries by float32 factors and casts the product the same way.
        dtype = torch.promote_types(q.dtype, torch.float32)
        return (q.to(dtype) * scale.to(dtype)).to(q.dtype), k
