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
their cos and sin made once per forward; the phase bias, the magnitudes and the product are
float32 or wider, rounded to the input dtype at the end. Under autograd a rotation keeps only
its output, which attention keeps anyway (:func:`polar_embed`). Attention on the 2D-wide q and k with D-wide
values runs on SDPA's CPU flash kernel, not its math kernel (:func:`posenc.backends.sdpa.sdpa`).

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


def polar_embed(x: Tensor, cos: Tensor, sin: Tensor, delta: Tensor | None = None) -> Tensor:
    """``[mu cos(a - delta) | mu sin(a - delta)]`` with ``mu = softplus(x)``: (..., D) -> (..., 2D),
    in x's dtype, computed in float32 or wider.

    ``cos``, ``sin``: cos(a), sin(a) of the position angles, broadcasting against x; ``delta``
    (H, D): a per-head phase bias (None: none), taken off by the angle-difference identities
    cos(a - d) = cos a cos d + sin a sin d, sin(a - d) = sin a cos d - cos a sin d, so no
    (B, H, T, D) angle tensor is made. Under autograd only the output is kept for the backward
    (:class:`_PolarEmbed`): the products of the forward would otherwise keep four tensors of
    x's size in float32 per call.
    """
    return _PolarEmbed.apply(x, cos, sin, delta)


def _cos_sin_of_difference(cos: Tensor, sin: Tensor, delta: Tensor | None, dt: torch.dtype) -> tuple[Tensor, Tensor]:
    cos, sin = cos.to(dt), sin.to(dt)
    if delta is None:
        return cos, sin
    d = delta.to(dt)[:, None, :]  # (H, 1, D) against (B, 1, T, D)
    cd, sd = d.cos(), d.sin()
    return cos * cd + sin * sd, sin * cd - cos * sd  # cos(a - delta), sin(a - delta): (B, H, T, D)


class _PolarEmbed(torch.autograd.Function):
    """:func:`polar_embed` whose backward reads its own output alone.

    The output o = [mu C | mu S] holds everything the backward needs, since C² + S² = 1:
    mu = |(o_C, o_S)|, and softplus' = sigmoid(x) = 1 - e^(-mu) (mu = log(1 + e^x)), so

        dx = (g_C o_C + g_S o_S) (1 - e^(-mu)) / mu,    d delta = sum (g_C o_S - g_S o_C)

    (d cos(a - delta)/d delta = sin(a - delta), d sin(a - delta)/d delta = -cos(a - delta)).
    Attention keeps that output for its own backward, so the rotation adds no saved tensor.
    """

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor, delta: Tensor | None) -> Tensor:
        dt = torch.promote_types(x.dtype, torch.float32)
        c, s = _cos_sin_of_difference(cos, sin, delta, dt)
        mu = F.softplus(x.to(dt))
        out = torch.cat((mu * c, mu * s), dim=-1).to(x.dtype)  # (..., 2D)
        ctx.save_for_backward(out)
        ctx.delta_shape = None if delta is None else (delta.shape, delta.dtype)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        dt = torch.promote_types(out.dtype, torch.float32)
        o_c, o_s = out.to(dt).chunk(2, dim=-1)  # mu cos, mu sin: (..., D) each
        g_c, g_s = grad.to(dt).chunk(2, dim=-1)
        mu = torch.hypot(o_c, o_s)
        # (1 - e^-mu) / mu, -> 1 as mu -> 0 (mu == 0: softplus underflowed, and so did o)
        slope = torch.where(mu > 0, -torch.expm1(-mu) / mu, torch.ones_like(mu))
        dx = ((g_c * o_c + g_s * o_s) * slope).to(out.dtype)
        d_delta = None
        if ctx.delta_shape is not None and ctx.needs_input_grad[3]:
            per = g_c * o_s - g_s * o_c  # (B, H, T, D)
            n = per.dim()
            d_delta = per.sum(dim=tuple(i for i in range(n) if i not in (n - 3, n - 1))).to(ctx.delta_shape[1])  # (H, D)
        return dx, None, None, d_delta


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

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin (B, 1, Tq, D) float64 of the angles at the query positions, for q and the
        new keys (self-attention), made (and checked) once per forward."""
        a = self.angles(q_pos, q_pos.device)
        return a.cos(), a.sin()

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) at q_pos (B, Tq) -> (B, H, Tq, 2D); k (B, Hkv, Tk, D) -> (B, Hkv, Tk, 2D).
        ``state``: :meth:`prepare`'s, for keys at the query positions."""
        if state is None:
            q_tab, k_tab = self.prepare(q_pos, q_pos), self.prepare(k_pos, k_pos)
        else:
            q_tab = k_tab = state
        if k_tab[0].shape[-2] != k.shape[-2]:
            raise ValueError(
                f"state is prepare()'s, for keys at the {k_tab[0].shape[-2]} query positions, but k has {k.shape[-2]}; "
                "pass state=None for keys at other positions"
            )
        # The phase bias on q alone (module docstring): q's phase m theta - delta, k's n theta.
        return polar_embed(q, *q_tab, self.delta()), polar_embed(k, *k_tab)
