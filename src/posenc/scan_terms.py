"""Logit terms computed by a scan over the keys between a key and its query
(:mod:`posenc.terms` describes the kinds and re-exports these):

* :class:`CountTerm` — CoPE's gain at a count of gated keys (gates sigmoid of the logits);
* stick terms (:class:`StickSums`): the log of what is left of a stick once the keys between
  key and query have each kept a fraction sigmoid(±y) of it, y the dot products of the term's
  gate vectors (:class:`StickRule` says which sign, power and diagonal):
  :class:`StickBreakingTerm` — stick-breaking's log weights, its gates the attention's own
  logits (keep 1 - sigmoid), whose layer takes exp(logits) instead of the softmax;
  :class:`StickTerm` — gates of vectors of their own (per_row_alibi's per-query forget gates);
* :class:`HouseholderTerm` — PaTH's logits through the product of the Householder-like
  matrices of the tokens between key and query (:mod:`posenc.householder`).

All have a dense form (the eager reference, and flex's ``score_mod`` reads it); the fused
function computes counts and sticks block by block (:mod:`posenc.backends.counting`,
:mod:`posenc.backends.stick_breaking`), from the block's own logits where they are the gates;
a Householder term alone under a plain causal mask has a leaf of its own
(:mod:`posenc.backends.householder_flash`).
The scans run over stream indices: the queries are the last Tq of the Tk keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .householder import CHUNK, path_logits

__all__ = ["CountTerm", "EXCLUDED", "HouseholderTerm", "StickBreakingTerm", "StickRule", "StickSums", "StickTerm", "contextual_positions",
           "interpolated_gain", "stick_log_left"]


def _dense_score_mod(logits: Tensor) -> Callable:
    """FlexAttention ``score_mod`` reading a dense (B|1, H, Tq, Tk) term."""
    from .terms import DenseTerm  # terms re-exports this module's kinds

    return DenseTerm(logits).score_mod(None, None)


def contextual_positions(gates: Tensor) -> Tensor:
    """CoPE's counts p_ij from gates g_it (B, H, Tq, Tk): the sum of g_it over the keys t from
    j to the query's stream index Tk - Tq + i (from that index to j for a key after it). Same
    shape. The sums run from the query outwards (a reversed cumulative sum), so the small
    counts near the query, the ones the embeddings tell apart, are summed first."""
    Tq, Tk = gates.shape[-2:]
    s = torch.arange(Tk - Tq, Tk, device=gates.device)[:, None]  # (Tq, 1): each query's stream index
    t = torch.arange(Tk, device=gates.device)  # (Tk,)
    before = torch.where(t <= s, gates, 0.0)  # keys up to the query
    after = torch.where(t >= s, gates, 0.0)  # keys from the query on
    back = before.flip(-1).cumsum(-1).flip(-1)  # sum over t in [j, Tk): the paper's reversed cumsum
    fwd = after.cumsum(-1)  # sum over t in [0, j]
    return torch.where(t <= s, back, fwd)


def interpolated_gain(per_position: Tensor, pos: Tensor) -> Tensor:
    """z = per_position[..., p] read at fractional positions ``pos`` (clamped counts, >= 0):
    ``(1 - w) * per_position[floor p] + w * per_position[ceil p]``, ``w = p - floor p``.
    per_position (B, H, rows, M), pos (B, H, rows, n) -> (B, H, rows, n). A NaN count (a
    diverged model) reads row 0 and, through w, gives a NaN gain."""
    lo, hi = pos.floor(), pos.ceil()
    w = pos - lo  # the gradient reaches the count through w
    z_lo = per_position.gather(-1, lo.nan_to_num(0.0).long())  # NaN.long() is int64's minimum
    z_hi = per_position.gather(-1, hi.nan_to_num(0.0).long())
    return z_hi * w + z_lo * (1 - w)


@dataclass(frozen=True, eq=False)
class CountTerm:
    """Contextual positions' logit gain (CoPE, Golovneva et al. 2024, eq. 3-5), in logit units:

        g_it = sigmoid(scale q_i·k_t)   p_ij = min(sum_{t=j}^{s_i} g_it, M - 1)   (s_i: i's stream index)
        logit_ij += q_i·e[p_ij], e interpolated between the integer positions around p_ij.

    ``q`` (B, H, Tq, D) and ``k`` (B, H, Tk, D) are the attention's own queries and keys (its
    scaled logits are the gates), ``emb`` (M, D) the integer positions' embeddings, ``scale``
    the attention's logit scale. A key after its query (bidirectional use) counts from the
    query to the key, the mirror image (:func:`contextual_positions`).

    ``dense`` builds (B, H, Tq, Tk) (the eager reference); ``score_mod`` reads that tensor.
    :func:`posenc.backends.fused.fused_attention` computes the term block by block of query
    rows from the attention's own logits, forward and backward, so no (Tq, Tk) tensor outlives
    a block; causal rows count only from the query back to where every count of the block has
    reached M - 1 (beyond it the gain is the constant q_i·e[M - 1]).
    """

    q: Tensor
    k: Tensor
    emb: Tensor
    scale: float

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors this term reads."""
        return (self.q, self.k, self.emb)

    @property
    def max_pos(self) -> int:
        return self.emb.shape[0]

    def positions(self) -> Tensor:
        """The clamped counts p_ij (B, H, Tq, Tk), float32 or wider."""
        dt = torch.promote_types(self.q.dtype, torch.float32)
        gates = torch.sigmoid((self.q.to(dt) @ self.k.to(dt).transpose(-1, -2)) * self.scale)
        return contextual_positions(gates).clamp(max=self.max_pos - 1)

    def dense(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B, H, Tq, Tk): q_i·e[p_ij], interpolated."""
        dt = torch.promote_types(self.q.dtype, torch.float32)
        per_position = self.q.to(dt) @ self.emb.to(dt).t()  # (B, H, Tq, M): q_i·e[p]
        return interpolated_gain(per_position, self.positions())

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> Callable:
        """FlexAttention ``score_mod`` reading the dense tensor (a count is a scan over keys,
        which a pointwise score_mod cannot compute)."""
        return _dense_score_mod(self.dense(q_pos, k_pos))


#: The term of a key that takes no part of the stick (the query's own key when stick-breaking
#: does not attend to it): the log weight the reference gives a hidden pair (``sb_ref.stickbreaking``:
#: ``log_z.masked_fill(mask, -1e5)``). Finite, so a row that sees no other key has weights
#: exp(logit - 1e5) = 0 on every path, where -inf would give NaN in a softmax or in a probe.
EXCLUDED = -1e5


@dataclass(frozen=True)
class StickRule:
    """How a stick term turns its gate logits y_it into log keeps and where it sums them:

        log_keep_it = power · log sigmoid(-y_it)   (``negate``: stick-breaking keeps 1 - sigmoid(y))
        log_keep_it = power · log sigmoid(y_it)    (otherwise: per_row_alibi's forget gates)

    summed by :func:`stick_log_left` from key j to the last token e_i that breaks query i's
    stick: the query itself with ``attend_current``, else the token before it; a key after the
    query mirrors it. Without ``attend_current`` the query's own key is :data:`EXCLUDED` when
    ``hide_current`` (stick-breaking: it takes no share), else 0, the empty sum (per_row_alibi's
    diagonal, attended with the whole stick).
    """

    negate: bool = True
    power: float = 1.0
    attend_current: bool = False
    hide_current: bool = True

    def __post_init__(self) -> None:
        if torch.compiler.is_compiling():  # checked in eager; dynamo cannot trace math.isfinite's bool
            return
        for name in ("negate", "attend_current", "hide_current"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"StickRule.{name} must be a bool, got {getattr(self, name)!r}")
        p = self.power
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p):
            raise ValueError(f"StickRule.power must be a finite float, got {p!r}")

    @classmethod
    def breaking(cls, attend_current: bool) -> "StickRule":
        """Stick-breaking's rule: keep 1 - sigmoid(y), the query's own key hidden unless attended."""
        return cls(negate=True, power=1.0, attend_current=attend_current, hide_current=True)

    def log_sigmoid(self, y: Tensor) -> Tensor:
        """logsigmoid(∓y), elementwise: the log keep at unit power."""
        return F.logsigmoid(-y if self.negate else y)

    def weighted(self, log_sigmoid: Tensor) -> Tensor:
        """The log keep: ``log_sigmoid`` times the power (not multiplied at the unit power, so
        stick-breaking stays bit for bit what it was)."""
        return log_sigmoid if self.power == 1.0 else log_sigmoid * self.power


def stick_log_left(log_keep: Tensor, attend_current: bool, hide_current: bool = True) -> Tensor:
    """Sums of ``log_keep`` (B, H, Tq, Tk), the log fraction of query i's stick each key keeps,
    over the keys that break the stick before key j takes its share, key j's own break
    included:

        key j at or before e_i:  sum_{t=j}^{e_i} log_keep_it      (e_i = s_i, or s_i - 1 when not
                                                                   ``attend_current``)
        key j after the query:   sum_{t=b_i}^{j} log_keep_it      (b_i = s_i, or s_i + 1)

    s_i is query i's stream index (the queries are the last Tq of the Tk keys); the query's own
    key, when not attended, gets :data:`EXCLUDED` (``hide_current``) or 0. Keys after the query
    (bidirectional use) break a second stick from the query forwards, the mirror image. Same
    shape. The sums run from the query outwards (a reversed cumulative sum), so the small sums
    near the query, the keys that take most of the stick, are summed first."""
    Tq, Tk = log_keep.shape[-2:]
    s = torch.arange(Tk - Tq, Tk, device=log_keep.device)[:, None]  # (Tq, 1): each query's stream index
    t = torch.arange(Tk, device=log_keep.device)  # (Tk,)
    before = t <= (s if attend_current else s - 1)  # (Tq, Tk): keys up to e_i
    after = t >= (s if attend_current else s + 1)  # keys from b_i on
    back = torch.where(before, log_keep, 0.0).flip(-1).cumsum(-1).flip(-1)  # sum over t in [j, Tk)
    fwd = torch.where(after, log_keep, 0.0).cumsum(-1)  # sum over t in [0, j]
    return torch.where(before, back, torch.where(t > s, fwd, EXCLUDED if hide_current else 0.0))


class StickSums:
    """A logit term that is the log of what is left of query i's stick when key j takes its
    share: the sum of log keeps (:class:`StickRule`) over the keys from j to the query
    (:func:`stick_log_left`), the gates y = gate_scale · gate_q_i · gate_k_t.

    A subclass gives ``gate_q`` (B, H, Tq, d), ``gate_k`` (B, H, Tk, d), ``gate_scale``,
    ``rule`` and ``normalized`` (False: the logits are log weights, the layer takes their exp).
    ``dense`` builds (B, H, Tq, Tk) (the eager reference; ``score_mod`` reads it);
    :func:`posenc.backends.fused.fused_attention` computes the sums block by block of query
    rows, forward and backward, from gates of the block's own (or, when the gates are the
    call's q, k and scale, from the block's logits), so no (Tq, Tk) tensor is kept
    (:mod:`posenc.backends.stick_breaking`).
    """

    gate_q: Tensor
    gate_k: Tensor
    gate_scale: float
    rule: StickRule
    normalized: bool = True

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors this term reads."""
        return (self.gate_q, self.gate_k)

    def gate_logits(self) -> Tensor:
        """y = gate_scale · gate_q·gate_kᵀ (B, H, Tq, Tk), float32 or wider."""
        dt = torch.promote_types(self.gate_q.dtype, torch.float32)
        return (self.gate_q.to(dt) @ self.gate_k.to(dt).transpose(-1, -2)) * self.gate_scale

    def dense(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B, H, Tq, Tk): the sums of the log keeps from key j to the query (:func:`stick_log_left`)."""
        r = self.rule
        return stick_log_left(r.weighted(r.log_sigmoid(self.gate_logits())), r.attend_current, r.hide_current)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> Callable:
        """FlexAttention ``score_mod`` reading the dense tensor (the sums are a scan over keys,
        which a pointwise score_mod cannot compute)."""
        return _dense_score_mod(self.dense(q_pos, k_pos))


@dataclass(frozen=True, eq=False)
class StickTerm(StickSums):
    """A stick term with gate vectors of its own (per_row_alibi: gate queries and keys of the
    layer input), added to the logits of a softmax:

        logit_ij += sum_{t=j}^{e_i} log_keep_it,   log_keep_it = power · log sigmoid(±gate_scale u_i·v_t)

    ``gate_q`` (B, H, Tq, d) and ``gate_k`` (B, H, Tk, d), float32 or wider, the queries the
    last Tq of the keys; ``rule`` the sign, power and diagonal (:class:`StickRule`).
    """

    gate_q: Tensor
    gate_k: Tensor
    gate_scale: float
    rule: StickRule


@dataclass(frozen=True, eq=False)
class StickBreakingTerm(StickSums):
    """Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention", ICLR 2025,
    arXiv:2410.17980; the reference ``stickbreaking_attention/sb_ref.py``) as a logit term. With
    z_ij = scale q_i·k_j and beta_ij = sigmoid(z_ij), query i's weight of key j is what is left
    of its stick once the keys between j and i have broken off their shares, times beta_ij:

        A_ij = beta_ij prod_{j<t<=e_i} (1 - beta_it),  log A_ij = z_ij + sum_{t=j}^{e_i} log(1 - beta_it)

    (log beta = z + log(1 - beta)), with e_i the query's own stream index when
    ``attend_current`` and the one before it otherwise (the reference's default: "for each
    token before the current"). So ``dense`` is the sum (:func:`stick_log_left`) and the
    logits are the log weights themselves: the layer's output is sum_j A_ij v_j = sum_j
    exp(logit_ij) v_j, not a softmax (:attr:`normalized` is False; the backends take
    exp(logits), or the softmax times exp(logsumexp), which is sum_j A_ij = 1 - prod_t
    (1 - beta_it) <= 1). The rest of the stick is dropped, as the reference kernels' output.

    ``q`` (B, H, Tq, D) and ``k`` (B, H, Tk, D) are the attention's own queries and keys (its
    scaled logits are the breaks), ``scale`` its logit scale: a :class:`StickSums` whose gates
    are q, k and scale and whose rule is :meth:`StickRule.breaking`. ``dense`` builds (B, H,
    Tq, Tk) (the eager reference; ``score_mod`` reads it);
    :func:`posenc.backends.fused.fused_attention` computes the term block by block of query
    rows from the block's own logits, forward and backward (:mod:`posenc.backends.stick_breaking`).
    """

    q: Tensor
    k: Tensor
    scale: float
    attend_current: bool = False

    #: The layer's weights are exp(logits): rows sum to at most 1, the stick's broken part.
    normalized = False

    @property
    def gate_q(self) -> Tensor:
        return self.q

    @property
    def gate_k(self) -> Tensor:
        return self.k

    @property
    def gate_scale(self) -> float:
        return self.scale

    @property
    def rule(self) -> StickRule:
        """Keep 1 - sigmoid(z): :meth:`StickRule.breaking`."""
        return StickRule.breaking(self.attend_current)

    def logits(self) -> Tensor:
        """z = scale q·kᵀ (B, H, Tq, Tk), float32 or wider."""
        return self.gate_logits()

    def weights(self) -> Tensor:
        """The stick-breaking weights A_ij (B, H, Tq, Tk), float32 or wider, unmasked."""
        z = self.logits()
        return torch.exp(z + stick_log_left(F.logsigmoid(-z), self.attend_current))


@dataclass(frozen=True, eq=False)
class HouseholderTerm:
    """PaTH's logits (:mod:`posenc.householder`) as a logit term: query i sees key j through the
    product of the Householder-like matrices H_t = I - β_t w_t w_tᵀ of the tokens after the key
    up to the query, so the layer's scaled logit is scale · q_iᵀ H_i ⋯ H_{j+1} k_j in place of
    scale · q_i·k_j (a key after its query: the mirror, H_{i+1} ⋯ H_j).

    ``q`` and ``k`` (B, H, T, D) are the attention's own queries and keys (float32 or wider),
    queries and keys of the same T tokens; ``w`` (B, H, T, D) unit vectors and ``beta``
    (B, H, T) in (0, 2) of every token; ``scale`` the attention's logit scale; ``chunk`` the
    tokens per chunk of the products. As every term it is additive: ``dense`` is the
    difference scale · (q_iᵀ P_ij k_j - q_i·k_j) (B, H, T, T), which a backend adds to its
    own scaled q·kᵀ (the eager reference, the fused function, flex's ``score_mod``).
    :func:`posenc.backends.householder_flash.householder_attention` computes the causal
    logits themselves, chunk by chunk with no (T, T) tensor, in place of the call's q·kᵀ.
    """

    q: Tensor
    k: Tensor
    w: Tensor
    beta: Tensor
    scale: float
    chunk: int = CHUNK

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors this term reads."""
        return (self.q, self.k, self.w, self.beta)

    def dense(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B, H, T, T): scale · (q_iᵀ P_ij k_j - q_i·k_j), both triangles."""
        return self.scale * (path_logits(self.q, self.k, self.w, self.beta, chunk=self.chunk) - self.q @ self.k.mT)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> Callable:
        """FlexAttention ``score_mod`` reading the dense tensor (the products are a scan over
        the tokens between key and query, which a pointwise score_mod cannot compute)."""
        return _dense_score_mod(self.dense(q_pos, k_pos))
