"""HoPE: high-frequency rotary position encoding (Chen et al. 2025, "HoPE: A Novel Positional
Encoding Without Long-Term Decay for Enhanced Context Awareness and Extrapolation", ACL 2025,
arXiv:2410.21216).

RoPE's low-frequency pairs turn by less than one period over the trained length L: within
training they act as a slowly drifting bias (the source of RoPE's long-term decay, the paper
argues), and past L they reach angles never seen. HoPE keeps RoPE's high-frequency pairs and
makes the others position-independent:

    theta'_i = theta_i   if 2 pi / theta_i <= L   (the pair completes a period within L),
    theta'_i = 0         otherwise                (the pair is not rotated: NoPE channels),

theta_i = base^(-2i/d) as RoPE's. It is a choice of frequencies for training from scratch, so
it is one :class:`~posenc.rotary.scaling.schema.Scaling` entry: ``posenc.build(
"rope", scaling="hope", original_max_position_embeddings=L)``, and every RoPE option (layout,
partial rotary, kernels, ``from_hf`` of a config that names it) applies. Like p-RoPE
(``proportional``) it zeroes the lowest frequencies; HoPE sets the cut from L, p-RoPE from a
fraction of the pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import check_int
from .schema import Scaling, ScalingConfig

__all__ = ["HOPE", "HopeScaling", "hope_inv_freq"]


@dataclass
class HopeScaling(ScalingConfig):
    """Config of the ``hope`` rope type.

    Attributes:
        original_max_position_embeddings: L, the trained length (int >= 1); pairs whose
            wavelength 2 pi / theta_i exceeds it get theta = 0.
    """

    original_max_position_embeddings: int | None = None

    def validate(self) -> None:
        if self.original_max_position_embeddings is None:
            raise ValueError("original_max_position_embeddings is required for rope type 'hope' (the trained "
                             "length L: pairs whose wavelength exceeds it stop rotating), got None")
        check_int("original_max_position_embeddings", self.original_max_position_embeddings, minimum=1)


def hope_inv_freq(inv_freq: Tensor, cfg: HopeScaling, *, base: float, seq_len: int | None = None) -> tuple[Tensor, float]:
    """theta_i where 2 pi / theta_i <= L, else 0; attention factor 1."""
    wavelength = 2 * math.pi / inv_freq
    return torch.where(wavelength <= cfg.original_max_position_embeddings, inv_freq, 0.0), 1.0


HOPE = Scaling(
    "hope", HopeScaling, hope_inv_freq,
    "theta_i kept where its wavelength 2 pi / theta_i <= L, 0 (not rotated) elsewhere",
    "Chen et al. 2025, HoPE: A Novel Positional Encoding Without Long-Term Decay", label="HoPE",
    # Figures draw it as trained at L (it is not a training-free extension: no `extension`).
    illustration=lambda factor, original, rotary_dim: {"original_max_position_embeddings": original},
)
