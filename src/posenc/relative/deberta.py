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

``share_att_key``: as in DeBERTa-v2, K^r and Q^r come from the calling layer's own query and
key projections (the ``proj`` argument of the ``terms`` hook, a
:class:`~posenc.encoding.QKProjection`), so each layer projects the shared table with its own
weights and the encoding owns only P (and its LayerNorm). Without it, the encoding owns
``pos_key_proj``/``pos_query_proj``; because a shared posenc encoding serves every layer,
those are then shared across layers (DeBERTa has one pair per layer: build the model with
``share_encoding=False`` for that, which also gives each layer its own P).

The ``terms`` hook returns c2p as a query-side :class:`~posenc.terms.TableTerm` q·K^rᵀ
(B, H, Tq, R) and p2c as a key-side one k·Q^rᵀ (B, H, Tk, R), R <= 2·span rows of P (the
rows the step's distances reach), read by bucket delta(i, j) (a :class:`LookupBucket`: the
log buckets are computed once, at construction, for the distances where they are not yet
saturated, not for every pair). No (T, T) tensor. Both are given by their factors
(:meth:`~posenc.terms.TableTerm.product`), so in a decoding step p2c gathers one row of
Q^r per cached key instead of computing k·Q^rᵀ for all R rows, and only for the
keys within the log buckets' saturation distance: the older keys all read the last row, one
matrix-vector product (:class:`~posenc.terms.SaturatingBucket`).

