"""Transformer-XL relative attention (Dai et al. 2019, "Transformer-XL: Attentive Language
Models Beyond a Fixed-Length Context", eq. in Sec. 3.3; also XLNet, Yang et al. 2019).

    A_ij = q_i·k_j + u·k_j + q_i·W_R R_(i-j) + v·W_R R_(i-j)
         =  (q_i + u)·k_j  +  (q_i + v)·W_R R_(i-j)

R_d is the sinusoid of the distance d = q_pos_i - k_pos_j (Transformer-XL's layout: [sin |
cos] over d_model channels, inverse frequencies base^(-2m/d_model)); W_R (d_model -> H·D,
no bias) and u, v (H, D) are learned. The ``score`` hook returns the three terms beyond
q_i·k_j multiplied by the logit scale 1/sqrt(D), as Transformer-XL scales (AC + BD).

Segment-level memory is posenc's :class:`~posenc.attention.KVCache` with ``max_length`` (the
memory length) and ``detach=True`` (no gradient into past segments): keys then span memory
plus the current segment and distances are taken between actual positions, so the memory
needs no special case here. The relative shift is :func:`~posenc.relative.distance.skew`.

``prepare`` computes the chosen form's position factors once per forward (the sinusoids and
their projection W_R R_d, or the angle factors), shared by every layer using the module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..limits import MAX_DISTANCE, MAX_INIT_STD
from ..config import EncodingConfig, check_even, check_int, check_range
from ..encoding import Dims, PositionalEncoding
from ..registry import register
from .distance import RelativeLayout

__all__ = ["TransformerXLConfig", "TransformerXLRelative", "TransformerXLState"]


@dataclass
class TransformerXLConfig(EncodingConfig):
    """Bounds: ``base`` >= 1 (inverse frequencies in (0, 1]; base = 1e-300 overflows the
    angles), ``max_distance`` in [1, 2^40] (a clamp, no table), ``init_std`` in (0, 1e4]."""

    base: float = 10000.0
    max_distance: int | None = None  # Transformer-XL's clamp_len: |d| beyond it uses R_(+-max)
    init_std: float = 0.02  # of u and v

    def validate(self) -> None:
        check_range("base", self.base, 1.0, None)
        check_range("init_std", self.init_std, 0.0, MAX_INIT_STD, low_inclusive=False)
        if self.max_distance is not None:
            check_int("max_distance", self.max_distance, minimum=1, maximum=MAX_DISTANCE)


@register(
    "transformer_xl",
    family="relative",
    summary="(q+u)·k + (q+v)·W_R R(i-j): sinusoidal relative keys with global biases, segment memory",
    paper="Dai et al. 2019, Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context",
)
class TransformerXLRelative(PositionalEncoding):
    Config = TransformerXLConfig

    def __init__(self, config: TransformerXLConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        check_even("d_model", dims.d_model)
        H, D = dims.num_heads, dims.head_dim
        self.u = nn.Parameter(torch.randn(H, D) * config.init_std)  # r_w_bias
        self.v = nn.Parameter(torch.randn(H, D) * config.init_std)  # r_r_bias
        self.r_net = nn.Linear(dims.d_model, H * D, bias=False)  # W_R

    def _clip(self, d: Tensor) -> Tensor:
        m = self.config.max_distance
        return d if m is None else d.clamp(-m, m)

    def relative_keys(self, distances: Tensor) -> Tensor:
        """W_R R_d for distances (R,) -> (H, D, R) in W_R's dtype (sinusoid angles in float64)."""
        # Float64 angles (as sinusoidal_table), but kept in float64 until W_R's dtype: the
        # shared table helper returns float32, which would cap a float64 model at 1e-7.
        C = self.dims.d_model
        inv_freq = self.config.base ** (-torch.arange(0, C, 2, dtype=torch.float64, device=distances.device) / C)
        ang = distances.to(torch.float64)[:, None] * inv_freq  # (R, C/2)
        sin = torch.cat([ang.sin(), ang.cos()], dim=-1)  # (R, C): Transformer-XL's [sin | cos]
        r = self.r_net(sin.to(self.r_net.weight.dtype))  # (R, H*D)
        return r.view(-1, self.dims.num_heads, self.dims.head_dim).permute(1, 2, 0)  # (H, D, R)

    def _use_angles(self, tq: int, tk: int) -> bool:
        # Unclipped, the angle form is exact for any positions. Use it under compile (the table
        # path's row range depends on the positions' values) and whenever it is cheaper: its
        # cost H·Tq·Tk·C against the table's projection (Tq+Tk)·C·H·D, e.g. in decoding
        # (Tq = 1), where projecting a row per cached key would dominate the step.
        C = self.dims.d_model
        return self.config.max_distance is None and (
            torch.compiler.is_compiling() or tq * tk * C < (tq + tk) * C * self.dims.head_dim
        )

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> "TransformerXLState":
        """The chosen form's position factors, once per forward for every layer (see the state)."""
        if self._use_angles(q_pos.shape[1], k_pos.shape[1]):
            C = self.dims.d_model
            inv_freq = self.config.base ** (-torch.arange(0, C, 2, dtype=torch.float64, device=q_pos.device) / C)
            a = q_pos.to(torch.float64)[:, None, :, None] * inv_freq  # (B, 1, Tq, C/2), angles in float64
            b = k_pos.to(torch.float64)[:, None, :, None] * inv_freq  # (B|1, 1, Tk, C/2)
            kf = torch.cat([b.cos(), b.sin()], dim=-1)  # (B|1, 1, Tk, C)
            return TransformerXLState(None, None, a.sin(), a.cos(), kf)
        m = self.config.max_distance
        lay = RelativeLayout.build(q_pos, k_pos, self._clip, None if m is None else (-m, m))
        return TransformerXLState(lay, self.relative_keys(lay.distances), None, None, None)

    def score(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float, layer: nn.Module | None = None,
        state: Any = None,
    ) -> Tensor:
        state = self.prepare(q_pos, k_pos) if state is None else state
        if state.layout is None:
            return self.score_by_angles(q, k, q_pos, k_pos, scale, state)
        return self.score_by_table(q, k, q_pos, k_pos, scale, state)

    def score_by_table(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float, state: "TransformerXLState | None" = None
    ) -> Tensor:
        """The term through W_R R_d for the distances that occur, skewed or gathered into pairs."""
        if state is None or state.layout is None:
            m = self.config.max_distance
            lay = RelativeLayout.build(q_pos, k_pos, self._clip, None if m is None else (-m, m))
            state = TransformerXLState(lay, self.relative_keys(lay.distances), None, None, None)
        lay = state.layout
        # The scale is applied to the small factors (W rows, u), never to a (T, T) tensor.
        r = (state.keys * scale).to(q.dtype)  # (H, D, W)
        out = lay.query_pairs(q + self.v[:, None].to(q.dtype), r)  # (B, H, Tq, Tk)
        uk = (k @ (self.u * scale)[:, :, None].to(k.dtype)).transpose(-1, -2)  # (B, H, 1, Tk): u·k_j
        return out.add_(uk)

    def score_by_angles(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float, state: "TransformerXLState | None" = None
    ) -> Tensor:
        """The same term for any positions, by the angle-difference identities (no table, no index).

        With a = q_pos_i w, b = k_pos_j w, sin(a - b) = sin a cos b - cos a sin b and
        cos(a - b) = cos a cos b + sin a sin b, so (q_i + v)·W_R R_(i-j) is a product of a
        (Tq, C) query factor and a (C, Tk) key factor: O(Tq·Tk·C) per head, C/D times the cost
        of q·k^T, with shapes that do not depend on the positions' values (torch.compile).
        Requires ``max_distance=None`` (a clamp breaks the identity).
        """
        if self.config.max_distance is not None:
            raise ValueError(f"score_by_angles needs max_distance=None, got {self.config.max_distance}")
        if state is None or state.layout is not None:
            C = self.dims.d_model
            inv_freq = self.config.base ** (-torch.arange(0, C, 2, dtype=torch.float64, device=q.device) / C)
            a = q_pos.to(torch.float64)[:, None, :, None] * inv_freq  # (B, 1, Tq, C/2), angles in float64
            b = k_pos.to(torch.float64)[:, None, :, None] * inv_freq  # (B|1, 1, Tk, C/2)
            state = TransformerXLState(None, None, a.sin(), a.cos(), torch.cat([b.cos(), b.sin()], dim=-1))
        C, H, D = self.dims.d_model, self.dims.num_heads, self.dims.head_dim
        w = (self.r_net.weight * scale).to(q.dtype).view(H, D, C)  # (H, D, C): W_R per head, scaled
        qv = q + self.v[:, None].to(q.dtype)  # (B, H, Tq, D)
        alpha, beta = (qv @ w).chunk(2, dim=-1)  # (B, H, Tq, C/2) each: weights of sin(dw), cos(dw)
        sa, ca = state.sin_q.to(q.dtype), state.cos_q.to(q.dtype)  # (B, 1, Tq, C/2)
        kf = state.key_factor.to(q.dtype)  # (B|1, 1, Tk, C)
        qf = torch.cat([alpha * sa + beta * ca, beta * sa - alpha * ca], dim=-1)  # (B, H, Tq, C)
        uk = (k @ (self.u * scale)[:, :, None].to(k.dtype)).transpose(-1, -2)  # (B, H, 1, Tk): u·k_j
        return qf @ kf.transpose(-1, -2) + uk  # (B, H, Tq, Tk)


@dataclass
class TransformerXLState:
    """Per-forward position factors of one of the two forms (``prepare`` picks it).

    Table form: ``layout`` and ``keys`` = W_R R_d (H, D, W) for its distances, unscaled, in
    W_R's dtype. Angle form (``layout`` None): ``sin_q``/``cos_q`` (B, 1, Tq, C/2) of the query
    angles and ``key_factor`` [cos | sin] (B|1, 1, Tk, C) of the key angles, float64.
    """

    layout: RelativeLayout | None
    keys: Tensor | None
    sin_q: Tensor | None
    cos_q: Tensor | None
    key_factor: Tensor | None
