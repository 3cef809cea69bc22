"""Helpers shared by the content-independent relative biases (T5, ALiBi, KERPLE, FIRE).

Shapes: positions (B, T); distances (B, Tq, Tk); biases (B or 1, H, Tq, Tk).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .distance import uniform_offset

__all__ = ["shared_rows", "bias_dtype", "toeplitz_bias"]


def toeplitz_bias(fn: Callable[[Tensor, Tensor], Tensor], q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """``fn(q_pos, k_pos)`` (B|1, H, Tq, Tk) for a bias that depends on ``q_pos_i - k_pos_j`` only.

    When the batch shares contiguous positions (``shared_rows`` gives one row and
    ``q_pos_i - k_pos_j = s + i - j``, the Toeplitz case) ``fn`` runs on the Tq + Tk - 1
    distinct distances only, and the (1, H, Tq, Tk) bias is one copy of their sliding
    windows; otherwise (packed, padded, per-row offsets, or under torch.compile) on all pairs.
    """
    q_pos, k_pos = shared_rows(q_pos, k_pos)
    s = uniform_offset(q_pos, k_pos) if q_pos.shape[0] == 1 and k_pos.shape[0] == 1 else None
    if s is None:
        return fn(q_pos, k_pos)
    tq, tk = q_pos.shape[1], k_pos.shape[1]
    d = s + torch.arange(tq - 1, -tk, -1, device=q_pos.device)  # (Tq + Tk - 1,) distances, descending
    per_distance = fn(d[None], d.new_zeros(1, 1))[..., 0]  # (1, H, Tq + Tk - 1): "query at d, key at 0"
    # Window w holds distances s + Tq - 1 - w - j over keys j, i.e. query i = Tq - 1 - w; picking
    # the windows in reverse is one contiguous copy (flip would keep the windows' overlapping strides).
    windows = per_distance.unfold(-1, tk, 1)  # (1, H, Tq, Tk) view, rows in reverse query order
    return windows.index_select(-2, torch.arange(tq - 1, -1, -1, device=d.device))  # (1, H, Tq, Tk)


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
