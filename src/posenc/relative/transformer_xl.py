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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_even, check_int, check_positive
from ..encoding import Dims, PositionalEncoding
from ..registry import register
from .distance import RelativeLayout

__all__ = ["TransformerXLConfig", "TransformerXLRelative"]


@dataclass
class TransformerXLConfig(EncodingConfig):
    base: float = 10000.0
    max_distance: int | None = None  # Transformer-XL's clamp_len: |d| beyond it uses R_(+-max)
    init_std: float = 0.02  # of u and v

    def validate(self) -> None:
        check_positive("base", self.base)
        check_positive("init_std", self.init_std)
        if self.max_distance is not None:
            check_int("max_distance", self.max_distance, minimum=1)


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

    def score(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float, layer: nn.Module | None = None,
        state: Any = None,
    ) -> Tensor:
        m = self.config.max_distance
        tq, tk, C = q.shape[-2], k.shape[-2], self.dims.d_model
        # Unclipped, the angle form is exact for any positions. Use it under compile (the table
        # path's row range depends on the positions' values) and whenever it is cheaper: its
        # cost H·Tq·Tk·C against the table's projection (Tq+Tk)·C·H·D, e.g. in decoding
        # (Tq = 1), where projecting a row per cached key would dominate the step.
        if m is None and (torch.compiler.is_compiling() or tq * tk * C < (tq + tk) * C * self.dims.head_dim):
            return self.score_by_angles(q, k, q_pos, k_pos, scale)
        return self.score_by_table(q, k, q_pos, k_pos, scale)

    def score_by_table(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        """The term through W_R R_d for the distances that occur, skewed or gathered into pairs."""
        m = self.config.max_distance
        lay = RelativeLayout.build(q_pos, k_pos, self._clip, None if m is None else (-m, m))
        # The scale is applied to the small factors (W rows, u), never to a (T, T) tensor.
        r = (self.relative_keys(lay.distances) * scale).to(q.dtype)  # (H, D, W)
        out = lay.query_pairs(q + self.v[:, None].to(q.dtype), r)  # (B, H, Tq, Tk)
        uk = (k @ (self.u * scale)[:, :, None].to(k.dtype)).transpose(-1, -2)  # (B, H, 1, Tk): u·k_j
        return out.add_(uk)

    def score_by_angles(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        """The same term for any positions, by the angle-difference identities (no table, no index).

        With a = q_pos_i w, b = k_pos_j w, sin(a - b) = sin a cos b - cos a sin b and
        cos(a - b) = cos a cos b + sin a sin b, so (q_i + v)·W_R R_(i-j) is a product of a
        (Tq, C) query factor and a (C, Tk) key factor: O(Tq·Tk·C) per head, C/D times the cost
        of q·k^T, with shapes that do not depend on the positions' values (torch.compile).
        Requires ``max_distance=None`` (a clamp breaks the identity).
        """
        if self.config.max_distance is not None:
            raise ValueError(f"score_by_angles needs max_distance=None, got {self.config.max_distance}")
        C, H, D = self.dims.d_model, self.dims.num_heads, self.dims.head_dim
        inv_freq = self.config.base ** (-torch.arange(0, C, 2, dtype=torch.float64, device=q.device) / C)
        w = (self.r_net.weight * scale).to(q.dtype).view(H, D, C)  # (H, D, C): W_R per head, scaled
        qv = q + self.v[:, None].to(q.dtype)  # (B, H, Tq, D)
        alpha, beta = (qv @ w).chunk(2, dim=-1)  # (B, H, Tq, C/2) each: weights of sin(dw), cos(dw)
        a = q_pos.to(torch.float64)[:, None, :, None] * inv_freq  # (B, 1, Tq, C/2), angles in float64
        sa, ca = a.sin().to(q.dtype), a.cos().to(q.dtype)
        b = k_pos.to(torch.float64)[:, None, :, None] * inv_freq  # (B|1, 1, Tk, C/2)
        kf = torch.cat([b.cos(), b.sin()], dim=-1).to(q.dtype)  # (B|1, 1, Tk, C)
        qf = torch.cat([alpha * sa + beta * ca, beta * sa - alpha * ca], dim=-1)  # (B, H, Tq, C)
        uk = (k @ (self.u * scale)[:, :, None].to(k.dtype)).transpose(-1, -2)  # (B, H, 1, Tk): u·k_j
        return qf @ kf.transpose(-1, -2) + uk  # (B, H, Tq, Tk)
