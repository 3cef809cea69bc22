"""T5's bucketed relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer
Learning with a Unified Text-to-Text Transformer", section 2.1).

Each head learns one scalar per bucket of the relative position ``k_pos - q_pos``; the logit of
query i for key j gets ``table[bucket(j - i), h]``. Buckets are exact for short distances
(half of a direction's buckets) and logarithmically wider up to ``max_distance``; every
distance at or beyond it shares the last bucket, so the bias is constant there.

``bidirectional`` (default True) splits the buckets between keys before and after the query.
With False (T5's decoder) every bucket goes to past keys and all future keys share bucket 0 —
right only under a causal mask, since an encoder could then not tell left from right. The hook
does not know whether the model is causal, so the default is the setting that is correct for
both (a decoder merely leaves half of its buckets unused); set False for decoders.

Shapes: positions (B, T); buckets (B, Tq, Tk); bias (B or 1, H, Tq, Tk).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_int, check_range
from ..encoding import Dims, PositionalEncoding
from ..limits import MAX_DISTANCE, MAX_INIT_STD, MAX_TABLE_ROWS, check_table_size
from ..literature import LEARNED, NOT_A_FEATURE_MAP, NO_ABSOLUTE, RELATIVE_BY_CONSTRUCTION, UNTRAINED
from ..registry import register
from ..terms import BiasTerm
from ._bias import bias_dtype

__all__ = ["T5Config", "T5RelativeBias", "t5_relative_position_bucket"]


def _check_bucket_args(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__} {bidirectional!r}")
    check_int("num_buckets", num_buckets, minimum=2, maximum=MAX_TABLE_ROWS)
    if bidirectional and num_buckets < 4:
        raise ValueError(
            f"num_buckets must be >= 4 when bidirectional (each direction needs an exact and a log bucket), "
            f"got {num_buckets}"
        )
    # Half of a direction's buckets are the exact range [0, max_exact); the log buckets
    # divide by log(max_distance / max_exact), which needs max_distance > max_exact.
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    check_int("max_distance", max_distance, minimum=1, maximum=MAX_DISTANCE)
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance must be > {max_exact} (the exact range, half of a direction's {2 * max_exact} "
            f"buckets), got {max_distance}"
        )


def t5_relative_position_bucket(
    relative_position: Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5's bucket of each relative position ``key position - query position`` (int64, same shape).

    With ``bidirectional``, buckets [0, num_buckets // 2) hold keys at or before the query and
    the next num_buckets // 2 keys after it; otherwise only n = max(q - k, 0) is bucketed. With
    nb buckets for a direction and max_exact = nb // 2: n < max_exact is its own bucket, larger
    n gets ``max_exact + floor(log(n / max_exact) / log(max_distance / max_exact) * (nb - max_exact))``
    capped at nb - 1.

    The log is taken in float32, as in Mesh TensorFlow's T5 and transformers' T5Attention, so
    buckets match trained T5 checkpoints bit for bit — including the rare n where the exact
    value is an integer and float32 rounding decides the side.
    """
    _check_bucket_args(bidirectional, num_buckets, max_distance)
    rel = relative_position.long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        n = rel.abs()
    else:
        n = (-rel).clamp(min=0)
    max_exact = num_buckets // 2
    # log(0) never reaches the int cast: small n take the exact branch below anyway.
    ratio = n.clamp(min=max_exact).float() / max_exact
    log_bucket = max_exact + (
        torch.log(ratio) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).long()
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return buckets + torch.where(n < max_exact, n, log_bucket)


@dataclass
class T5Config(EncodingConfig):
    """Bounds: ``num_buckets`` in [2, 2^24] (table rows; at most 2^30 numbers with the heads),
    ``max_distance`` in (exact range, 2^40], ``init_std`` in [0, 1e4]."""

    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True  # False: T5's decoder buckets (all future keys share bucket 0)
    init_std: float = 0.02  # std of the normal init of the (num_buckets, H) table

    def validate(self) -> None:
        _check_bucket_args(self.bidirectional, self.num_buckets, self.max_distance)
        check_range("init_std", self.init_std, 0.0, MAX_INIT_STD)


@register(
    "t5",
    family="relative",
    summary="learned per-head scalar per log-spaced bucket of k - q, added to the logits (T5)",
    paper="Raffel et al. 2020, Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer",
    claims={
        "absolute": (False, NO_ABSOLUTE),
        "relative": (True, "Raffel et al. 2020: " + RELATIVE_BY_CONSTRUCTION),
        "bounded": (True, "one learned scalar per bucket (Raffel et al. 2020)"),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, "distances beyond max_distance share the last bucket"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
)
class T5RelativeBias(PositionalEncoding):
    """Logit bias ``table[t5_relative_position_bucket(k_pos - q_pos), h]``, table (num_buckets, H).

    Share one module across layers (``ModelConfig.share_encoding``, the default) for T5's single
    table computed once per forward.
    """

    Config = T5Config

    def __init__(self, config: T5Config, dims: Dims) -> None:
        super().__init__(config, dims)
        check_table_size("num_buckets", config.num_buckets, dims.num_heads, "num_heads")
        self.table = nn.Parameter(torch.randn(config.num_buckets, dims.num_heads) * config.init_std)

    def logit_bias(self) -> BiasTerm:
        c = self.config
        table = self.table.to(bias_dtype(self.table)).t()  # (H, num_buckets)

        def fn(h: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
            # Key minus query: T5's sign.
            buckets = t5_relative_position_bucket(k_pos - q_pos, c.bidirectional, c.num_buckets, c.max_distance)
            return table[h, buckets]

        return BiasTerm(fn, self.dims.num_heads, toeplitz=True)