``prepare`` (once per forward, or once per decoding step) picks those rows of P and
layer-normalizes them and, with the encoding's own projections, projects them: every layer
sharing the module reuses the result. With ``share_att_key`` only the projection is per
layer (it uses the layer's own weights). With few queries (decoding) c2p skips projecting P
by ``pos_key_proj``: (q W_k)·P_r + q·b_k takes each query to P's width instead, H·Tq·C·(D + R)
per layer against R·C·H·D (:meth:`DebertaRelative._c2p_by_query`). ``layer_norm_eps`` is DeBERTa-v2's
``layer_norm_eps`` (1e-7 by default there and here). DeBERTa's ``max_relative_positions``
keeps its Hugging Face name (it is the clip span only without buckets, and the log scale's
``max_position`` with them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..limits import MAX_INIT_STD, MAX_TABLE_ROWS, check_table_size
from ..config import EncodingConfig, check_int, check_range
from ..encoding import Dims, PositionalEncoding, QKProjection
from ..literature import LEARNED, NOT_A_FEATURE_MAP, NO_ABSOLUTE, RELATIVE_BY_CONSTRUCTION, UNTRAINED
from ..registry import register
from ..terms import TableTerm
from .distance import LookupBucket, saturation_bounds

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
    claims={
        "absolute": (False, NO_ABSOLUTE + " (DeBERTa adds absolute positions in its decoder, not here)"),
        "relative": (True, "He et al. 2021: " + RELATIVE_BY_CONSTRUCTION),
        "bounded": (True, "log buckets up to max_relative_positions (He et al. 2021)"),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, "bucketing makes every distance valid"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
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
        # The row of P of each distance in [lo, hi]: a config constant, so computed here once,
        # not in every forward (a decoding step would recompute the log buckets for every token).
        lo, hi = self.bounds
        self.register_buffer("lut", self._canon(torch.arange(lo, hi + 1)) + config.span, persistent=False)  # (hi - lo + 1,)

    def _canon(self, d: Tensor) -> Tensor:
        c = self.config
        if c.position_buckets:
            d = log_bucket_position(d, c.position_buckets, c.max_relative_positions)
        return d.clamp(-c.span, c.span - 1)

    def attention_scale(self, head_dim: int) -> float:
        return 1.0 / math.sqrt(head_dim * (1 + self.config.num_position_terms))

    def _reached(self, q_pos: Tensor, k_pos: Tensor) -> tuple[int, int, LookupBucket]:
        """Rows [r0, r1] of P that the distances occurring reach, and the bucket into them."""
        lo, hi = self.bounds  # canon is constant for d <= lo and d >= hi
        lut = self.lut  # (hi - lo + 1,) rows of P
        r0, r1 = 0, 2 * self.config.span - 1
        if not torch.compiler.is_compiling() and q_pos.numel() and k_pos.numel():
            # Only the rows the distances that occur reach (canon is monotone): a decoding step
            # or a short sequence projects a few rows, not all 2·span.
            dlo = int(q_pos.min()) - int(k_pos.max())
            dhi = int(q_pos.max()) - int(k_pos.min())
            r0, r1 = (int(lut[min(max(d, lo), hi) - lo]) for d in (dlo, dhi))
        return r0, r1, LookupBucket((lut - r0).clamp(0, r1 - r0), lo, hi)

    def _rows(self, r0: int, r1: int) -> Tensor:
        """Rows [r0, r1] of P, layer-normalized: (R, C)."""
        p = self.rel_embeddings[r0 : r1 + 1]
        return p if self.norm is None else self.norm(p)  # row-wise: as normalizing P, then indexing

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> "DebertaState":
        r0, r1, bucket = self._reached(q_pos, k_pos)
        p = self._rows(r0, r1)  # (R, C)
        state = DebertaState(bucket, p, None, None)
        if not self.config.share_att_key:  # the encoding's own projections: shared by layers too
            if self.config.c2p and not self._c2p_by_query(q_pos.shape[1], p.shape[0]):
                state.keys = self._project(p, self.pos_key_proj)
            state.queries = self._project(p, self.pos_query_proj) if self.config.p2c else None
        return state

    def prepare_cached(self, q_pos: Tensor, k_pos: Tensor, memo: dict) -> "DebertaState":
        """Decoding: the encoding's own projections of all 2·span rows of P, made once per cache
        and kept in ``memo``; each step slices the rows it reaches (``prepare`` would project
        them again at every step)."""
        if self.config.share_att_key or torch.compiler.is_compiling() or q_pos.numel() == 0 or k_pos.numel() == 0:
            return self.prepare(q_pos, k_pos)  # share_att_key: each layer projects with its own weights
        if "projected" not in memo:
            p = self._rows(0, 2 * self.config.span - 1)  # (2·span, C)
            memo["projected"] = (
                self._project(p, self.pos_key_proj) if self.config.c2p else None,  # (H, D, 2·span)
                self._project(p, self.pos_query_proj) if self.config.p2c else None,
            )
        keys, queries = memo["projected"]
        r0, r1, bucket = self._reached(q_pos, k_pos)
        pick = lambda t: None if t is None else t[..., r0 : r1 + 1]  # noqa: E731
        return DebertaState(bucket, self._rows(r0, r1), pick(keys), pick(queries))

    def _c2p_by_query(self, tq: int, rows: int) -> bool:
        """c2p as (q W_k)·P_r + q·b_k (each layer takes its queries to P's width C) rather than
        q·K^r_r (P's R rows projected once, shared by the layers): H·Tq·C·(D + R) per layer
        against R·C·H·D per forward. Taken when cheaper even with 16 layers sharing the
        projection, i.e. in decoding, where the Tq = 1 query reaches all R rows."""
        return not torch.compiler.is_compiling() and 16 * tq * (self.dims.head_dim + rows) <= rows * self.dims.head_dim

    def _project(self, p: Tensor, proj: nn.Linear) -> Tensor:
        """Normalized rows p (R, C) -> projected (H, D, R) with the encoding's own projection,
        times the attention scale (once here, not in every layer that reads them)."""
        H, D = self.dims.num_heads, self.dims.head_dim
        rows = proj(p.to(proj.weight.dtype)).view(p.shape[0], H, D).permute(1, 2, 0)  # (H, D, R)
        return rows * self.attention_scale(D)

    def _c2p_table(self, q: Tensor, rows: Tensor) -> Tensor:
        """q·K^rᵀ unscaled without projecting P: with K^r_h = P W_hᵀ + b_h (W_h the head's
        (D, C) slice of ``pos_key_proj``), q_h·K^r_h,r = (q_h W_h)·P_r + q_h·b_h.
        q (B, H, Tq, D), rows P (R, C) -> (B, H, Tq, R) in q's dtype."""
        H, D = self.dims.num_heads, self.dims.head_dim
        w = self.pos_key_proj.weight.to(q.dtype).view(H, D, -1)  # (H, D, C)
        b = self.pos_key_proj.bias.to(q.dtype).view(H, D, 1)  # (H, D, 1)
        return (q @ w) @ rows.to(q.dtype).T + q @ b  # (B, H, Tq, C) @ (C, R) + (B, H, Tq, 1)

    def terms(self, q: Tensor, k: Tensor, state: "DebertaState", proj: QKProjection | None = None) -> list[TableTerm]:
        """c2p q·K^rᵀ (B, H, Tq, R) and p2c k·Q^rᵀ (B, H, Tk, R), scaled, float32 or wider."""
        if self.config.share_att_key and proj is None:
            raise ValueError("share_att_key needs the calling attention layer's projections: pass proj (a QKProjection)")
        dt = torch.promote_types(q.dtype, torch.float32)
        scale = self.attention_scale(q.shape[-1])
        out: list[TableTerm] = []
        if self.config.c2p and not self.config.share_att_key and state.keys is None:
            out.append(TableTerm(self._c2p_table(q.to(dt), state.rows) * scale, "query", state.bucket))  # (B, H, Tq, R)
        elif self.config.c2p:  # the encoding's K^r come scaled; the layer's own are scaled here
            kr = state.keys if state.keys is not None else proj.key(state.rows).transpose(-1, -2) * scale  # (H, D, R)
            out.append(TableTerm.product(q.to(dt), kr.to(dt), "query", state.bucket))  # table (B, H, Tq, R)
        if self.config.p2c:
            qr = state.queries if state.queries is not None else proj.query(state.rows).transpose(-1, -2) * scale  # (H, D, R)
            out.append(TableTerm.product(k.to(dt), qr.to(dt), "key", state.bucket))  # table (B, H, Tk, R)
        return out


@dataclass
class DebertaState:
    """Per-forward state: the bucket of a pair (a row of ``rows``), the layer-normalized rows
    of P it reads, (R, C), and with the encoding's own projections the position keys and
    queries (H, D, R), times the attention scale (None with ``share_att_key``: each layer
    projects ``rows``)."""

    bucket: LookupBucket
    rows: Tensor
    keys: Tensor | None
    queries: Tensor | None
