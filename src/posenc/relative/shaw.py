"""Shaw et al. 2018, "Self-Attention with Relative Position Representations".

Two learned tables w^K, w^V of 2k + 1 rows (D wide, shared by all heads) give the edge
vectors a^K_ij = w^K[clip(j - i, k)] and a^V_ij = w^V[clip(j - i, k)] (the paper's index is
key minus query: j - i = k_pos_j - q_pos_i). Then

    e_ij = q_i·(k_j + a^K_ij) / sqrt(D)              (the ``score`` hook: q_i·a^K_ij / sqrt(D))
    z_i  = sum_j alpha_ij (v_j + a^V_ij)             (the ``output`` hook: sum_j alpha_ij a^V_ij)

Either part can be switched off (``use_key``, ``use_value``); the capability then disappears
(``has_score``/``has_output`` follow the config), so a key-only Shaw keeps the SDPA path.
The value term sums the probabilities of each query per table row (an unskew per block of
queries, or a scatter-add, (B, H, Tq, 2k + 1)) and multiplies by w^V: no (T, T, D) tensor.

``prepare`` builds the distance layout and gathers both tables' rows once per forward; every
layer sharing the module and both hooks (``score`` and ``output``) reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..limits import MAX_INIT_STD, MAX_TABLE_ROWS, check_table_size
from ..config import EncodingConfig, check_int, check_range
from ..encoding import Dims, PositionalEncoding
from ..registry import register
from .distance import RelativeLayout

__all__ = ["ShawConfig", "ShawRelative", "ShawState"]


@dataclass
class ShawState:
    """Per-forward state: the layout of (q_pos, k_pos) and the rows (W, D) of each table it
    reads (unscaled, in the table's dtype; None for a term that is off)."""

    layout: RelativeLayout
    key_rows: Tensor | None
    value_rows: Tensor | None


@dataclass
class ShawConfig(EncodingConfig):
    """Bounds: ``clip`` in [1, 2^23 - 1] (tables of 2 clip + 1 <= 2^24 rows, at most 2^30
    numbers with head_dim), ``init_std`` in (0, 1e4]."""

    clip: int = 16  # k: distances clipped to [-k, k] (the paper uses k = 16 for translation)
    use_key: bool = True  # a^K on the keys (the logits)
    use_value: bool = True  # a^V on the values (the attention output)
    init_std: float = 0.02

    def validate(self) -> None:
        check_int("clip", self.clip, minimum=1, maximum=(MAX_TABLE_ROWS - 1) // 2)
        check_range("init_std", self.init_std, 0.0, MAX_INIT_STD, low_inclusive=False)
        if not (self.use_key or self.use_value):
            raise ValueError("at least one of use_key, use_value must be True, got both False")


@register(
    "shaw",
    family="relative",
    summary="learned clipped relative vectors added to keys (a^K) and values (a^V)",
    paper="Shaw et al. 2018, Self-Attention with Relative Position Representations",
)
class ShawRelative(PositionalEncoding):
    Config = ShawConfig

    def __init__(self, config: ShawConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        rows = 2 * config.clip + 1
        d = dims.head_dim
        check_table_size("clip", config.clip, d, "head_dim", rows_per=2, extra_rows=1)
        self.key_table = nn.Parameter(torch.randn(rows, d) * config.init_std) if config.use_key else None
        self.value_table = nn.Parameter(torch.randn(rows, d) * config.init_std) if config.use_value else None

    @property
    def has_score(self) -> bool:
        return self.config.use_key

    @property
    def has_output(self) -> bool:
        return self.config.use_value

    def _clip(self, d: Tensor) -> Tensor:
        k = self.config.clip
        return d.clamp(-k, k)

    def _layout(self, q_pos: Tensor, k_pos: Tensor) -> RelativeLayout:
        k = self.config.clip
        return RelativeLayout.build(q_pos, k_pos, self._clip, (-k, k))

    def _rows(self, table: Tensor | None, distances: Tensor) -> Tensor | None:
        # distances are q_pos - k_pos; the paper's index is j - i = -(q_pos - k_pos).
        return None if table is None else table[self.config.clip - distances]  # (R, D)

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> ShawState:
        lay = self._layout(q_pos, k_pos)
        return ShawState(lay, self._rows(self.key_table, lay.distances), self._rows(self.value_table, lay.distances))

    def score(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float, layer: nn.Module | None = None,
        state: Any = None,
    ) -> Tensor:
        if self.key_table is None:
            raise RuntimeError("shaw has no key term (use_key=False)")
        state = self.prepare(q_pos, k_pos) if state is None else state
        rows = (state.key_rows * scale).to(q.dtype)  # (W, D), scaled here: no T^2 copy
        return state.layout.query_pairs(q, rows.T)  # (B, H, Tq, Tk)

    def output(self, probs: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, state: Any = None) -> Tensor:
        if self.value_table is None:
            raise RuntimeError("shaw has no value term (use_value=False)")
        state = self.prepare(q_pos, k_pos) if state is None else state
        rows = state.value_rows.to(probs.dtype)  # (W, D)
        return state.layout.query_output(probs, rows)  # (B, H, Tq, D)
