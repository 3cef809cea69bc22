"""YaRN (``yarn``): high frequencies kept, low ones interpolated, a ramp between, and an
attention factor on cos and sin."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import check_positive, check_range
from .schema import HFSpec, Scaling, ScalingConfig, check_factor, check_original, factor_and_length_rule

__all__ = ["YARN", "YarnScaling", "yarn_mscale"]


@dataclass
class YarnScaling(ScalingConfig):
    """YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of LLMs").

    Per pair, r_i = L * theta_i / (2 pi) rotations over the trained length. Pairs with
    r_i > beta_fast keep theta_i (extrapolate), pairs with r_i < beta_slow use theta_i / s
    (interpolate), with a linear ramp over the pair index between them. attention_factor
    defaults to 0.1 ln(s) + 1 (or the ratio of mscale to mscale_all_dim forms, DeepSeek-V2).
    """

    factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float | None = None  # None: 32 (the paper's; transformers reads null as 32 too)
    beta_slow: float | None = None  # None: 1
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def validate(self) -> None:
        check_factor(self.factor)
        check_original(self.original_max_position_embeddings)
        for name in ("beta_fast", "beta_slow"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.fast <= self.slow:
            raise ValueError(f"beta_fast must be > beta_slow ({self.slow}), got {self.fast}")
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                check_range(name, getattr(self, name), 0.0, None)
        if self.attention_factor is not None:
            check_positive("attention_factor", self.attention_factor)

    @property
    def fast(self) -> float:
        """beta_fast, or its default 32."""
        return 32.0 if self.beta_fast is None else self.beta_fast

    @property
    def slow(self) -> float:
        """beta_slow, or its default 1."""
        return 1.0 if self.beta_slow is None else self.beta_slow


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor at scale factor s: 0.1 * mscale * ln(s) + 1 for s > 1, else 1
    (``yarn_get_mscale`` of the YaRN and DeepSeek-V2/V3 code; DeepSeek's softmax scale is its
    square at ``mscale_all_dim``)."""
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(inv_freq: Tensor, cfg: YarnScaling, *, base: float, seq_len: int | None = None):
    d = 2 * inv_freq.numel()
    L = cfg.original_max_position_embeddings
    s = cfg.factor

    def pair_index(rotations: float) -> float:
        # The (fractional) pair index i at which theta_i makes `rotations` turns over L:
        # L * base^(-2i/d) = 2 pi r  =>  i = d ln(L / (2 pi r)) / (2 ln base).
        return d * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(cfg.fast), pair_index(cfg.slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # a one-point ramp: avoid 0/0 (as the reference implementation does)
    i = torch.arange(d // 2, dtype=torch.float64, device=inv_freq.device)
    ramp = ((i - low) / (high - low)).clamp(0.0, 1.0)  # 0: extrapolate, 1: interpolate
    extrapolate = 1.0 - ramp
    out = (inv_freq / s) * (1.0 - extrapolate) + inv_freq * extrapolate

    if cfg.attention_factor is not None:
        factor = float(cfg.attention_factor)
    elif cfg.mscale and cfg.mscale_all_dim:
        factor = yarn_mscale(s, cfg.mscale) / yarn_mscale(s, cfg.mscale_all_dim)
    else:
        factor = yarn_mscale(s)
    return out, factor


YARN = Scaling("yarn", YarnScaling, _yarn, "theta_i kept above beta_fast turns over L, / s below beta_slow, ramp "
               "between; attention factor 0.1 ln s + 1", "Peng et al. 2023, YaRN", label="YaRN",
               hf=HFSpec("yarn", implied_factor=True), extension=factor_and_length_rule)
