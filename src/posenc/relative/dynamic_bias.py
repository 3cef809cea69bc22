"""Dynamic position bias: a small MLP of the relative distance, one output per head.

From the "dynamic position bias" of CrossFormer (Wang et al. 2021, "CrossFormer: A Versatile
Vision Transformer Hinging on Cross-scale Attention", sec. 3.3), as x-transformers applies it
to language models (``dynamic_pos_bias``). The bias of a query at position i for a key at j is

    b_h(i, j) = MLP(x)_h,   x = i - j,  or  x = sign(i - j) * log(1 + |i - j|)  (``log_distance``),

with MLP = Linear(1, w) [LayerNorm] SiLU, then ``depth - 1`` times Linear(w, w) [LayerNorm]
SiLU, then Linear(w, H). Unlike T5's buckets the function is continuous in the distance, so it
is defined at every distance, including ones never seen in training; unlike FIRE it is not
normalised by the query position, so it depends on i - j only (a Toeplitz bias).

The first LayerNorm has a gain and no bias, the later ones both, as in x-transformers (so its
weights load one to one). The MLP runs in float32 (or the parameters' dtype when wider).

Shapes: positions (B, T); bias (B or 1, H, Tq, Tk); w the MLP's width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import EncodingConfig, check_int
from ..encoding import Dims, PositionalEncoding
from ..literature import LEARNED, NOT_A_FEATURE_MAP, NO_ABSOLUTE, UNTRAINED
from ..registry import register
from ..terms import BiasTerm
from ._bias import bias_dtype, distance_table_bias

__all__ = ["DynamicBiasConfig", "DynamicPositionBias"]

MAX_MLP_WIDTH = 4096
MAX_DEPTH = 16


@dataclass
class DynamicBiasConfig(EncodingConfig):
    """Config of :class:`DynamicPositionBias`.

    Attributes:
        width: w, the MLP's hidden width, in [1, 4096]; None: d_model // 4 (at least 1), as
            x-transformers sets it.
        depth: hidden layers (Linear + SiLU), in [1, 16]; x-transformers' default is 2.
        log_distance: feed sign(d) log(1 + |d|) instead of d (compresses far distances).
        norm: a LayerNorm after each hidden Linear.
    """

    width: int | None = None
    depth: int = 2
    log_distance: bool = False
    norm: bool = False

    def validate(self) -> None:
        if self.width is not None:
            check_int("width", self.width, minimum=1, maximum=MAX_MLP_WIDTH)
        check_int("depth", self.depth, minimum=1, maximum=MAX_DEPTH)


@register(
    "dynamic_bias",
    family="relative",
    summary="an MLP of the distance i - j (or its signed log), one bias per head",
    paper="Wang et al. 2021, CrossFormer (dynamic position bias); x-transformers dynamic_pos_bias",
    claims={
        "absolute": (False, NO_ABSOLUTE),
        "relative": (True, "Wang et al. 2021 (CrossFormer): an MLP of i - j"),
        "bounded": (UNTRAINED, LEARNED),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, "continuous in the distance: defined at every distance (Wang et al. 2021)"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
)
class DynamicPositionBias(PositionalEncoding):
    """Logit bias ``MLP(i - j)_h`` as a Toeplitz :class:`~posenc.terms.BiasTerm`.

    ``hidden`` holds the hidden layers (``Linear``, and ``LayerNorm`` when ``norm``); ``out`` is
    the last ``Linear(w, H)``, read per head inside the pointwise function (its row ``h``), so
    the same definition serves the dense table and a FlexAttention ``score_mod``.
    """

    Config = DynamicBiasConfig

    def __init__(self, config: DynamicBiasConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        w = max(1, dims.d_model // 4) if config.width is None else config.width
        self.width = w
        self.linears = nn.ModuleList([nn.Linear(1, w)] + [nn.Linear(w, w) for _ in range(config.depth - 1)])
        self.norms = nn.ModuleList(
            [nn.LayerNorm(w, bias=i > 0) for i in range(config.depth)] if config.norm else []
        )
        self.out = nn.Linear(w, dims.num_heads)

    def distance_features(self, d: Tensor, dtype: torch.dtype) -> Tensor:
        """The MLP's input from integer distances ``d`` (any shape): (..., 1) in ``dtype``."""
        x = d.to(dtype)
        if self.config.log_distance:
            x = torch.sign(x) * torch.log1p(x.abs())
        return x[..., None]

    def hidden_features(self, d: Tensor) -> Tensor:
        """The last hidden layer at distances ``d`` (any shape): (..., w), float32 or wider."""
        dtype = bias_dtype(*self.parameters())
        x = self.distance_features(d, dtype)
        for i, lin in enumerate(self.linears):
            x = F.linear(x, lin.weight.to(dtype), lin.bias.to(dtype))
            if self.norms:
                ln = self.norms[i]
                x = F.layer_norm(x, (self.width,), ln.weight.to(dtype), None if ln.bias is None else ln.bias.to(dtype),
                                 ln.eps)
            x = F.silu(x)
        return x

    def logit_bias(self) -> BiasTerm:
        dtype = bias_dtype(*self.parameters())
        weight, bias = self.out.weight.to(dtype), self.out.bias.to(dtype)  # (H, w), (H,)

        def fn(h: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
            hidden = self.hidden_features(q_pos - k_pos)  # (..., w)
            return (hidden * weight[h]).sum(-1) + bias[h]  # row h of the last Linear, per pair

        return BiasTerm(fn, self.dims.num_heads, toeplitz=True)

    def logit_bias_cached(self, q_pos: Tensor, k_pos: Tensor, memo: dict) -> BiasTerm:
        """Decoding: the MLP at every distance in [-n, n], (H, 2n + 1), made once per cache and
        kept in ``memo`` (:func:`~posenc.relative._bias.distance_table_bias`); a step reads its
        distances from that table instead of running the MLP on each key (at a context of 4096
        the MLP was a quarter of a decoding step)."""
        def values(d: Tensor) -> Tensor:  # (2n + 1,) -> (H, 2n + 1), as logit_bias sums
            dtype = bias_dtype(*self.parameters())
            weight, bias = self.out.weight.to(dtype), self.out.bias.to(dtype)
            return (self.hidden_features(d)[None] * weight[:, None]).sum(-1) + bias[:, None]

        term = distance_table_bias(memo, "dynamic_bias_table", q_pos, k_pos, self.dims.num_heads, values)
        return self.logit_bias() if term is None else term
