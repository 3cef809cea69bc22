"""BERT's relative_key / relative_key_query (Huang et al. 2020, "Improve Transformer Models
with Better Relative Position Embeddings", method 4; HF ``position_embedding_type``).

One learned table a (2k + 1, D), shared by all heads, indexed by the clipped distance
d = clip(q_pos_i - k_pos_j, -k, k) (query minus key, as HF BERT's ``position_ids_l -
position_ids_r``):

    relative_key:        logit_ij = (q_i·k_j + q_i·a_d) / sqrt(D)
    relative_key_query:  logit_ij = (q_i·k_j + q_i·a_d + k_j·a_d) / sqrt(D)

Both relative terms take the same 1/sqrt(D) as q·k (HF multiplies them by ``self.scaling``).
HF's table has 2P - 1 rows for ``max_position_embeddings`` P and reads row d + P - 1; with
``max_distance = P - 1`` the layouts are identical, so an HF ``distance_embedding.weight``
loads as ``weight``. HF never clips (its distances stay below P); here distances beyond k
share the boundary rows.

``prepare`` builds the distance layout and gathers the table's rows once per forward, shared
by every layer that uses the module.
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

__all__ = ["RelativeKeyConfig", "RelativeKey", "RelativeKeyQuery", "RelativeKeyState"]


@dataclass
class RelativeKeyState:
    """Per-forward state: the layout, the query-side rows (W, D) and, for relative_key_query,
    the key-side rows (W, D) (unscaled, in the table's dtype)."""

    layout: RelativeLayout
    rows: Tensor
    key_rows: Tensor | None


@dataclass
class RelativeKeyConfig(EncodingConfig):
    """Bounds: ``max_distance`` in [1, 2^23 - 1] (a table of 2k + 1 <= 2^24 rows, at most 2^30
    numbers with head_dim), ``init_std`` in (0, 1e4]."""

    max_distance: int = 128  # k: distances clipped to [-k, k]; table of 2k + 1 rows
    init_std: float = 0.02

    def validate(self) -> None:
        check_int("max_distance", self.max_distance, minimum=1, maximum=(MAX_TABLE_ROWS - 1) // 2)
        check_range("init_std", self.init_std, 0.0, MAX_INIT_STD, low_inclusive=False)


class _RelativeKeyBase(PositionalEncoding):
    Config = RelativeKeyConfig
    key_term = False  # relative_key_query adds k_j·a_d

    def __init__(self, config: RelativeKeyConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        k = config.max_distance
        check_table_size("max_distance", k, dims.head_dim, "head_dim", rows_per=2, extra_rows=1)
        self.weight = nn.Parameter(torch.randn(2 * config.max_distance + 1, dims.head_dim) * config.init_std)

    def _clip(self, d: Tensor) -> Tensor:
        k = self.config.max_distance
        return d.clamp(-k, k)

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> RelativeKeyState:
        kmax = self.config.max_distance
        lay = RelativeLayout.build(q_pos, k_pos, self._clip, (-kmax, kmax))
        key_rows = self.weight[lay.key_distances() + kmax] if self.key_term else None  # (W, D)
        return RelativeKeyState(lay, self.weight[lay.distances + kmax], key_rows)

    def score(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float, layer: nn.Module | None = None,
        state: Any = None,
    ) -> Tensor:
        state = self.prepare(q_pos, k_pos) if state is None else state
        lay = state.layout
        # The scale goes on the (W, D) rows, not on the (B, H, Tq, Tk) result.
        rows = (state.rows * scale).to(q.dtype)  # (W, D)
        out = lay.query_pairs(q, rows.T)  # (B, H, Tq, Tk)
        if state.key_rows is not None:
            rows_k = (state.key_rows * scale).to(k.dtype)  # (W, D)
            lay.key_pairs(k, rows_k.T, out=out)  # added in place: no second (B, H, Tq, Tk) buffer
        return out


@register(
    "relative_key",
    family="relative",
    summary="q·a(i-j): a learned clipped distance table shared by heads, added to the logits (BERT)",
    paper="Huang et al. 2020, Improve Transformer Models with Better Relative Position Embeddings",
)
class RelativeKey(_RelativeKeyBase):
    """``logit_ij += q_i·a_clip(i-j) / sqrt(D)`` (HF BERT ``relative_key``)."""


@register(
    "relative_key_query",
    family="relative",
    summary="q·a(i-j) + k·a(i-j): one clipped distance table seen by queries and keys (BERT)",
    paper="Huang et al. 2020, Improve Transformer Models with Better Relative Position Embeddings (method 4)",
)
class RelativeKeyQuery(_RelativeKeyBase):
    """``logit_ij += (q_i + k_j)·a_clip(i-j) / sqrt(D)`` (HF BERT ``relative_key_query``)."""

    key_term = True
