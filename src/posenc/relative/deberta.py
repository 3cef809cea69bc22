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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_int, check_positive
from ..encoding import Dims, PositionalEncoding
from ..registry import register
from .distance import RelativeLayout, saturation_bounds

__all__ = ["DebertaConfig", "DebertaRelative", "log_bucket_position"]


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
    c2p: bool = True  # content-to-position: q_i·K^r
    p2c: bool = True  # position-to-content: k_j·Q^r
    max_relative_positions: int = 512  # clip span without buckets; the log scale's max_position with them
    position_buckets: int = 256  # 0: no buckets (v1 style, span = max_relative_positions)
    share_att_key: bool = False  # project P with the layer's own q_proj/k_proj (v2/v3 checkpoints)
    layer_norm: bool = True  # v2's norm_rel_ebd="layer_norm"
    init_std: float = 0.02

    def validate(self) -> None:
        if not (self.c2p or self.p2c):
            raise ValueError("at least one of c2p, p2c must be True, got both False")
        check_int("max_relative_positions", self.max_relative_positions, minimum=1)
        check_int("position_buckets", self.position_buckets, minimum=0)
        if self.position_buckets:
            _check_buckets(self.position_buckets, self.max_relative_positions, ("position_buckets", "max_relative_positions"))
        check_positive("init_std", self.init_std)

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
        self.rel_embeddings = nn.Parameter(torch.randn(2 * config.span, C) * config.init_std)
        self.norm = nn.LayerNorm(C) if config.layer_norm else None
        self._inference_tables: dict = {}  # see _project
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

    def _project(self, distances: Tensor, which: str, layer: nn.Module | None) -> Tensor:
        """Position keys ("k") or queries ("q") for distances (R,) -> (H, D, R)."""
        if self.config.share_att_key:
            proj = getattr(layer, f"{which}_proj", None)
            if proj is None:
                raise ValueError(f"share_att_key needs the calling attention layer (with {which}_proj) as `layer`")
        else:
            proj = self.pos_key_proj if which == "k" else self.pos_query_proj
        rows = distances + self.config.span
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return self._project_rows(self.rel_embeddings[rows], proj)
        # Inference: the projected table depends on parameters only, and a decoding step would
        # otherwise project it again in every layer for a single query. Memoized per projection,
        # keyed on the parameters themselves (held) and their in-place versions.
        params = [self.rel_embeddings, proj.weight, *(() if self.norm is None else self.norm.parameters())]
        key = (which, id(proj.weight))
        stamp = tuple((p.dtype, p.device, p._version) for p in params)
        hit = self._inference_tables.get(key)
        if hit is None or hit[0] is not proj.weight or hit[1] != stamp:
            hit = (proj.weight, stamp, self._project_rows(self.rel_embeddings, proj))  # (H, D, 2*span)
            self._inference_tables[key] = hit
        return hit[2].index_select(-1, rows)  # (H, D, R)

    def _project_rows(self, p: Tensor, proj: nn.Linear) -> Tensor:
        """Table rows p (R, C) -> normalized, projected (H, D, R)."""
        if self.norm is not None:
            p = self.norm(p)  # row-wise: the same as normalizing the whole table, then indexing
        r = proj(p.to(proj.weight.dtype))  # (R, Hp*D)
        H, D = self.dims.num_heads, self.dims.head_dim
        r = r.view(r.shape[0], -1, D).permute(1, 2, 0)  # (Hp, D, R)
        if r.shape[0] != H:  # grouped-query k_proj: Hkv heads, repeated as attention repeats k
            r = r.repeat_interleave(H // r.shape[0], dim=0)  # (H, D, R)
        return r

    def score(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float, layer: nn.Module | None = None,
        state: Any = None,
    ) -> Tensor:
        lay = RelativeLayout.build(q_pos, k_pos, self._canon, self.bounds)
        out: Tensor | None = None
        if self.config.c2p:
            kr = (self._project(lay.distances, "k", layer) * scale).to(q.dtype)  # (H, D, W); scaled here, not on T^2
            out = lay.query_pairs(q, kr)  # (B, H, Tq, Tk)
        if self.config.p2c:
            qr = (self._project(lay.key_distances(), "q", layer) * scale).to(k.dtype)  # (H, D, W)
            out = lay.key_pairs(k, qr, out=out)  # added in place into c2p's output
        assert out is not None
        return out
