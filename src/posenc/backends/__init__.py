"""Attention backends: the shared types of every path, and the plan that picks the path of a call.

Every path computes ``softmax(q·kᵀ·scale + logit terms + mask)·v (+ value terms)`` from the
same inputs: q (B, H, Tq, D), k and v (B, H, Tk, D) (grouped-query heads already repeated),
the per-forward mask description (:class:`~posenc.masks.AttentionMask`) and the layer's terms
(:class:`LayerTerms`, built from :mod:`posenc.terms`); ``exp`` instead of ``softmax`` when a
term's logits are the log weights themselves (:attr:`LayerTerms.normalized`: stick-breaking).

``impl`` is what a user asks for (:data:`IMPLS`: ``eager``, ``sdpa``, ``flex``, ``auto``); the
leaf that runs is decided in one place, :func:`~posenc.backends.planner.plan`, whose docstring
holds the list of leaves with the measurement that keeps each one (the list lives there only).
:func:`run` is the plan followed by its leaf. The leaves are straight-line functions in
:mod:`.eager` (the reference every other path is tested against), :mod:`.sdpa`,
:mod:`.cpu_flash`, :mod:`.fused` and :mod:`.flex`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from ..masks import AttentionMask
from ..terms import BiasTerm, CountTerm, DenseTerm, HouseholderTerm, LogitsTerm, PrefixSumTerm, StickSums, TableTerm, Term, ValueTerm
from .cpu_flash import SummedBias

__all__ = ["IMPLS", "LEAVES", "Backend", "Impl", "LayerTerms", "Leaf", "Plan", "SharedBias", "logit_dtype", "plan", "run"]

Impl = Literal["eager", "sdpa", "flex", "auto"]
IMPLS: tuple[str, ...] = ("eager", "sdpa", "flex", "auto")


def logit_dtype(dtype: torch.dtype) -> torch.dtype:
    """Logits and score terms are accumulated in float32 for half types (softmax of bf16
    logits loses the small differences that carry position) and kept in float64 for float64
    inputs (a float64 model is a reference: rounding it to float32 costs 1e-7 relative)."""
    return torch.promote_types(dtype, torch.float32)


class SharedBias:
    """A :class:`~posenc.terms.BiasTerm` of one forward with its dense forms, computed on first
    use and shared by every layer that uses the encoding (the model's context owns it).

    ``dense()``: (B|1, H, Tq, Tk) float32 or wider; ``masked(dtype)``: that in ``dtype`` with
    -inf where the mask hides a key (SDPA's float ``attn_mask``).
    """

    def __init__(self, term: BiasTerm, mask: AttentionMask) -> None:
        self.term, self.mask = term, mask
        self.q_pos, self.k_pos = mask.q_seq.positions, mask.k_seq.positions
        self._dense: Tensor | None = None
        self._masked: dict[torch.dtype, Tensor] = {}
        self._summed: SummedBias | None = None

    def dense(self) -> Tensor:
        if self._dense is None:
            self._dense = self.term.dense(self.q_pos, self.k_pos)
        return self._dense

    def summed(self) -> SummedBias:
        """``dense()`` for the CPU flash calls of every layer, which sum their gradients in one
        buffer (per diagonal, for a bias that is Toeplitz at these positions; by the bias's own
        accumulator, for one that gives :meth:`~posenc.terms.BiasTerm.block_sums`)."""
        if self._summed is None:
            values = self.term.toeplitz_values(self.q_pos, self.k_pos) if torch.is_grad_enabled() else None
            blocks = self.term.block_sums(self.q_pos, self.k_pos) if torch.is_grad_enabled() and values is None else None
            if values is not None and values.requires_grad:
                self._summed = SummedBias.toeplitz(values, self.q_pos.shape[-1], self.k_pos.shape[-1])
            elif blocks is not None:  # the dense values without their graph; the gradient by blocks
                self._summed = SummedBias.blockwise(self.dense(), *blocks)
            else:
                self._summed = SummedBias(self.dense())
        return self._summed

    def masked(self, dtype: torch.dtype) -> Tensor:
        if dtype not in self._masked:
            bias, m = self.dense().to(dtype), self.mask.dense()
            self._masked[dtype] = bias if m is None else bias.masked_fill(~m, float("-inf"))
        return self._masked[dtype]


@dataclass(frozen=True, eq=False)
class LayerTerms:
    """What one layer adds to plain attention: a shared bias, logit terms, value terms."""

    q_pos: Tensor  # (B|1, Tq)
    k_pos: Tensor  # (B|1, Tk)
    bias: SharedBias | None = None
    logits: tuple[TableTerm | DenseTerm | LogitsTerm | PrefixSumTerm | CountTerm | StickSums | HouseholderTerm, ...] = ()
    values: tuple[ValueTerm, ...] = ()

    @classmethod
    def of(cls, q_pos: Tensor, k_pos: Tensor, bias: SharedBias | None, terms: list[Term]) -> "LayerTerms":
        """Sort an encoding's term list into logit and value terms (a BiasTerm is refused here:
        content-independent biases come once per forward as ``bias``)."""
        logits, values = [], []
        for t in terms:
            if isinstance(t, ValueTerm):
                values.append(t)
            elif isinstance(t, (TableTerm, DenseTerm, LogitsTerm, PrefixSumTerm, CountTerm, StickSums, HouseholderTerm)):
                logits.append(t)
            else:
                raise TypeError(
                    "terms() must return TableTerm, DenseTerm, LogitsTerm, PrefixSumTerm, CountTerm, StickBreakingTerm, "
                    f"StickTerm, HouseholderTerm or ValueTerm objects, got {type(t).__name__}"
                )
        return cls(q_pos, k_pos, bias, tuple(logits), tuple(values))

    @property
    def normalized(self) -> bool:
        """The weights are softmax(logits). False when a term's logits are the log weights
        themselves (:class:`~posenc.terms.StickBreakingTerm`): the weights are exp(logits),
        rows summing to at most 1, i.e. the softmax times exp(logsumexp(logits))."""
        return all(getattr(t, "normalized", True) for t in self.logits)

    @property
    def empty(self) -> bool:
        return self.bias is None and len(self.logits) == 0 and len(self.values) == 0

    def dense_logits(self) -> Tensor | None:
        """Bias plus logit terms, dense (B|1, H, Tq, Tk) float32 or wider; None without any."""
        total = None if self.bias is None else self.bias.dense()
        for t in self.logits:
            d = t.dense(self.q_pos, self.k_pos)
            total = d if total is None else total + d
        return total

    def tensors(self) -> list[Tensor]:
        """Every tensor the terms read (to ask whether autograd needs a backward)."""
        out = []
        for t in self.logits:
            out += [t.table] if isinstance(t, TableTerm) else [t.logits] if isinstance(t, DenseTerm) else list(t.tensors())
        out += [t.values for t in self.values]
        return out


class Backend(Protocol):
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor: ...


def needs_grad(q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms) -> bool:
    """Autograd records this call: some input (or term tensor) requires grad."""
    if not torch.is_grad_enabled():
        return False
    dense_bias = [] if terms.bias is None else [terms.bias.dense()]
    return any(t.requires_grad for t in (q, k, v, *terms.tensors(), *dense_bias))


# The leaves import the names above, so the plan comes last.
from .planner import LEAVES, Leaf, Plan, plan, run  # noqa: E402
