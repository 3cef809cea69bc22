"""Llama 3.1's scaling (``llama3``): long wavelengths divided by s, short ones kept, a smooth
interpolation between."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import check_positive
from .schema import HFSpec, Scaling, ScalingConfig, check_factor, check_original, factor_and_length_rule

__all__ = ["LLAMA3", "Llama3Scaling"]


@dataclass
class Llama3Scaling(ScalingConfig):
    """Llama 3.1 scaling (Meta 2024): wavelengths above L/low_freq_factor are divided by s,
    below L/high_freq_factor kept, with a smooth interpolation in between."""

    factor: float | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None

    def validate(self) -> None:
        check_factor(self.factor)
        check_positive("low_freq_factor", self.low_freq_factor)
        check_positive("high_freq_factor", self.high_freq_factor)
        if self.low_freq_factor > self.high_freq_factor:  # equal: a step at L/low_freq_factor (Llama 4 Scout)
            raise ValueError(
                f"low_freq_factor must be <= high_freq_factor ({self.high_freq_factor}), got {self.low_freq_factor}"
            )
        check_original(self.original_max_position_embeddings)


def _llama3(inv_freq: Tensor, cfg: Llama3Scaling, *, base: float, seq_len: int | None = None):
    L = cfg.original_max_position_embeddings
    s, lo, hi = cfg.factor, cfg.low_freq_factor, cfg.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen, high_freq_wavelen = L / lo, L / hi
    # 0 at L/lo, 1 at L/hi; with lo == hi no wavelength lies strictly between: a step, no band
    smooth = (L / wavelen - lo) / (hi - lo) if hi > lo else torch.zeros_like(inv_freq)
    medium = (1 - smooth) * inv_freq / s + smooth * inv_freq
    out = torch.where(wavelen > low_freq_wavelen, inv_freq / s, inv_freq)
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, medium, out), 1.0


LLAMA3 = Scaling("llama3", Llama3Scaling, _llama3, "wavelengths < L/high_freq_factor kept, > L/low_freq_factor / s, "
                 "smooth between", "Meta 2024, Llama 3.1", label="Llama 3",
                 hf=HFSpec("llama3", required=("factor", "low_freq_factor", "high_freq_factor")),
                 extension=factor_and_length_rule, bench=False)
