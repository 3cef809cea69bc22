"""Transformer-XL relative attention (Dai et al. 2019, "Transformer-XL: Attentive Language
Models Beyond a Fixed-Length Context", eq. in Sec. 3.3; also XLNet, Yang et al. 2019).

    A_ij = q_i·k_j + u·k_j + q_i·W_R R_(i-j) + v·W_R R_(i-j)
         =  (q_i + u)·k_j  +  (q_i + v)·W_R R_(i-j)

R_d is the sinusoid of the distance d = q_pos_i - k_pos_j (Transformer-XL's layout: [sin |
cos] over d_model channels, inverse frequencies base^(-2m/d_model)); W_R (d_model -> H·D,
no bias) and u, v (H, D) are learned. The ``terms`` hook returns the three terms beyond
q_i·k_j multiplied by the logit scale 1/sqrt(D), as Transformer-XL scales (AC + BD).

Segment-level memory is posenc's :class:`~posenc.kv_cache.KVCache` with ``max_length`` (the
memory length) and ``detach=True`` (no gradient into past segments): keys then span memory
plus the current segment and distances are taken between actual positions, so the memory
needs no special case here.

**Distances are unbounded.** Without ``clip`` (Transformer-XL's ``clamp_len``) every distance
has its own R_d, so the number of distinct rows is R = Tq + Tk - 1 (the range of q_pos - k_pos
that occurs), not a constant: the query-side table (q_i + v)·W_R R_d is (B, H, Tq, Tq + Tk - 1),
O(T²) like the logits themselves (twice their size), and the prepared W_R R_d costs a
(Tq + Tk - 1) x d_model x H·D projection. Two forms, chosen by ``prepare`` by cost:

* table form: :class:`~posenc.terms.TableTerm` over the distances [lo, hi] that occur (with
  ``clip``, at most 2·clip + 1 rows), plus u·k_j as a one-row key-side TableTerm;
* angle form (no ``clip``; one-token decoding steps, and under ``torch.compile`` where the
  row range cannot depend on position values): sin(a - b) and cos(a - b) expanded, so the
  term is a (Tq, C) x (C, Tk) product, returned as one :class:`~posenc.terms.DenseTerm`
  (B, H, Tq, Tk).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..limits import MAX_DISTANCE, MAX_INIT_STD
from ..config import EncodingConfig, check_even, check_int, check_range
from ..encoding import Dims, PositionalEncoding, QKProjection
from ..literature import LEARNED, NOT_A_FEATURE_MAP, NO_ABSOLUTE, RELATIVE_BY_CONSTRUCTION, UNTRAINED
from ..registry import register
from ..terms import DenseTerm, TableTerm
from .distance import DistanceBucket

__all__ = ["TransformerXLConfig", "TransformerXLRelative", "TransformerXLState"]


@dataclass
class TransformerXLConfig(EncodingConfig):
    """Bounds: ``base`` >= 1 (inverse frequencies in (0, 1]; base = 1e-300 overflows the
    angles), ``clip`` in [1, 2^40] (a clamp, no table), ``init_std`` in (0, 1e4]."""

    base: float = 10000.0
    clip: int | None = None  # Transformer-XL's clamp_len: |d| beyond it uses R_(+-clip)
    init_std: float = 0.02  # of u and v

    def validate(self) -> None:
        check_range("base", self.base, 1.0, None)
        check_range("init_std", self.init_std, 0.0, MAX_INIT_STD, low_inclusive=False)
        if self.clip is not None:
            check_int("clip", self.clip, minimum=1, maximum=MAX_DISTANCE)


@register(
    "transformer_xl",
    family="relative",
    summary="(q+u)·k + (q+v)·W_R R(i-j): sinusoidal relative keys with global biases, segment memory",
    paper="Dai et al. 2019, Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context",
    claims={
        "absolute": (False, NO_ABSOLUTE),
        "relative": (True, "Dai et al. 2019: " + RELATIVE_BY_CONSTRUCTION),
        "bounded": (True, "sinusoids of i - j (Dai et al. 2019)"),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, "Dai et al. 2019: generalizes to longer attention at evaluation"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
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

    def _inv_freq(self, device) -> Tensor:
        C = self.dims.d_model
        return self.config.base ** (-torch.arange(0, C, 2, dtype=torch.float64, device=device) / C)  # (C/2,)

    def relative_keys(self, distances: Tensor) -> Tensor:
        """W_R R_d for distances (R,) -> (H, D, R) in W_R's dtype (sinusoid angles in float64)."""
        # Float64 angles (as sinusoidal_table), but kept in float64 until W_R's dtype: the
        # shared table helper returns float32, which would cap a float64 model at 1e-7.
        ang = distances.to(torch.float64)[:, None] * self._inv_freq(distances.device)  # (R, C/2)
        sin = torch.cat([ang.sin(), ang.cos()], dim=-1)  # (R, C): Transformer-XL's [sin | cos]
        r = self.r_net(sin.to(self.r_net.weight.dtype))  # (R, H*D)
        return r.view(-1, self.dims.num_heads, self.dims.head_dim).permute(1, 2, 0)  # (H, D, R)

    def _use_angles(self, tq: int, tk: int) -> bool:
        # Unclipped, the angle form is exact for any positions. Use it under compile (the table
        # form's row range depends on the positions' values) and whenever it is cheaper: its
        # cost H·Tq·Tk·C against the table's projection (Tq+Tk)·C·H·D, e.g. in decoding
        # (Tq = 1), where projecting a row per cached key would dominate the step.
        C = self.dims.d_model
        return self.config.clip is None and (
            torch.compiler.is_compiling() or tq * tk * C < (tq + tk) * C * self.dims.head_dim
        )

    def _range(self, q_pos: Tensor, k_pos: Tensor) -> tuple[int, int]:
        """[lo, hi]: the distances that occur (clamped to the clip), or the clip's whole range
        when that is known without reading the positions (compile) or there are no pairs."""
        m = self.config.clip
        if q_pos.numel() == 0 or k_pos.numel() == 0:
            return (0, 0) if m is None else (-m, m)  # no pairs: one placeholder row
        if torch.compiler.is_compiling():
            return -m, m  # only reached with a clip: _use_angles takes the unclipped case
        lo = int(q_pos.min()) - int(k_pos.max())
        hi = int(q_pos.max()) - int(k_pos.min())
        return (lo, hi) if m is None else (max(min(lo, m), -m), min(max(hi, -m), m))

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> "TransformerXLState":
        """The chosen form's position factors, once per forward for every layer (see the state)."""
        if self._use_angles(q_pos.shape[1], k_pos.shape[1]):
            inv_freq = self._inv_freq(q_pos.device)
            a = q_pos.to(torch.float64)[:, None, :, None] * inv_freq  # (B, 1, Tq, C/2), angles in float64
            b = k_pos.to(torch.float64)[:, None, :, None] * inv_freq  # (B|1, 1, Tk, C/2)
            # Cast once here, not in every layer: in decoding the (Tk, C) key factor is the
            # largest tensor of the step. Float32, or float64 in a float64 model.
            dt = torch.promote_types(self.r_net.weight.dtype, torch.float32)
            kf = torch.cat([b.cos().to(dt), b.sin().to(dt)], dim=-1)  # (B|1, 1, Tk, C): cast, then concatenated
            return TransformerXLState(None, None, a.sin().to(dt), a.cos().to(dt), kf)
        lo, hi = self._range(q_pos, k_pos)
        distances = torch.arange(lo, hi + 1, device=q_pos.device)  # (R,): row r is distance lo + r
        return TransformerXLState(DistanceBucket(lo, hi), self.relative_keys(distances), None, None, None)

    def prepare_cached(self, q_pos: Tensor, k_pos: Tensor, memo: dict) -> "TransformerXLState":
        """Decoding: the table form with W_R R_d kept in ``memo`` and extended by the distances
        each step adds (one per step), so no step projects a row per cached key (the table
        form's cost) or multiplies (Tk, C) angle factors per layer (the angle form's).

        The rows live in an (H, D, capacity) buffer that doubles when full, as the KV cache
        does: a step writes its new row in place instead of copying all R rows (concatenating
        them cost a copy of the whole (H, D, R) table per step)."""
        if self.config.clip is not None or torch.compiler.is_compiling() or q_pos.numel() == 0 or k_pos.numel() == 0:
            return self.prepare(q_pos, k_pos)
        lo, hi = self._range(q_pos, k_pos)
        dev = q_pos.device
        if "keys" not in memo:
            memo["keys"] = (lo, hi, self.relative_keys(torch.arange(lo, hi + 1, device=dev)))  # (H, D, capacity)
        lo0, hi0, buf = memo["keys"]
        if lo < lo0:  # distances below the buffer's first (not reached by decoding): rebuild it
            buf = torch.cat([self.relative_keys(torch.arange(lo, lo0, device=dev)), buf[..., : hi0 - lo0 + 1]], dim=-1)
            lo0 = lo
        if hi > hi0:  # new distances past the end: project only those rows
            need = hi - lo0 + 1
            if need > buf.shape[-1]:
                grown = buf.new_empty(*buf.shape[:-1], max(need, 2 * buf.shape[-1]))
                grown[..., : hi0 - lo0 + 1] = buf[..., : hi0 - lo0 + 1]
                buf = grown
            buf[..., hi0 - lo0 + 1 : need] = self.relative_keys(torch.arange(hi0 + 1, hi + 1, device=dev))
            hi0 = hi
        memo["keys"] = (lo0, hi0, buf)
        return TransformerXLState(DistanceBucket(lo, hi), buf[..., lo - lo0 : hi - lo0 + 1], None, None, None)

    def terms(self, q: Tensor, k: Tensor, state: "TransformerXLState", proj: QKProjection | None = None) -> list:
        """u·k_j and (q_i + v)·W_R R_(i-j), scaled, float32 or wider (see the module docstring)."""
        dt = torch.promote_types(q.dtype, torch.float32)
        scale = self.attention_scale(q.shape[-1])
        q, k = q.to(dt), k.to(dt)
        qv = q + self.v[:, None].to(dt)  # (B, H, Tq, D)
        # vecdot, not k @ u[:, :, None]: a batched matrix-vector product is several times slower on CPU.
        uk = torch.linalg.vecdot(k, (self.u.to(dt) * scale)[:, None])[..., None]  # (B, H, Tk, 1): u·k_j, a one-row key-side table
        u_term = TableTerm(uk, "key", DistanceBucket(0, 0))
        if state.bucket is None:
            return [DenseTerm(self._angle_logits(qv, state, scale)), u_term]
        r = state.keys.to(dt)  # (H, D, R)
        if qv.numel() < r.numel():  # the scale on the smaller factor (the query in decoding)
            qv = qv * scale
        else:
            r = r * scale
        return [TableTerm.product(qv, r, "query", state.bucket), u_term]  # table (B, H, Tq, R)

    def _angle_logits(self, qv: Tensor, state: "TransformerXLState", scale: float) -> Tensor:
        """(q_i + v)·W_R R_(i-j) for any positions, by the angle-difference identities.

        With a = q_pos_i w, b = k_pos_j w, sin(a - b) = sin a cos b - cos a sin b and
        cos(a - b) = cos a cos b + sin a sin b, so the term is a product of a (Tq, C) query
        factor and a (C, Tk) key factor: O(Tq·Tk·C) per head, C/D times the cost of q·k^T,
        with shapes that do not depend on the positions' values (torch.compile). (B, H, Tq, Tk).
        """
        C, H, D = self.dims.d_model, self.dims.num_heads, self.dims.head_dim
        w = (self.r_net.weight.to(qv.dtype) * scale).view(H, D, C)  # (H, D, C): W_R per head, scaled
        alpha, beta = (qv @ w).chunk(2, dim=-1)  # (B, H, Tq, C/2) each: weights of sin(dw), cos(dw)
        sa, ca = state.sin_q.to(qv.dtype), state.cos_q.to(qv.dtype)  # (B, 1, Tq, C/2)
        kf = state.key_factor.to(qv.dtype)  # (B|1, 1, Tk, C)
        qf = torch.cat([alpha * sa + beta * ca, beta * sa - alpha * ca], dim=-1)  # (B, H, Tq, C)
        # The heads as rows of one product: matmul would copy kf once per head to broadcast it.
        out = qf.flatten(1, 2) @ kf[:, 0].transpose(-1, -2)  # (B, H·Tq, C) @ (B|1, C, Tk)
        return out.view(qf.shape[:3] + out.shape[-1:])  # (B, H, Tq, Tk)


@dataclass
class TransformerXLState:
    """Per-forward position factors of one of the two forms (``prepare`` picks it).

    Table form: ``bucket`` (row r is distance lo + r) and ``keys`` = W_R R_d (H, D, R) for
    those distances, unscaled, in W_R's dtype. Angle form (``bucket`` None): ``sin_q``/``cos_q``
    (B, 1, Tq, C/2) of the query angles and ``key_factor`` [cos | sin] (B|1, 1, Tk, C) of the
    key angles, computed in float64 and stored in float32 (float64 in a float64 model).
    """

    bucket: DistanceBucket | None
    keys: Tensor | None
    sin_q: Tensor | None
    cos_q: Tensor | None
    key_factor: Tensor | None
