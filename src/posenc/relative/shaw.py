"""Shaw et al. 2018, "Self-Attention with Relative Position Representations".

Two learned tables w^K, w^V of 2k + 1 rows (D wide, shared by all heads) give the edge
vectors a^K_ij = w^K[clip(j - i, k)] and a^V_ij = w^V[clip(j - i, k)] (the paper's index is
key minus query: j - i = k_pos_j - q_pos_i). Then

    e_ij = q_i·(k_j + a^K_ij) / sqrt(D)              (the ``score`` hook: q_i·a^K_ij / sqrt(D))
    z_i  = sum_j alpha_ij (v_j + a^V_ij)             (the ``output`` hook: sum_j alpha_ij a^V_ij)

Either part can be switched off (``use_key``, ``use_value``); the flags follow the config, so
a key-only Shaw has no value term and can take any backend.

The ``terms`` hook returns both parts as :mod:`posenc.terms` objects over the 2k + 1 clipped
distances: a^K as a query-side :class:`~posenc.terms.TableTerm` (q_i·w^K_r for every row r:
a (B, H, Tq, 2k + 1) table, O(T·k), read by bucket), a^V as a :class:`~posenc.terms.ValueTerm`
(w^V itself: the backend sums each query's probabilities per row and multiplies). No (T, T)
tensor of edge vectors is built. The value term needs the probabilities, so FlexAttention
(which returns only the output) cannot run Shaw with ``use_value``; the fused SDPA-backend
kernel (:mod:`posenc.backends.fused`) can.

``prepare`` puts both tables in bucket order once per forward; every layer sharing the module
reuses them.
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
from ..terms import TableTerm, ValueTerm
from .distance import DistanceBucket

__all__ = ["ShawConfig", "ShawRelative", "ShawState"]


@dataclass
class ShawState:
    """Per-forward state: the bucket of a pair (its row r holds distance q_pos - k_pos =
    r - k) and each table's rows in that order, (2k + 1, D) (None for a term that is off)."""

    bucket: DistanceBucket
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
    claims={
        "absolute": (False, NO_ABSOLUTE),
        "relative": (True, "Shaw et al. 2018: " + RELATIVE_BY_CONSTRUCTION),
        "bounded": (True, "distances clipped to [-k, k] (Shaw et al. 2018)"),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, "clipping makes every distance valid (Shaw et al. 2018)"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
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
    def has_terms(self) -> bool:
        return self.config.use_key

    @property
    def has_value_terms(self) -> bool:
        return self.config.use_value

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> ShawState:
        k = self.config.clip
        # Bucket r is distance q_pos - k_pos = r - k; the paper's index is j - i = k - r, i.e.
        # table row 2k - r: the rows in bucket order are the table flipped.
        flip = lambda t: None if t is None else t.flip(0)  # noqa: E731
        return ShawState(DistanceBucket(-k, k), flip(self.key_table), flip(self.value_table))

    def terms(self, q: Tensor, k: Tensor, state: ShawState, proj: QKProjection | None = None) -> list[TableTerm | ValueTerm]:
        """a^K: q_i·w^K_r scaled, (B, H, Tq, 2k + 1) in float32 or wider; a^V: w^V (1, 2k + 1, D).

        ``q`` may be None when only the value term is wanted (the base class's ``output``).
        """
        out: list[TableTerm | ValueTerm] = []
        if state.key_rows is not None and q is not None:
            dt = torch.promote_types(q.dtype, torch.float32)
            rows = (state.key_rows.to(dt) * self.attention_scale(q.shape[-1])).T  # (D, R): scaled here, not on T·R
            out.append(TableTerm.product(q.to(dt), rows, "query", state.bucket))  # table (B, H, Tq, R)
        if state.value_rows is not None:
            out.append(ValueTerm(state.value_rows[None], state.bucket))  # (1, R, D)
        return out
