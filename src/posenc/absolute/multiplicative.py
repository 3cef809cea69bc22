"""Multiplicative absolute position embeddings: x * P[pos], a learned table near 1.

Instead of adding a position vector, each channel of the token embedding is scaled by a
learned per-position gain: ``y = x ⊙ p_pos``. This is the element-wise product fusion of
word and position information that Wang et al. 2020 ("Encoding word order in complex
embeddings", ICLR) make the general form of their position-aware word embeddings
(word embedding ⊙ position function); here with a free real table in place of their
complex exponential. (The "multiplicative" embeddings of Huang et al. 2021 act on
relative positions inside attention and are not this encoding.)

The table is initialised to 1 + N(0, init_std^2), so an untrained model starts as NoPE
rather than silencing every channel; it grows with ``extend`` exactly like the learned
table (new random rows are drawn around 1 too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..literature import EMBEDDINGS_ONLY, LEARNED, TABLE_END, UNTRAINED
from ..positions import SequenceInfo
from ..registry import register
from .learned import LearnedConfig, LearnedPositionalEmbedding, check_positions_in_table

__all__ = ["MultiplicativeConfig", "MultiplicativeEmbedding"]


@dataclass
class MultiplicativeConfig(LearnedConfig):
    """``max_len`` rows, initialised to 1 + N(0, init_std^2); the bounds of :class:`LearnedConfig`."""


@register(
    "multiplicative",
    family="absolute",
    summary="token embeddings scaled channel-wise by a learned per-position gain table (x * P[pos])",
    paper="Wang et al. 2020, Encoding word order in complex embeddings (element-wise product fusion)",
    claims={
        "absolute": (True, "one learned vector per position"),
        "relative": (UNTRAINED, LEARNED),
        "linear_map": (UNTRAINED, LEARNED),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (False, TABLE_END),
        "linear_attention": (True, EMBEDDINGS_ONLY),
    },
)
class MultiplicativeEmbedding(LearnedPositionalEmbedding):
    """x * P[pos] with P a (max_len, C) trainable table around 1."""

    Config = MultiplicativeConfig

    def _fresh_rows(self, n: int, dim: int, dtype: torch.dtype, device: torch.device | None) -> Tensor:
        return 1.0 + torch.randn(n, dim, dtype=dtype, device=device) * self.config.init_std

    def embed(self, x: Tensor, seq: SequenceInfo, state: dict[str, Any] | None = None) -> Tensor:
        check_positions_in_table(seq.positions, self.max_len, f"a multiplicative table of {self.max_len} rows")
        return x * self.weight[seq.positions].to(x.dtype)  # (B, T, C)
