"""Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without
Tuning", ICML 2024).

A pair (query at position m, key at position n) at distance d = m - n < W (the neighbour window)
takes RoPE's own logit, at positions (m, n). Farther pairs take the logit of grouped positions:
the key at floor(n / G), the query at floor(m / G) + W - W / G, shifted so that the grouped
distance is about W where the neighbour window ends (at d = W it is W/G + W - W/G up to the
floors). One softmax runs over the merged logits. The largest distance RoPE sees at length T is
then about W + (T - W) / G.

The formulas follow the authors' code, datamllab/LongLM ``self_extend_patch/Llama.py`` (commit
cdbbb061dc76438c46d7e1ddc500f8e4bf255574): ``group_size_1`` is G, ``group_size_2`` is W,
``group_query_position = query_position // G + W - W / G`` (a real shift: W / G is a true
division there, so W need not be a multiple of G; llama.cpp's ``--grp-attn-w`` requires one, and
then it equals W - floor(W / G)), ``group_key_position = key_position // G``, and the neighbour
logit wherever m - n < W. LongLM tests the window on stream indices and drops the shift while
every query position is below W; here the window is tested on positions (right for packed
documents and left padding), and the shift needs no special case: a query below W has no pair at
distance >= W.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import Tensor

from ..config import check_int
from ..positions import floor_div
from .base import AttentionMethod

__all__ = ["SelfExtend"]

#: positions and windows are bounded as RoPE's positions are (float64 angles, 2**53 - 1)
MAX_WINDOW = 2**53 - 1


def _smallest_group(trained: int, target: int, window: int) -> int:
    """The smallest group G whose extended window (L - W) G + W reaches ``target``:
    ceil((N - W) / (L - W)), at least 1 (the paper's section 3.2)."""
    return max(1, -(-(target - window) // (trained - window)))


@dataclasses.dataclass(frozen=True)
class SelfExtend(AttentionMethod):
    """``group_size`` G >= 1 (G = 1 is plain RoPE), ``neighbor_window`` W >= 1."""

    group_size: int
    neighbor_window: int

    name: ClassVar[str] = "self_extend"
    label: ClassVar[str] = "Self-Extend"
    paper: ClassVar[str] = "Jin et al. 2024, LLM Maybe LongLM (datamllab/LongLM)"

    @classmethod
    def recommended(cls, trained: int, target: int) -> dict[str, int | float]:
        """W = L / 4 and the smallest G whose extended window (L - W) G + W (the paper's section 3.2)
        reaches ``target``: the paper's Llama-2 runs (L = 4096) use W = 1024 with G large enough for
        the target, and its ablation finds the smallest sufficient group best."""
        check_int("trained", trained, minimum=4, maximum=MAX_WINDOW)
        check_int("target", target, minimum=1, maximum=MAX_WINDOW)
        W = trained // 4
        return dict(group_size=_smallest_group(trained, target, W), neighbor_window=W)

    @classmethod
    def grid(cls, trained: int, target: int) -> tuple[dict[str, int | float], ...]:
        """The recommended set; the window halved (W = L / 8, the smallest sufficient G for it);
        the group doubled at W = L / 4 (the paper's ablations vary both, and find the smallest
        sufficient G best)."""
        rec = cls.recommended(trained, target)
        W = max(1, trained // 8)
        half = dict(group_size=_smallest_group(trained, target, W), neighbor_window=W)
        return cls._distinct([rec, half, dict(rec, group_size=2 * rec["group_size"])])

    def validate(self) -> None:
        check_int("group_size", self.group_size, minimum=1, maximum=MAX_WINDOW)
        check_int("neighbor_window", self.neighbor_window, minimum=1, maximum=MAX_WINDOW)

    @property
    def num_rotations(self) -> int:
        return 2

    def rotations(self, q_pos: Tensor, k_pos: Tensor) -> tuple[tuple[Tensor, Tensor], ...]:
        G, W = self.group_size, self.neighbor_window
        # floor_div, not torch.div(rounding_mode="floor"): inductor leaves the last partial group unwritten
        group_q = floor_div(q_pos, G).double() + (W - W / G)  # (B, Tq)
        group_k = floor_div(k_pos, G).double()  # (B, Tk)
        return (q_pos.double(), k_pos.double()), (group_q, group_k)

    def select(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return (q_pos - k_pos >= self.neighbor_window).long()  # 0: neighbour, 1: grouped
