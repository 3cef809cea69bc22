"""LongRoPE (``longrope``): searched per-pair factors, one set up to the trained length and
one beyond, and an attention factor."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from ...config import check_positive
from .schema import HFSpec, Scaling, ScalingConfig, check_factor, check_original

__all__ = ["LONGROPE", "LongRopeScaling"]


@dataclass
class LongRopeScaling(ScalingConfig):
    """LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million
    Tokens"): theta_i / lambda_i with searched per-pair factors, ``short_factor`` for
    sequences up to L and ``long_factor`` beyond. attention_factor defaults to
    sqrt(1 + ln(s) / ln(L)) (Phi-3)."""

    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    original_max_position_embeddings: int | None = None
    factor: float | None = None
    attention_factor: float | None = None
    length_dependent: ClassVar[bool] = True

    def validate(self) -> None:
        for name in ("short_factor", "long_factor"):  # tuples of floats by now (check_fields)
            value = getattr(self, name)
            if not value:
                raise ValueError(f"{name} must be a non-empty list of numbers (one per rotated pair), got {value!r}")
            for i, v in enumerate(value):
                check_positive(f"{name}[{i}]", v)
        check_original(self.original_max_position_embeddings)
        check_factor(self.factor)
        if self.attention_factor is not None:
            check_positive("attention_factor", self.attention_factor)


def _longrope(inv_freq: Tensor, cfg: LongRopeScaling, *, base: float, seq_len: int | Tensor | None = None):
    n = inv_freq.numel()
    for name in ("short_factor", "long_factor"):
        got = len(getattr(cfg, name))
        if got != n:
            raise ValueError(f"{name} must have rotary_dim/2 = {n} entries (one per rotated pair), got {got}")
    L = cfg.original_max_position_embeddings
    if isinstance(seq_len, Tensor):  # traced: select without a host sync
        long = torch.tensor(cfg.long_factor, dtype=torch.float64, device=inv_freq.device)
        short = torch.tensor(cfg.short_factor, dtype=torch.float64, device=inv_freq.device)
        ext = torch.where(seq_len.to(inv_freq.device) > L, long, short)
    else:
        factors = cfg.long_factor if seq_len is not None and seq_len > L else cfg.short_factor
        ext = torch.tensor(factors, dtype=torch.float64, device=inv_freq.device)
    if cfg.attention_factor is not None:
        factor = float(cfg.attention_factor)
    elif cfg.factor <= 1.0:
        factor = 1.0
    else:
        factor = math.sqrt(1 + math.log(cfg.factor) / math.log(L))
    return inv_freq / ext, factor


def _longrope_ramp(s: float, L: int, rotary_dim: int) -> dict[str, Any]:
    # LongRoPE's per-pair factors are searched per model: a ramp from 1 (highest frequency)
    # to s (lowest) stands in for them in figures.
    n = rotary_dim // 2
    return {"short_factor": (1.0,) * n, "long_factor": tuple(1.0 + (s - 1.0) * i / max(n - 1, 1) for i in range(n)),
            "factor": s, "original_max_position_embeddings": L}


LONGROPE = Scaling("longrope", LongRopeScaling, _longrope, "theta_i / lambda_i, short_factor for n <= L, long_factor "
                   "beyond; attention factor sqrt(1 + ln s / ln L)", "Ding et al. 2024, LongRoPE; Phi-3",
                   label="LongRoPE",
                   hf=HFSpec("longrope", required=("short_factor", "long_factor"), implied_factor=True),
                   illustration=_longrope_ramp)
