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
their cos and sin made once per forward, with q's phases shifted by the phase bias
(:class:`PopeState`: every layer then takes one turn per tensor, softplus, two products and a
concatenation, in one pass of the fused CPU kernel where it is built, :mod:`posenc.rotary.cpu_rope`);
the phase bias, the magnitudes and the product are float32 or wider, rounded to the input dtype
at the end. Under autograd a rotation keeps only its output, which attention keeps anyway, and
its backward gives the phase bias its gradient directly, sum(g_c o_s - g_s o_c), so no gradient
of the (B, H, T, D) tables is formed (:func:`polar_turn`). Attention on the 2D-wide q and k with D-wide
values does p·v at width D on CPU too, not on SDPA's math kernel (:func:`posenc.backends.sdpa.sdpa`,
:mod:`posenc.backends.narrow_values`).

Shapes: q (B, H, Tq, D) -> (B, H, Tq, 2D); k (B, Hkv, Tk, D) -> (B, Hkv, Tk, 2D).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import EncodingConfig, check_choice, check_positive
from ..encoding import Dims, PositionalEncoding
from ..limits import Float32Params, check_positions
from ..literature import ROPE_FEATURES
from ..registry import register
from . import cpu_rope

__all__ = ["PopeConfig", "PolarEmbedding", "PopeState", "polar_embed", "polar_turn"]

BIAS_INITS = ("zeros", "uniform")


def polar_embed(x: Tensor, cos: Tensor, sin: Tensor, delta: Tensor | None = None) -> Tensor:
    """``[mu cos(a - delta) | mu sin(a - delta)]`` with ``mu = softplus(x)``: (..., D) -> (..., 2D),
    in x's dtype, computed in float32 or wider.

    ``cos``, ``sin``: cos(a), sin(a) of the position angles, broadcasting against x; ``delta``
    (H, D): a per-head phase bias (None: none), taken off by the angle-difference identities
    cos(a - d) = cos a cos d + sin a sin d, sin(a - d) = sin a cos d - cos a sin d, so no
    (B, H, T, D) angle tensor is made; x is then (B, H, T, D). Under autograd only the output is
    kept for the backward, which gives delta its gradient directly (:func:`polar_turn`).
    """
    dt = torch.promote_types(x.dtype, torch.float32)
    bias = None if delta is None else delta.detach()
    return polar_turn(x, *_cos_sin_of_difference(cos, sin, bias, dt), delta)


