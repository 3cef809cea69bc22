"""Sandwich (Chi, Fan, Rudnicky & Ramadge 2023, "Dissecting Transformer Length Extrapolation
via the Lens of Receptive Field Analysis", ACL 2023, arXiv:2212.10356).

No parameters. The inner product of two sinusoidal position embeddings p_m, p_n of width d'
depends on m - n alone,

    p_m · p_n = sum_{i} cos((m - n) w_i),   w_i = 10000^(-2 i / d'),

and Sandwich adds it to the logits, shifted to be 0 at distance 0 and compressed per head as
ALiBi's slopes are (the paper's Figure 1: h in {1..H} times 8 / H):

    b_h(m, n) = (sum_{i=1}^{d'/2} cos(|m - n| w_i) - d'/2) / (8 h / H),   h = 1..H.

The sum lies in [-d'/2, d'/2], so the bias lies in [-d' H / (8 h), 0]: bounded, 0 on the
diagonal, and it falls roughly with log |m - n| up to distances near 1 / w_{d'/2} = 10000 (the
low frequencies then turn too), where it levels off around -d'/2 / (8 h / H) with a ripple.
It is the paper's "parameter-free relative positional embedding" from which length
extrapolation comes: the frequencies are not learned, so distances past the training length
read the same formula.

The constants follow NVIDIA NeMo's implementation (``SandwichRelativePositionEmbedding``,
nemo/collections/nlp/modules/common/megatron/position_embedding/
sandwich_relative_position_embedding.py, commit 000b931ed00341cd2a8ae713f1f8de24fafa952e):

* d' is the head dimension (NeMo passes ``hidden_size // num_attention_heads``, or
  ``kv_channels``); ``dim`` overrides it;
* the frequency index runs over i = 1..d'/2, so the highest frequency is 10000^(-2/d'), not
  Vaswani et al.'s 1 (index 0);
* the distance is |m - n| in causal and bidirectional attention alike (NeMo's
  ``build_relative_position(full=True)`` takes the absolute value), so the bias is symmetric.

Precision: the angles |m - n| w_i and their cosines are float64 (float32 loses about 1e-2 rad
at a distance of 1e6), the sum is divided by the head's compression and cast last to float32
(or float64 in a float64 model). The sum is a loop over the d'/2 frequencies of pointwise
tensor ops, so a dense bias never holds a (Tq, Tk, d'/2) tensor and FlexAttention's
``score_mod`` stays pointwise.

Shapes: positions (B, T); bias (B or 1, H, Tq, Tk); d' the sinusoids' width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import EncodingConfig, check_int
from ..encoding import Dims, PositionalEncoding
from ..limits import Float32Params
from ..literature import NOT_A_FEATURE_MAP, NO_ABSOLUTE
from ..positions import relative_positions
from ..registry import register
from ..terms import BiasTerm
from ._bias import distance_table_bias

__all__ = ["SandwichConfig", "Sandwich", "sandwich_compression", "sandwich_frequencies", "sandwich_bias"]

_CHI = "Chi et al. 2023 (Sandwich)"
BASE = 10000.0  # the sinusoids' base, as in Vaswani et al. 2017 and NeMo
MAX_DIM = 4096  # d': the bias loops over d'/2 cosines per (query, key) pair


def sandwich_frequencies(dim: int) -> list[float]:
    """w_i = 10000^(-2 i / d') for i = 1..d'/2 (NeMo's index range), as Python floats."""
    check_int("dim", dim, minimum=2, maximum=MAX_DIM)
    if dim % 2:
        raise ValueError(f"dim must be even (d'/2 sinusoid pairs), got {dim}")
    return [BASE ** (-2.0 * i / dim) for i in range(1, dim // 2 + 1)]


def sandwich_compression(num_heads: int) -> list[float]:
    """The per-head divisor 8 h / H, h = 1..H (the paper's ALiBi-like compression ratios)."""
    check_int("num_heads", num_heads, minimum=1)
    return [8.0 * h / num_heads for h in range(1, num_heads + 1)]


def _cosine_sum(dist: Tensor, freqs: list[float]) -> Tensor:
    """sum_i cos(dist w_i) - d'/2 in float64, pointwise in ``dist`` (int64, any shape)."""
    d = dist.abs().to(torch.float64)
    total = torch.cos(d * freqs[0])
    for w in freqs[1:]:  # a loop of pointwise ops: no (..., d'/2) tensor per pair
        total = total + torch.cos(d * w)
    return total - len(freqs)


def sandwich_bias(q_pos: Tensor, k_pos: Tensor, num_heads: int, dim: int) -> Tensor:
    """The Sandwich bias, float64: (B, Tq), (B, Tk) -> (B, H, Tq, Tk)."""
    dist = relative_positions(q_pos, k_pos)[:, None]  # (B, 1, Tq, Tk): m - n, exact int64
    ratio = torch.tensor(sandwich_compression(num_heads), dtype=torch.float64, device=dist.device)
    return _cosine_sum(dist, sandwich_frequencies(dim)) / ratio[None, :, None, None]  # (B, H, Tq, Tk)


@dataclass
class SandwichConfig(EncodingConfig):
    """Config of :class:`Sandwich`.

    Attributes:
        dim: d', the sinusoidal embeddings' width, an even int in [2, 4096]; None: the head
            dimension (as NeMo). It must be even when taken from the head dimension too.
    """

    dim: int | None = None

    def validate(self) -> None:
        if self.dim is not None:
            sandwich_frequencies(self.dim)  # the range and evenness, refused by name


@register(
    "sandwich",
    family="relative",
    summary="parameter-free sinusoidal inner product p_m·p_n - d'/2 on the logits, compressed per head by 8h/H",
    paper="Chi et al. 2023, Dissecting Transformer Length Extrapolation via the Lens of Receptive Field Analysis",
    claims={
        "absolute": (False, NO_ABSOLUTE),
        "relative": (True, _CHI + ": p_m·p_n of sinusoids is a function of m - n"),
        "bounded": (True, _CHI + ": a sum of d'/2 cosines minus d'/2 lies in [-d', 0]"),
        "decay": (True, _CHI + ": the same logarithmic decaying temporal bias pattern as KERPLE and T5"),
        "extrapolation": (True, _CHI + ": parameter free, uses information beyond the training length"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
)
class Sandwich(Float32Params, PositionalEncoding):
    """Logit bias ``(sum_i cos(|m - n| w_i) - d'/2) / (8 h / H)`` per head h = 1..H.

    ``frequencies``: the d'/2 frequencies w_i and ``compression`` the H divisors 8 h / H, as
    Python floats; ``compression_table``: the divisors as a non-persistent float32 buffer
    (float32 under ``.to(bfloat16)``), whose device and dtype the bias takes (a float64 model
    gets a float64 bias).
    """

    Config = SandwichConfig
    float32_params = ("compression_table",)

    def __init__(self, config: SandwichConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        dim = dims.head_dim if config.dim is None else config.dim
        if config.dim is None and dims.head_dim % 2:
            raise ValueError(f"dim must be even: sandwich takes d' from head_dim, which is odd ({dims.head_dim}); "
                             "pass dim=<an even int in [2, 4096]>")
        self.dim = dim
        self.frequencies = tuple(sandwich_frequencies(dim))
        self.compression = tuple(sandwich_compression(dims.num_heads))
        self.register_buffer("compression_table", torch.tensor(self.compression, dtype=torch.float32), persistent=False)

    def logit_bias(self) -> BiasTerm:
        table, freqs = self.compression_table, list(self.frequencies)
        # The divisors exact in float64 (8/3 is not a float32); the buffer gives device and dtype.
        ratio = torch.tensor(self.compression, dtype=torch.float64, device=table.device)

        def fn(h: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
            return (_cosine_sum(q_pos - k_pos, freqs) / ratio[h]).to(table.dtype)

        return BiasTerm(fn, self.dims.num_heads, toeplitz=True)

    def logit_bias_cached(self, q_pos: Tensor, k_pos: Tensor, memo: dict) -> BiasTerm:
        """Decoding: the bias at every distance in [-n, n], (H, 2n + 1), made once per cache
        (:func:`~posenc.relative._bias.distance_table_bias`); a step reads its keys' distances
        there instead of summing d'/2 cosines per key."""
        ratio = torch.tensor(self.compression, dtype=torch.float64, device=q_pos.device)[:, None]
        dtype = self.compression_table.dtype

        def values(d: Tensor) -> Tensor:  # (2n + 1,) -> (H, 2n + 1), as logit_bias computes them
            return (_cosine_sum(d, list(self.frequencies))[None] / ratio).to(dtype)

        term = distance_table_bias(memo, "sandwich_table", q_pos, k_pos, self.dims.num_heads, values)
        return self.logit_bias() if term is None else term
