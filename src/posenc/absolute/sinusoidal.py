"""Sinusoidal absolute encodings (Vaswani et al. 2017, "Attention Is All You Need").

PE(p, 2i) = sin(p / base^(2i/d)),  PE(p, 2i+1) = cos(p / base^(2i/d)).

Two layouts, spelled as rotary's: ``"interleaved"`` (sin, cos per pair, as in the paper) and
``"half"`` ([sin | cos], as fairseq and tensor2tensor lay it out; ``"halves"`` is refused
with a pointer to ``"half"``). Three fusions with the token
embeddings: ``"add"`` (the paper), ``"mul"`` (x * PE) and ``"concat"`` ([x | PE] followed by
a learned projection back to the model width). ``learnable_scale`` multiplies PE by one
learned scalar (the "scaled sinusoidal" of Hua et al. 2022, "Transformer Quality in Linear
Time").

Angles are computed in float64 (p / base^(2i/d) at p = 1e6 needs more than float32's 24
bits to keep the phase); the table is cast to the input's dtype last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_choice, check_even, check_int, check_range
from ..encoding import Dims, PositionalEncoding
from ..literature import EMBEDDINGS_ONLY
from ..positions import SequenceInfo
from ..registry import register
from ..limits import MAX_WIDTH

__all__ = ["SinusoidalConfig", "SinusoidalEncoding", "sinusoidal_table"]

_VASWANI = "Vaswani et al. 2017, §3.5"

LAYOUTS = ("interleaved", "half")  # the rotary family's spellings (posenc.rotary.LAYOUTS)
FUSIONS = ("add", "mul", "concat")


def _check_layout(layout: str) -> None:
    if layout == "halves":  # a likely slip for "half": say which spelling is meant
        raise ValueError("layout must be one of 'interleaved', 'half'; got 'halves' (spelled 'half' now)")
    check_choice("layout", layout, LAYOUTS)


def sinusoidal_table(positions: Tensor, dim: int, base: float = 10000.0, layout: str = "interleaved") -> Tensor:
    """Sinusoidal codes for integer or real ``positions`` (any shape) -> (*shape, dim), float32."""
    check_even("dim", dim)
    check_range("base", base, 1.0, None)
    _check_layout(layout)
    return _table(positions, dim, base, layout)


def _table(positions: Tensor, dim: int, base: float, layout: str) -> Tensor:
    # Unchecked core of sinusoidal_table (configs are validated once, at construction).
    i = torch.arange(dim // 2, dtype=torch.float64, device=positions.device)
    inv_freq = base ** (-2.0 * i / dim)  # (dim/2,)
    ang = positions.to(torch.float64)[..., None] * inv_freq  # (..., dim/2)
    sin, cos = ang.sin(), ang.cos()
    if layout == "interleaved":
        out = torch.stack([sin, cos], dim=-1).flatten(-2)  # (..., dim): s0 c0 s1 c1 ...
    else:
        out = torch.cat([sin, cos], dim=-1)  # (..., dim): s0 s1 ... c0 c1 ...
    return out.float()


@dataclass
class SinusoidalConfig(EncodingConfig):
    """``base`` >= 1: frequencies base^(-2i/d) lie in (0, 1] (a base below 1 makes them grow
    with i, and base = 1e-300 overflows the angles to inf: NaN codes). ``dim``: an even width
    in [2, 2^16] (the concat projection is (d_model + dim) x d_model)."""

    base: float = 10000.0
    layout: str = "interleaved"
    fusion: str = "add"
    dim: int | None = None  # width of PE; defaults to d_model (required to equal it for add/mul)
    learnable_scale: bool = False

    def validate(self) -> None:
        check_range("base", self.base, 1.0, None)
        _check_layout(self.layout)
        check_choice("fusion", self.fusion, FUSIONS)
        if self.dim is not None:
            check_int("dim", self.dim, minimum=2, maximum=MAX_WIDTH)
            check_even("dim", self.dim)


@register(
    "sinusoidal",
    family="absolute",
    summary="fixed sin/cos waves of geometric wavelengths added to embeddings (any base, 2 layouts)",
    paper="Vaswani et al. 2017, Attention Is All You Need",
    claims={
        "absolute": (True, "Vaswani et al. 2017: a unique code per position"),
        "relative": (True, "PE(i)·PE(j) = sum cos((i - j) w): " + _VASWANI),
        "linear_map": (True, _VASWANI),
        "bounded": (True, "sin, cos in [-1, 1]"),
        "decay": (True, "Yan et al. 2019 (TENER): PE(i)·PE(j) decreases with |i - j|"),
        "extrapolation": (True, "defined at every position"),
        "linear_attention": (True, EMBEDDINGS_ONLY),
    },
)
class SinusoidalEncoding(PositionalEncoding):
    Config = SinusoidalConfig

    def __init__(self, config: SinusoidalConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        dim = dims.d_model if config.dim is None else config.dim
        check_even("dim" if config.dim is not None else "d_model", dim)
        if config.fusion != "concat" and dim != dims.d_model:
            raise ValueError(f"dim must equal d_model ({dims.d_model}) for fusion={config.fusion!r}, got {dim}")
        self.dim = dim
        self.scale = nn.Parameter(torch.ones(())) if config.learnable_scale else None
        self.proj = nn.Linear(dims.d_model + dim, dims.d_model, bias=False) if config.fusion == "concat" else None

    def table(self, positions: Tensor) -> Tensor:
        """(B, T) positions -> (B, T, dim) float32 codes."""
        return _table(positions, self.dim, self.config.base, self.config.layout)

    def embed(self, x: Tensor, seq: SequenceInfo, state: dict[str, Any] | None = None) -> Tensor:
        pe = self.table(seq.positions)  # (B, T, dim) float32
        if self.scale is not None:
            pe = pe * self.scale
        pe = pe.to(x.dtype)
        if self.config.fusion == "add":
            return x + pe
        if self.config.fusion == "mul":
            return x * pe
        return self.proj(torch.cat([x, pe.expand(x.shape[0], -1, -1)], dim=-1))  # (B, T, C)
