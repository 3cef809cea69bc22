"""Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language
Models", ICML 2024; ChunkLlama).

The positions are cut into chunks of c = chunk_size - local_size; every key sits at its position
within its chunk, n mod c. The query's position depends on where the key is:

* intra-chunk (the key in the query's chunk): m mod c, so the distance is the true m - n;
* successive-chunk (the key in the chunk before): min(m mod c + c, chunk_size), the true distance
  while it is at most chunk_size, clamped beyond;
* inter-chunk (two chunks back or more): min(2c - 1, chunk_size), one position for every query.

No distance then exceeds chunk_size, which is set below the trained length L (ChunkLlama:
chunk_size = 3L/4, local_size = L/8). Chunks are cut on positions (so packed documents and left
padding keep theirs); one softmax runs over the merged logits.

The formulas follow the authors' code, HKUNLP/ChunkLlama ``chunkllama_attn_replace.py`` (commit
2add4d7c99d24dcc1ab03414cc602abb2e28cf2c): ``chunk_len = chunk_size - local_window``,
``q_t = arange(chunk_len)``, ``qc_t = (arange(chunk_len) + chunk_len).clamp(max=chunk_size)``,
``k_t = arange(...) % chunk_len``; the inter-chunk query reads ``qc_t`` at ``chunk_len - 1``.
ChunkLlama's optional linear ``scaling_factor`` and its mscale (YaRN's 0.1 ln s + 1 halved) are
not part of the method here: compose a RoPE scaling with ``scaling=`` instead.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import Tensor

from ..config import check_int
from .base import AttentionMethod
from .self_extend import MAX_WINDOW

__all__ = ["DualChunk"]


@dataclasses.dataclass(frozen=True)
class DualChunk(AttentionMethod):
    """``chunk_size`` s >= 2 and ``local_size`` l in [0, s - 1]: chunks of c = s - l positions."""

    chunk_size: int
    local_size: int

    name: ClassVar[str] = "dual_chunk"
    label: ClassVar[str] = "Dual Chunk"
    paper: ClassVar[str] = "An et al. 2024, Dual Chunk Attention (HKUNLP/ChunkLlama)"

    @classmethod
    def recommended(cls, trained: int, target: int) -> dict[str, int | float]:
        """chunk_size = 3L / 4, local_size = L / 8: ChunkLlama's ``chunkllama_attn_replace.py``
        (``pretraining_length * 3 // 4``, ``pretraining_length // 8``); whatever the target."""
        check_int("trained", trained, minimum=8, maximum=MAX_WINDOW)
        check_int("target", target, minimum=1, maximum=MAX_WINDOW)
        return dict(chunk_size=trained * 3 // 4, local_size=trained // 8)

    @classmethod
    def grid(cls, trained: int, target: int) -> tuple[dict[str, int | float], ...]:
        """The recommended set (chunk 3L/4, local L/8); a chunk of L/2; a local window of L/16."""
        rec = cls.recommended(trained, target)
        return cls._distinct([rec, dict(rec, chunk_size=trained // 2), dict(rec, local_size=trained // 16)])

    def validate(self) -> None:
        check_int("chunk_size", self.chunk_size, minimum=2, maximum=MAX_WINDOW)
        check_int("local_size", self.local_size, minimum=0, maximum=self.chunk_size - 1)

    @property
    def chunk_len(self) -> int:
        return self.chunk_size - self.local_size

    @property
    def num_rotations(self) -> int:
        return 3

    def rotations(self, q_pos: Tensor, k_pos: Tensor) -> tuple[tuple[Tensor, Tensor], ...]:
        c, s = self.chunk_len, self.chunk_size
        k_in = torch.remainder(k_pos, c).double()  # (B, Tk)
        q_in = torch.remainder(q_pos, c)  # (B, Tq)
        successive = (q_in + c).clamp(max=s).double()
        inter = torch.full_like(q_in, min(2 * c - 1, s), dtype=torch.float64)
        return (q_in.double(), k_in), (successive, k_in), (inter, k_in)

    def select(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        c = self.chunk_len
        apart = torch.div(q_pos, c, rounding_mode="floor") - torch.div(k_pos, c, rounding_mode="floor")
        return apart.clamp(0, 2)  # 0: intra, 1: successive, 2: inter
