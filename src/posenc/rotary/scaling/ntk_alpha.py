"""NTK-alpha scaling (``ntk_alpha``): the RoPE base stretched by a fixed alpha, as Tencent's
Hunyuan models set it, base' = base * alpha^(d/(d-2)).

Source: vLLM's ``DynamicNTKAlphaRotaryEmbedding``
(vllm/model_executor/layers/rotary_embedding/dynamic_ntk_alpha_rope.py, commit a42938c,
``_compute_cos_sin_cache``: ``base = self.base * self.scaling_alpha ** (self.rotary_dim /
(self.rotary_dim - 2))``, then ``1 / base ** (arange(0, d, 2) / d)``); transformers 5.24 has the
same formula in ``HunYuanMoEV1RotaryEmbedding.compute_ntk_alpha_rope_parameters`` (with d the
head dim). Despite "Dynamic" in vLLM's name the frequencies do not depend on the length: the
checkpoints spell it ``{"rope_type": "dynamic", "alpha": ...}`` and transformers gives it a
type of its own to keep its dynamic update from recomputing them.

The frequencies equal static ``ntk``'s at factor = alpha (bloc97's base' is the same
formula); the type exists so that Hunyuan's parameter reads as the checkpoints write it, and
alpha may be any number > 0 (``ntk`` takes factor >= 1). transformers' spelling ("dynamic"
with an ``alpha`` key) is dynamic NTK's rope type, so the entry has no :class:`HFSpec`;
``to_hf`` writes it as plain RoPE with rope_theta = base'. The source gives no rule for "alpha
at factor s x L" (Hunyuan chose alpha per model), so the entry has no extension rule; figures
illustrate it at alpha = s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import check_positive
from .schema import Scaling, ScalingConfig

__all__ = ["NTK_ALPHA", "NTKAlphaScaling", "ntk_alpha_base"]


@dataclass
class NTKAlphaScaling(ScalingConfig):
    """NTK-alpha (Hunyuan; vLLM's DynamicNTKAlphaRotaryEmbedding): base' = base * alpha^(d/(d-2)).

    Attributes:
        alpha: > 0 (required); 1 leaves the frequencies as trained, > 1 lowers them (longer
            wavelengths), the highest (pair 0) kept.
    """

    alpha: float | None = None

    def validate(self) -> None:
        if self.alpha is None:
            raise ValueError("alpha is required for rope type 'ntk_alpha' (the base is stretched by "
                             "alpha^(d/(d-2)), alpha > 0), got None")
        check_positive("alpha", self.alpha)


def ntk_alpha_base(alpha: float, base: float, rotary_dim: int) -> float:
    """base' = base * alpha^(d/(d-2)), refused where it is not a usable RoPE base (d = 2: no
    exponent; an overflow to inf or an underflow to 0; exactly 1: every pair turns alike)."""
    d = rotary_dim
    if d <= 2:
        raise ValueError(f"rope type 'ntk_alpha' needs rotary_dim >= 4 (its exponent is d/(d-2)), got {d}")
    try:
        stretched = base * alpha ** (d / (d - 2))
    except OverflowError:
        stretched = math.inf
    if not 0.0 < stretched < math.inf or stretched == 1.0:
        raise ValueError(f"alpha={alpha!r} makes the base base * alpha^(d/(d-2)) = {stretched!r} at base={base!r}, "
                         f"rotary_dim={d}: it must be finite, > 0 and != 1")
    return stretched


def _ntk_alpha(inv_freq: Tensor, cfg: NTKAlphaScaling, *, base: float, seq_len: int | None = None):
    d = 2 * inv_freq.numel()
    stretched = ntk_alpha_base(cfg.alpha, base, d)
    exponent = torch.arange(0, d, 2, dtype=torch.float64, device=inv_freq.device) / d  # (d/2,)
    return stretched ** -exponent, 1.0


def _hf_base(cfg: NTKAlphaScaling, base: float, rotary_dim: int) -> float:
    return ntk_alpha_base(cfg.alpha, base, rotary_dim)


def _illustrate(s: float, L: int, rotary_dim: int) -> dict:
    # Figures only: Hunyuan picks alpha per model; alpha = s gives NTK-aware's base at factor s.
    return {"alpha": s}


NTK_ALPHA = Scaling("ntk_alpha", NTKAlphaScaling, _ntk_alpha, "base' = base * alpha^(d/(d-2)) (a fixed alpha > 0)",
                    "Hunyuan (Tencent); vLLM DynamicNTKAlphaRotaryEmbedding", label="NTK-alpha",
                    hf_default_base=_hf_base, illustration=_illustrate)
