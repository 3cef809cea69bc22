"""NoPE: no positional encoding at all, the baseline every benchmark compares against.

A causal decoder can still infer position from the attention mask (Kazemnejad et al. 2023,
"The Impact of Positional Encoding on Length Generalization in Transformers").
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import EncodingConfig
from ..encoding import PositionalEncoding
from ..registry import register


@dataclass
class NoPEConfig(EncodingConfig):
    pass


@register(
    "none",
    family="none",
    summary="no positional encoding (NoPE); causal masking alone carries order",
    paper="Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization in Transformers",
    claims={
        "absolute": (False, "Kazemnejad et al. 2023: NoPE has no explicit position"),
        "extrapolation": (True, "no position table to run out of"),
        "linear_attention": (True, "nothing positional in the logits"),
    },
)
class NoPE(PositionalEncoding):
    """Overrides no hook: attention sees content only."""

    Config = NoPEConfig
