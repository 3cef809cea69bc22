"""Complex-order embeddings (Wang et al. 2020, "Encoding word order in complex embeddings").

Wang, Zhao, Lioma, Li, Zhang & Simonsen (ICLR 2020) make each word embedding a function of
its position. Per complex dimension k, word j at position pos is

    f_k(j, pos) = r_jk * exp(i (omega_jk * pos + theta_jk))          (the paper's general solution)

with an amplitude r, a frequency omega and an initial phase theta; moving the word by an
offset multiplies f by exp(i omega offset), whatever the absolute position.

How this maps onto a real model of width C (C/2 complex dimensions, pair k = channels
(2k, 2k+1) holding (real, imaginary)):

* the token embedding x supplies the word's amplitude *and* word phase: its pair k is read
  as the complex number x_k = r_jk exp(i phi_jk), i.e. the word's embedding at position 0
  up to the learned phase below;
* theta_jk = phi_jk + theta_k with a learned per-dimension phase offset theta_k (init 0);
* omega_jk = omega_k, a learned per-dimension frequency initialised like the sinusoidal
  ones, base^(-2k/C); with ``word_dependent=True`` it becomes omega_k + (W x)_k, a learned
  linear map of the token embedding (the paper's per-word frequencies, W initialised to 0).

So the output pair k is x_k rotated by the angle omega_jk * pos + theta_k, written back as
(real, imaginary). Angles are computed in float64 (omega * pos at pos = 1e5 loses ~1e-2 rad
in float32); the result is cast to the input's dtype. The learned frequencies and phases
stay float32 when the model is cast to bfloat16/float16 (:class:`~posenc.limits.Float32Params`):
omega rounded to bfloat16 is off by up to 2^-9 relative, which at position 8192 moved the
logits of a bf16 model by 0.63 against the float32 model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_even, check_range
from ..encoding import Dims, PositionalEncoding
from ..literature import EMBEDDINGS_ONLY
from ..positions import SequenceInfo
from ..registry import register
from ..limits import Float32Params

__all__ = ["ComplexOrderConfig", "ComplexOrderEmbedding"]

_WANG = "Wang et al. 2020: position-free offset transformation, boundedness"


@dataclass
class ComplexOrderConfig(EncodingConfig):
    """``base`` >= 1: initial frequencies base^(-2k/C) in (0, 1]; a base below 1 makes them
    grow, and base = 1e-300 overflows omega to inf in float32 (NaN logits)."""

    base: float = 10000.0  # initial frequencies omega_k = base^(-2k/C)
    word_dependent: bool = False  # omega_jk = omega_k + (W x)_k (the paper's per-word frequencies)

    def validate(self) -> None:
        check_range("base", self.base, 1.0, None)


@register(
    "complex_order",
    family="absolute",
    summary="embedding pairs as complex r*exp(i(omega*pos + theta)): learned frequencies and phases",
    paper="Wang et al. 2020, Encoding word order in complex embeddings (ICLR)",
    claims={
        "absolute": (True, "Wang et al. 2020: r e^{i(w p + theta)} per position"),
        "linear_map": (True, _WANG),
        "bounded": (True, _WANG),
        "extrapolation": (True, "defined at every position"),
        "linear_attention": (True, EMBEDDINGS_ONLY),
    },
)
class ComplexOrderEmbedding(Float32Params, PositionalEncoding):
    """Rotate each (real, imaginary) pair of x by omega * pos + theta (see the module docstring)."""

    Config = ComplexOrderConfig
    float32_params = ("omega", "theta", "omega_proj")  # angle-like: never rounded to bf16/fp16

    def __init__(self, config: ComplexOrderConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        check_even("d_model", dims.d_model)
        half = dims.d_model // 2
        k = torch.arange(half, dtype=torch.float64)
        self.omega = nn.Parameter((config.base ** (-2.0 * k / dims.d_model)).float())  # (C/2,)
        self.theta = nn.Parameter(torch.zeros(half))  # (C/2,)
        self.omega_proj = nn.Parameter(torch.zeros(half, dims.d_model)) if config.word_dependent else None

    def angles(self, x: Tensor, positions: Tensor) -> Tensor:
        """omega_jk * pos + theta_k, float64, (B, T, C/2)."""
        omega = self.omega.double()  # (C/2,)
        if self.omega_proj is not None:
            omega = omega + torch.nn.functional.linear(x.double(), self.omega_proj.double())  # (B, T, C/2)
        return positions.double()[..., None] * omega + self.theta.double()

    def embed(self, x: Tensor, seq: SequenceInfo, state: dict[str, Any] | None = None) -> Tensor:
        B, T, C = x.shape
        ang = self.angles(x, seq.positions)  # (B, T, C/2)
        dtype = torch.promote_types(x.dtype, torch.float32)
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        z = x.to(dtype).view(B, T, C // 2, 2)  # (B, T, C/2, 2): (real, imag)
        re, im = z[..., 0], z[..., 1]
        out = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)  # (B, T, C/2, 2)
        return out.view(B, T, C).to(x.dtype)
