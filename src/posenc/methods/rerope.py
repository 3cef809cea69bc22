"""ReRoPE and leaky ReRoPE (Su 2023, "Transformer upgrade path 12: ReRoPE for infinite
extrapolation?", https://kexue.fm/archives/9708).

A pair at distance d = m - n < w (the window) takes RoPE's own logit. Beyond the window the
distance is replaced: ReRoPE clamps it to w; leaky ReRoPE lets it grow with slope s = 1/k < 1,
w + s (d - w). Both are two rotations of the same q and k: the query at w (1 - s) + s m and the
key at s n give the distance w + s (d - w) (s = 0: the query at w and the key unrotated).

The formulas follow the author's code, bojone/rerope (commit
acfe78840357a94d0bb504cb8865eeaa752df1a6): ``rerope_patch.py`` rotates the query to
``position_ids * 0 + window`` and leaves the key unrotated for the far logit, taken where
``|m - n| >= window``; ``leaky_rerope_patch.py`` rotates the query to ``position + window (k - 1)``
and the key to its position with a linear scaling of factor k (both divided by k), which is the
(w (1 - s) + s m, s n) above with s = 1/k. Not included: the log-n query scaling
(``log(pos + 1) / log(training_length)``, clipped at 1) those scripts also apply; it is a separate
choice, the same for any method.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import Tensor

from ..config import check_int, check_range
from .base import AttentionMethod
from .self_extend import MAX_WINDOW

__all__ = ["ReRoPE"]


@dataclasses.dataclass(frozen=True)
class ReRoPE(AttentionMethod):
    """``window`` w >= 1; ``slope`` s in [0, 1]: 0 is ReRoPE, 0 < s < 1 leaky ReRoPE (s = 1/k),
    1 plain RoPE."""

    window: int
    slope: float = 0.0

    name: ClassVar[str] = "rerope"
    label: ClassVar[str] = "ReRoPE"
    paper: ClassVar[str] = "Su 2023, ReRoPE (bojone/rerope)"

    @classmethod
    def recommended(cls, trained: int, target: int) -> dict[str, int | float]:
        """w = L / 8, ReRoPE proper (slope 0): the author's scripts (``rerope_patch.py``,
        ``training_length = 4096``, ``window = 512``); whatever the target, no distance exceeds w.
        (Leaky ReRoPE there: the same window, ``scaling_factor = 16``, slope 1/16.)"""
        check_int("trained", trained, minimum=8, maximum=MAX_WINDOW)
        check_int("target", target, minimum=1, maximum=MAX_WINDOW)
        return dict(window=trained // 8, slope=0.0)

    @classmethod
    def grid(cls, trained: int, target: int) -> tuple[dict[str, int | float], ...]:
        """The recommended set (w = L / 8); the window halved and doubled; leaky ReRoPE at the
        recommended window with slope 1/16 (the author's ``scaling_factor = 16``)."""
        rec = cls.recommended(trained, target)
        w = rec["window"]
        return cls._distinct([rec, dict(rec, window=max(1, w // 2)), dict(rec, window=2 * w),
                              dict(rec, slope=1 / 16)])

    def validate(self) -> None:
        check_int("window", self.window, minimum=1, maximum=MAX_WINDOW)
        check_range("slope", self.slope, 0.0, 1.0)

    @property
    def num_rotations(self) -> int:
        return 2

    def rotations(self, q_pos: Tensor, k_pos: Tensor) -> tuple[tuple[Tensor, Tensor], ...]:
        w, s = float(self.window), self.slope
        far_q = w * (1.0 - s) + s * q_pos.double()  # (B, Tq)
        far_k = s * k_pos.double()  # (B, Tk): zero for ReRoPE
        return (q_pos.double(), k_pos.double()), (far_q, far_k)

    def select(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return (q_pos - k_pos >= self.window).long()  # 0: inside the window, 1: rectified
