"""Learned absolute position embeddings (BERT, GPT-2), with extension past the table.

``extend(new_max_len, method)`` grows the table:
* ``"random"``: old rows kept, new rows drawn like a fresh init (std 0.02);
* ``"interpolate"``: the table resampled linearly to the new length (positions compressed);
* ``"hierarchical"``: Su's hierarchical decomposition (Jianlin Su, 2020, "Hierarchical
  decomposition position encoding", kexue.fm/archives/7947). With trained rows p_0..p_{n-1}
  and u_i = (p_i - alpha * p_0) / (1 - alpha), position k = i * n + j becomes
  alpha * u_i + (1 - alpha) * u_j. For k < n (i = 0) this equals p_k; those rows are copied
  bitwise. Supports up to n^2 positions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_choice, check_int, check_range
from ..encoding import Dims, PositionalEncoding
from ..literature import EMBEDDINGS_ONLY, LEARNED, TABLE_END, UNTRAINED
from ..positions import SequenceInfo
from ..registry import register
from ..limits import MAX_INIT_STD, MAX_TABLE_ROWS, check_table_size

__all__ = ["LearnedConfig", "LearnedPositionalEmbedding", "check_positions_in_table"]

EXTEND_METHODS = ("random", "interpolate", "hierarchical")


def check_positions_in_table(positions: Tensor, size: int, what: str) -> None:
    """Raise a clear ``ValueError`` when any position is outside [0, size)."""
    if torch.compiler.is_compiling() or positions.numel() == 0:
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or hi >= size:
        raise ValueError(
            f"positions must be in [0, {size - 1}] for {what}, got range [{lo}, {hi}]; "
            f"call extend(new_max_len, method) to grow the table"
        )


@dataclass
class LearnedConfig(EncodingConfig):
    """``max_len``: rows of the table, in [1, 2^24], and at most 2^30 numbers with d_model
    (4 GiB in float32; checked when the module is built). ``init_std``: std of the rows' normal
    init, in (0, 1e4]; larger values overflow a LayerNorm's float32 variance (NaN logits)."""

    max_len: int = 1024
    init_std: float = 0.02

    def validate(self) -> None:
        check_int("max_len", self.max_len, minimum=1, maximum=MAX_TABLE_ROWS)
        check_range("init_std", self.init_std, 0.0, MAX_INIT_STD, low_inclusive=False)


@register(
    "learned",
    family="absolute",
    summary="trainable table of position vectors added to token embeddings (BERT/GPT)",
    paper="Devlin et al. 2019 (BERT); Radford et al. 2019 (GPT-2)",
    claims={
        "absolute": (True, "Devlin et al. 2019 / Radford et al. 2019: one vector per position"),
        "relative": (UNTRAINED, LEARNED),
        "linear_map": (UNTRAINED, LEARNED),
        "decay": (UNTRAINED, "Wang & Chen 2020 find decay only after training"),
        "extrapolation": (False, TABLE_END),
        "linear_attention": (True, EMBEDDINGS_ONLY),
    },
)
class LearnedPositionalEmbedding(PositionalEncoding):
    """x + P[pos] with P a (max_len, C) trainable table."""

    Config = LearnedConfig

    def __init__(self, config: LearnedConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        check_table_size("max_len", config.max_len, dims.d_model, "d_model")
        self.weight = nn.Parameter(self._fresh_rows(config.max_len, dims.d_model, torch.float32, None))

    def _fresh_rows(self, n: int, dim: int, dtype: torch.dtype, device: torch.device | None) -> Tensor:
        """Rows of a newly initialised table (used by __init__ and extend(method="random"))."""
        return torch.randn(n, dim, dtype=dtype, device=device) * self.config.init_std

    @property
    def max_len(self) -> int:
        return self.weight.shape[0]

    def embed(self, x: Tensor, seq: SequenceInfo, state: dict[str, Any] | None = None) -> Tensor:
        check_positions_in_table(seq.positions, self.max_len, f"a learned table of {self.max_len} rows")
        return x + self.weight[seq.positions].to(x.dtype)  # (B, T, C)

    @torch.no_grad()
    def extend(self, new_max_len: int, method: str = "hierarchical", alpha: float = 0.4) -> None:
        """Grow the table to ``new_max_len`` rows in place (see the module docstring)."""
        check_choice("method", method, EXTEND_METHODS)
        n = self.max_len
        check_int("new_max_len", new_max_len, minimum=n, maximum=MAX_TABLE_ROWS)
        check_table_size("new_max_len", new_max_len, self.weight.shape[1], "d_model")
        old = self.weight.detach()
        if method == "random":
            new = torch.cat([old, self._fresh_rows(new_max_len - n, old.shape[1], old.dtype, old.device)])
        elif method == "interpolate":
            if n < 2:
                raise ValueError("interpolate needs a table of at least 2 rows")
            src = torch.linspace(0, n - 1, new_max_len, dtype=torch.float64, device=old.device)
            lo = src.floor().long().clamp(max=n - 2)
            w = (src - lo).to(old.dtype)[:, None]
            new = old[lo] * (1 - w) + old[lo + 1] * w
        else:
            check_range("alpha", alpha, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
            if new_max_len > n * n:
                raise ValueError(f"hierarchical extension reaches at most n^2 = {n * n} positions, got {new_max_len}")
            new = hierarchical_extension(old, new_max_len, alpha)
        self.weight = nn.Parameter(new.contiguous())
        self.config = dataclasses.replace(self.config, max_len=new_max_len)


def hierarchical_extension(table: Tensor, new_len: int, alpha: float) -> Tensor:
    """Su's hierarchical decomposition of an (n, C) table to (new_len, C); first n rows bitwise."""
    n = table.shape[0]
    t64 = table.double()
    u = (t64 - alpha * t64[0]) / (1 - alpha)  # (n, C)
    k = torch.arange(new_len, device=table.device)
    out = alpha * u[k // n] + (1 - alpha) * u[k % n]  # (new_len, C)
    out = out.to(table.dtype)
    out[:n] = table  # exact in theory; copied so the trained rows stay bitwise
    return out
