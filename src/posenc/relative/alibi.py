"""ALiBi: attention with linear biases (Press et al. 2022, "Train Short, Test Long: Attention
with Linear Biases Enables Input Length Extrapolation").

No parameters: head h adds ``-m_h * (i - j)`` to the logit of query position i for key
position j. The slopes m_h are a geometric sequence (``alibi_slopes``). Because the penalty
grows without bound with distance, attention stays local past the training length.

``symmetric`` (default True) uses ``-m_h * |i - j|``. Under a causal mask (j <= i) this equals
the paper's bias on every key the mask lets through, and in a bidirectional encoder it is the
usual symmetric variant; the hook does not know which kind of model it serves, so this is the
default that is right for both. ``symmetric=False`` is the paper's literal ``-m_h * (i - j)``,
which rewards future keys (positive bias) and is only meaningful under a causal mask.

Shapes: positions (B, T); bias (B or 1, H, Tq, Tk).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import EncodingConfig, check_int
from ..encoding import Dims, PositionalEncoding
from ..limits import Float32Params
from ..literature import NOT_A_FEATURE_MAP, NO_ABSOLUTE
from ..positions import relative_positions
from ..registry import register
from ..terms import BiasTerm

__all__ = ["AlibiConfig", "ALiBi", "alibi_slopes", "alibi_bias"]

_PRESS = "Press et al. 2022 (ALiBi)"


def alibi_slopes(num_heads: int) -> list[float]:
    """The paper's head slopes, as its official code builds them, for any head count.

    For n a power of two: m_i = 2^(-8 i / n), i = 1..n (a geometric sequence starting at and
    with ratio 2^(-8/n)). Otherwise, with p the largest power of two below n: the p slopes of
    ``alibi_slopes(p)`` followed by the first n - p of the odd-indexed slopes of
    ``alibi_slopes(2 p)`` (those interleave between the first ones).
    """
    check_int("num_heads", num_heads, minimum=1)
    p = 2 ** math.floor(math.log2(num_heads))

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if p == num_heads:
        return power_of_two(p)
    return power_of_two(p) + alibi_slopes(2 * p)[0::2][: num_heads - p]


def alibi_bias(q_pos: Tensor, k_pos: Tensor, slopes: Tensor, symmetric: bool = True) -> Tensor:
    """ALiBi bias in the dtype of ``slopes`` (H,): (B, Tq) x (B, Tk) -> (B, H, Tq, Tk).

    ``-m_h * |i - j|`` when ``symmetric``, else the paper's ``-m_h * (i - j)``.
    """
    dist = relative_positions(q_pos, k_pos)  # (B, Tq, Tk): i - j, exact int64
    if symmetric:
        dist = dist.abs()
    return -slopes[None, :, None, None] * dist[:, None].to(slopes.dtype)  # (B, H, Tq, Tk)


@dataclass
class AlibiConfig(EncodingConfig):
    symmetric: bool = True  # -m|i-j| (right for causal and bidirectional); False: -m(i-j)


@register(
    "alibi",
    family="relative",
    summary="fixed per-head linear distance penalty -m_h |i - j| on the logits, geometric slopes",
    paper="Press et al. 2022, Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation",
    claims={
        "absolute": (False, NO_ABSOLUTE),
        "relative": (True, _PRESS + ": -m |i - j|"),
        "bounded": (False, _PRESS + ": the penalty grows linearly by design"),
        "decay": (True, _PRESS + ": linear penalty without end"),
        "extrapolation": (True, _PRESS),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
)
class ALiBi(Float32Params, PositionalEncoding):
    """Logit bias ``-m_h * |i - j|`` (or ``-m_h * (i - j)``), slopes from :func:`alibi_slopes`.

    ``slopes``: the H slopes as Python floats; ``slope_table``: the same as a non-persistent
    float32 buffer (it moves with the model and stays float32 under ``.to(bfloat16)``).
    """

    Config = AlibiConfig
    float32_params = ("slope_table",)

    def __init__(self, config: AlibiConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        self.slopes = tuple(alibi_slopes(dims.num_heads))
        self.register_buffer("slope_table", torch.tensor(self.slopes, dtype=torch.float32), persistent=False)

    def logit_bias(self) -> BiasTerm:
        slopes, symmetric = self.slope_table, self.config.symmetric

        def fn(h: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
            dist = q_pos - k_pos  # exact int64
            return -slopes[h] * (dist.abs() if symmetric else dist).to(slopes.dtype)

        return BiasTerm(fn, self.dims.num_heads, toeplitz=True)
