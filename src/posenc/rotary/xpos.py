"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer").

RoPE plus an exponential decay per rotated pair: q at position m is rotated and scaled by
zeta_j^(m / scale_base), k at position n rotated and scaled by zeta_j^(-n / scale_base), with
zeta_j = (2j/r + gamma) / (1 + gamma) in (0, 1). The score of pair j picks up
zeta_j^((m - n) / scale_base): a function of m - n only, which decays with distance for
m > n (keys in the past), so long-range terms fade smoothly (the paper's "attention
resolution").

Bidirectional use: for a key in the future (n > m) the factor is zeta_j^(-(n - m)/scale_base)
> 1, so an encoder amplifies the terms of distant future keys instead of damping them. The
paper uses xPos in causal language models (with blockwise causal attention); use it with
``causal=True`` unless you mean this.

Range: zeta_j^(-n / scale_base) grows exponentially with n; with gamma = 0.4 and
scale_base = 512 it passes float32's range near n = 36000. A position whose scale would not
be finite in float32 is an error (raise ``scale_base`` for longer contexts); under
torch.compile that check (a host sync) is skipped and such a scale is inf.

xPos has no tables: cos/sin and the scales are computed from the positions in every call,
eager or compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import check_positive
from ..registry import register
from .functional import apply_rotary_qk
from .rope import RotaryConfig, RotaryEmbedding

__all__ = ["XPosConfig", "XPos", "xpos_scale"]

_F32_MAX = torch.finfo(torch.float32).max


@dataclass
class XPosConfig(RotaryConfig):
    """RoPE's config plus ``scale_base`` (the paper's 512) and ``gamma`` (0.4)."""

    scale_base: float = 512.0
    gamma: float = 0.4

    def validate(self) -> None:
        super().validate()
        check_positive("scale_base", self.scale_base)
        check_positive("gamma", self.gamma)


def xpos_scale(positions: Tensor, rotary_dim: int, scale_base: float, gamma: float = 0.4) -> Tensor:
    """zeta_j^(m / scale_base) at positions m (B, T) -> (B, T, r/2) float64."""
    j = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=positions.device)
    zeta = (j / rotary_dim + gamma) / (1 + gamma)  # (r/2,) in (gamma/(1+gamma), 1)
    return zeta ** (positions.to(torch.float64)[..., None] / scale_base)


@register(
    "xpos",
    family="rotary",
    summary="RoPE with an exponential decay zeta^((m-n)/scale_base) on each pair's score",
    paper="Sun et al. 2022, A Length-Extrapolatable Transformer",
)
class XPos(RotaryEmbedding):
    """xPos as a ``rotate`` hook: q scaled by zeta^(m/scale_base), k by zeta^(-n/scale_base)."""

    Config = XPosConfig

    def _scaled_cos_sin(self, positions: Tensor, sign: float, seq_len: int | Tensor | None) -> tuple[Tensor, Tensor]:
        inv_freq, factor = self.frequencies(seq_len)
        scale = xpos_scale(positions, self.rotary_dim, self.config.scale_base / sign, self.config.gamma)
        if not torch.compiler.is_compiling() and not bool((scale <= _F32_MAX).all()):
            raise ValueError(
                f"xPos scale overflows float32 at position {int(positions.max())} with scale_base="
                f"{self.config.scale_base}; use a larger scale_base"
            )
        # Angles and scale in float64, one rounding to float32.
        ang = positions.to(torch.float64)[..., None] * inv_freq.to(positions.device)  # (B, T, r/2)
        cos, sin = ang.cos() * (scale * factor), ang.sin() * (scale * factor)
        return cos.float(), sin.float()

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> None:
        return None  # the scale differs for q and k: computed per call

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: None = None) -> tuple[Tensor, Tensor]:
        if not torch.compiler.is_compiling():  # a host sync: eager only
            if q_pos.numel() and int(q_pos.min()) < 0 or k_pos.numel() and int(k_pos.min()) < 0:
                raise ValueError("positions must be >= 0")
        seq_len = self.current_length(q_pos, k_pos)
        cq, sq = self._scaled_cos_sin(q_pos, 1.0, seq_len)
        ck, sk = self._scaled_cos_sin(k_pos, -1.0, seq_len)
        return apply_rotary_qk(q, k, cq, sq, ck, sk, self.config.layout, self.config.kernel)
