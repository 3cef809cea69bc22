"""PoPE: polar coordinate position embedding (Gopalakrishnan et al. 2025, "Decoupling the
'What' and 'Where' With Polar Coordinate Positional Embeddings", arXiv:2509.10534).

RoPE rotates pairs of q's channels, so a channel's content and its phase mix: the logit
depends on what a token is through the angle as well as the magnitude. PoPE gives each of
the D channels c a magnitude from content and a phase from position alone:

    q_c -> softplus(q_c) e^{i m theta_c},   k_c -> softplus(k_c) e^{i (n theta_c + delta_c)},
    theta_c = base^(-c/D),  c = 0 .. D - 1,

and the logit is the real part of the Hermitian product,

    Re sum_c softplus(q_c) softplus(k_c) e^{i ((m - n) theta_c - delta_c)},

a function of m - n whose sign no content can flip (the magnitudes are positive). delta
(H, D) is a learned phase bias per head and channel, clamped to [-2 pi, 0] as in the paper.

The real form has twice the channels: ``rotate`` returns q and k of width 2D,
``[mu cos(phase) | mu sin(phase)]``, whose dot product is the logit above; values keep width D.
The scale stays 1/sqrt(D) of the original head dim (as x-transformers' ``polar_pos_emb``). The
phase bias goes on the query (phase m theta - delta): the logit is the same, and keys then
carry no per-head parameter, so grouped-query keys are cached before they are repeated.

Angles are float64 (as RoPE's; positions past 2**53 - 1 are refused, as RoPE refuses them),
the magnitudes and the product float32 or wider, rounded to the input dtype at the end.

Shapes: q (B, H, Tq, D) -> (B, H, Tq, 2D); k (B, Hkv, Tk, D) -> (B, Hkv, Tk, 2D).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import EncodingConfig, check_choice, check_positive
from ..encoding import Dims, PositionalEncoding
from ..limits import Float32Params, check_positions
from ..literature import ROPE_FEATURES
from ..registry import register

__all__ = ["PopeConfig", "PolarEmbedding", "polar_embed"]

BIAS_INITS = ("zeros", "uniform")


def polar_embed(x: Tensor, angles: Tensor) -> Tensor:
    """``[softplus(x) cos(angles) | softplus(x) sin(angles)]``: (..., D) -> (..., 2D), float32
    or wider (``angles`` broadcasts against x)."""
    dt = torch.promote_types(x.dtype, torch.float32)
    mu = F.softplus(x.to(dt))
    return torch.cat((mu * angles.cos().to(dt), mu * angles.sin().to(dt)), dim=-1)


@dataclass
class PopeConfig(EncodingConfig):
    """Config of :class:`PolarEmbedding`.

    Attributes:
        base: theta_c = base^(-c/D); > 1 (a base <= 1 makes the frequencies grow with c).
        bias_init: the phase bias delta at init: "zeros" (x-transformers' default) or
            "uniform" on [-2 pi, 0] (the paper's; x-transformers ``polar_bias_uniform_init``).
    """

    base: float = 10000.0
    bias_init: str = "zeros"

    def validate(self) -> None:
        check_positive("base", self.base)
        if self.base <= 1.0:
            raise ValueError(f"base must be > 1 (theta_c = base^(-c/D) must decrease), got {self.base}")
        check_choice("bias_init", self.bias_init, BIAS_INITS)


@register(
    "pope",
    family="rotary",
    summary="polar embedding: softplus magnitudes, phases m*theta_c per channel (q, k twice as wide)",
    paper="Gopalakrishnan et al. 2025, Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings",
    claims={
        "absolute": (True, "Gopalakrishnan et al. 2025: a phase m theta_c per position"),
        "relative": (True, "Gopalakrishnan et al. 2025: the logit is a function of m - n"),
        "linear_map": (True, "a rotation per channel by k theta_c, as RoPE's"),
        "bounded": (True, "phases rotate, magnitudes come from content only"),
        "extrapolation": (True, "Gopalakrishnan et al. 2025: defined at every position"),
        "linear_attention": (True, ROPE_FEATURES),
    },
)
class PolarEmbedding(Float32Params, PositionalEncoding):
    """PoPE as a ``rotate`` hook that widens q and k from D to 2D channels.

    ``phase_bias`` (H, D): delta, used clamped to [-2 pi, 0] (kept float32 under a bf16 cast:
    it is an angle).
    """

    Config = PopeConfig
    float32_params = ("phase_bias",)

    def __init__(self, config: PopeConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        D = dims.head_dim
        bias = torch.zeros(dims.num_heads, D)
        if config.bias_init == "uniform":
            bias.uniform_(-2 * math.pi, 0.0)
        self.phase_bias = nn.Parameter(bias)

    def inv_freq(self, device: torch.device | None = None) -> Tensor:
        """theta_c = base^(-c/D), (D,) float64: computed, not a buffer, so no cast rounds it."""
        D = self.dims.head_dim
        return self.config.base ** (-torch.arange(D, dtype=torch.float64, device=device) / D)

    def delta(self) -> Tensor:
        """The phase bias as used: clamped to [-2 pi, 0], (H, D)."""
        return self.phase_bias.clamp(-2 * math.pi, 0.0)

    def angles(self, positions: Tensor, device: torch.device) -> Tensor:
        """m theta_c at ``positions`` (B, T): (B, 1, T, D) float64. Positions must lie in
        [0, 2**53 - 1] (float64 angles; checked in eager mode, as RoPE's)."""
        check_positions(positions)
        return positions[:, None, :, None].to(torch.float64) * self.inv_freq(device)  # (B, 1, T, D)

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The angles at the query positions, for q and the new keys (self-attention), made
        (and checked) once per forward."""
        return self.angles(q_pos, q_pos.device)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) at q_pos (B, Tq) -> (B, H, Tq, 2D); k (B, Hkv, Tk, D) -> (B, Hkv, Tk, 2D).
        ``state``: :meth:`prepare`'s, for keys at the query positions."""
        q_angles = self.angles(q_pos, q.device) if state is None else state.to(q.device)
        k_angles = self.angles(k_pos, k.device) if state is None else q_angles
        if k_angles.shape[-2] != k.shape[-2]:
            raise ValueError(
                f"state is prepare()'s, for keys at the {k_angles.shape[-2]} query positions, but k has {k.shape[-2]}; "
                "pass state=None for keys at other positions"
            )
        q_angles = q_angles - self.delta().to(torch.float64)[None, :, None, :]  # (B, H, Tq, D)
        return polar_embed(q, q_angles).to(q.dtype), polar_embed(k, k_angles).to(k.dtype)
