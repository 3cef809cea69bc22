"""Small encodings for the analysis tests, registered nowhere (``register`` is global).

Each is the paper's formula in a few lines, written independently of posenc's own families,
so the checks can be tested before (and apart from) the real encodings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posenc import Dims, EncodingConfig, PositionalEncoding
from posenc.terms import BiasTerm


@dataclass
class RoPEConfig(EncodingConfig):
    base: float = 10000.0


class MiniRoPE(PositionalEncoding):
    """RoPE (Su et al. 2021), interleaved pairs: (x0, x1) rotated by p * base^(-2i/D)."""

    Config = RoPEConfig

    def inv_freq(self, positions: Tensor) -> Tensor:
        """(B, T) positions -> (B, T, D/2) frequencies (the same at every position)."""
        D = self.dims.head_dim
        f = self.config.base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        return f.expand(*positions.shape, D // 2)

    def _rot(self, x: Tensor, pos: Tensor) -> Tensor:
        ang = pos.double()[..., None] * self.inv_freq(pos)  # (B, T, D/2)
        cos, sin = ang.cos()[:, None], ang.sin()[:, None]  # (B, 1, T, D/2)
        x0, x1 = x.double()[..., 0::2], x.double()[..., 1::2]
        out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
        return out.to(x.dtype)

    def rotate(self, q, k, q_pos, k_pos, state=None):
        return self._rot(q, q_pos), self._rot(k, k_pos)


class ShuffledRoPE(MiniRoPE):
    """Deliberately broken RoPE: each position permutes the frequency table differently."""

    def inv_freq(self, positions: Tensor) -> Tensor:
        f = super().inv_freq(positions)
        g = torch.Generator().manual_seed(0)
        n = int(positions.max()) + 1
        perms = torch.stack([torch.randperm(f.shape[-1], generator=g) for _ in range(n)])  # (P, D/2)
        return torch.gather(f, -1, perms[positions])


@dataclass
class ALiBiConfig(EncodingConfig):
    pass


class MiniALiBi(PositionalEncoding):
    """ALiBi (Press et al. 2022): bias -m_h * |i - j|, slopes 2^(-8h/H), h = 1..H."""

    Config = ALiBiConfig

    def logit_bias(self):
        H = self.dims.num_heads
        m = 2.0 ** (-8.0 * torch.arange(1, H + 1, dtype=torch.float32) / H)  # (H,)
        return BiasTerm(lambda h, qp, kp: -m[h] * (qp - kp).abs().float(), H)


@dataclass
class LogBiasConfig(EncodingConfig):
    r: float = 0.01


class MiniLogBias(PositionalEncoding):
    """KERPLE's logarithmic kernel (Chi et al. 2022) with a tiny weight: -r log(1 + |i - j|).

    Unbounded however small r is: every doubling of the distance adds r log 2.
    """

    Config = LogBiasConfig

    def logit_bias(self):
        r = self.config.r
        return BiasTerm(lambda h, qp, kp: -r * torch.log1p((qp - kp).abs().double()), self.dims.num_heads)  # same for every head


@dataclass
class TableConfig(EncodingConfig):
    max_len: int = 64


class MiniTable(PositionalEncoding):
    """A learned-style random table that rejects positions past its end."""

    Config = TableConfig

    def __init__(self, config, dims):
        super().__init__(config, dims)
        self.weight = torch.nn.Parameter(torch.randn(config.max_len, dims.d_model, generator=torch.Generator().manual_seed(0)))

    def embed(self, x, seq, state=None):
        if int(seq.positions.max()) >= self.config.max_len:
            raise ValueError("position past the table")
        return x + self.weight[seq.positions].to(x.dtype)


def make(cls, d_model: int = 64, num_heads: int = 4, **config) -> PositionalEncoding:
    return cls(cls.Config(**config), Dims(d_model, num_heads, d_model // num_heads)).eval()
