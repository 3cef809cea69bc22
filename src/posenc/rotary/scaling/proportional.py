"""p-RoPE (``proportional``): the highest-frequency fraction p of the pairs rotate, the
others are position-independent channels."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ...config import check_range
from .schema import HFSpec, Scaling, ScalingConfig

__all__ = ["PROPORTIONAL", "ProportionalScaling"]


@dataclass
class ProportionalScaling(ScalingConfig):
    """p-RoPE (Barbero et al. 2025, "Round and Round We Go! What makes Rotary Positional
    Encodings useful?", ICLR 2025; Gemma 4): the first int(p * d // 2) pairs (the highest
    frequencies) keep theta_i, the others get theta = 0 (not rotated: position-independent
    channels); every theta is then divided by ``factor`` (transformers' "proportional")."""

    proportion: float = 1.0  # p, in [0, 1]; transformers' rope-dict partial_rotary_factor
    factor: float = 1.0

    def validate(self) -> None:
        check_range("proportion", self.proportion, 0.0, 1.0)
        check_range("factor", self.factor, 1.0, None)


def _proportional(inv_freq: Tensor, cfg: ProportionalScaling, *, base: float, seq_len: int | None = None):
    kept = int(cfg.proportion * (2 * inv_freq.numel()) // 2)  # as transformers counts the rotated pairs
    out = inv_freq.clone()
    out[kept:] = 0.0
    return out / cfg.factor, 1.0


PROPORTIONAL = Scaling("proportional", ProportionalScaling, _proportional, "theta_i kept for the first p of the pairs, 0 "
                       "(not rotated) for the rest; all / s",
                       "Barbero et al. 2025, Round and Round We Go (p-RoPE); Gemma 4",
                       label="p-RoPE", illustration=lambda s, L, rotary_dim: {"proportion": 0.25},
                       hf=HFSpec("proportional", keys={"proportion": "partial_rotary_factor"}))
