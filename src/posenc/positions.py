"""Explicit token positions: where each token sits in its own sequence.

Notation used throughout posenc:
    B batch, T sequence length (Tq queries, Tk keys), H heads, D head dim, C model width.

Every encoding receives per-token position ids of shape (B, T). :class:`SequenceInfo`
carries them together with the two other facts attention needs:

* ``segment_ids`` (B, T) for packed sequences: tokens attend only within their document;
* ``valid`` (B, T) bool, False at padding tokens.

Build one with the helpers: :meth:`SequenceInfo.from_offset` (plain batches and KV-cache
decoding), :meth:`SequenceInfo.from_padding_mask` (left or right padding) and
:meth:`SequenceInfo.from_cu_seqlens` (packed documents, positions restart at each one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["SequenceInfo", "relative_positions"]


def relative_positions(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Distances ``i - j`` (query position minus key position): (B, Tq) x (B, Tk) -> (B, Tq, Tk)."""
    return q_pos[:, :, None] - k_pos[:, None, :]


@dataclass
class SequenceInfo:
    """Positions and document/padding structure of a batch of tokens.

    Attributes:
        positions: (B, T) int64 position ids. Padding tokens get 0.
        segment_ids: (B, T) int64 document ids, or None when each row is one sequence.
        valid: (B, T) bool, False at padding, or None when there is none.
    """

    positions: Tensor
    segment_ids: Tensor | None = None
    valid: Tensor | None = None

    def __post_init__(self) -> None:
        if self.positions.dim() != 2:
            raise ValueError(f"positions must have shape (B, T), got {tuple(self.positions.shape)}")
        if self.positions.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"positions must be an integer tensor, got {self.positions.dtype}")
        for name in ("segment_ids", "valid"):
            t = getattr(self, name)
            if t is not None and t.shape != self.positions.shape:
                raise ValueError(
                    f"{name} must have the shape of positions {tuple(self.positions.shape)}, "
                    f"got {tuple(t.shape)}"
                )
        if self.valid is not None and self.valid.dtype != torch.bool:
            raise TypeError(f"valid must be a bool tensor, got {self.valid.dtype}")

    @property
    def shape(self) -> torch.Size:
        return self.positions.shape

    @classmethod
    def from_offset(
        cls,
        batch: int,
        length: int,
        offset: int | Tensor = 0,
        device: torch.device | str | None = None,
    ) -> "SequenceInfo":
        """Positions ``offset, offset + 1, ...`` for every row.

        ``offset`` is an int or a (B,) tensor (one offset per row, e.g. KV-cache decoding of
        sequences of different lengths).
        """
        if batch < 1 or length < 0:
            raise ValueError(f"batch must be >= 1 and length >= 0, got batch={batch}, length={length}")
        if isinstance(offset, Tensor):
            if offset.shape != (batch,):
                raise ValueError(f"offset tensor must have shape ({batch},), got {tuple(offset.shape)}")
            device = offset.device
            pos = offset.long()[:, None] + torch.arange(length, device=device)[None, :]
        else:
            if offset < 0:
                raise ValueError(f"offset must be >= 0, got {offset}")
            pos = torch.arange(offset, offset + length, device=device).expand(batch, length)
        return cls(positions=pos)

    @classmethod
    def from_padding_mask(cls, mask: Tensor) -> "SequenceInfo":
        """Positions from a (B, T) padding mask (1/True = real token, 0/False = padding).

        Works for left and right padding: the first real token of each row gets position 0.
        """
        if mask.dim() != 2:
            raise ValueError(f"mask must have shape (B, T), got {tuple(mask.shape)}")
        valid = mask.bool()
        pos = (valid.long().cumsum(-1) - 1).clamp_min(0)
        pos = pos.masked_fill(~valid, 0)
        return cls(positions=pos, valid=valid)

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: Tensor | list[int]) -> "SequenceInfo":
        """A packed row of documents, given their cumulative lengths ``[0, n1, n1+n2, ...]``.

        Returns B = 1: positions restart at 0 at each document and segment ids number them.
        """
        cu = torch.as_tensor(cu_seqlens, dtype=torch.long)
        if cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0:
            raise ValueError(f"cu_seqlens must be 1-D, start at 0 and have >= 2 entries, got {cu.tolist()}")
        lengths = cu.diff()
        if bool((lengths <= 0).any()):
            raise ValueError(f"cu_seqlens must be strictly increasing, got {cu.tolist()}")
        total = int(cu[-1])
        seg = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths)
        pos = torch.arange(total, device=cu.device) - cu[:-1][seg]
        return cls(positions=pos[None], segment_ids=seg[None])

    def to(self, device: torch.device | str) -> "SequenceInfo":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return SequenceInfo(move(self.positions), move(self.segment_ids), move(self.valid))

    def next(self, length: int = 1) -> "SequenceInfo":
        """The info of the ``length`` tokens that follow each row (greedy decoding).

        Positions continue from the last position of each row; the new tokens are valid and
        belong to the last document of their row.
        """
        last = self.positions[:, -1:]
        step = torch.arange(1, length + 1, device=last.device)[None, :]
        pos = last + step
        seg = None if self.segment_ids is None else self.segment_ids[:, -1:].expand(-1, length)
        valid = None if self.valid is None else torch.ones_like(pos, dtype=torch.bool)
        return SequenceInfo(pos, seg, valid)
