"""What a training-free attention method is: a few RoPE rotations of the same q and k, and a rule
saying which rotation's logit each (query, key) pair takes.

Self-Extend, ReRoPE and Dual Chunk Attention all keep RoPE's q·k product but, for pairs whose
distance the model never saw in training, read the logit of other positions: Self-Extend the
grouped positions floor(p / G), ReRoPE a clamped distance, Dual Chunk Attention positions taken
modulo a chunk. Each is therefore described by

* ``rotations(q_pos, k_pos)``: R pairs (query positions (B, Tq), key positions (B, Tk)), float64,
  the positions q and k are rotated to for the r-th logit (positions may be fractional: leaky
  ReRoPE's slope, Self-Extend's shift W - W / G);
* ``select(q_pos, k_pos)``: for broadcasting (B, Tq, 1) and (B, 1, Tk) integer positions, the
  index r in [0, R) of the rotation whose logit the pair takes (an integer tensor, pointwise),
  nondecreasing in the query's position and nonincreasing in the key's: farther pairs take
  later rotations. The fused path (:mod:`posenc.methods.fused`) relies on this to read a tile
  of pairs off its two corners.

:func:`posenc.methods.blockwise.method_attention` computes the R logits of a block of queries,
merges them by ``select``, then takes one softmax. A method holds no state: positions arrive per
call.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch import Tensor

from ..config import check_fields

__all__ = ["AttentionMethod"]


@dataclasses.dataclass(frozen=True)
class AttentionMethod:
    """Base of every method: a frozen dataclass whose fields are its parameters, type-checked from
    their annotations (:func:`posenc.config.check_fields`), then range-checked by :meth:`validate`
    (a ``ValueError`` naming the parameter and its range)."""

    name: ClassVar[str] = ""
    #: its name in tables
    label: ClassVar[str] = ""
    #: the paper and the authors' code the formulas follow
    paper: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_fields(self, plain=True)
        self.validate()

    def validate(self) -> None:  # pragma: no cover - overridden
        """Check ranges; raise ``ValueError`` naming the parameter."""

    @property
    def num_rotations(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def rotations(self, q_pos: Tensor, k_pos: Tensor) -> tuple[tuple[Tensor, Tensor], ...]:  # pragma: no cover
        """R pairs (q positions (B, Tq), k positions (B, Tk)), float64, from int64 positions."""
        raise NotImplementedError

    def select(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:  # pragma: no cover
        """The rotation index of each pair (integer; monotone, see the module docstring);
        q_pos (B, Tq, 1), k_pos (B, 1, Tk) int64."""
        raise NotImplementedError

    @classmethod
    def recommended(cls, trained: int, target: int) -> dict[str, int | float]:  # pragma: no cover - overridden
        """The parameters the method's paper or authors' code recommends for a model trained on
        ``trained`` tokens serving ``target`` tokens (what ``bench --model`` and ``extend`` run)."""
        raise NotImplementedError

    @classmethod
    def grid(cls, trained: int, target: int) -> tuple[dict[str, int | float], ...]:
        """A small grid of parameter sets around :meth:`recommended` (which comes first), from the
        neighbours the method's paper or code varies (what ``extend --method-grid small`` runs);
        each set valid, none repeated. The base: the recommended set alone."""
        return (cls.recommended(trained, target),)

    @classmethod
    def _distinct(cls, sets: list[dict[str, int | float]]) -> tuple[dict[str, int | float], ...]:
        """``sets`` in order, repeats dropped, each validated by building the method."""
        out: list[dict[str, int | float]] = []
        for params in sets:
            if params not in out:
                cls(**params)  # a ValueError naming the parameter if a rule made an invalid set
                out.append(params)
        return tuple(out)

    def params(self) -> dict[str, object]:
        """The parameters, by name (what ``patch_model(..., method=name, **params)`` takes)."""
        return dataclasses.asdict(self)