def polar_turn(x: Tensor, c: Tensor, s: Tensor, delta: Tensor | None = None) -> Tensor:
    """``[mu c | mu s]`` with ``mu = softplus(x)``, c and s the cos and sin of the phases
    (broadcasting against x, in x's compute dtype: float32 or wider): (..., D) -> (..., 2D) in
    x's dtype.

    ``delta`` (H, D), with x (B, H, T, D): the phase bias c and s have taken off (c = cos(a - delta),
    s = sin(a - delta)), passed so that it gets its gradient here, the sum over batch and
    positions of g_c o_s - g_s o_c (the output's derivative in delta is (o_s, -o_c)); c and s
    are then made from a detached delta, so no gradient of (B, H, T, D) tables is formed.

    Under autograd only the output is kept (:class:`_PolarTurn`); without it, the turn alone (a
    decoding step). float32 CPU tensors of (B, H, T, D) against tables of (B|1, H|1, T, D) take
    the fused CPU kernel where it is built (:func:`_fused`): one pass each way, the forward's
    bits those of the four ATen ops."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, c, s, delta)):
        return _PolarTurn.apply(x, c, s, delta)
    return _turn(x, c, s)


def _turn(x: Tensor, c: Tensor, s: Tensor) -> Tensor:
    ext = _fused(x, c, s)
    if ext is not None:
        return ext.polar_turn(x, c, s)
    mu = F.softplus(x.to(c.dtype))
    return torch.cat((mu * c, mu * s), dim=-1).to(x.dtype)


def _fused(x: Tensor, *tables: Tensor):
    """The fused CPU rotary kernel (:mod:`posenc.rotary.cpu_rope`) when it is built and takes
    these tensors: float32 on CPU, 4-D with a contiguous last dim, each table's batch and head
    dims x's or 1 and the rest x's; outside torch.compile (a C++ call would break the graph).
    None otherwise: the ATen ops. (Cheap attributes only: a decoding step asks twice a layer.)"""
    f32 = torch.float32
    if x.dtype is not f32 or x.dim() != 4 or x.stride(-1) != 1:
        return None
    B, H, *rest = x.shape
    for t in tables:
        if t.dtype is not f32 or not t.is_cpu or t.dim() != 4 or t.stride(-1) != 1:
            return None
        b, h, *trest = t.shape
        if trest != rest or (b != B and b != 1) or (h != H and h != 1):
            return None
    return cpu_rope.kernel_on(x)


def _cos_sin_of_difference(cos: Tensor, sin: Tensor, delta: Tensor | None, dt: torch.dtype) -> tuple[Tensor, Tensor]:
    cos, sin = cos.to(dt), sin.to(dt)
    if delta is None:
        return cos, sin
    d = delta.to(dt)[:, None, :]  # (H, 1, D) against (B, 1, T, D)
    cd, sd = d.cos(), d.sin()
    return cos * cd + sin * sd, sin * cd - cos * sd  # cos(a - delta), sin(a - delta): (B, H, T, D)


class _PolarTurn(torch.autograd.Function):
    """:func:`polar_turn` whose backward reads its own output alone.

    The output o = [mu c | mu s] holds everything the backward needs, since c² + s² = 1:
    mu = |(o_c, o_s)|, and softplus' = sigmoid(x) = 1 - e^(-mu) (mu = log(1 + e^x)), so

        dx = (g_c o_c + g_s o_s) (1 - e^(-mu)) / mu,    dc = g_c mu,    ds = g_s mu,
        d delta = sum over batch and positions of (g_c o_s - g_s o_c)

    (dc and ds only where the tables need a gradient, d delta only where a phase bias is
    given: q's). Attention keeps that output for its own backward, so the rotation adds no
    saved tensor.
    """

    @staticmethod
    def forward(ctx, x: Tensor, c: Tensor, s: Tensor, delta: Tensor | None) -> Tensor:
        out = _turn(x, c, s)  # (..., 2D)
        ctx.save_for_backward(out)
        ctx.shapes = (c.shape, s.shape, None if delta is None else delta.shape)
        ctx.bias_dtype = None if delta is None else delta.dtype
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        want_c, want_s, want_bias = ctx.needs_input_grad[1:4]
        bias_shape = ctx.shapes[2]
        # the kernel for a first-order backward (grad enabled here: a double backward, through the ATen ops)
        ext = None if torch.is_grad_enabled() else _fused(out, grad)
        fits = bias_shape is None or bias_shape == (out.shape[1], out.shape[-1] // 2)
        if ext is not None and fits and out.is_contiguous() and grad.shape == out.shape:
            dx, dc, ds, dbias = ext.polar_turn_backward(out, grad, want_c or want_s, want_bias)
        else:
            dx, dc, ds, dbias = _turn_backward(out, grad, want_c or want_s, want_bias, bias_shape)
        return (dx, _sum_to(dc, ctx.shapes[0]) if want_c else None, _sum_to(ds, ctx.shapes[1]) if want_s else None,
                dbias.to(ctx.bias_dtype) if want_bias else None)


def _turn_backward(out: Tensor, grad: Tensor, tables: bool, bias: bool, bias_shape) -> tuple:
    """:class:`_PolarTurn`'s backward in ATen ops: (dx, dc, ds, d delta), None where not asked."""
    dt = torch.promote_types(out.dtype, torch.float32)
    o_c, o_s = out.to(dt).chunk(2, dim=-1)  # mu c, mu s: (..., D) each
    g_c, g_s = grad.to(dt).chunk(2, dim=-1)
    mu = torch.hypot(o_c, o_s)
    # (1 - e^-mu) / mu, -> 1 as mu -> 0 (mu == 0: softplus underflowed, and so did o)
    slope = torch.where(mu > 0, -torch.expm1(-mu) / mu, torch.ones_like(mu))
    dx = ((g_c * o_c + g_s * o_s) * slope).to(out.dtype)
    dc, ds = (g_c * mu, g_s * mu) if tables else (None, None)
    dbias = None
    if bias:  # delta (H, D) against x (B, H, T, D): summed over the batch and the positions
        H, D = bias_shape
        dbias = (g_c * o_s - g_s * o_c).sum_to_size(H, 1, D).view(H, D)
    return dx, dc, ds, dbias


def _sum_to(g: Tensor, shape: torch.Size) -> Tensor:
    """``g`` summed over the dimensions a broadcast input of ``shape`` was expanded along."""
    return g if g.shape == shape else g.sum_to_size(shape)


@dataclass(eq=False)
class PopeState:
    """Per-forward PoPE tables at the query positions, for q and the new keys (self-attention):
    cos and sin (B, 1, Tq, D) float64 of the angles, and the phase bias (H, D) as used. Per
    compute dtype, made on first use and shared by every layer: k's (cos, sin) and q's phases
    shifted by the bias, (cos(a - delta), sin(a - delta)) (B, H, Tq, D), made from the bias
    detached: each layer's turn of q gives the bias its gradient (:func:`polar_turn`)."""

    cos: Tensor
    sin: Tensor
    delta: Tensor
    _tables: dict = field(default_factory=dict, repr=False)

    def tables(self, dt: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(q's c, q's s, k's c, k's s) in ``dt``, made once per dtype."""
        if dt not in self._tables:
            kc, ks = self.cos.to(dt), self.sin.to(dt)
            self._tables[dt] = (*_cos_sin_of_difference(kc, ks, self.delta.detach(), dt), kc, ks)
        return self._tables[dt]


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

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> PopeState:
        """The tables at the query positions, for q and the new keys (self-attention), made (and
        checked) once per forward: :class:`PopeState`."""
        a = self.angles(q_pos, q_pos.device)
        return PopeState(a.cos(), a.sin(), self.delta())

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: PopeState | None = None) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) at q_pos (B, Tq) -> (B, H, Tq, 2D); k (B, Hkv, Tk, D) -> (B, Hkv, Tk, 2D).
        ``state``: :meth:`prepare`'s, for keys at the query positions."""
        dt = torch.promote_types(q.dtype, torch.float32)
        if state is None:
            qc, qs, _, _ = self.prepare(q_pos, q_pos).tables(dt)
            _, _, kc, ks = self.prepare(k_pos, k_pos).tables(dt)
        else:
            qc, qs, kc, ks = state.tables(dt)
        if kc.shape[-2] != k.shape[-2]:
            raise ValueError(
                f"state is prepare()'s, for keys at the {kc.shape[-2]} query positions, but k has {k.shape[-2]}; "
                "pass state=None for keys at other positions"
            )
        # The phase bias on q alone (module docstring): q's phase m theta - delta, k's n theta.
        delta = self.delta() if state is None else state.delta
        return polar_turn(q, qc, qs, delta), polar_turn(k, kc, ks)
