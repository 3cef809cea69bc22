"""BERT's relative_key / relative_key_query (Huang et al. 2020, "Improve Transformer Models
with Better Relative Position Embeddings", method 4; HF ``position_embedding_type``).

One learned table a (2k + 1, D), shared by all heads, indexed by the clipped distance
d = clip(q_pos_i - k_pos_j, -k, k) (query minus key, as HF BERT's ``position_ids_l -
position_ids_r``):

    relative_key:        logit_ij = (q_i·k_j + q_i·a_d) / sqrt(D)
    relative_key_query:  logit_ij = (q_i·k_j + q_i·a_d + k_j·a_d) / sqrt(D)

Both relative terms take the same 1/sqrt(D) as q·k (HF multiplies them by ``self.scaling``).
HF's table has 2P - 1 rows for ``max_position_embeddings`` P and reads row d + P - 1; with
``clip = P - 1`` the layouts are identical, so an HF ``distance_embedding.weight``
loads as ``weight``. HF never clips (its distances stay below P); here distances beyond k
share the boundary rows.

The ``terms`` hook returns q·aᵀ as a query-side :class:`~posenc.terms.TableTerm` (B, H, Tq,
2k + 1) and, for relative_key_query, k·aᵀ as a key-side one (B, H, Tk, 2k + 1): O(T·k), read
by bucket d + k by the attention backend (fused kernel, FlexAttention ``score_mod`` or the
dense reference). No (T, T) tensor. Both are given by their factors
(:meth:`~posenc.terms.TableTerm.product`): in a decoding step the key side gathers one row
per cached key within the clip instead of multiplying every key by all 2k + 1 rows, and keys
beyond it read the clip's row together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..limits import MAX_INIT_STD, MAX_TABLE_ROWS, check_table_size
from ..config import EncodingConfig, check_int, check_range
from ..encoding import Dims, PositionalEncoding, QKProjection
from ..literature import LEARNED, NOT_A_FEATURE_MAP, NO_ABSOLUTE, RELATIVE_BY_CONSTRUCTION, UNTRAINED
from ..registry import register
from ..terms import TableTerm
from .distance import DistanceBucket

__all__ = ["RelativeKeyConfig", "RelativeKey", "RelativeKeyQuery", "RelativeKeyState"]


@dataclass
class RelativeKeyState:
    """Per-forward state: the bucket of a pair (row r of the table: distance r - k)."""

    bucket: DistanceBucket


@dataclass
class RelativeKeyConfig(EncodingConfig):
    """Bounds: ``clip`` in [1, 2^23 - 1] (a table of 2k + 1 <= 2^24 rows, at most 2^30
    numbers with head_dim), ``init_std`` in (0, 1e4]."""

    clip: int = 128  # k: distances clipped to [-k, k]; table of 2k + 1 rows
    init_std: float = 0.02

    def validate(self) -> None:
        check_int("clip", self.clip, minimum=1, maximum=(MAX_TABLE_ROWS - 1) // 2)
        check_range("init_std", self.init_std, 0.0, MAX_INIT_STD, low_inclusive=False)


class _RelativeKeyBase(PositionalEncoding):
    Config = RelativeKeyConfig
    key_term = False  # relative_key_query adds k_j·a_d

    def __init__(self, config: RelativeKeyConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        k = config.clip
        check_table_size("clip", k, dims.head_dim, "head_dim", rows_per=2, extra_rows=1)
        self.weight = nn.Parameter(torch.randn(2 * k + 1, dims.head_dim) * config.init_std)  # row d + k

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> RelativeKeyState:
        return RelativeKeyState(DistanceBucket(-self.config.clip, self.config.clip))

    def terms(self, q: Tensor, k: Tensor, state: RelativeKeyState, proj: QKProjection | None = None) -> list[TableTerm]:
        """q·aᵀ (B, H, Tq, 2k + 1) and, with the key term, k·aᵀ (B, H, Tk, 2k + 1), scaled, float32 or wider."""
        dt = torch.promote_types(q.dtype, torch.float32)
        rows = (self.weight.to(dt) * self.attention_scale(q.shape[-1])).T  # (D, R): the scale on R rows, not T·R
        out = [TableTerm.product(q.to(dt), rows, "query", state.bucket)]  # table (B, H, Tq, R)
        if self.key_term:
            out.append(TableTerm.product(k.to(dt), rows, "key", state.bucket))  # table (B, H, Tk, R)
        return out


# The same claims for both variants: Huang et al. 2020 define both.
_HUANG_CLAIMS = {
    "absolute": (False, NO_ABSOLUTE),
    "relative": (True, "Huang et al. 2020: " + RELATIVE_BY_CONSTRUCTION),
    "bounded": (True, "distances clipped (Huang et al. 2020)"),
    "decay": (UNTRAINED, LEARNED),
    "extrapolation": (True, "clipping makes every distance valid"),
    "linear_attention": (False, NOT_A_FEATURE_MAP),
}


@register(
    "relative_key",
    family="relative",
    summary="q·a(i-j): a learned clipped distance table shared by heads, added to the logits (BERT)",
    paper="Huang et al. 2020, Improve Transformer Models with Better Relative Position Embeddings",
    claims=_HUANG_CLAIMS,
)
class RelativeKey(_RelativeKeyBase):
    """``logit_ij += q_i·a_clip(i-j) / sqrt(D)`` (HF BERT ``relative_key``)."""


@register(
    "relative_key_query",
    family="relative",
    summary="q·a(i-j) + k·a(i-j): one clipped distance table seen by queries and keys (BERT)",
    paper="Huang et al. 2020, Improve Transformer Models with Better Relative Position Embeddings (method 4)",
    claims=_HUANG_CLAIMS,
)
class RelativeKeyQuery(_RelativeKeyBase):
    """``logit_ij += (q_i + k_j)·a_clip(i-j) / sqrt(D)`` (HF BERT ``relative_key_query``)."""

    key_term = True
