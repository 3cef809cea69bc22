"""Helpers shared by the content-independent relative biases (T5, ALiBi, KERPLE, FIRE).

Shapes: positions (B, T); distances (B, Tq, Tk); biases (B or 1, H, Tq, Tk).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["shared_rows", "bias_dtype"]


def shared_rows(q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
    """Reduce (B, T) positions to one row when every row is provably the same.

    A bias that depends on positions only is then computed once, (1, H, Tq, Tk), and
    broadcast over the batch. The test is exact and free: a batch of one row, or a row
    expanded with stride 0 (``SequenceInfo.from_offset`` with an int offset, the model's
    default). Rows that merely happen to be equal are left alone; comparing them would need
    a device sync.
    """
    if _one_row(q_pos) and _one_row(k_pos):
        return q_pos[:1], k_pos[:1]
    return q_pos, k_pos


def _one_row(pos: Tensor) -> bool:
    return pos.shape[0] == 1 or pos.stride(0) == 0


def bias_dtype(*params: Tensor) -> torch.dtype:
    """float32, or the parameters' dtype when it is wider (float64 in gradchecks and references)."""
    dtype = torch.float32
    for p in params:
        dtype = torch.promote_types(dtype, p.dtype)
    return dtype
