"""DeBERTa's disentangled attention (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with
Disentangled Attention"; the v2/v3 code).

One table P of 2·span relative embeddings (C wide; span = ``position_buckets`` if > 0 else
``max_relative_positions``), layer-normed, is projected to position keys K^r = P W_{k,r} and
position queries Q^r = P W_{q,r}. With the row of a pair

    delta(i, j) = clamp(bucket(q_pos_i - k_pos_j), -span, span - 1) + span

the logits are

    A_ij = [ q_i·k_j  +  q_i·K^r_delta(i,j)  (c2p)  +  k_j·Q^r_delta(i,j)  (p2c) ] / sqrt(D (1 + n))

with n the number of position terms on (1 or 2): the ``attention_scale`` hook.

Index convention, read from the v2 code (HF ``DisentangledSelfAttention``): c2p gathers
``clamp(rel + span)`` with rel = query - key; p2c gathers ``clamp(-r_pos + span)`` in the
key-major (key j, query i) frame where r_pos = j - i, so both terms read the row of
query - key. (The paper writes delta(j, i) for p2c; the code, which the checkpoints were
trained with, is what is implemented.) For cross-attention with Tq != Tk, HF recomputes
p2c's positions over the keys (and swaps bucket_size/max_position in that call); here both
terms use the actual q_pos - k_pos.

``bucket`` is DeBERTa-v2's :func:`log_bucket_position` (exact up to |d| <= bucket_size // 2,
logarithmic beyond, reaching bucket_size // 2 + (mid - 1) at max_position).

``share_att_key``: as in DeBERTa-v2, K^r and Q^r come from the calling layer's own
``k_proj`` and ``q_proj`` (the ``layer`` argument of the ``score`` hook), so each layer
projects the shared table with its own weights and the encoding owns only P (and its
LayerNorm). Without it, the encoding owns ``pos_key_proj``/``pos_query_proj``; because a
shared posenc encoding serves every layer, those are then shared across layers (DeBERTa has
one pair per layer: build the model with ``share_encoding=False`` for that, which also gives
each layer its own P).

``prepare`` (once per forward, or once per decoding step) builds the layout, gathers and
layer-normalizes the rows of P that the step's distances use and, with the encoding's own
projections, projects them: every layer sharing the module reuses the result. With
``share_att_key`` only the projection is per layer (it uses the layer's own weights).
``layer_norm_eps`` is DeBERTa-v2's ``layer_norm_eps`` (1e-7 by default there and here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..limits import MAX_INIT_STD, MAX_TABLE_ROWS, check_table_size
from ..config import EncodingConfig, check_int, check_range
from ..encoding import Dims, PositionalEncoding
from ..registry import register
from .distance import RelativeLayout, saturation_bounds

__all__ = ["DebertaConfig", "DebertaRelative", "DebertaState", "log_bucket_position"]

MAX_SPAN = MAX_TABLE_ROWS // 2  # P has 2 * span rows


def _check_buckets(bucket_size: int, max_position: int, names: tuple[str, str]) -> None:
    check_int(names[0], bucket_size, minimum=2)
    check_int(names[1], max_position, minimum=1)
    if bucket_size > max_position:
        raise ValueError(f"{names[0]} must be <= {names[1]} ({max_position}), got {bucket_size}")
    if bucket_size // 2 >= max_position - 1:
        raise ValueError(
            f"{names[0]} // 2 must be < {names[1]} - 1 ({max_position - 1}) for the log scale, got {bucket_size}"
        )


def log_bucket_position(relative_pos: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """DeBERTa-v2's logarithmic relative-position buckets (``make_log_bucket_position``).

    With mid = bucket_size // 2: |d| <= mid is kept as is; beyond,
    ``sign(d) * (mid + ceil(log(|d| / mid) / log((max_position - 1) / mid) * (mid - 1)))``,
    so |d| = max_position - 1 maps to bucket_size - 1 and larger distances keep growing
    (callers clamp). Computed in float32 in the reference's order of operations, so the
    ceil lands on the same bucket at boundaries. Returns int64, same shape.
    """
    _check_buckets(bucket_size, max_position, ("bucket_size", "max_position"))
    rel = relative_pos.long()
    sign = torch.sign(rel)
    mid = bucket_size // 2
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.full_like(rel, mid - 1), rel.abs())
    denom = torch.log(torch.tensor((max_position - 1) / mid, dtype=torch.float32, device=rel.device))
    log_pos = torch.ceil(torch.log(abs_pos.float() / mid) / denom * (mid - 1)) + mid  # float32
    return torch.where(abs_pos <= mid, rel, (log_pos * sign).long())


@dataclass
class DebertaConfig(EncodingConfig):
    """Bounds: ``max_relative_positions`` in [1, 2^23] and ``position_buckets`` in [0, 2^23]
    (P has 2 * span <= 2^24 rows, and at most 2^30 numbers with d_model); ``init_std`` in
    (0, 1e4]; ``layer_norm_eps`` in (0, 1]."""

    c2p: bool = True  # content-to-position: q_i·K^r
    p2c: bool = True  # position-to-content: k_j·Q^r
    max_relative_positions: int = 512  # clip span without buckets; the log scale's max_position with them
    position_buckets: int = 256  # 0: no buckets (v1 style, span = max_relative_positions)
    share_att_key: bool = False  # project P with the layer's own q_proj/k_proj (v2/v3 checkpoints)
    layer_norm: bool = True  # v2's norm_rel_ebd="layer_norm"
    init_std: float = 0.02
    layer_norm_eps: float = 1e-7  # DeBERTa-v2's layer_norm_eps (its LayerNorm of P)

    def validate(self) -> None:
        if not (self.c2p or self.p2c):
            raise ValueError("at least one of c2p, p2c must be True, got both False")
        check_int("max_relative_positions", self.max_relative_positions, minimum=1, maximum=MAX_SPAN)
        check_int("position_buckets", self.position_buckets, minimum=0, maximum=MAX_SPAN)
        if self.position_buckets:
            _check_buckets(self.position_buckets, self.max_relative_positions, ("position_buckets", "max_relative_positions"))
        check_range("init_std", self.init_std, 0.0, MAX_INIT_STD, low_inclusive=False)
        check_range("layer_norm_eps", self.layer_norm_eps, 0.0, 1.0, low_inclusive=False)

    @property
    def span(self) -> int:
        return self.position_buckets or self.max_relative_positions

    @property
    def num_position_terms(self) -> int:
        return int(self.c2p) + int(self.p2c)


@register(
    "deberta",
    family="relative",
    summary="disentangled attention: content-to-position and position-to-content terms, log buckets",
    paper="He et al. 2021, DeBERTa: Decoding-enhanced BERT with Disentangled Attention",
)
class DebertaRelative(PositionalEncoding):
    Config = DebertaConfig

    def __init__(self, config: DebertaConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        C, HD = dims.d_model, dims.num_heads * dims.head_dim
        field = "position_buckets" if config.position_buckets else "max_relative_positions"
        check_table_size(field, config.span, C, "d_model", rows_per=2)
        self.rel_embeddings = nn.Parameter(torch.randn(2 * config.span, C) * config.init_std)
        self.norm = nn.LayerNorm(C, eps=config.layer_norm_eps) if config.layer_norm else None
        own = not config.share_att_key
        self.pos_key_proj = nn.Linear(C, HD) if own and config.c2p else None
        self.pos_query_proj = nn.Linear(C, HD) if own and config.p2c else None
        # Distances beyond which the clamped buckets are constant: the table's static range.
        self.bounds = saturation_bounds(self._canon, config.span - 1, -config.span)

    def _canon(self, d: Tensor) -> Tensor:
        c = self.config
        if c.position_buckets:
            d = log_bucket_position(d, c.position_buckets, c.max_relative_positions)
        return d.clamp(-c.span, c.span - 1)

    def attention_scale(self, head_dim: int) -> float:
        return 1.0 / math.sqrt(head_dim * (1 + self.config.num_position_terms))

    def _proj(self, which: str, layer: nn.Module | None) -> nn.Linear:
        """The projection of P to position keys ("k") or queries ("q")."""
        if self.config.share_att_key:
            proj = getattr(layer, f"{which}_proj", None)
            if proj is None:
                raise ValueError(f"share_att_key needs the calling attention layer (with {which}_proj) as `layer`")
            return proj
        return self.pos_key_proj if which == "k" else self.pos_query_proj

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> "DebertaState":
        lay = RelativeLayout.build(q_pos, k_pos, self._canon, self.bounds)
        d, span = lay.distances, self.config.span  # (W,) canonical distances, with repeats
        index = None
        if torch.compiler.is_compiling() or d.numel() == 0:
            p = self.rel_embeddings.index_select(0, d + span)  # (W, C)
        else:
            # The W distances of a layout repeat buckets (a decoding step at context 256 reads
            # ~140 distinct rows through 257 columns): normalize and project the contiguous row
            # range once, then spread it to the columns.
            lo, hi = int(d.min()), int(d.max())
            p, index = self.rel_embeddings[lo + span : hi + span + 1], d - lo  # (R, C), (W,)
        if self.norm is not None:
            p = self.norm(p)  # row-wise: the same as normalizing the whole table, then indexing
        state = DebertaState(lay, p, index, None, None)
        if not self.config.share_att_key:  # the encoding's own projections: shared by layers too
            state.keys = self._project_rows(p, self.pos_key_proj, index) if self.config.c2p else None
            state.queries = self._project_rows(p, self.pos_query_proj, index) if self.config.p2c else None
        return state

    def _project_rows(self, p: Tensor, proj: nn.Linear, index: Tensor | None = None) -> Tensor:
        """Normalized rows p (R, C) -> projected (H, D, R), or (H, D, W) columns ``index`` (W,) of it."""
        r = proj(p.to(proj.weight.dtype))  # (R, Hp*D)
        H, D = self.dims.num_heads, self.dims.head_dim
        r = r.view(r.shape[0], -1, D).permute(1, 2, 0)  # (Hp, D, R)
        if r.shape[0] != H:  # grouped-query k_proj: Hkv heads, repeated as attention repeats k
            r = r.repeat_interleave(H // r.shape[0], dim=0)  # (H, D, R)
        # Contiguous (index_select copies): a permuted view would send every layer's batched
        # matmul with it down a strided path.
        return r.contiguous() if index is None else r.index_select(-1, index)

    def score(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float, layer: nn.Module | None = None,
        state: Any = None,
    ) -> Tensor:
        state = self.prepare(q_pos, k_pos) if state is None else state
        lay = state.layout
        out: Tensor | None = None
        if self.config.c2p:
            kr = state.keys
            if kr is None:
                kr = self._project_rows(state.rows, self._proj("k", layer), state.index)
            kr = (kr * scale).to(q.dtype)  # (H, D, W); scaled here, not on T^2
            out = lay.query_pairs(q, kr)  # (B, H, Tq, Tk)
        if self.config.p2c:
            qr = state.queries
            if qr is None:
                qr = self._project_rows(state.rows, self._proj("q", layer), state.index)
            qr = (lay.key_order(qr) * scale).to(k.dtype)  # (H, D, W), columns in key order
            out = lay.key_pairs(k, qr, out=out)  # added in place into c2p's output
        assert out is not None
        return out


@dataclass
class DebertaState:
    """Per-forward state: the layout; the layer-normalized rows of P it reads, (R, C), with
    ``index`` (W,) the row of each layout column (None: one row per column, R = W); and with
    the encoding's own projections the position keys and queries (H, D, W), unscaled, in
    distance order (None with ``share_att_key``: each layer projects ``rows`` itself)."""

    layout: RelativeLayout
    rows: Tensor
    index: Tensor | None
    keys: Tensor | None
    queries: Tensor | None
